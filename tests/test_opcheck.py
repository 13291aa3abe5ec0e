"""torch.library.opcheck on every operator that takes tensors (RX, cgRX, updatable cgRX), with realistic arguments.

opcheck runs four checks per call: test_schema (the op mutates and aliases only what its schema declares),
test_autograd_registration, test_faketensor (the fake kernel in torch_rtindex/_fake.py gives the real
kernel's output shapes, dtypes and devices) and test_aot_dispatch_dynamic (the op traced by AOTAutograd with
dynamic shapes gives the same values as eager). Each test also checks the op's eager answer against an
independent reference, so the arguments are the realistic ones the API passes. Operators with data-dependent
output sizes (the CSR lookups, cgrx_build, cgrx_nodes_load, cgrx_nodes_export, the builds of structures) pass
all four checks through unbacked sizes in their fake kernels; the mutating cgrx_nodes_apply (declared
``Tensor(a!) nodes``) passes them too, test_schema checking that it mutates nothing else.

Where a check cannot apply it is left out, per device, and the reason is written next to it:

- CUDA rx_build / cgrx_build_scene: test_aot_dispatch_dynamic compares two builds' bytes, and the OptiX
  structure holds its own device address (and a traversable handle), so two correct builds never compare equal.
- CPU cgrx_build_scene: the triangle list marks inactive slots with NaN corners, and test_aot_dispatch_dynamic
  compares without equal_nan; the same comparison is made here with NaN equal to NaN (aot_eager, dynamic).
- CUDA rx_lookup / rx_lookup_csr / rx_lookup_csr_capped / rx_aggregate: every opcheck check runs the op on
  *clones* of the tensor arguments, and a cloned OptiX structure has a stale address, which the kernels answer
  by tracing nothing (all misses, by design). The checks still run (schema, shapes, dtypes, eager vs traced
  agree), but their value comparison is between two all-miss answers; the values on the real structure are
  checked here against the CPU operator instead.
- CUDA cgrx_* lookups with backend 1 (OptiX): the same cloned-scene situation, where the ray search on a
  stale handle is not a defined answer; test_aot_dispatch_dynamic (the value comparison) is left out and the
  values on the real scene are compared with the CPU operator.
- CUDA rx_refit: the op refuses a copied structure ("moved or copied; rebuild it"), so opcheck's copies make
  every check fail for that reason alone; the schema check (SchemaCheckMode) and the fake kernel
  (FakeTensorMode) are run directly on the real tensors instead.
- scene_* and cgrx_scene_rays operators have CPU kernels only (they feed the Embree checks); they are checked
  on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo
from keysets import ROW, int64_keys, keys_of_type, point_queries, range_queries
from reference import Reference, check_capped, check_lookup, check_matches

from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from torch_rtindex import UpdatableCgRXIndex
from torch_rtindex._config import BACKEND_CODES, LAYOUT_CODES, cgrx_config, rx_config
from torch_rtindex._keys import KEY_TYPES
from torch_rtindex.results import Lookup, Matches

ops = torch.ops.rtindex
SCENE = [23, 23, 18, 0, 0]
ALL_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
CUDA_STRUCTURE_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")  # see the docstring


def opcheck(op, args, test_utils=ALL_UTILS) -> None:
    result = torch.library.opcheck(op, args, test_utils=test_utils)
    assert result == {name: "SUCCESS" for name in test_utils}, result


@pytest.fixture
def data(gen):
    """Keys with duplicates (heavy runs and singles), point queries (half hits) and ranges across scene rows."""
    keys = torch.cat([int64_keys("duplicates", 600, gen), int64_keys("uniform", 300, gen)])
    queries = point_queries(keys, 400, gen)
    lo, hi = range_queries(keys, 200, gen, 3 * ROW)
    values = torch.randn(keys.numel(), generator=gen, dtype=torch.float64)
    return keys, queries, lo, hi, values


def ordered(t: torch.Tensor, key_type: str = "int64") -> torch.Tensor:
    return ops.map_keys(t, KEY_TYPES[key_type])


@pytest.mark.parametrize("key_type", ["int64", "uint64", "uint64_in_int64", "int32", "float32", "float64"])
def test_map_keys_and_ranges(device, gen, key_type):
    storage_only = key_type == "uint64_in_int64"  # unsigned values in an int64 tensor
    key_type = "uint64" if storage_only else key_type
    keys = keys_of_type(key_type, 500, gen)
    if key_type == "uint64" and not storage_only:
        if not hasattr(torch, "uint64"):
            pytest.skip("no torch.uint64 in this PyTorch")
        keys = keys.view(torch.uint64)
    lo, hi = keys[:-1].contiguous(), keys[1:].contiguous()
    kt = KEY_TYPES[key_type]
    opcheck(ops.map_keys.default, (keys.to(device), kt))
    opcheck(ops.map_ranges.default, (lo.to(device), hi.to(device), kt))
    # Reference: the mapping is monotone in the key type's own order (ties only for equal values, -0.0 == 0.0).
    mapped = ops.map_keys(keys.to(device), kt).cpu().numpy().view(np.uint64)
    native_uint64 = keys.dtype == getattr(torch, "uint64", None)
    src = keys.view(torch.int64).numpy().view(np.uint64) if native_uint64 or storage_only else keys.numpy()
    order = np.argsort(src, kind="stable")
    s = mapped[order]
    assert np.all(s[1:] >= s[:-1])
    np.testing.assert_array_equal(s[1:] == s[:-1], src[order][1:] == src[order][:-1])


@pytest.mark.parametrize("allow_update", [False, True])
def test_rx_build(device, data, allow_update):
    keys = ordered(data[0]).to(device)
    utils = ALL_UTILS if device.type == "cpu" else CUDA_STRUCTURE_UTILS
    opcheck(ops.rx_build.default, (keys, SCENE, allow_update), utils)
    opcheck(ops.rx_build.default, (keys[:0], SCENE, allow_update), utils)  # the empty index
    if device.type == "cpu":  # the CPU structure is the keys sorted with their row IDs
        s = ops.rx_build(keys, SCENE, allow_update)
        order = np.argsort(keys.numpy().view(np.uint64), kind="stable")
        np.testing.assert_array_equal(s[0].numpy(), keys.numpy()[order])
        np.testing.assert_array_equal(s[1].numpy(), order)


def lookup_args(device, data, is_range: bool):
    keys, queries, lo, hi, _ = data
    k = ordered(keys).to(device)
    structure = ops.rx_build(k, SCENE, False)
    # The queries in their own dtype (int64, key_type 0): the operators map them in their kernels.
    qlo, qhi = (lo.to(device), hi.to(device)) if is_range else (queries.to(device), None)
    return (structure, k, rx_config("int64", False, 64, SCENE), qlo, qhi)


def on_cpu(args):
    """The same call on the CPU: for a CUDA structure, a CPU one built from the same keys."""
    structure, k, config, lo, hi, *rest = args
    k = k.cpu()
    return (ops.rx_build(k, SCENE, False), k, config, lo.cpu(), None if hi is None else hi.cpu(), *rest)


@pytest.mark.parametrize("is_range", [False, True])
def test_rx_lookup(device, data, is_range):
    args = lookup_args(device, data, is_range)
    opcheck(ops.rx_lookup.default, args)
    ref = Reference(data[0], "int64")
    first, count, _ = ref.ranges(data[2], data[3]) if is_range else ref.points(data[1])
    check_lookup(Lookup(*ops.rx_lookup(*args)), first, count)
    # an empty batch of queries
    opcheck(ops.rx_lookup.default, (*args[:3], args[3][:0], None if args[4] is None else args[4][:0], *args[5:]))
    check_lookup_rows(ops.rx_lookup_rows, args, first)


def check_lookup_rows(op, args, first) -> None:
    """The one-output form: the first rows, the miss row where a query has none (also an empty index)."""
    for miss_row in (-1, 0, 7, 2**62):
        opcheck(op.default, (*args, miss_row))
        np.testing.assert_array_equal(op(*args, miss_row).cpu().numpy(), np.where(first < 0, miss_row, first))


@pytest.mark.parametrize("is_range", [False, True])
def test_rx_lookup_csr(device, data, is_range):
    args = lookup_args(device, data, is_range)
    opcheck(ops.rx_lookup_csr.default, args)
    ref = Reference(data[0], "int64")
    _, _, rows = ref.ranges(data[2], data[3]) if is_range else ref.points(data[1])
    check_matches(Matches(*ops.rx_lookup_csr(*args)), rows)
    # all misses: an empty rows output
    misses = torch.full_like(args[3], 12345)
    opcheck(ops.rx_lookup_csr.default, (*args[:3], misses, None, *args[5:]))


@pytest.mark.parametrize("is_range", [False, True])
def test_rx_lookup_csr_capped(device, data, is_range):
    args = lookup_args(device, data, is_range)
    full = ops.rx_lookup_csr(*args)
    total = full[1].numel()
    for capacity in (0, 1, total // 3, total, total + 17):  # empty, cut inside queries, exact, with room to spare
        opcheck(ops.rx_lookup_csr_capped.default, (*args, capacity))
        check_capped(ops.rx_lookup_csr_capped(*args, capacity), full, capacity, exact_prefix=False)
    # all misses, and an empty batch: nothing written, total 0
    misses = torch.full_like(args[3], 12345)
    opcheck(ops.rx_lookup_csr_capped.default, (*args[:3], misses, None, *args[5:], 8))
    empty = (*args[:3], args[3][:0], None if args[4] is None else args[4][:0], *args[5:], 8)
    opcheck(ops.rx_lookup_csr_capped.default, empty)
    offsets, rows, tot = ops.rx_lookup_csr_capped(*empty)
    assert offsets.tolist() == [0] and rows.tolist() == [-1] * 8 and int(tot) == 0


@pytest.mark.parametrize("values_dtype", [torch.float64, torch.float32, torch.int64, torch.int32])
def test_rx_aggregate(device, data, values_dtype):
    for is_range in (False, True):
        args = lookup_args(device, data, is_range)
        values = (data[4] * 100).to(values_dtype).to(device)
        opcheck(ops.rx_aggregate.default, (*args, values))
        ref = Reference(data[0], "int64")
        _, count, rows = ref.ranges(data[2], data[3]) if is_range else ref.points(data[1])
        got_count, got_sum = ops.rx_aggregate(*args, values)
        np.testing.assert_array_equal(got_count.cpu().numpy(), count)
        np.testing.assert_allclose(got_sum.cpu().numpy(), Reference.sums(rows, values), rtol=1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compares CUDA with CPU")
def test_cuda_values_match_cpu_operators(data):
    """The CUDA lookups on the real (uncloned) structure give exactly the CPU operators' answers."""
    for is_range in (False, True):
        args = lookup_args(torch.device("cuda"), data, is_range)
        cpu_args = on_cpu(args)
        for got, want in zip(ops.rx_lookup(*args), ops.rx_lookup(*cpu_args)):
            assert torch.equal(got.cpu(), want)
        for got, want in zip(ops.rx_lookup_csr(*args), ops.rx_lookup_csr(*cpu_args)):
            assert torch.equal(got.cpu(), want)
        big = ops.rx_lookup_csr(*cpu_args)[1].numel() + 5  # with room: no cut, so the answers are identical
        for got, want in zip(ops.rx_lookup_csr_capped(*args, big), ops.rx_lookup_csr_capped(*cpu_args, big)):
            assert torch.equal(got.cpu(), want)


def test_rx_refit(device, data):
    keys = ordered(data[0]).to(device)
    moved = ordered(data[0] + 7).to(device)
    structure = ops.rx_build(keys, SCENE, True)
    if device.type == "cpu":
        opcheck(ops.rx_refit.default, (structure, moved, SCENE))
    else:  # opcheck would hand refit a copied structure, which it refuses (see the docstring)
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch._subclasses.schema_check_mode import SchemaCheckMode

        with SchemaCheckMode():  # refit mutates only `structure`, as its schema's (a!) says
            ops.rx_refit(structure, moved, SCENE)
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake = [mode.from_tensor(t) for t in (structure, moved)]
            assert ops.rx_refit(fake[0], fake[1], SCENE) is None
        structure = ops.rx_build(keys, SCENE, True)
    ops.rx_refit(structure, moved, SCENE)
    # After the refit the structure answers for the moved keys.
    q = ordered(data[1] + 7).to(device)  # ordered keys: key_type uint64 reads them as they are
    first, count, _ = Reference(data[0] + 7, "int64").points(data[1] + 7)
    check_lookup(Lookup(*ops.rx_lookup(structure, moved, rx_config("uint64", False, 64, SCENE), q, None)), first, count)


def test_scene_operators(data):
    """CPU only: these operators exist to hand the scene to Embree."""
    keys, queries, lo, hi, _ = data
    k = ordered(keys)
    opcheck(torch.ops.rtindex_internal.scene_triangles.default, (k, SCENE))
    opcheck(torch.ops.rtindex_internal.scene_point_rays.default, (ordered(queries), SCENE))
    qlo, qhi = ops.map_ranges(lo, hi, 0)
    opcheck(torch.ops.rtindex_internal.scene_range_rays.default, (qlo, qhi, SCENE, 64))
    opcheck(torch.ops.rtindex_internal.scene_range_rays.default, (qlo, qhi, SCENE, 1))  # most ranges too wide: few rays
    # Reference: a triangle is centred on its key's (x, y, z) cell; a range fires one ray per segment it touches
    # (aligned blocks of 2^21 keys, inside one row of 2^23; ranges of more than max_range_rays segments fire none).
    tris = torch.ops.rtindex_internal.scene_triangles(k, SCENE).double().numpy()
    u = k.numpy().view(np.uint64)
    centre = np.stack([(u & (2**23 - 1)).astype(np.float64), ((u >> 23) & (2**23 - 1)).astype(np.float64),
                       (u >> 46).astype(np.float64)], axis=1)
    np.testing.assert_allclose(tris.mean(axis=1), centre + [0, -1 / 6, 0], rtol=0, atol=1e-9)
    owner, rays = torch.ops.rtindex_internal.scene_range_rays(qlo, qhi, SCENE, 64)
    ul, uh = qlo.numpy().view(np.uint64), qhi.numpy().view(np.uint64)
    segments = np.where(ul <= uh, (uh >> np.uint64(21)).astype(np.int64) - (ul >> np.uint64(21)).astype(np.int64) + 1, 0)
    segments = np.where(segments > 64, 0, segments)
    np.testing.assert_array_equal(np.bincount(owner.numpy(), minlength=len(ul)), segments)
    assert rays.shape == (owner.numel(), 8)


# ---------------------------------------------------------------------------------------------------- cgRX
CGRX_SCENE = [23, 23, 18, 15, 25]
CGRX_BACKENDS = BACKEND_CODES
LAYOUT_NAMES = {code: name for name, code in LAYOUT_CODES.items()}
BACKEND_NAMES = {code: name for name, code in BACKEND_CODES.items()}
BUCKET = 8


def cgrx_structure(device, keys, backend: int, layout: int = 0):
    """(pairs, reps, table, scene) as CgRXIndex builds them; the OptiX scene only for backend 1 on CUDA."""
    k = ordered(keys).to(device)
    pairs, reps, table = ops.cgrx_build(k, BUCKET, layout)
    if backend == 1 and device.type == "cuda":
        scene = ops.cgrx_build_scene(reps, reps.numel(), CGRX_SCENE, 1, pairs, BUCKET, layout)
    else:
        scene = torch.empty(0, dtype=torch.uint8, device=device)
    return pairs, reps, table, scene


def cgrx_lookup_args(device, data, backend: int, is_range: bool, layout: int = 0):
    keys, queries, lo, hi, _ = data
    qlo, qhi = (lo.to(device), hi.to(device)) if is_range else (queries.to(device), None)
    # key_type int64: the kernels map the queries
    config = cgrx_config("int64", LAYOUT_NAMES[layout], BUCKET, "binary", BACKEND_NAMES[backend], CGRX_SCENE)
    return (*cgrx_structure(device, keys, backend, layout), config, qlo, qhi)


def cgrx_utils(device, backend: int):
    return CUDA_STRUCTURE_UTILS if device.type == "cuda" and backend == 1 else ALL_UTILS  # see the docstring


def check_key_ordered_matches(result, rows, keys):
    """cgRX CSR rows are in (key, row ID) order: per query the reference's rows as a set, in that order."""
    offsets, got = result[0].cpu().numpy(), result[1].cpu().numpy()
    k = ordered(keys).numpy().view(np.uint64)
    assert len(offsets) == len(rows) + 1 and offsets[-1] == len(got)
    for i, r in enumerate(rows):
        seg = got[offsets[i] : offsets[i + 1]]
        np.testing.assert_array_equal(np.sort(seg), r, err_msg=f"query {i}")
        np.testing.assert_array_equal(np.lexsort((seg, k[seg])), np.arange(len(seg)), err_msg=f"query {i}")


@pytest.mark.parametrize("layout", [0, 1, 2])
def test_cgrx_build(device, data, layout):
    k = ordered(data[0]).to(device)
    opcheck(ops.cgrx_build.default, (k, BUCKET, layout))
    opcheck(ops.cgrx_build.default, (k[:0], BUCKET, layout))  # the empty index
    # Reference: the representatives are the last key of every bucket of the sorted keys.
    _, reps, table = ops.cgrx_build(k, BUCKET, layout)
    u = np.sort(k.cpu().numpy().view(np.uint64))
    want = u[np.minimum(np.arange(1, -(-u.size // BUCKET) + 1) * BUCKET, u.size) - 1]
    np.testing.assert_array_equal(reps.cpu().numpy().view(np.uint64), want)
    assert table.dtype == torch.int32 and table.numel() >= 2


@pytest.mark.parametrize("representation", [0, 1])
def test_cgrx_build_scene(device, data, representation):
    k = ordered(data[0]).to(device)
    pairs, reps, _ = ops.cgrx_build(k, BUCKET, 0)
    args = (reps, reps.numel(), CGRX_SCENE, representation, pairs, BUCKET, 0)
    opcheck(ops.cgrx_build_scene.default, args, CUDA_STRUCTURE_UTILS)  # see the docstring for both devices
    if device.type == "cpu":  # the CPU scene is the triangle list (its geometry: test_cgrx_scene_embree.py)
        tris = ops.cgrx_build_scene(*args)
        assert tris.dim() == 3 and tris.shape[1:] == (3, 3) and tris.shape[0] >= reps.numel()
        # test_aot_dispatch_dynamic's comparison, with NaN equal to NaN: traced (fake sizes) and eager agree.
        traced = torch.compile(lambda *a: ops.cgrx_build_scene(*a), backend="aot_eager", fullgraph=True, dynamic=True)
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
            torch.testing.assert_close(traced(*args), tris, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("backend", list(CGRX_BACKENDS))
@pytest.mark.parametrize("is_range", [False, True])
def test_cgrx_lookups(device, data, backend, is_range):
    """cgrx_lookup, cgrx_lookup_csr, cgrx_lookup_csr_capped and cgrx_aggregate, each against the reference."""
    b = CGRX_BACKENDS[backend]
    args = cgrx_lookup_args(device, data, b, is_range)
    utils = cgrx_utils(device, b)
    ref = Reference(data[0], "int64")
    first, count, rows = ref.ranges(data[2], data[3]) if is_range else ref.points(data[1])

    opcheck(ops.cgrx_lookup.default, args, utils)
    check_lookup(Lookup(*ops.cgrx_lookup(*args)), first, count)
    for miss_row in (-1, 3):
        opcheck(ops.cgrx_lookup_rows.default, (*args, miss_row), utils)
        np.testing.assert_array_equal(ops.cgrx_lookup_rows(*args, miss_row).cpu().numpy(), np.where(first < 0, miss_row, first))

    opcheck(ops.cgrx_lookup_csr.default, args, utils)
    full = ops.cgrx_lookup_csr(*args)
    check_key_ordered_matches(full, rows, data[0])

    total = full[1].numel()
    for capacity in (0, total // 2, total, total + 9):
        opcheck(ops.cgrx_lookup_csr_capped.default, (*args, capacity), utils)
        # cgRX fills in its output order, so a cut answer is exactly the full answer's first entries
        check_capped(ops.cgrx_lookup_csr_capped(*args, capacity), full, capacity, exact_prefix=True)

    values = (data[4] * 100).to(device)
    opcheck(ops.cgrx_aggregate.default, (*args, values), utils)
    got_count, got_sum = ops.cgrx_aggregate(*args, values)
    np.testing.assert_array_equal(got_count.cpu().numpy(), count)
    np.testing.assert_allclose(got_sum.cpu().numpy(), Reference.sums(rows, values), rtol=1e-9)

    if is_range:  # the count from the positions of each range's ends
        opcheck(ops.cgrx_range_count.default, args, utils)
        np.testing.assert_array_equal(ops.cgrx_range_count(*args).cpu().numpy(), count)
    else:
        with pytest.raises(RuntimeError, match="hi is required"):
            ops.cgrx_range_count(*args)

    # an empty batch of queries
    empty = (*args[:5], args[5][:0], None if args[6] is None else args[6][:0], *args[7:])
    opcheck(ops.cgrx_lookup.default, empty, utils)
    opcheck(ops.cgrx_lookup_csr_capped.default, (*empty, 4), utils)
    if is_range:
        opcheck(ops.cgrx_range_count.default, empty, utils)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compares CUDA with CPU")
@pytest.mark.parametrize("backend", list(CGRX_BACKENDS))
def test_cgrx_cuda_values_match_cpu_operators(data, backend):
    """The CUDA cgRX lookups on the real (uncloned) structures give exactly the CPU operators' answers."""
    b = CGRX_BACKENDS[backend]
    for is_range in (False, True):
        args = cgrx_lookup_args(torch.device("cuda"), data, b, is_range)
        cpu_args = cgrx_lookup_args(torch.device("cpu"), data, b, is_range)
        for op, extra in ((ops.cgrx_lookup, ()), (ops.cgrx_lookup_csr, ()), (ops.cgrx_lookup_csr_capped, (50,))):
            for got, want in zip(op(*args, *extra), op(*cpu_args, *extra)):
                assert torch.equal(got.cpu(), want), (op, is_range)
        if is_range:
            assert torch.equal(ops.cgrx_range_count(*args).cpu(), ops.cgrx_range_count(*cpu_args))


def test_cgrx_scene_rays(data):
    """CPU only (the Embree check's operator): two steps of the ray search, from the start and from a state."""
    keys, queries, *_ = data
    k = ordered(keys)
    _, reps, _ = ops.cgrx_build(k, BUCKET, 0)
    q = ordered(queries)
    for representation in (0, 1):
        args = (q, CGRX_SCENE, reps, reps.numel(), representation, None, None)
        opcheck(torch.ops.rtindex_internal.cgrx_scene_rays.default, args)
        state, rays = torch.ops.rtindex_internal.cgrx_scene_rays(*args)
        assert state.shape == (q.numel(), 2) and rays.shape == (q.numel(), 8)
        misses = torch.stack([torch.full_like(q, -1), torch.zeros_like(q)], dim=1)  # every first ray missed
        opcheck(torch.ops.rtindex_internal.cgrx_scene_rays.default, (q, CGRX_SCENE, reps, reps.numel(), representation, state, misses))


class RecordRtindexCalls(TorchDispatchMode):
    """Records every rtindex operator call with copies of its arguments as they were before the call (a
    mutating operator's inputs, not its outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch._ops.OpOverload, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "rtindex":
            assert not kwargs
            self.calls.append((func, pytree.tree_map_only(torch.Tensor, lambda t: t.clone(), args)))
        return func(*args, **kwargs)


def test_cgrx_update_operators(device, gen):
    """cgrx_nodes_load, cgrx_find_buckets, cgrx_nodes_plan, cgrx_nodes_apply and cgrx_nodes_export, and the
    lookups on the node layout (layout 3), with the arguments UpdatableCgRXIndex really passes them (recorded
    from a build, two update batches, lookups and a compaction)."""
    from collections import Counter

    keys = int64_keys("duplicates", 400, gen)
    ins = torch.cat([keys[:30], torch.randint(-(2**63), 2**63 - 1, (200,), generator=gen)])  # forces node growth
    with RecordRtindexCalls() as rec:
        index = UpdatableCgRXIndex(keys.to(device), node_size=8, backend="radix")  # no OptiX scene to opcheck
        index.update(insert_keys=ins.to(device), delete_keys=keys[:5].to(device), delete_rows=torch.arange(5, device=device))
        index.update(delete_keys=keys[5:9].to(device))  # by key: every pair of those keys
        q = ins[:50].to(device)
        index.lookup(q), index.range(q, q + 2**40), index.lookup_all_capped(q, 40)  # lookups on the node chains
        index.range_count(q, q + 2**40)  # counted by visiting: node chains have no global positions
        index.aggregate(q, torch.arange(index._next_row, dtype=torch.float64, device=device))
        index.rebuild()
    names = [f._opname for f, _ in rec.calls]
    for name in ("cgrx_nodes_load", "cgrx_find_buckets", "cgrx_nodes_plan", "cgrx_nodes_apply", "cgrx_nodes_export",
                 "cgrx_nodes_stats", "cgrx_lookup", "cgrx_lookup_csr", "cgrx_lookup_csr_capped", "cgrx_aggregate",
                 "cgrx_range_count"):
        assert name in names, name
    for func, args in rec.calls:
        if func._opname.startswith("cgrx_"):
            opcheck(func, args)  # apply's inputs as they were before it ran: it mutates nodes

    # Reference: what export returns is the multiset of pairs the updates leave, with their ordered keys.
    pairs = Counter(zip(keys.tolist(), range(keys.numel())))
    for k, r in zip(keys[:5].tolist(), range(5)):
        pairs[(k, r)] -= 1
    pairs.update(zip(ins.tolist(), range(keys.numel(), keys.numel() + ins.numel())))
    gone = set(keys[5:9].tolist())
    want = sorted((k, r) for (k, r), c in pairs.items() if k not in gone for _ in range(c))
    k_out, r_out = ops.cgrx_nodes_export(index._pairs, index.node_size, index.num_buckets)
    as_signed = (k_out.cpu() ^ (-(2**63))).tolist()  # ordered int64 keys back to the values
    got = sorted(zip(as_signed, (r_out.cpu().to(torch.int64) & 0xFFFFFFFF).tolist()))
    assert got == want

    # find_buckets: the bucket of the first representative >= key, clamped to the first and last bucket.
    reps = index._reps.cpu().numpy().view(np.uint64)
    probe = ordered(ins)
    b = ops.cgrx_find_buckets(index._reps, index._table, probe.to(device)).cpu().numpy()
    np.testing.assert_array_equal(b, np.minimum(np.searchsorted(reps, probe.numpy().view(np.uint64)), reps.size - 1))


@pytest.mark.parametrize("layout", [0, 1, 2])
def test_state_export_operators(device, data, layout):
    """cgrx_pairs_export and unmap_keys: what state_dict() saves, read back from the index."""
    keys = data[0].to(device)
    k = ordered(data[0]).to(device)
    pairs, _, _ = ops.cgrx_build(k, BUCKET, layout)
    opcheck(ops.cgrx_pairs_export.default, (pairs, layout))
    sk, rows = ops.cgrx_pairs_export(pairs, layout)
    order = np.argsort(k.cpu().numpy().view(np.uint64), kind="stable")
    np.testing.assert_array_equal(rows.cpu().numpy(), order)
    np.testing.assert_array_equal(sk.cpu().numpy(), k.cpu().numpy()[order])
    opcheck(ops.unmap_keys.default, (k, 0, torch.int64))
    assert torch.equal(ops.unmap_keys(k, 0, torch.int64), keys)
    f = torch.tensor([-1.5, 0.0, 3.25, float("inf")], dtype=torch.float32, device=device)
    assert torch.equal(ops.unmap_keys(ops.map_keys(f, 3), 3, torch.float32), f)


def test_spare_rows_operator(device, data):
    """cgrx_set_spare_rows (in place: each aligned pair's spare word from rows[row ID]) and a lookup that answers
    with those words (the config's spare_rows), as a sharded index's shard uses them."""
    from torch_rtindex import _config

    keys, queries, *_ = data
    k = ordered(keys).to(device)
    pairs, reps, table = ops.cgrx_build(k, BUCKET, 1)
    n = k.numel()
    mapping = (torch.arange(n, dtype=torch.int64) * 5 + 11).to(device)
    opcheck(ops.cgrx_set_spare_rows.default, (pairs, 1, mapping))
    ops.cgrx_set_spare_rows(pairs, 1, mapping)
    words = pairs.view(-1, 4).cpu()
    assert torch.equal(words[:, 3].to(torch.int64), words[:, 2].to(torch.int64) * 5 + 11)
    q = ordered(queries).to(device)
    empty = torch.empty(0, dtype=torch.uint8, device=device)  # no scene: the radix backend
    cfg = _config.cgrx_config("uint64", "aligned_row", BUCKET, "binary", "radix", SCENE, spare_rows=True)
    plain = _config.cgrx_config("uint64", "aligned_row", BUCKET, "binary", "radix", SCENE)
    opcheck(ops.cgrx_lookup.default, (pairs, reps, table, empty, cfg, q, None))
    first, count = ops.cgrx_lookup(pairs, reps, table, empty, cfg, q, None)
    want_first, want_count = ops.cgrx_lookup(pairs, reps, table, empty, plain, q, None)
    assert torch.equal(count, want_count)
    assert torch.equal(first, torch.where(want_first >= 0, want_first * 5 + 11, -1))


def test_config_schema_matches_the_python_mirrors():
    from torch_rtindex import _config

    assert torch.ops.rtindex_internal.config_schema() == _config._schema()
