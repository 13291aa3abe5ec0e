"""The cgRX scenes (naive and optimized representation) and their ray search, checked with Embree.

cgrx_build_scene (CPU) returns the same triangle buffer the CUDA build hands to OptiX, and cgrx_scene_rays runs
one step of the very search the OptiX program runs (ray_search_step in csrc/cgrx/cgrx_scene.h): it takes the
closest hit of each query's last ray and returns the next ray, or the answer. Here Embree traces the rays, so
the whole lookup runs as on the GPU, and the bucket found must be the first representative >= key
(np.searchsorted(reps, key, "left")) for every key reps[0] < key <= reps[-1] (the others are decided before
tracing).

Faces: OptiX and Embree both take N = (v1 - v0) x (v2 - v0) as a triangle's front normal; OptiX reports a back-face
hit (OPTIX_HIT_KIND_TRIANGLE_BACK_FACE) when the ray direction points along N, and Embree's Ng (run(..., output=1))
is that N. So "back face" here is dot(direction, Ng) > 0, what the OptiX program reads with
optixIsTriangleBackFaceHit()."""

import numpy as np
import pytest
import torch
from keysets import int64_keys

embree_scene = pytest.importorskip("embreex.rtcore_scene")
embree_mesh = pytest.importorskip("embreex.mesh_construction")

ops = torch.ops.rtindex
SCENES = {"scaled": [23, 23, 18, 15, 25], "unscaled": [23, 23, 18, 0, 0], "split": [21, 22, 21, 3, 7]}
REPRESENTATIONS = {"naive": 0, "optimized": 1}
KINDS = [
    "uniform", "dense", "dense_planes", "duplicates", "dup_rows", "narrow", "single_row", "single_plane", "corners",
]
DONE = 6  # RayStage::Done
NEXT_ROW, PLANE_ROWS = 2, 4  # the stages of the y-rays, which read the face of what they hit
U64 = np.uint64
TOP = U64(1) << U64(63)


def _u(values):
    return np.asarray(values, dtype=np.uint64)


def ordered_keys(kind, cfg, n, gen):
    """Keys in the ordered (unsigned) key space, where the scene's slot layout is plain bit fields."""
    bx, by, bz = cfg[:3]
    row, plane = 1 << bx, 1 << (bx + by)
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))

    def around(edges, count):  # runs of `count` consecutive keys straddling each edge
        return (edges[:, None] - U64(count // 2) + np.arange(count, dtype=np.uint64)[None, :]).ravel()

    if kind in ("uniform", "duplicates", "dense", "narrow"):  # the shared generators, mapped like map_keys
        # (dense: a run across a multiple of 2^23, a row edge of every scene here; narrow: +-3 * 2^23 around
        # ordered 2^63, a plane edge of every scene)
        return int64_keys(kind, n, gen).numpy().view(np.uint64) ^ TOP
    if kind == "dense_planes":  # runs crossing plane edges and row edges
        p = rng.integers(1, 1 << min(bz, 20), size=4, dtype=np.uint64) * U64(plane)
        r = p + rng.integers(1, 1 << min(by, 20), size=4, dtype=np.uint64) * U64(row)
        return np.concatenate([around(p, n // 8), around(r, n // 8)])
    if kind == "dup_rows":  # duplicate runs spanning several buckets right at row and plane edges
        base = rng.integers(1, 1 << min(bz, 20), size=3, dtype=np.uint64) * U64(plane)
        edges = np.concatenate([base, base + U64(row), base + U64(7 * row)])
        values = np.concatenate([edges + _u(d) for d in (0, 1, 2, row - 1, row - 2)] + [edges - U64(1)])
        mult = rng.integers(1, 40, size=values.size)
        return np.repeat(values, mult)
    if kind == "single_row":
        r0 = U64(rng.integers(0, 1 << 40)) * U64(row)
        return r0 + rng.integers(0, row, size=n, dtype=np.uint64)
    if kind == "single_plane":
        p0 = U64(rng.integers(0, 1 << min(bz, 20))) * U64(plane)
        rows = rng.integers(0, 1 << by, size=40, dtype=np.uint64)
        return p0 + rng.choice(rows, size=n) * U64(row) + rng.integers(0, row, size=n, dtype=np.uint64)
    if kind == "corners":  # keys only at the first and last slots of rows and planes
        xs = _u([0, 1, 2, row - 3, row - 2, row - 1])
        ys = _u([0, 1, (1 << by) - 2, (1 << by) - 1])
        z0 = U64(rng.integers(0, (1 << bz) - 4))
        zs = z0 + _u([0, 1, 2, 3])
        cand = (zs[:, None, None] * U64(plane) + ys[None, :, None] * U64(row) + xs[None, None, :]).ravel()
        pick = cand[rng.random(cand.size) < 0.5]
        return np.repeat(pick, rng.integers(1, 6, size=pick.size))
    raise ValueError(kind)


def lookup_queries(keys, reps, cfg, gen):
    """Keys of the index, random keys, and every representative's neighbours at key, row and plane edges."""
    bx, by = cfg[:2]
    row, plane = U64(1 << bx), U64(1 << (bx + by))
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    u = reps
    edges = [u, u - U64(1), u + U64(1), u // row * row, u // row * row - U64(1), u | (row - U64(1)),
             (u | (row - U64(1))) + U64(1), u // plane * plane, u // plane * plane - U64(1), u | (plane - U64(1)),
             (u | (plane - U64(1))) + U64(1)]
    near = np.concatenate(edges)
    near = near[rng.random(near.size) < min(1.0, 6000 / near.size)]
    rand = rng.integers(0, 2**64 - 1, size=1500, dtype=np.uint64, endpoint=True)
    inside = reps[0] + (rng.random(1500) * float(reps[-1] - reps[0])).astype(np.uint64)
    return np.concatenate([rng.choice(keys, 1500), rand, inside, near])


def embree_of(tris):
    active = ~np.isnan(tris).any(axis=(1, 2))
    slots = np.nonzero(active)[0]  # Embree gets the active triangles only; its primIDs map back to slots
    scene = embree_scene.EmbreeScene()
    embree_mesh.TriangleMesh(scene, tris[active])
    return scene, slots


def trace(scene, slots, tris, rays):
    res = scene.run(rays[:, 0:3].copy(), rays[:, 3:6].copy(), dists=rays[:, 7].copy(), output=1)
    prim = res["primID"].astype(np.int64)
    hit = prim >= 0
    slot = np.where(hit, slots[np.maximum(prim, 0)], -1)
    ng = res["Ng"].astype(np.float64)
    back = (ng * rays[:, 3:6]).sum(axis=1) > 0
    # Embree's Ng is the counter-clockwise normal (v1 - v0) x (v2 - v0), the normal OptiX's faces refer to.
    t = tris[slot[hit]].astype(np.float64)
    n = np.cross(t[:, 1] - t[:, 0], t[:, 2] - t[:, 0])
    assert np.all(np.sign(n) == np.sign(ng[hit])), "Embree's Ng is not the counter-clockwise normal"
    return slot, back & hit


def run_search(scene, slots, tris, q, cfg, reps_t, m, representation):
    """Runs the OptiX program's search with Embree as the ray tracer: (bucket found or -1, rays fired, y-ray hits)."""
    state, rays = torch.ops.rtindex_internal.cgrx_scene_rays(q, cfg, reps_t, m, representation)
    fired = np.zeros(q.numel(), dtype=np.int64)
    y_hits = []  # (slot, back face) of every hit by a y-ray, whose face decides the next step
    for _ in range(6):
        r = rays.numpy()
        live = r[:, 7] >= 0
        if not live.any():
            break
        fired += live
        hits = np.full((q.numel(), 2), -1, dtype=np.int64)
        hits[:, 1] = 0
        slot, back = trace(scene, slots, tris, r[live])
        hits[live, 0] = slot
        hits[live, 1] = back
        stage = state.numpy()[live, 0]
        yray = ((stage == NEXT_ROW) | (stage == PLANE_ROWS)) & (slot >= 0)
        y_hits.append(np.stack([slot[yray], back[yray]], axis=1))
        state, rays = torch.ops.rtindex_internal.cgrx_scene_rays(q, cfg, reps_t, m, representation, state, torch.from_numpy(hits))
    assert (state.numpy()[:, 0] == DONE).all(), "a search fired more than five rays"
    return state.numpy()[:, 1], fired, np.concatenate(y_hits) if y_hits else np.zeros((0, 2), np.int64)


def check_exact(tris, cfg):
    """Every corner is its slot's centre +- half a slot, exactly, with an integer slot (float32-exact scene)."""
    sy, sz = 2.0 ** cfg[3], 2.0 ** cfg[4]
    t = tris[~np.isnan(tris).any(axis=(1, 2))].astype(np.float64)
    centre = t.mean(axis=1)
    slot = np.round(centre / np.array([1.0, sy, sz]))
    np.testing.assert_array_equal(slot * np.array([1.0, sy, sz]), centre)
    h = np.array([0.5, sy / 2, sz / 2])
    offsets = (t - centre[:, None, :]) / h
    assert np.isin(offsets, [-1.0, 0.0, 1.0]).all()
    return slot


def expected_flips(tris, cfg, multi_row):
    """Independently of the C++ code: which active triangles must be flipped (alone in their row, at x_max)."""
    active = ~np.isnan(tris).any(axis=(1, 2))
    slot = check_exact(tris, cfg)
    x_max = 2 ** cfg[0] - 1
    rows, count = np.unique(slot[:, 1:], axis=0, return_counts=True)
    alone = dict(zip(map(tuple, rows), count == 1))
    want = np.array([multi_row and s[0] == x_max and alone[tuple(s[1:])] for s in slot], dtype=bool)
    t = tris[active].astype(np.float64)
    n = np.cross(t[:, 1] - t[:, 0], t[:, 2] - t[:, 0])
    got = n.sum(axis=1) > 0  # N along +x, +y, +z: every axis ray meets the back face
    out = np.zeros(len(tris), dtype=bool)
    out[np.nonzero(active)[0]] = got
    return want, got, out


@pytest.mark.parametrize("name", list(SCENES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bucket_size", [1, 3, 16])
def test_rays_find_the_first_representative(name, kind, bucket_size):
    gen = torch.Generator().manual_seed(3)
    cfg = SCENES[name]
    keys = ordered_keys(kind, cfg, 3000, gen)
    ordered = torch.from_numpy(keys.view(np.int64).copy())
    pairs, reps, _ = ops.cgrx_build(ordered, bucket_size, 0)
    m = -(-keys.size // bucket_size)
    r = reps.numpy().view(np.uint64)[:m]
    if kind == "single_row":
        assert r[0] >> U64(cfg[0]) == r[-1] >> U64(cfg[0])
    if kind == "single_plane":
        assert r[0] >> U64(cfg[0] + cfg[1]) == r[-1] >> U64(cfg[0] + cfg[1])
    qk = lookup_queries(keys, r, cfg, gen)
    q = torch.from_numpy(qk.view(np.int64).copy())
    expected = np.searchsorted(r, qk, side="left")
    traced = (qk > r[0]) & (qk <= r[-1])  # the others are answered without rays
    multi_row = bool(r[0] >> U64(cfg[0]) != r[-1] >> U64(cfg[0]))
    active = {}
    for rep_name, rep in REPRESENTATIONS.items():
        tris = ops.cgrx_build_scene(reps, m, cfg, rep, pairs, bucket_size, 0).numpy()
        active[rep_name] = int((~np.isnan(tris).any(axis=(1, 2))).sum())
        want, got, flipped = expected_flips(tris, cfg, multi_row and rep_name == "optimized")
        np.testing.assert_array_equal(got, want, err_msg=f"{rep_name}: flipped triangles")
        scene, slots = embree_of(tris)
        found, fired, y_hits = run_search(scene, slots, tris, q, cfg, reps, m, rep)
        np.testing.assert_array_equal(found[traced], expected[traced], err_msg=f"{rep_name}: bucket found")
        assert fired[traced].max() <= (3 if rep_name == "naive" else 5)
        # The rays that read a face see a flipped triangle as a back face and every other one as a front face.
        np.testing.assert_array_equal(y_hits[:, 1].astype(bool), flipped[y_hits[:, 0]])
    assert active["optimized"] <= active["naive"]


def test_optimized_scene_by_hand():
    """A small multi-row, multi-plane set whose triangles are worked out by hand (scene 'split': x 21 bits)."""
    cfg = SCENES["split"]
    x_max, y_max = (1 << 21) - 1, (1 << 22) - 1

    def key(x, y, z):
        return (z << 43) | (y << 21) | x

    keys = _u([key(5, 0, 0), key(6, 0, 0), key(9, 0, 0),  # bucket 0: 5, 6 | bucket 1: 9 + next key in row 0
               key(11, 0, 0), key(3, 2, 0), key(3, 2, 0),  # bucket 1 ends at 11, bucket 2 ends at (3, 2)
               key(3, 2, 0), key(4, 2, 0), key(7, 1, 1)])  # bucket 3 ends at (4, 2); bucket 4: (7, 1, 1)
    pairs, reps, _ = ops.cgrx_build(torch.from_numpy(keys.view(np.int64).copy()), 2, 0)
    m = 5
    r = reps.numpy().view(np.uint64)
    assert list(r) == [key(6, 0, 0), key(11, 0, 0), key(3, 2, 0), key(4, 2, 0), key(7, 1, 1)]
    tris = ops.cgrx_build_scene(reps, m, cfg, 1, pairs, 2, 0).numpy()
    assert len(tris) == 3 * m + 1  # representatives, row ends, plane ends, the representation's tag slot
    slot = np.full((len(tris), 3), -9.0)
    act = ~np.isnan(tris).any(axis=(1, 2))
    slot[act] = check_exact(tris, cfg)
    _, _, flipped = expected_flips(tris, cfg, True)
    placed = {i: tuple(slot[i]) for i in np.nonzero(act)[0]}
    assert placed == {
        0: (6, 0, 0),  # bucket 0: next key 9 in the same row, stays
        1: (x_max, 0, 0),  # bucket 1: 11 is its row's last key (next key in row 2): moved to x_max
        2: (3, 2, 0),  # bucket 2: (3, 2) stays (next key is its duplicate)
        3: (x_max, 2, 0),  # bucket 3: (4, 2), next key in plane 1: moved to x_max
        4: (x_max, 1, 1),  # bucket 4, the last: moved, alone in its row: flipped
        2 * m + 3: (x_max, y_max, 0),  # plane 0 ends at (x_max, y_max): bucket 3's plane end -> bucket 4
        2 * m + 4: (x_max, y_max, 1),  # plane 1's end (never the answer: nothing lies beyond it)
    }, placed
    assert [i for i in placed if flipped[i]] == [4, 2 * m + 3, 2 * m + 4]
    # (query, bucket, rays): a moved representative answers keys above its own key with the next bucket; an
    # empty row finds the next row's end (a front face: one more ray from that row's start) or the plane's
    # end (flipped: answered at once); an empty plane start finds the next row's flipped end.
    cases = [(key(7, 0, 0), 1, 1), (key(11, 0, 0), 1, 1), (key(12, 0, 0), 2, 1), (key(x_max, 0, 0), 2, 1),
             (key(3, 2, 0), 2, 1), (key(4, 2, 0), 3, 1), (key(5, 2, 0), 4, 1), (key(0, 1, 0), 2, 3),
             (key(5, 3, 0), 4, 2), (key(0, 0, 1), 4, 2), (key(0, 1, 1), 4, 1), (key(7, 1, 1), 4, 1)]
    q = torch.from_numpy(_u([c[0] for c in cases]).view(np.int64).copy())
    scene, slots = embree_of(tris)
    found, fired, _ = run_search(scene, slots, tris, q, cfg, reps, m, 1)
    assert found.tolist() == [c[1] for c in cases]
    assert fired.tolist() == [c[2] for c in cases]


def test_rays_per_lookup():
    """Rays per lookup of both representations on uniform 64-bit keys (printed; run with -s to see them)."""
    cfg = SCENES["scaled"]
    gen = torch.Generator().manual_seed(11)
    rng = np.random.default_rng(11)
    lines = []
    for n in (3000, 200_000):
        keys = int64_keys("uniform", n, gen).numpy().view(np.uint64) ^ TOP
        ordered = torch.from_numpy(keys.view(np.int64).copy())
        for bucket_size in (1, 16):
            pairs, reps, _ = ops.cgrx_build(ordered, bucket_size, 0)
            m = -(-keys.size // bucket_size)
            r = reps.numpy().view(np.uint64)[:m]
            hits = rng.choice(keys, 2000)
            misses = rng.integers(0, 2**64 - 1, size=2000, dtype=np.uint64, endpoint=True)
            for qname, qk in (("keys", hits), ("random", misses)):
                qk = qk[(qk > r[0]) & (qk <= r[-1])]
                q = torch.from_numpy(qk.view(np.int64).copy())
                avg = {}
                for rep_name, rep in REPRESENTATIONS.items():
                    tris = ops.cgrx_build_scene(reps, m, cfg, rep, pairs, bucket_size, 0).numpy()
                    scene, slots = embree_of(tris)
                    found, fired, _ = run_search(scene, slots, tris, q, cfg, reps, m, rep)
                    np.testing.assert_array_equal(found, np.searchsorted(r, qk, side="left"))
                    avg[rep_name] = fired.mean()
                lines.append(f"n={n} B={bucket_size} queries={qname}: naive {avg['naive']:.3f}, "
                             f"optimized {avg['optimized']:.3f} rays/lookup")
                assert avg["optimized"] <= avg["naive"] + 0.02, lines[-1]
    print("\n" + "\n".join(lines))
