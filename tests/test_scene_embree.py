"""The scene geometry checked by an independent ray tracer (Embree, on the CPU).

The triangles of a key set and the rays of a batch of lookups are produced by the same C++ functions the
OptiX programs run (csrc/core/scene.h). Embree traces those rays against those triangles in float32; every
ray must hit exactly the keys the reference expects, so a float32 mistake (a vertex that is not exactly
representable, a ray that grazes a triangle edge) fails here without a GPU.
"""

import numpy as np
import pytest
import torch
from keysets import ROW, int64_keys, point_queries, range_queries

embree_scene = pytest.importorskip("embreex.rtcore_scene")
embree_mesh = pytest.importorskip("embreex.mesh_construction")

ops = torch.ops.rtindex
SCENES = {"rx": [23, 23, 18, 0, 0], "scaled": [23, 23, 18, 15, 25], "split": [22, 21, 21, 0, 0]}


def make_scene(keys: torch.Tensor, scene):
    tris = torch.ops.rtindex_internal.scene_triangles(ops.map_keys(keys, 0), scene).numpy()
    s = embree_scene.EmbreeScene()
    embree_mesh.TriangleMesh(s, tris)
    return s, tris


def trace_all(scene, rays: np.ndarray, tris: np.ndarray):
    """Every hit of every ray, by re-firing from just past each hit. Duplicates share one triangle place,
    so Embree reports one of them: hits are compared as key values, not row IDs."""
    hits = [[] for _ in range(len(rays))]
    origin = rays[:, 0:3].copy()
    direction = rays[:, 3:6].copy()
    remaining = rays[:, 7].copy()
    active = np.arange(len(rays))
    for _ in range(10_000):
        if active.size == 0:
            break
        res = scene.run(origin[active], direction[active], dists=remaining[active], output=1)
        hit = res["primID"] >= 0
        for i, prim, t in zip(active[hit], res["primID"][hit], res["tfar"][hit]):
            hits[i].append(int(prim))
            # keys in a row sit one slot apart: continue half a slot past this hit (exact in float32)
            step = np.float32(t) + np.float32(0.5)
            origin[i] = origin[i] + direction[i] * step
            remaining[i] = remaining[i] - step
        active = active[hit]
    return hits


@pytest.mark.parametrize("name", list(SCENES))
@pytest.mark.parametrize("kind", ["uniform", "dense", "narrow"])
def test_point_rays_hit_exactly_their_key(name, kind):
    gen = torch.Generator().manual_seed(7)
    keys = torch.unique(int64_keys(kind, 4000, gen))
    scene_cfg = SCENES[name]
    scene, tris = make_scene(keys, scene_cfg)
    queries = point_queries(keys, 4000, gen)
    rays = torch.ops.rtindex_internal.scene_point_rays(ops.map_keys(queries, 0), scene_cfg).numpy()
    res = scene.run(rays[:, 0:3].copy(), rays[:, 3:6].copy(), dists=rays[:, 7].copy(), output=1)
    lookup = {int(k): i for i, k in enumerate(keys.tolist())}
    expected = np.array([lookup.get(int(q), -1) for q in queries.tolist()])
    np.testing.assert_array_equal(res["primID"], expected)
    # a point ray meets its triangle half a slot along the z axis
    hit = expected >= 0
    half_z = 2.0 ** (scene_cfg[4] - 1)
    # (within Embree's own rounding, which differs by an ulp between its SIMD paths on different CPUs)
    np.testing.assert_allclose(res["tfar"][hit], np.float32(half_z), rtol=4 * np.finfo(np.float32).eps, atol=0)


@pytest.mark.parametrize("name", list(SCENES))
@pytest.mark.parametrize("kind", ["uniform", "dense", "narrow"])
def test_range_rays_hit_exactly_the_range(name, kind):
    gen = torch.Generator().manual_seed(11)
    keys = torch.unique(int64_keys(kind, 3000, gen))
    scene_cfg = SCENES[name]
    scene, tris = make_scene(keys, scene_cfg)
    lo, hi = range_queries(keys, 300, gen, 3 * ROW)
    owner, rays = torch.ops.rtindex_internal.scene_range_rays(*ops.map_ranges(lo, hi, 0), scene_cfg, 1 << 20)
    hits = trace_all(scene, rays.numpy(), tris)
    got = [set() for _ in range(lo.numel())]
    for q, h in zip(owner.tolist(), hits):
        got[q].update(h)
    k = keys.numpy()
    for i in range(lo.numel()):
        expected = set(np.nonzero((k >= lo[i].item()) & (k <= hi[i].item()))[0].tolist())
        assert got[i] == expected, f"range {i}: [{lo[i].item()}, {hi[i].item()}]"


def test_vertices_are_exact_at_the_extremes():
    # The largest coordinates on every axis: corners at p +- 1/2 must be representable (the probe's bug).
    keys = torch.tensor([-(2**63), 2**63 - 1, -1, 0], dtype=torch.int64)
    for scene_cfg in SCENES.values():
        tris = torch.ops.rtindex_internal.scene_triangles(ops.map_keys(keys, 0), scene_cfg).numpy().astype(np.float64)
        ordered = ops.map_keys(keys, 0).numpy().view(np.uint64)
        bx, by, bz, sy, sz = scene_cfg
        for t, key in zip(tris, ordered):
            key = int(key)
            x = key & ((1 << bx) - 1)
            y = (key >> bx) & ((1 << by) - 1)
            z = key >> (bx + by)
            p = np.array([x, y * 2.0**sy, z * 2.0**sz])
            h = np.array([0.5, 2.0 ** (sy - 1), 2.0 ** (sz - 1)])
            np.testing.assert_array_equal(t[0], p + h * [-1, -1, 1])
            np.testing.assert_array_equal(t[1], p + h * [1, -1, -1])
            np.testing.assert_array_equal(t[2], p + h * [0, 1, 0])
