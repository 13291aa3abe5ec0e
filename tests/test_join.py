"""join / range_join against a brute-force numpy join (every probe compared with every build key)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo
from keysets import ROW, int64_keys, keys_of_type, point_queries, range_queries
from reference import to_numpy

from torch_rtindex import RXIndex, join, range_join


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


@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("key_type", ["int64", "float64", "uint64"])
def test_join(device, gen, how, key_type):
    build, probe = build_and_probe(gen, key_type)
    index = RXIndex(build.to(device), key_type="uint64" if key_type == "uint64" else None)
    b, p = to_numpy(build, key_type), to_numpy(probe, key_type)
    want = brute_force(p[:, None] == b[None, :], how)
    check_pairs(join(index, probe.to(device), how=how), want)
    if how == "inner":
        assert want[0].size > probe.numel()  # duplicates on the build side really multiply the matches


def test_join_float_semantics(device):
    build = torch.tensor([0.0, -0.0, 1.5, float("inf"), 1.5], dtype=torch.float64)
    probe = torch.tensor([-0.0, float("nan"), 1.5, 2.0, float("inf")], dtype=torch.float64)
    index = RXIndex(build.to(device))
    b, p = build.numpy(), probe.numpy()  # numpy: -0.0 == 0.0, NaN equals nothing
    for how in ("inner", "left"):
        check_pairs(join(index, probe.to(device), how=how), brute_force(p[:, None] == b[None, :], how))


@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("key_type", ["int64", "uint64"])
def test_range_join(device, gen, how, key_type):
    build, _ = build_and_probe(gen, key_type)
    lo, hi = range_queries(build, 300, gen, 3 * ROW)  # some empty (lo > hi), some lo == hi
    index = RXIndex(build.to(device), key_type="uint64" if key_type == "uint64" else None, max_range_rays=2)
    b, l, h = (to_numpy(t, key_type) for t in (build, lo, hi))
    want = brute_force((b[None, :] >= l[:, None]) & (b[None, :] <= h[:, None]), how)
    check_pairs(range_join(index, lo.to(device), hi.to(device), how=how), want)


def test_empty_sides(device):
    empty_index = RXIndex(torch.empty(0, dtype=torch.int64, device=device))
    probe = torch.tensor([1, 2, 1], device=device)
    check_pairs(join(empty_index, probe), (np.zeros(0), np.zeros(0)))
    check_pairs(join(empty_index, probe, how="left"), (np.arange(3), np.full(3, -1)))
    index = RXIndex(torch.tensor([1, 1, 5], device=device))
    none = torch.empty(0, dtype=torch.int64, device=device)
    check_pairs(join(index, none, how="left"), (np.zeros(0), np.zeros(0)))
    check_pairs(range_join(index, none, none, how="left"), (np.zeros(0), np.zeros(0)))
    check_pairs(join(index, probe, how="left"), (np.array([0, 0, 1, 2, 2]), np.array([0, 1, -1, 0, 1])))
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
