"""join / range_join (and their fixed-capacity forms join_capped / range_join_capped) against a brute-force numpy
join (every probe compared with every build key), over RXIndex, CgRXIndex and UpdatableCgRXIndex."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo
from keysets import ROW, int64_keys, keys_of_type, point_queries, range_queries
from reference import to_numpy

from torch_rtindex import CgRXIndex, RXIndex, UpdatableCgRXIndex, join, join_capped, range_join, range_join_capped

# Any index with lookup_all / range works as the build side.
INDEXES = {
    "rx": RXIndex,
    "cgrx": lambda keys, **kw: CgRXIndex(keys, bucket_size=4, backend="radix", **{k: v for k, v in kw.items() if k == "key_type"}),
    "updatable": lambda keys, **kw: UpdatableCgRXIndex(keys, node_size=4, **{k: v for k, v in kw.items() if k == "key_type"}),
}


def brute_force(match: np.ndarray, how: str) -> tuple[np.ndarray, np.ndarray]:
    """Pairs from a [probes, build] boolean match matrix, by probe then build row; left: misses as (i, -1)."""
    probe, build = np.nonzero(match)  # row-major: already ordered by probe, then build row
    if how == "left":
        missed = np.nonzero(~match.any(axis=1))[0]
        probe = np.concatenate([probe, missed])
        build = np.concatenate([build, np.full(missed.size, -1)])
        order = np.lexsort((build, probe))
        probe, build = probe[order], build[order]
    return probe.astype(np.int64), build.astype(np.int64)


def check_pairs(got: tuple[torch.Tensor, torch.Tensor], want: tuple[np.ndarray, np.ndarray]) -> None:
    probe, build = got
    assert probe.dtype == torch.int64 and build.dtype == torch.int64 and probe.shape == build.shape
    np.testing.assert_array_equal(probe.cpu().numpy(), want[0])
    np.testing.assert_array_equal(build.cpu().numpy(), want[1])


def build_and_probe(gen: torch.Generator, key_type: str = "int64"):
    """Build keys with duplicates (one key 1000 times, others up to 100 times) and probes that repeat
    build keys, repeat themselves, and miss."""
    if key_type == "int64":
        build = int64_keys("duplicates", 1500, gen)
    else:
        base = keys_of_type(key_type, 300, gen)
        build = base[torch.randint(0, base.numel(), (1200,), generator=gen)]  # duplicates
    probe = point_queries(build, 400, gen)
    probe = torch.cat([probe, probe[:50]])  # repeated probe keys
    return build, probe


def check_capped_pairs(got, want: tuple[np.ndarray, np.ndarray], capacity: int) -> None:
    """A capped join: the true total, -1 padding, and the uncapped pairs where they fit: every probe that fits
    completely is identical, the probe straddling the capacity has some of its pairs."""
    probe, build, total = (t.cpu() for t in got)
    n = min(capacity, want[0].size)
    assert probe.shape == build.shape == (capacity,) and int(total) == want[0].size
    assert bool((probe[n:] == -1).all()) and bool((build[n:] == -1).all())
    np.testing.assert_array_equal(probe[:n].numpy(), want[0][:n])
    complete = want[0][:n] < (want[0][n] if n < want[0].size else np.iinfo(np.int64).max)
    np.testing.assert_array_equal(build[:n].numpy()[complete], want[1][:n][complete])
    for p in np.unique(probe[:n].numpy()[~complete]):  # the cut probe: a subset of its build rows
        assert set(build[:n].numpy()[probe[:n].numpy() == p]) <= set(want[1][want[0] == p])


@pytest.mark.parametrize("kind", list(INDEXES))
@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("key_type", ["int64", "float64", "uint64"])
def test_join(device, gen, kind, how, key_type):
    build, probe = build_and_probe(gen, key_type)
    index = INDEXES[kind](build.to(device), key_type="uint64" if key_type == "uint64" else None)
    b, p = to_numpy(build, key_type), to_numpy(probe, key_type)
    want = brute_force(p[:, None] == b[None, :], how)
    check_pairs(join(index, probe.to(device), how=how), want)
    if how == "inner":
        assert want[0].size > probe.numel()  # duplicates on the build side really multiply the matches
    for capacity in (0, want[0].size // 3, want[0].size, want[0].size + 11):
        check_capped_pairs(join_capped(index, probe.to(device), capacity, how=how), want, capacity)


def test_join_float_semantics(device):
    build = torch.tensor([0.0, -0.0, 1.5, float("inf"), 1.5], dtype=torch.float64)
    probe = torch.tensor([-0.0, float("nan"), 1.5, 2.0, float("inf")], dtype=torch.float64)
    index = RXIndex(build.to(device))
    b, p = build.numpy(), probe.numpy()  # numpy: -0.0 == 0.0, NaN equals nothing
    for how in ("inner", "left"):
        check_pairs(join(index, probe.to(device), how=how), brute_force(p[:, None] == b[None, :], how))


@pytest.mark.parametrize("kind", list(INDEXES))
@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("key_type", ["int64", "uint64"])
def test_range_join(device, gen, kind, how, key_type):
    build, _ = build_and_probe(gen, key_type)
    lo, hi = range_queries(build, 300, gen, 3 * ROW)  # some empty (lo > hi), some lo == hi
    key_opt = {"key_type": "uint64"} if key_type == "uint64" else {}
    index = RXIndex(build.to(device), max_range_rays=2, **key_opt) if kind == "rx" else INDEXES[kind](build.to(device), **key_opt)
    b, l, h = (to_numpy(t, key_type) for t in (build, lo, hi))
    want = brute_force((b[None, :] >= l[:, None]) & (b[None, :] <= h[:, None]), how)
    check_pairs(range_join(index, lo.to(device), hi.to(device), how=how), want)  # cgRX: re-sorted by build row
    for capacity in (0, want[0].size // 2, want[0].size + 5):
        check_capped_pairs(range_join_capped(index, lo.to(device), hi.to(device), capacity, how=how), want, capacity)


@pytest.mark.parametrize("kind", list(INDEXES))
def test_empty_sides(device, kind):
    empty_index = INDEXES[kind](torch.empty(0, dtype=torch.int64, device=device))
    probe = torch.tensor([1, 2, 1], device=device)
    check_pairs(join(empty_index, probe), (np.zeros(0), np.zeros(0)))
    check_pairs(join(empty_index, probe, how="left"), (np.arange(3), np.full(3, -1)))
    check_capped_pairs(join_capped(empty_index, probe, 4, how="left"), (np.arange(3), np.full(3, -1)), 4)
    index = INDEXES[kind](torch.tensor([1, 1, 5], device=device))
    none = torch.empty(0, dtype=torch.int64, device=device)
    check_pairs(join(index, none, how="left"), (np.zeros(0), np.zeros(0)))
    check_pairs(range_join(index, none, none, how="left"), (np.zeros(0), np.zeros(0)))
    check_pairs(join(index, probe, how="left"), (np.array([0, 0, 1, 2, 2]), np.array([0, 1, -1, 0, 1])))
    check_capped_pairs(join_capped(index, none, 3, how="left"), (np.zeros(0), np.zeros(0)), 3)
    with pytest.raises(ValueError, match="how"):
        join(index, probe, how="outer")
    with pytest.raises(ValueError, match="how"):
        range_join(index, probe, probe, how="right")


def test_join_compiles(device, gen):
    """The join is tensor code end to end: one graph with dynamic output sizes (AOTAutograd, no codegen, to
    keep the suite fast; test_compile.py runs Inductor on the CSR lookups it is built from)."""
    build, probe = build_and_probe(gen)
    index = RXIndex(build.to(device))

    def left_join(p: torch.Tensor):
        return join(index, p, how="left")

    b, p = build.numpy(), probe.numpy()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(left_join, backend="aot_eager", fullgraph=True, dynamic=True)
        for n in (probe.numel(), 97):
            check_pairs(compiled(probe[:n].to(device, copy=True)), brute_force(p[:n, None] == b[None, :], "left"))


@pytest.mark.parametrize("kind", list(INDEXES))
def test_probes_follow_the_dtype_policy(device, gen, kind):
    """int32 probes on an int64 build side are the same keys (every join form); float probes on an integer build
    side are refused naming both dtypes."""
    build = torch.randint(-(2**31), 2**31 - 1, (200,), generator=gen)
    build = torch.cat([build, build[:40], torch.tensor([-(2**31), 2**31 - 1])])
    index = INDEXES[kind](build.to(device))
    probe = torch.cat([build[:60], torch.tensor([5, -(2**31), 2**31 - 1])]).to(torch.int32)
    b, p = build.numpy(), probe.numpy().astype(np.int64)
    lo, hi = probe, torch.clamp(probe.to(torch.int64) + 2**20, max=2**31 - 1).to(torch.int32)
    ranged = (b[None, :] >= p[:, None]) & (b[None, :] <= hi.numpy()[:, None])
    for how in ("inner", "left"):
        want = brute_force(p[:, None] == b[None, :], how)
        check_pairs(join(index, probe.to(device), how=how), want)
        check_capped_pairs(join_capped(index, probe.to(device), want[0].size + 3, how=how), want, want[0].size + 3)
        want = brute_force(ranged, how)
        check_pairs(range_join(index, lo.to(device), hi.to(device), how=how), want)
        check_capped_pairs(range_join_capped(index, lo.to(device), hi.to(device), want[0].size, how=how), want,
                           want[0].size)
    with pytest.raises(TypeError, match="dtype torch.float64 but the index holds int64 keys"):
        join(index, probe.to(torch.float64).to(device))
