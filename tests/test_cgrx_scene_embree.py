"""The cgRX scene (representatives, row and plane markers) and its three-ray search, checked with Embree.

cgrx_build_scene (CPU) returns the same triangles the CUDA build hands to OptiX, and cgrx_scene_rays the same
rays the OptiX program fires. Embree answers each ray with its closest hit; following the paper's
Algorithm 2 (same row, next row, next plane), the bucket found must be the first representative >= key."""

import numpy as np
import pytest
import torch
from keysets import ROW, int64_keys, point_queries

embree_scene = pytest.importorskip("embreex.rtcore_scene")
embree_mesh = pytest.importorskip("embreex.mesh_construction")

ops = torch.ops.rtindex
SCENES = {"scaled": [23, 23, 18, 15, 25], "unscaled": [23, 23, 18, 0, 0], "split": [21, 22, 21, 3, 7]}


def closest_hits(scene, rays):
    res = scene.run(rays[:, 0:3].copy(), rays[:, 3:6].copy(), dists=np.maximum(rays[:, 7], 0).copy(), output=1)
    prim = res["primID"].astype(np.int64)
    prim[rays[:, 7] < 0] = -1  # no such ray
    return prim


@pytest.mark.parametrize("name", list(SCENES))
@pytest.mark.parametrize("kind", ["uniform", "dense", "duplicates", "narrow"])
@pytest.mark.parametrize("bucket_size", [1, 3, 16])
def test_rays_find_the_first_representative(name, kind, bucket_size):
    gen = torch.Generator().manual_seed(3)
    keys = int64_keys(kind, 3000, gen)
    scene_cfg = SCENES[name]
    ordered = ops.map_keys(keys, 0)
    pairs, reps, table = ops.cgrx_build(ordered, bucket_size, 0)
    m = -(-keys.numel() // bucket_size)
    tris = ops.cgrx_build_scene(reps, m, scene_cfg).numpy()
    active = ~np.isnan(tris).any(axis=(1, 2))
    slots = np.nonzero(active)[0]  # Embree gets the active triangles only; map its primIDs back to slots
    scene = embree_scene.EmbreeScene()
    embree_mesh.TriangleMesh(scene, tris[active])
    queries = point_queries(keys, 3000, gen)
    q = ops.map_keys(queries, 0)
    rays = ops.cgrx_scene_rays(q, scene_cfg).numpy()
    hits = [closest_hits(scene, rays[:, j, :]) for j in range(3)]
    found = np.full(len(queries), -1, dtype=np.int64)
    for h in hits:  # Algorithm 2: the first ray that hits decides
        take = (found < 0) & (h >= 0)
        found[take] = slots[h[take]] % m
    r = reps.numpy().view(np.uint64)
    qk = q.numpy().view(np.uint64)
    expected = np.searchsorted(r, qk, side="left")
    # keys at or below the first representative and above the last are answered without rays
    traced = (qk > r[0]) & (qk <= r[-1])
    np.testing.assert_array_equal(found[traced], expected[traced])
