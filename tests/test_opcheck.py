"""torch.library.opcheck on every RX operator that takes tensors, with realistic arguments.

opcheck runs four checks per call: test_schema (the op mutates and aliases only what its schema declares),
test_autograd_registration, test_faketensor (the fake kernel in torch_rtindex/_fake.py gives the real
kernel's output shapes, dtypes and devices) and test_aot_dispatch_dynamic (the op traced by AOTAutograd with
dynamic shapes gives the same values as eager). Each test also checks the op's eager answer against an
independent reference, so the arguments are the realistic ones the API passes.

Where a check cannot apply it is left out, per device, and the reason is written next to it:

- CUDA rx_build: test_aot_dispatch_dynamic compares two builds' bytes, and the OptiX structure holds its own
  device address (and a traversable handle), so two correct builds never compare equal.
- CUDA rx_lookup / rx_lookup_csr / rx_aggregate: every opcheck check runs the op on *clones* of the tensor
  arguments, and a cloned OptiX structure has a stale address, which the kernels answer by tracing nothing
  (all misses, by design). The checks still run (schema, shapes, dtypes, eager vs traced agree), but their
  value comparison is between two all-miss answers; the values on the real structure are checked here
  against the CPU operator instead.
- CUDA rx_refit: the op refuses a copied structure ("moved or copied; rebuild it"), so opcheck's copies make
  every check fail for that reason alone; the schema check (SchemaCheckMode) and the fake kernel
  (FakeTensorMode) are run directly on the real tensors instead.
- scene_* operators have CPU kernels only (they feed the Embree check); they are checked on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from keysets import ROW, int64_keys, keys_of_type, point_queries, range_queries
from reference import Reference, check_lookup, check_matches

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
    if is_range:
        qlo, qhi = ops.map_ranges(lo.to(device), hi.to(device), 0)
    else:
        qlo, qhi = ordered(queries).to(device), None
    return (structure, k, qlo, qhi, SCENE, False, 64)


def on_cpu(args):
    """The same call on the CPU: for a CUDA structure, a CPU one built from the same keys."""
    structure, k, lo, hi, *rest = args
    k = k.cpu()
    return (ops.rx_build(k, SCENE, False), k, lo.cpu(), None if hi is None else hi.cpu(), *rest)


@pytest.mark.parametrize("is_range", [False, True])
def test_rx_lookup(device, data, is_range):
    args = lookup_args(device, data, is_range)
    opcheck(ops.rx_lookup.default, args)
    ref = Reference(data[0], "int64")
    first, count, _ = ref.ranges(data[2], data[3]) if is_range else ref.points(data[1])
    check_lookup(Lookup(*ops.rx_lookup(*args)), first, count)
    # an empty batch of queries
    opcheck(ops.rx_lookup.default, (*args[:2], args[2][:0], None if args[3] is None else args[3][:0], *args[4:]))


@pytest.mark.parametrize("is_range", [False, True])
def test_rx_lookup_csr(device, data, is_range):
    args = lookup_args(device, data, is_range)
    opcheck(ops.rx_lookup_csr.default, args)
    ref = Reference(data[0], "int64")
    _, _, rows = ref.ranges(data[2], data[3]) if is_range else ref.points(data[1])
    check_matches(Matches(*ops.rx_lookup_csr(*args)), rows)
    # all misses: an empty rows output
    misses = torch.full_like(args[2], 12345)
    opcheck(ops.rx_lookup_csr.default, (*args[:2], misses, None, *args[4:]))


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
    q = ordered(data[1] + 7).to(device)
    first, count, _ = Reference(data[0] + 7, "int64").points(data[1] + 7)
    check_lookup(Lookup(*ops.rx_lookup(structure, moved, q, None, SCENE, False, 64)), first, count)


def test_scene_operators(data):
    """CPU only: these operators exist to hand the scene to Embree."""
    keys, queries, lo, hi, _ = data
    k = ordered(keys)
    opcheck(ops.scene_triangles.default, (k, SCENE))
    opcheck(ops.scene_point_rays.default, (ordered(queries), SCENE))
    qlo, qhi = ops.map_ranges(lo, hi, 0)
    opcheck(ops.scene_range_rays.default, (qlo, qhi, SCENE, 64))
    opcheck(ops.scene_range_rays.default, (qlo, qhi, SCENE, 1))  # most ranges too wide: few rays
    # Reference: a triangle is centred on its key's (x, y, z) cell; a range fires one ray per scene row it
    # touches (rows of 2^23 keys; ranges wider than max_range_rays rows fire none).
    tris = ops.scene_triangles(k, SCENE).double().numpy()
    u = k.numpy().view(np.uint64)
    centre = np.stack([(u & (2**23 - 1)).astype(np.float64), ((u >> 23) & (2**23 - 1)).astype(np.float64),
                       (u >> 46).astype(np.float64)], axis=1)
    np.testing.assert_allclose(tris.mean(axis=1), centre + [0, -1 / 6, 0], rtol=0, atol=1e-9)
    owner, rays = ops.scene_range_rays(qlo, qhi, SCENE, 64)
    ul, uh = qlo.numpy().view(np.uint64), qhi.numpy().view(np.uint64)
    rows = np.where(ul <= uh, (uh >> np.uint64(23)).astype(np.int64) - (ul >> np.uint64(23)).astype(np.int64) + 1, 0)
    rows = np.where(rows > 64, 0, rows)
    np.testing.assert_array_equal(np.bincount(owner.numpy(), minlength=len(ul)), rows)
    assert rays.shape == (owner.numel(), 8)
