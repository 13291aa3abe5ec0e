"""The bound eager path of point lookups (csrc/bound_lookups.cpp): ``lookup`` and ``lookup_rows`` of a plain batch
call the operator's typed dispatcher entry with the index's tensors held in C++.

Checked here: its answers equal the reference and the torch.ops path's for every key type and index kind over the
full 64-bit range; batches it does not take (strided, 2-D, another dtype or device) still get the checked path's errors,
and tensor subclasses its answers; __torch_function__ and __torch_dispatch__ modes see the operator; a rebuild,
an update or a change of ``sort_queries`` rebinds it; and IdToRow's own use of it keeps its miss policies and notices
IDs changed in place.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from keysets import int64_keys, keys_of_type, point_queries
from reference import Reference, check_lookup
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from torch_rtindex import CgRXIndex, IdToRow, RXIndex, UpdatableCgRXIndex

KEY_DTYPES = {"int64": torch.int64, "int32": torch.int32, "uint64": torch.uint64, "float32": torch.float32,
              "float64": torch.float64}


def index_kinds(keys: torch.Tensor) -> list:
    out = [CgRXIndex(keys, backend="radix"), CgRXIndex(keys, backend="binary_search"), UpdatableCgRXIndex(keys, backend="radix")]
    if keys.device.type == "cpu":  # on CUDA RX traces rays, which refuse capture: no bound path
        out.append(RXIndex(keys))
    return out


def via_ops(index, q: torch.Tensor, miss_row: int | None = None):
    """The same call through torch.ops (the operator the bound call dispatches to)."""
    if miss_row is None:
        return index._forms["lookup"](*index._lead, index._cfg, q, None)
    return index._forms["lookup_rows"](*index._lead, index._cfg, q, None, miss_row)


@pytest.mark.parametrize("key_type", list(KEY_DTYPES))
def test_bound_answers_equal_the_reference_and_the_operator(device, gen, key_type):
    keys = keys_of_type(key_type, 3000, gen)
    if key_type == "uint64":
        keys = keys.view(torch.uint64)
    keys = keys.to(device)
    ref = Reference(keys, key_type)
    q = point_queries(keys.cpu().view(torch.int64) if key_type == "uint64" else keys.cpu(), 2000, gen)
    q = (q.view(torch.uint64) if key_type == "uint64" else q).to(device)
    first, count, _ = ref.points(q)
    for index in index_kinds(keys):
        assert index._bound is not None, type(index).__name__
        got = index.lookup(q)
        check_lookup(got, first, count)
        want = via_ops(index, q)
        assert torch.equal(got.first_row, want[0]) and torch.equal(got.count, want[1])
        rows = index.lookup_rows(q, -5)
        np.testing.assert_array_equal(rows.cpu().numpy(), np.where(count > 0, first, -5))
        assert torch.equal(rows, via_ops(index, q, -5))
        empty = index.lookup(q[:0])
        assert empty.first_row.shape == (0,) and empty.count.shape == (0,)


def test_batches_the_bound_call_hands_back(device, gen):
    """Strided, 2-D, wrong-dtype and other-device batches get the checked path's errors; a tensor subclass is
answered through torch.ops (its __torch_function__ must see the call)."""
    keys = int64_keys("duplicates", 2000, gen).to(device)
    ref = Reference(keys, "int64")
    index = CgRXIndex(keys)
    q = point_queries(keys.cpu(), 1000, gen).to(device)
    strided = q[::2]
    with pytest.raises(ValueError, match="contiguous"):
        index.lookup(strided)
    with pytest.raises(ValueError, match="contiguous"):
        index.lookup_rows(strided, 0)

    class Sub(torch.Tensor):
        pass

    check_lookup(index.lookup(q.as_subclass(Sub)), *ref.points(q)[:2])
    with pytest.raises(ValueError, match="1-D"):
        index.lookup(q[:16].view(4, 4))
    # Another dtype: the checked path converts what converts exactly and refuses the rest.
    narrow = q.to(torch.int32)
    check_lookup(index.lookup(narrow), *ref.points(narrow.to(torch.int64))[:2])
    np.testing.assert_array_equal(index.lookup_rows(narrow, -2).cpu().numpy(),
                                  np.where(ref.points(narrow.to(torch.int64))[1] > 0, ref.points(narrow.to(torch.int64))[0], -2))
    with pytest.raises(TypeError, match="dtype torch.float64 but the index holds int64"):
        index.lookup_rows(q.to(torch.float64), 0)
    with pytest.raises(TypeError, match="dtype torch.int64 but the index holds int32"):
        CgRXIndex(narrow).lookup(q)
    other = "cpu" if device.type == "cuda" else "meta"
    with pytest.raises((ValueError, RuntimeError)):
        index.lookup(q.to(other))
    for bad in (2**63, -(2**63) - 1):
        with pytest.raises(ValueError, match="miss_row must fit in int64"):
            index.lookup_rows(q, bad)
    with pytest.raises(ValueError, match="default_row"):
        IdToRow(keys, default_row=2**63)
    check_lookup(index.lookup(q), *ref.points(q)[:2])  # and the index still answers


def test_modes_see_the_operator(device, gen):
    keys = int64_keys("uniform", 500, gen).to(device)
    index = CgRXIndex(keys)
    q = keys[:10].clone()
    seen = []

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    class Dispatches(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    for mode in (Functions, Dispatches):
        seen.clear()
        with mode():
            got = index.lookup(q)
            rows = index.lookup_rows(q, -1)
        assert seen.count("rtindex.cgrx_lookup.default") == 1, (mode.__name__, seen)
        assert seen.count("rtindex.cgrx_lookup_rows.default") == 1, (mode.__name__, seen)
        assert got.count.tolist() == [1] * 10 and torch.equal(rows, got.first_row)


def test_rebuilds_updates_and_query_sort_rebind(device, gen):
    keys = int64_keys("uniform", 1000, gen).to(device)
    index = UpdatableCgRXIndex(keys, backend="radix", node_size=8)
    edges = torch.tensor([17, -(2**63), 2**63 - 1, 17], dtype=torch.int64, device=device)
    fresh = torch.cat([edges, int64_keys("uniform", 3000, gen).to(device)])
    index.insert(fresh)  # rows 1000...: the reference's positions in the concatenation; the node space grows
    all_keys = torch.cat([keys, fresh])
    check_lookup(index.lookup(all_keys), *Reference(all_keys, "int64").points(all_keys)[:2])
    np.testing.assert_array_equal(index.lookup_rows(fresh, -1).cpu().numpy(), Reference(all_keys, "int64").points(fresh)[0])
    index.sort_queries = True
    assert index._bound is None
    check_lookup(index.lookup(all_keys), *Reference(all_keys, "int64").points(all_keys)[:2])
    index.sort_queries = None
    assert index._bound is not None

    cg = CgRXIndex(keys)
    cg.rebuild(keys[:10])
    q = keys[:20].clone()
    check_lookup(cg.lookup(q), *Reference(keys[:10], "int64").points(q)[:2])
    np.testing.assert_array_equal(cg.lookup_rows(q, -1).cpu().numpy(), Reference(keys[:10], "int64").points(q)[0])


@pytest.mark.parametrize("miss", ["default", "minus_one", "error"])
def test_id_to_row_bound_path(device, gen, miss):
    ids = int64_keys("uniform", 800, gen).to(device)
    m = IdToRow(ids, miss=miss, default_row=3)
    ref = Reference(ids, "int64")
    q = ids[torch.randperm(ids.numel(), generator=gen)[:100].to(device)]
    first, _, _ = ref.points(q)
    np.testing.assert_array_equal(m(q).cpu().numpy(), first)
    absent = torch.tensor([12345], dtype=torch.int64, device=device)
    absent = absent if not bool((ids == 12345).any()) else absent + 1
    if miss == "error":
        with pytest.raises(KeyError):
            m(absent)
    else:
        assert m(absent).tolist() == [3 if miss == "default" else -1]
    ids[0] = 12345 + 7  # in place: the next call re-indexes
    assert m(ids[:1].clone()).tolist() == [0]
    m.default_row = 5  # attributes are read per call
    if miss == "default":
        assert m(absent).tolist() == [5]
    grid = q[:12].view(3, 4)  # not 1-D: the checked path, same answers in the IDs' shape
    assert m(grid).shape == (3, 4)
