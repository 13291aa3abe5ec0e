"""The sharded index's routing operators (csrc/distributed): partition_queries and partition_padded against a
reference built with map_keys, searchsorted and a stable argsort; pack_answers, scatter_answers_into and
gather_answers against plain torch; opcheck."""

from __future__ import annotations

import pytest
import torch
from keysets import keys_of_type

from torch_rtindex import _extension
from torch_rtindex._config import PADDED_COUNT, PADDED_HEADER, PADDED_OVERFLOW, PADDED_STATUS
from torch_rtindex._keys import KEY_TYPES

_extension.load()  # the operators are registered by the extension

ops = torch.ops.rtindex
internal = torch.ops.rtindex_internal
SIGN = -(2**63)


def reference(queries, key_type, splitters, chunks, skip=-1):
    ordered = ops.map_keys(queries.cpu(), KEY_TYPES[key_type])
    n, world = ordered.numel(), splitters.numel() + 1
    owner = torch.searchsorted(splitters.cpu() ^ SIGN, ordered ^ SIGN, right=True)
    chunk = torch.arange(n) * chunks // max(n, 1)
    bucket = chunk * world + owner
    order = torch.argsort(bucket, stable=True)
    order = order[owner[order] != skip]  # the skipped owner's queries left out
    return ordered[order], order, torch.bincount(bucket[order], minlength=chunks * world).view(chunks, world)


def splitters_from(ordered: torch.Tensor, m: int, gen) -> torch.Tensor:
    """m ascending ordered keys (unsigned order), drawn from the queries' own keys and the 64-bit extremes."""
    pool = torch.cat([ordered, torch.tensor([0, -1, SIGN, 2**63 - 1])])
    pick = pool[torch.randint(0, pool.numel(), (m,), generator=gen)]
    return torch.sort(pick ^ SIGN).values ^ SIGN


def check(queries, key_type, splitters, chunks, device, skip=-1):
    keys, pos, counts = internal.partition_queries(queries.to(device), KEY_TYPES[key_type], splitters.to(device), chunks,
                                                   skip)
    rk, rp, rc = reference(queries, key_type, splitters, chunks, skip)
    assert torch.equal(counts.cpu(), rc)
    assert keys.numel() == pos.numel() == queries.numel()  # sized for every query; the routed ones at the front
    keys, pos = keys[:rp.numel()].cpu(), pos[:rp.numel()].cpu()
    if device.type == "cuda":  # order within a bucket is not stable there: compare each bucket as a set
        ends = rc.view(-1).cumsum(0).tolist()
        start = 0
        for e in ends:
            assert torch.equal(torch.sort(pos[start:e]).values, torch.sort(rp[start:e]).values)
            start = e
        assert torch.equal(keys, ops.map_keys(queries.cpu(), KEY_TYPES[key_type])[pos])
    else:
        assert torch.equal(pos, rp)
        assert torch.equal(keys, rk)


@pytest.mark.parametrize("key_type", ["int64", "uint64", "int32", "float32", "float64"])
@pytest.mark.parametrize("world,chunks", [(1, 1), (2, 1), (3, 4), (7, 3), (300, 2)])
def test_partition_queries(device, gen, key_type, world, chunks):
    q = keys_of_type(key_type, 3000, gen)
    if key_type in ("int64", "uint64"):
        q = torch.cat([q, torch.tensor([SIGN, 2**63 - 1, 0, -1, 1])])
    if key_type.startswith("float"):
        q = torch.cat([q, torch.tensor([float("nan")], dtype=q.dtype)])
    q = q[torch.randperm(q.numel(), generator=gen)]
    sp = splitters_from(ops.map_keys(q, KEY_TYPES[key_type]), world - 1, gen)
    check(q, key_type, sp, chunks, device)
    for skip in sorted({0, world // 2, world - 1}):  # a rank leaving its own queries out
        check(q, key_type, sp, chunks, device, skip)


# 2^21 + 5 queries: tiles 8 queries wide on a GPU of up to 512 multiprocessors (smaller batches take one per
# thread, so that they spread over the GPU).
WIDE = 2**21 + 5


@pytest.mark.parametrize("n,chunks", [(0, 1), (0, 4), (1, 1), (3, 8), (5000, 7), (WIDE, 3)])
def test_partition_queries_sizes(device, gen, n, chunks):
    q = keys_of_type("int64", n, gen)[:n]
    sp = splitters_from(ops.map_keys(q, 0) if n else torch.zeros(1, dtype=torch.int64), 4, gen)
    check(q, "int64", sp, chunks, device)


def test_partition_queries_errors(device):
    q = torch.zeros(4, dtype=torch.int64, device=device)
    sp = torch.zeros(1, dtype=torch.int64, device=device)
    with pytest.raises(RuntimeError, match="chunks"):
        internal.partition_queries(q, 0, sp, 0)
    for skip in (-2, 2):  # owners are 0 and 1 here
        with pytest.raises(RuntimeError, match="skip must be -1"):
            internal.partition_queries(q, 0, sp, 1, skip)
    with pytest.raises(RuntimeError, match="dtype"):
        internal.partition_queries(q.float(), 0, sp, 1)


@pytest.mark.parametrize("key_type", ["int64", "uint64", "int32", "float64"])
@pytest.mark.parametrize("world,capacity", [(1, 0), (1, 5000), (2, 1), (3, 700), (7, 3000), (300, 4)])
def test_partition_padded(device, gen, key_type, world, capacity):
    check_padded(device, gen, key_type, 3000, world, capacity)


@pytest.mark.parametrize("capacity", [WIDE // 3, WIDE])
def test_partition_padded_wide_batches(device, gen, capacity):
    check_padded(device, gen, "int64", WIDE, 3, capacity)


def check_padded(device, gen, key_type, n, world, capacity):
    q = keys_of_type(key_type, n, gen)
    if key_type in ("int64", "uint64"):
        q = torch.cat([q, torch.tensor([SIGN, 2**63 - 1, 0, -1, 1])])
    ordered = ops.map_keys(q, KEY_TYPES[key_type])
    splitters = splitters_from(ordered, world - 1, gen)
    block, slots = internal.partition_padded(q.to(device), KEY_TYPES[key_type], splitters.to(device), capacity)
    block, slots = block.cpu(), slots.cpu()
    H, width = PADDED_HEADER, PADDED_HEADER + capacity
    assert block.shape == (world, width)
    counts = block[:, PADDED_COUNT]
    owner = torch.searchsorted(splitters ^ SIGN, ordered ^ SIGN, right=True)
    # The header: each owner's count, this batch's overflow flag in every row, status 0.
    assert torch.equal(counts, torch.bincount(owner, minlength=world))
    overflow = int(bool((counts > capacity).any()))
    assert block[:, PADDED_OVERFLOW].tolist() == [overflow] * world and block[:, PADDED_STATUS].tolist() == [0] * world
    flat, kept = block.reshape(-1), slots >= 0
    # Each owner's block holds min(count, capacity) of its own queries, each once, at the slots recorded (the
    # entries of the flattened block, after its owner's header).
    assert torch.equal(torch.bincount(owner[kept], minlength=world), counts.clamp(max=capacity))
    assert torch.equal(slots[kept] // width, owner[kept])
    assert bool((slots[kept] % width >= H).all())
    assert torch.unique(slots[kept]).numel() == int(kept.sum())
    assert torch.equal(flat[slots[kept]], ordered[kept])
    filled = torch.zeros(world * width, dtype=torch.bool)
    filled[slots[kept]] = True
    filled.view(world, width)[:, :H] = True
    assert torch.equal(flat[~filled], torch.zeros(int((~filled).sum()), dtype=torch.int64))
    assert bool((slots[kept] % width - H < counts.clamp(max=capacity)[owner[kept]]).all())
    if device.type == "cpu":  # stable: an owner's first `capacity` queries in query order
        rank_in_owner = torch.empty_like(owner)
        for d in range(world):
            sel = (owner == d).nonzero()[:, 0]
            rank_in_owner[sel] = torch.arange(sel.numel())
        assert torch.equal(kept, rank_in_owner < capacity)
        assert torch.equal(slots[kept], owner[kept] * width + H + rank_in_owner[kept])


def test_partition_padded_errors(device):
    q, sp = torch.arange(10, device=device), torch.tensor([3], device=device)
    with pytest.raises(RuntimeError, match="capacity must be non-negative"):
        internal.partition_padded(q, 0, sp, -1)
    with pytest.raises(RuntimeError, match="does not fit in 64 bits"):
        internal.partition_padded(q, 0, sp, 2**62)
    block, slots = internal.partition_padded(q[:0], 0, sp, 4)
    assert block.shape == (2, PADDED_HEADER + 4) and slots.numel() == 0 and not block.any()


def test_padded_header_is_the_extensions():
    """The Python exchange reads the header partition_padded writes by the width and columns the extension
    exports; the import check refuses a Python side whose width or columns differ, naming both."""
    from torch_rtindex import _config

    _config.check_against_extension()
    wider = _config._schema().replace(f"padded_header:{PADDED_HEADER}", f"padded_header:{PADDED_HEADER + 1}")
    with pytest.raises(RuntimeError, match=f"C\\+\\+ 'padded_header:{PADDED_HEADER}' vs Python "
                                           f"'padded_header:{PADDED_HEADER + 1}'"):
        _config.check_against_extension(wider)
    swapped = _config._schema().replace(f"overflow={PADDED_OVERFLOW},status={PADDED_STATUS}",
                                        f"overflow={PADDED_STATUS},status={PADDED_OVERFLOW}")
    with pytest.raises(RuntimeError, match="padded_columns"):
        _config.check_against_extension(swapped)


def received_blocks(flags, capacity=4, device="cpu"):
    """Padded blocks as the query exchange delivers them, with these overflow flags."""
    block = torch.zeros(len(flags), PADDED_HEADER + capacity, dtype=torch.int64)
    block[:, PADDED_OVERFLOW] = torch.tensor(flags, dtype=torch.int64)
    return block.to(device)


def test_gather_answers(device, gen):
    m, n = 500, 3000
    ans = torch.randint(-(2**62), 2**62, (m, 2), generator=gen)
    slots = torch.randint(-1, m, (n,), generator=gen)
    first, second, over = internal.gather_answers(ans.to(device), slots.to(device), -1, -7, received_blocks([0, 0, 0], device=device))
    hit = slots >= 0
    assert torch.equal(first.cpu(), torch.where(hit, ans[slots.clamp(min=0), 0], -1))
    assert torch.equal(second.cpu(), torch.where(hit, ans[slots.clamp(min=0), 1], -7))
    assert over.dtype == torch.bool and over.dim() == 0 and not bool(over)
    a, b, over = internal.gather_answers(ans[:0].to(device), slots[:0].to(device), 0, 0, received_blocks([0, 1], device=device))
    assert a.numel() == 0 and b.numel() == 0 and bool(over)  # the flag is read with no queries too
    if device.type == "cpu":
        with pytest.raises(RuntimeError, match="past the answers"):
            internal.gather_answers(ans, torch.tensor([m]), 0, 0, received_blocks([0]))
    with pytest.raises(RuntimeError, match="answers must be an int64 tensor"):
        internal.gather_answers(ans.to(device).float(), slots.to(device), 0, 0, received_blocks([0], device=device))
    with pytest.raises(RuntimeError, match="received must be the int64 padded blocks"):
        internal.gather_answers(ans.to(device), slots.to(device), 0, 0, torch.zeros(2, 2, dtype=torch.int64, device=device))


@pytest.mark.parametrize("flags", [[0], [1], [0, 0, 0, 0], [0, 0, 0, 1], [1, 0, 1, 0], [0] * 63 + [1]])
def test_gather_answers_overflow_flag(device, flags):
    """The flag is any received row's overflow column, also read through a strided view of a wider block."""
    wide = received_blocks(flags, capacity=9, device=device)
    ans = torch.zeros(4, 2, dtype=torch.int64, device=device)
    _, _, over = internal.gather_answers(ans, torch.arange(4, device=device), 0, 0, wide)
    assert bool(over) == any(flags)
    _, _, over = internal.gather_answers(ans, torch.arange(4, device=device), 0, 0, wide[:, :PADDED_HEADER + 2])
    assert bool(over) == any(flags)


@pytest.mark.parametrize("b_dtype", [torch.int64, torch.int32])
def test_pack_and_scatter_answers(device, gen, b_dtype):
    n, m = 1000, 50
    a = torch.randint(-1, m, (n,), generator=gen).to(device)
    b = torch.randint(-(2**31), 2**31, (n,), generator=gen).to(b_dtype).to(device)
    wide = b.to(torch.int64)
    l2g = torch.sort(torch.randint(0, 10**12, (m,), generator=gen)).values.to(device)
    packed = internal.pack_answers(a, b, l2g)
    want0 = torch.where(a >= 0, l2g[a.clamp(min=0)], -1)
    assert torch.equal(packed, torch.stack([want0, wide], dim=1))
    assert torch.equal(internal.pack_answers(a, b, l2g[:0]), torch.stack([a, wide], dim=1))
    with pytest.raises(RuntimeError, match="b must be int64 or int32"):
        internal.pack_answers(a, b.float(), l2g)
    perm = torch.randperm(n, generator=gen).to(device)
    first, second = (torch.empty(n, dtype=torch.int64, device=device) for _ in range(2))
    internal.scatter_answers_into(packed, perm, first, second)  # a permutation: every entry written once
    assert torch.equal(first[perm], packed[:, 0]) and torch.equal(second[perm], packed[:, 1])
    assert first.is_contiguous() and second.is_contiguous()


def test_scatter_answers_into(device, gen):
    """m answer rows into columns of n entries: those at the positions overwritten, the others kept."""
    n, m = 1000, 300
    ans = torch.randint(-(2**62), 2**62, (m, 2), generator=gen)
    pos = torch.randperm(n, generator=gen)[:m]
    first, second = torch.arange(n) * 3, torch.arange(n) * 5
    want0, want1 = first.clone(), second.clone()
    want0[pos], want1[pos] = ans[:, 0], ans[:, 1]
    f, s = first.to(device), second.to(device)
    assert internal.scatter_answers_into(ans.to(device), pos.to(device), f, s) is None
    assert torch.equal(f.cpu(), want0) and torch.equal(s.cpu(), want1)
    internal.scatter_answers_into(ans[:0].to(device), pos[:0].to(device), f, s)  # nothing to place
    assert torch.equal(f.cpu(), want0)
    with pytest.raises(RuntimeError, match="contiguous 1-D int64"):
        internal.scatter_answers_into(ans.to(device), pos.to(device), f[::2], s[::2])
    with pytest.raises(RuntimeError, match="one length"):
        internal.scatter_answers_into(ans.to(device), pos.to(device), f, s[:-1])
    with pytest.raises(RuntimeError, match="one entry per answer"):
        internal.scatter_answers_into(ans.to(device), pos[:-1].to(device), f, s)
    if device.type == "cpu":  # CUDA drops the write
        with pytest.raises(RuntimeError, match="outside 0 .. 9"):
            internal.scatter_answers_into(ans[:1], torch.tensor([10]), f[:10].clone(), s[:10].clone())


@pytest.mark.parametrize("map_dtype", [torch.int32, torch.int64, None])
def test_global_rows(device, gen, map_dtype):
    """A chunk's local rows as global ones: -1 stays, int32 maps are unsigned offsets, no map: the row's own
    32-bit offset; always plus base."""
    n, m, base = 5000, 300, 2**40 + 7
    local = torch.randint(-1, m, (n,), generator=gen)
    if map_dtype is None:
        l2g = torch.empty(0, dtype=torch.int32)
        want = torch.where(local >= 0, (local & 0xFFFFFFFF) + base, -1)
    else:
        offsets = torch.sort(torch.randint(0, 2**32, (m,), generator=gen)).values  # past 2^31: negative as int32
        l2g = offsets.to(torch.int32) if map_dtype == torch.int32 else offsets
        want = torch.where(local >= 0, offsets[local.clamp(min=0)] + base, -1)
    got = internal.global_rows(local.to(device), l2g.to(device), base)
    assert torch.equal(got.cpu(), want)
    assert internal.global_rows(local[:0].to(device), l2g.to(device), base).numel() == 0
    if device.type == "cpu" and map_dtype is not None:
        with pytest.raises(RuntimeError, match="past local_to_global"):
            internal.global_rows(torch.tensor([m]), l2g, base)
    with pytest.raises(RuntimeError, match="local must be a 1-D int64"):
        internal.global_rows(local.to(torch.int32).to(device), l2g.to(device), base)


def test_opcheck(device, gen):
    q = keys_of_type("float64", 200, gen).to(device)
    sp = splitters_from(ops.map_keys(q.cpu(), KEY_TYPES["float64"]), 3, gen).to(device)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    for op, args in [
        (internal.partition_queries, (q, KEY_TYPES["float64"], sp, 3)),
        (internal.pack_answers, (torch.arange(10, device=device) - 1, torch.ones(10, dtype=torch.int64, device=device),
                                 torch.arange(20, device=device) * 3)),
        (internal.pack_answers, (torch.arange(10, device=device) - 1, torch.ones(10, dtype=torch.int32, device=device),
                                 torch.arange(20, device=device)[:0])),
        (internal.scatter_answers_into, (torch.arange(8, device=device).view(4, 2), torch.randperm(10, generator=gen)[:4].to(device),
                                         torch.zeros(10, dtype=torch.int64, device=device),
                                         torch.ones(10, dtype=torch.int64, device=device))),
        (internal.partition_queries, (q, KEY_TYPES["float64"], sp, 2, 1)),
        (internal.global_rows, (torch.arange(10, device=device) - 1, torch.arange(20, dtype=torch.int32, device=device), 5)),
        (internal.partition_padded, (q, KEY_TYPES["float64"], sp, 70)),
        (internal.gather_answers, (torch.arange(20, device=device).view(10, 2), torch.arange(11, device=device) - 1, -1, 0,
                                   torch.zeros(2, PADDED_HEADER + 3, dtype=torch.int64, device=device))),
    ]:
        if device.type == "cuda" and op in (internal.partition_queries, internal.partition_padded):
            continue  # order within a bucket may differ between the runs opcheck compares
        result = torch.library.opcheck(op, args, test_utils=utils)
        assert result == {u: "SUCCESS" for u in utils}, result


@pytest.mark.parametrize("n", [1, 3, 40000])
@pytest.mark.parametrize("size", [0, 1, 5000])
def test_group_by_is_a_stable_grouping(n, size):
    from torch_rtindex._grouping import group_by

    ids = torch.randint(0, n, (size,), generator=torch.Generator().manual_seed(n + size))
    order, counts = group_by(ids, n)
    assert torch.equal(order, torch.argsort(ids, stable=True))
    assert torch.equal(counts, torch.bincount(ids, minlength=n)) and counts.dtype == torch.int64
