"""Bad input gets a clear Python exception; the index stays usable afterwards."""

import numpy as np
import pytest
import torch
from reference import Reference, check_lookup, check_matches

from torch_rtindex import CgRXIndex, Index, RXIndex, SceneConfig, UpdatableCgRXIndex, UpdatableIndex
from torch_rtindex._config import rx_config

INDEXES = {
    "rx": RXIndex,
    "cgrx": lambda k, **kw: CgRXIndex(k, bucket_size=4, **kw),
    "updatable": lambda k, **kw: UpdatableCgRXIndex(k, node_size=4, **kw),
}


def test_bad_keys(device):
    with pytest.raises(TypeError, match="dtype"):
        RXIndex(torch.tensor([1, 2], dtype=torch.int16, device=device))
    with pytest.raises(ValueError, match="1-D"):
        RXIndex(torch.zeros(2, 2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="contiguous"):
        RXIndex(torch.arange(10, device=device)[::2])
    with pytest.raises(ValueError, match="NaN"):
        RXIndex(torch.tensor([1.0, float("nan")], device=device))
    with pytest.raises(TypeError, match="torch.Tensor"):
        RXIndex([1, 2, 3])
    with pytest.raises(TypeError, match="key_type"):
        RXIndex(torch.tensor([1.0], device=device), key_type="uint64")
    with pytest.raises(ValueError, match="key_type"):
        RXIndex(torch.tensor([1], device=device), key_type="int128")


def test_bad_queries_leave_the_index_usable(device):
    index = RXIndex(torch.tensor([5, 6, 7], device=device))
    with pytest.raises(TypeError, match="dtype"):
        index.lookup(torch.tensor([5.0], dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="1-D"):
        index.lookup(torch.tensor([[5]], device=device))
    with pytest.raises(ValueError, match="contiguous"):
        index.lookup(torch.arange(10, device=device)[::2])
    with pytest.raises(ValueError, match="same length"):
        index.range(torch.tensor([1, 2], device=device), torch.tensor([3], device=device))
    with pytest.raises(ValueError, match="values"):
        index.aggregate(torch.tensor([5], device=device), torch.ones(2, device=device))
    other = "cpu" if device.type == "cuda" else "meta"
    with pytest.raises(ValueError, match="index is on"):
        index.lookup(torch.tensor([5], device=other))
    assert index.lookup(torch.tensor([6], device=device)).first_row.tolist() == [1]


def test_bad_configuration(device):
    with pytest.raises(ValueError, match="64"):
        SceneConfig(20, 20, 20)
    with pytest.raises(ValueError, match="23"):
        SceneConfig(30, 17, 17)
    with pytest.raises(ValueError, match="max_range_rays"):
        RXIndex(torch.tensor([1], device=device), max_range_rays=0)
    index = RXIndex(torch.tensor([1, 2], device=device))
    with pytest.raises(RuntimeError, match="allow_update"):
        index.refit(torch.tensor([3, 4], device=device))
    updatable = RXIndex(torch.tensor([1, 2], device=device), allow_update=True)
    with pytest.raises(ValueError, match="number of keys"):
        updatable.refit(torch.tensor([3], device=device))


def test_failed_rebuild_keeps_the_old_keys(device):
    index = RXIndex(torch.tensor([1.0, 2.0, 3.0], device=device))
    with pytest.raises(ValueError, match="NaN"):
        index.rebuild(torch.tensor([1.0, float("nan")], device=device))
    with pytest.raises(TypeError, match="dtype"):
        index.rebuild(torch.tensor([1, 2], device=device))
    assert index.lookup(torch.tensor([2.0], device=device)).first_row.tolist() == [1]


def test_operators_check_their_arguments(device):
    ops = torch.ops.rtindex
    keys = torch.tensor([1, 2, 3], device=device)
    s = ops.rx_build(keys, [23, 23, 18, 0, 0], False)
    with pytest.raises(RuntimeError, match="scene"):
        ops.rx_build(keys, [23, 23], False)
    config = rx_config("int64", True, 16, [23, 23, 18, 0, 0])
    with pytest.raises(RuntimeError, match="int64"):
        ops.rx_lookup(s, keys, config, keys.int(), None)
    with pytest.raises(RuntimeError, match="config"):
        ops.rx_lookup(s, keys, -1, keys, None)
    with pytest.raises(RuntimeError, match="past its last field"):
        ops.rx_lookup(s, keys, config | 1 << 62, keys, None)
    with pytest.raises(RuntimeError, match="key_type"):
        ops.rx_lookup(s, keys, config | 7, keys, None)  # key type 7 does not exist
    with pytest.raises(RuntimeError, match="scene"):
        ops.rx_lookup(s, keys, config & ~(31 << 4), keys, None)  # scene bits_x 0
    with pytest.raises(ValueError, match="fit"):
        rx_config("int64", True, 2**31, [23, 23, 18, 0, 0])
    with pytest.raises(RuntimeError, match="same length"):
        ops.rx_lookup(s, keys, config, keys, keys[:2])
    with pytest.raises(RuntimeError, match="key_type|dtype"):
        ops.map_keys(keys, 3)


def test_bad_capacity(device):
    for index in (RXIndex(torch.tensor([5, 6, 6], device=device)), CgRXIndex(torch.tensor([5, 6, 6], device=device))):
        q = torch.tensor([6, 7], device=device)
        with pytest.raises(ValueError, match="capacity must be non-negative"):
            index.lookup_all_capped(q, -1)
        with pytest.raises(TypeError, match="capacity must be an int"):
            index.range_capped(q, q, 2.5)
        op = getattr(torch.ops.rtindex, f"{index._OPS}_lookup_csr_capped")
        with pytest.raises(RuntimeError, match="capacity must be non-negative"):  # the operator checks too
            op(*index._lead, index._cfg, q, None, -1)
        got = index.lookup_all_capped(q, 1)
        assert got.rows.tolist() == [1] and int(got.total) == 2 and bool(got.overflowed())


@pytest.mark.parametrize("kind", list(INDEXES))
def test_capacity_past_the_device_memory_is_refused_before_allocating(device, kind):
    """A capped answer's rows are allocated up front: 2^40 of them (8 TiB) can never be met, and the error says
    so instead of the allocator's; a 0-d integer tensor is a capacity like an int."""
    index = INDEXES[kind](torch.tensor([5, 6, 6], device=device))
    q = torch.tensor([6, 7], device=device)
    for form in (lambda c: index.lookup_all_capped(q, c), lambda c: index.range_capped(q, q, c)):
        with pytest.raises(ValueError, match=r"capacity=1099511627776 asks for 8.0 TiB .* memory"):
            form(2**40)
        for zero_d in (torch.tensor(3), torch.tensor(3, dtype=torch.int32, device=device)):
            got = form(zero_d)
            assert got.rows.shape == (3,) and int(got.total) == 2 and sorted(got.rows[:2].tolist()) == [1, 2]
        for bad in (torch.tensor(2.0), torch.tensor([3])):
            with pytest.raises(TypeError, match="0-d integer tensor"):
                form(bad)
    assert index.lookup(q).count.tolist() == [2, 0]


def _answers(index, q, lo, hi, values):
    """Every lookup form's answer to one batch, as plain lists (to compare a converted batch's with the original's)."""
    out = [*index.lookup(q), index.lookup_rows(q, -7), *index.range_lookup(lo, hi), index.range_count(lo, hi),
           *index.lookup_all(q), *index.range(lo, hi), *index.lookup_all_capped(q, 64), *index.range_capped(lo, hi, 64),
           *index.aggregate(q, values), *index.range_aggregate(lo, hi, values)]
    return [t.tolist() for t in out]


LOSSLESS = [  # (index key dtype, batch dtype): every value of the batch's dtype is exact in the index's
    (torch.int64, torch.int32), (torch.int64, torch.int16), (torch.int64, torch.uint8), (torch.int32, torch.int16),
    (torch.float64, torch.float32), (torch.float64, torch.float16), (torch.float32, torch.bfloat16),
]
REFUSED = [  # narrowing, integer <-> float, signed <-> unsigned
    (torch.int32, torch.int64), (torch.int64, torch.float32), (torch.int32, torch.float64),
    (torch.float64, torch.int64), (torch.float32, torch.int32), (torch.float32, torch.float64),
] + ([(torch.uint64, torch.int64), (torch.uint64, torch.int32)] if hasattr(torch, "uint64") else [])


@pytest.mark.parametrize("kind", list(INDEXES))
@pytest.mark.parametrize("key_dtype,batch_dtype", LOSSLESS, ids=str)
def test_lossless_query_dtypes_are_answered_as_converted(device, gen, kind, key_dtype, batch_dtype):
    """int32 queries on an int64 index, float32 on float64 and the like: every lookup form answers the batch
    exactly as the batch converted to the key dtype (which the reference answers)."""
    small = torch.randint(-100, 100, (300,), generator=gen)
    keys = (small.abs() if batch_dtype == torch.uint8 else small).to(key_dtype).to(device)
    index = INDEXES[kind](keys)
    q = torch.randint(-120, 120, (200,), generator=gen).to(batch_dtype)
    q = (q.abs() if batch_dtype == torch.uint8 else q).to(device)
    lo, hi = q, (q + 3).to(batch_dtype)
    values = torch.arange(keys.numel(), dtype=torch.float64, device=device)
    converted = [t.to(key_dtype) for t in (q, lo, hi)]
    assert _answers(index, q, lo, hi, values) == _answers(index, *converted, values)
    ref = Reference(keys, str(key_dtype).removeprefix("torch."))
    check_lookup(index.lookup(q), *ref.points(converted[0])[:2])
    check_matches(index.lookup_all(q), ref.points(converted[0])[2])
    np.testing.assert_array_equal(index.range_count(lo, hi).cpu().numpy(), ref.ranges(converted[1], converted[2])[1])


@pytest.mark.parametrize("kind", list(INDEXES))
@pytest.mark.parametrize("key_dtype,batch_dtype", REFUSED, ids=str)
def test_lossy_query_dtypes_are_refused_naming_both(device, kind, key_dtype, batch_dtype):
    index = INDEXES[kind](torch.tensor([1, 2, 3], device=device).to(key_dtype))
    q = torch.tensor([2], device=device).to(batch_dtype)
    both = f"queries has dtype {batch_dtype} but the index holds .*{key_dtype}"
    for call in (lambda: index.lookup(q), lambda: index.lookup_rows(q, 0), lambda: index.lookup_all_capped(q, 4),
                 lambda: index.aggregate(q, torch.ones(3, device=device))):
        with pytest.raises(TypeError, match=both):
            call()
    with pytest.raises(TypeError, match=f"lo has dtype {batch_dtype} but the index holds .*{key_dtype}"):
        index.range_lookup(q, q)
    assert index.lookup(torch.tensor([2], device=device).to(key_dtype)).first_row.tolist() == [1]


def test_protocols_and_flags(device):
    """The classes implement the contract (torch_rtindex.Index / UpdatableIndex); ``capturable`` is a flag, not
    a method that is always truthy."""
    keys = torch.tensor([3, 1, 2], device=device)
    for kind, make in INDEXES.items():
        index = make(keys)
        assert isinstance(index, Index), kind
        assert isinstance(index, UpdatableIndex) == (kind == "updatable"), kind
        assert index.capturable is True or index.capturable is False
    assert RXIndex(keys).capturable == (device.type == "cpu")  # on CUDA every RX lookup is an OptiX launch


def test_constructor_options_are_checked_where_given(device):
    keys = torch.tensor([1, 2, 3], device=device)
    for make in INDEXES.values():
        with pytest.raises(TypeError, match="scene must be a torch_rtindex.SceneConfig"):
            make(keys, scene=[23, 23, 18, 0, 0])
        with pytest.raises(ValueError, match="key_type must be one of"):
            make(keys, key_type="int128")
    with pytest.raises(TypeError, match="allow_update must be True or False"):
        RXIndex(keys, allow_update="no")
    with pytest.raises(ValueError, match="max_range_rays"):
        RXIndex(keys, max_range_rays=2**31)
    for option, bad in (("layout", "nodes"), ("layout", "rows"), ("backend", "rtcores"), ("bucket_search", "hash"),
                        ("representation", "fancy"), ("backend", None)):
        with pytest.raises(ValueError, match=f"{option} must be one of .*got {bad!r}"):
            CgRXIndex(keys, **{option: bad})
    for option, bad, error in (("node_size", 3, ValueError), ("node_size", 8192, ValueError),
                               ("growth", 0.5, ValueError), ("growth", "x", TypeError),
                               ("max_node_reads", 0.9, ValueError), ("backend", "rtcores", ValueError)):
        with pytest.raises(error, match=option):
            UpdatableCgRXIndex(keys, **{option: bad})


def test_enum_codes_are_the_extensions():
    """The extension exports its C++ enums (names and values from their definitions); the Python codes are
    derived from torch_rtindex.index's option names and checked against them at import, naming what differs."""
    from typing import get_args

    from torch_rtindex import _config, index

    native = dict(part.split(":", 1) for part in torch.ops.rtindex_internal.config_schema().split(";"))
    exported = {name: dict(p.split("=") for p in native[name].split(",")) for name in
                ("key_type", "layout", "backend", "bucket_search", "representation")}
    assert exported["key_type"] == {k: str(i) for i, k in enumerate(get_args(index.KeyType))}
    assert list(exported["layout"]) == [*get_args(index.PairsLayout), "nodes"]
    assert list(exported["backend"]) == list(get_args(index.SearchBackend)) == list(_config.BACKEND_CODES)
    assert list(exported["bucket_search"]) == list(get_args(index.BucketSearch))
    assert list(exported["representation"]) == list(get_args(index.Representation))
    _config.check_against_extension()
    swapped = _config._schema().replace("backend:radix=0,optix=1,binary_search=2",
                                        "backend:radix=0,binary_search=1,optix=2")
    with pytest.raises(RuntimeError, match="C\\+\\+ 'backend:radix=0,optix=1,binary_search=2' vs Python "
                                           "'backend:radix=0,binary_search=1,optix=2'"):
        _config.check_against_extension(swapped)


def test_build_settings_cannot_be_changed_afterwards(device):
    """An attribute the build packed into the lookups' configuration would lie if it could be reassigned: it is
    refused, naming the way to get that setting; the settings meant to change stay assignable."""
    keys = torch.tensor([1, 2, 3], device=device)
    for index, name, value in ((RXIndex(keys), "max_range_rays", 4), (RXIndex(keys), "scene", SceneConfig()),
                               (CgRXIndex(keys), "backend", "binary_search"), (CgRXIndex(keys), "bucket_search", "linear"),
                               (CgRXIndex(keys), "key_type", "uint64"), (UpdatableCgRXIndex(keys), "node_size", 8),
                               (UpdatableCgRXIndex(keys), "device", torch.device("meta"))):
        before = getattr(index, name)
        with pytest.raises(AttributeError, match=f"{name} is fixed when the index is built"):
            setattr(index, name, value)
        assert getattr(index, name) == before and index.lookup(keys).first_row.tolist() == [0, 1, 2]
    index = CgRXIndex(keys)
    index.sort_queries = True
    assert index.lookup(keys).first_row.tolist() == [0, 1, 2]
