"""The hot tier: a second, GPU-resident tier, a cgRX index over the hottest keys with all their row IDs, so that a
point query (``lookup``, ``lookup_all``, ``aggregate``, the capped form) for a hot key gets its complete answer
without touching a chunk; the other queries go through the chunks sorted by key, ranges always do. Skewed lookups
of hashed IDs touch every chunk, so a key-range cache alone cannot serve them from the GPU.

Which keys: learned from the point batches (a sample of each counted into decayed per-key counts; keys counted at
least twice are candidates, keys seen once too where that adds a useful share), the tier rebuilt (its keys' rows
fetched through the chunks, one batch) only when the candidates would answer clearly more of a batch than the
tier did, what they would answer estimated by Good-Turing (raw counts credit uniform IDs that repeat by chance);
or given with :meth:`HotTier.warm`. Like a chunk's, the tier's pairs hold row offsets from its smallest row where
its rows span less than 2^32 (else a row map). Its reservation, ``capacity`` x (HOT_CANDIDATE_BYTES of learning
candidate plus :meth:`HotTier.pair_bytes`), is taken from ``gpu_budget``; a tier given by ``warm(learn=False)``
keeps no candidates, so the same bytes hold :meth:`HotTier.capacity_given` pairs. Its keys stay in host memory in
their priority order, over which an update rebuilds it from the new chunks.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import torch

from .._base import _ops
from ..cgrx import LAYOUTS, CgRXIndex
from .config import ChunkedConfig
from .executor import Batch
from .merge import aggregated, combine_csr, key_sorted
from .stats import Stats
from .store import TOP, ChunkView, place_rows

if TYPE_CHECKING:
    from .executor import Executor

# The hot tier's reservation per key of capacity: a candidate (key and score, 12 bytes) and about one
# (key, row ID) pair of the tier's index (HotTier.pair_bytes: cgRX pair, search part, row map).
HOT_CANDIDATE_BYTES = 12
HOT_MAX_KEYS = 1 << 24
HOT_DECAY = 0.5  # a candidate's count halves every batch
HOT_REPEAT = 2.0  # a key counts as hot once its decayed count reaches this: a key seen once says nothing
HOT_USEFUL, HOT_PAUSE = 0.01, 8  # learning that finds under 1% of a batch worth a tier pauses for 8 batches
HOT_DRIFT = 0.02  # rebuild when the candidates would answer this share of a batch more than the tier did
HOT_SAMPLE_GPU, HOT_SAMPLE_CPU = 1 << 20, 1 << 16  # the default learning sample, by the queries' device
HOT_GT_EXACT = 5  # Good-Turing estimates for keys seen fewer times than this in a sample, raw counts above


class HotTier:
    """The tier, its learning candidates and its reservation. ``enabled`` (use it) and ``learning`` (learn its
    keys) switch it per batch; ``next_row`` gives the index's next free row ID (row IDs past 2^32 need a row map
    the reservation prices)."""

    def __init__(self, config: ChunkedConfig, key_type: str, key_dtype: torch.dtype, stats: Stats,
                 executor: "Executor", next_row: Callable[[], int]) -> None:
        self.config, self.key_type, self.key_dtype, self.stats = config, key_type, key_dtype, stats
        self.executor, self.next_row = executor, next_row
        self.capacity = 0
        self.reserved_pair = self.pair_bytes()
        self.enabled = True  # False serves every query through the chunks (the tier is kept)
        self.learning = True  # False keeps the tier's keys as they are (see warm)
        self.clear()

    def reserve(self, capacity: int) -> None:
        """Sets the tier's capacity (keys), its pair size priced now; drops what it holds."""
        self.capacity = capacity
        self.reserved_pair = self.pair_bytes()
        self.clear()

    def clear(self) -> None:
        """Drops the tier and what it learned (learning starts over)."""
        self.tier: dict | None = None  # the tier: its index's view on a device, its keys (host), sizes
        self.cand: tuple[torch.Tensor, torch.Tensor] | None = None  # candidates: flipped keys (sorted), counts
        self.pending: torch.Tensor | None = None  # the tier's keys, to rebuild after an update
        self.skip = 0  # point batches left that skip learning (it found nothing worth a tier)

    def pair_bytes(self) -> int:
        """The tier's bytes per (key, row ID) pair: its cgRX pair, search part and, where the index's row IDs
        reach 2^32, a row map (rebuild)."""
        search = 8 // self.config.bucket_size + 2  # representatives, and under a byte of radix table
        return self.config.pair_bytes + search + (8 if self.next_row() > 2**32 else 0)

    @property
    def n_keys(self) -> int:
        return 0 if self.tier is None else self.tier["n_keys"]

    @property
    def n_pairs(self) -> int:
        return 0 if self.tier is None else self.tier["pairs_n"]

    def nbytes(self) -> int:
        n = 0 if self.tier is None else sum(t.nbytes for t in self.tier["tensors"].values())
        return n + (0 if self.cand is None else sum(t.nbytes for t in self.cand))

    def before_batch(self, D: torch.device) -> None:
        """Brings the tier up to date before a point batch: rebuilt over its keys after an update, or, a given
        tier now learning, cut to its first keys, room for candidates."""
        if self.pending is not None:
            keys, self.pending = self.pending, None
            self.rebuild(keys, D)
        if self.learning and self.tier is not None and self.tier["pairs_n"] > self.room():
            self.rebuild(self.keys(), D)

    def after_update(self, keys: torch.Tensor) -> None:
        """The chunks changed: the tier's answers may be stale; rebuilt over ``keys`` (its keys, read before the
        update changed anything) at the next batch."""
        self.pending = keys
        self.tier = None

    def warm(self, qlo: torch.Tensor, learn: bool) -> int:
        """Builds the hot tier now from ``keys`` (in priority order: the first distinct keys that are in the index,
        as far as their row IDs fit the tier; twice as many keys as fit are fetched, room for absent ones), on
        ``keys``' device. With ``learn=False`` (the default) the tier keeps these keys until the next ``warm`` or
        ``hot_learn = True``, and, learning nothing, it also has the learning candidates' share of the
        reservation: up to :attr:`hot_capacity_given` keys of one row ID each instead of ``hot_capacity``. Once
        learning resumes, the next point batch keeps as many of its first keys as the learning tier's room holds
        (which learning may then replace). Updates rebuild it over the same keys. Returns the number of keys in
        the tier. ``qlo``: the keys as ordered keys (checked by the index)."""
        flipped = qlo ^ TOP
        uniq, inverse = torch.unique(flipped, return_inverse=True)
        first = torch.full((uniq.numel(),), flipped.numel(), dtype=torch.int64, device=flipped.device)
        first.scatter_reduce_(0, inverse, torch.arange(flipped.numel(), device=flipped.device), "amin")
        prio = uniq.index_select(0, torch.sort(first).indices)  # (rebuild fetches twice what fits, at most)
        self.clear()
        self.learning = learn
        self.rebuild(prio, qlo.device)
        return 0 if self.tier is None else self.tier["n_keys"]

    def capacity_given(self) -> int:
        """Keys (of one row ID each) a tier given by :meth:`warm` with ``learn=False`` holds: the reservation of
        ``hot_capacity`` keys less the learning candidates, which such a tier does not keep."""
        return self.room(learn=False)

    def room(self, learn: bool | None = None) -> int:
        """Pairs the tier's reservation holds (``learn``: whether candidates share it; None: ``hot_learn``). At the
        pair size priced at construction; fewer where row IDs have since grown past 2^32 (an update) and the tier
        needs a row map the reservation did not price."""
        learn = self.learning if learn is None else learn
        per_key = self.reserved_pair + (HOT_CANDIDATE_BYTES if not learn else 0)
        return self.capacity * per_key // self.pair_bytes()

    def view(self, D: torch.device) -> ChunkView:
        tier = self.tier
        if tier["device"] != D:  # the tier follows the queries' device
            tier["tensors"] = {k: v.to(D) for k, v in tier["tensors"].items()}
            tier["device"] = D
            tier["view"] = self._make_view(tier)
        return tier["view"]

    def _make_view(self, tier: dict) -> ChunkView:
        t = tier["tensors"]
        index = CgRXIndex._from_structure(
            t["pairs"], t["reps"], t["table"], tier["pairs_n"], key_type=self.key_type, key_dtype=self.key_dtype,
            key_span=tier["span"], bucket_size=self.config.bucket_size, layout=self.config.layout, backend=self.config.backend,
        )
        return ChunkView(index, t["rows"], tier["base"], direct=tier["direct"])

    def keys(self) -> torch.Tensor:
        """The tier's keys (flipped ordered keys, most important first), kept in host memory (not the budget's)."""
        return self.tier["keys"]

    def rebuild(self, prio: torch.Tensor, D: torch.device) -> None:
        """The tier over the keys ``prio`` (flipped ordered keys, most important first) with all their row IDs,
        fetched through the chunks (one CSR batch), as many keys as their pairs fit the reservation."""
        t0 = time.perf_counter()
        self.tier = None
        if not self.learning:
            self.cand = None  # learning nothing: the candidates' share of the reservation holds pairs
        room = self.room()
        prio = prio[: 2 * room].to(D)  # room for keys that turn out to be absent, without an unbounded fetch
        if prio.numel() == 0:
            return
        offsets, rows = self.executor.serve("csr", prio ^ TOP, None, None, D)
        per = offsets[1:] - offsets[:-1]
        present = per > 0  # absent keys stay out: the tier's hit test is "has rows"
        keep = present & (torch.cumsum(per, 0) <= room)
        if not bool(keep.any()):
            return
        pair_keys = torch.repeat_interleave(prio ^ TOP, per, output_size=rows.numel())
        pair_keep = torch.repeat_interleave(keep, per, output_size=rows.numel())
        pair_keys, rows = pair_keys[pair_keep], rows[pair_keep]
        rows_sorted, perm = torch.sort(rows)  # local row order = global row order: smallest and ascending rows
        k = pair_keys.index_select(0, perm).contiguous()
        pairs, reps, table = _ops().cgrx_build(k, self.config.bucket_size, LAYOUTS[self.config.layout])
        flipped = torch.aminmax(k ^ TOP)
        base, row_map = place_rows(pairs, self.config.layout, rows_sorted)  # as a chunk's (build_chunk)
        kept = prio[keep].cpu()  # host memory, in priority order: what an update rebuilds the tier over
        tier = {"device": D, "keys": kept, "n_keys": kept.numel(), "pairs_n": k.numel(), "base": base,
                "direct": row_map.numel() == 0, "span": (int(flipped.min) ^ TOP, int(flipped.max) ^ TOP),
                "tensors": {"pairs": pairs, "reps": reps, "table": table, "rows": row_map}}
        tier["view"] = self._make_view(tier)
        self.tier = tier
        self.stats.count("hot_rebuilds", 1)
        self.stats.time("hot_rebuild", time.perf_counter() - t0)

    def serve(self, form: str, qlo: torch.Tensor, values: torch.Tensor | None, D: torch.device):
        """Point queries: the tier's keys answered by the tier (their complete answer), the others through the
        chunks; returns the answer and the number of tier hits."""
        t0 = time.perf_counter()
        view = self.view(D)
        q = qlo.numel()
        _, first, count = self.executor.answer(view, Batch("lookup", qlo, None, None, D, None), qlo, None, D)
        hit = count > 0  # the tier holds only keys with rows: a tier key always has some
        miss = torch.nonzero(~hit).reshape(-1)
        hits = q - miss.numel()
        self.stats.time("hot", time.perf_counter() - t0)
        self.stats.count("hot_hits", hits)
        qmiss = qlo.index_select(0, miss)
        # The misses go to the chunks sorted by key, so that within a chunk's queue the lookups read its memory in
        # address order (the GPU's in-place reads, the CPU's searches) rather than all over it.
        if miss.numel() > 1:
            qmiss, order = key_sorted(qmiss)
            miss = miss.index_select(0, order)
        key_order = True
        if form == "lookup":
            if miss.numel():
                rf, rc = self.executor.serve("lookup", qmiss, None, None, D, key_order)
                first.index_copy_(0, miss, rf)
                count.index_copy_(0, miss, rc)
            return (first, count), hits
        idx = torch.nonzero(hit).reshape(-1)
        qhit = qlo.index_select(0, idx)
        if form == "aggregate":
            sum_dtype = torch.float64 if values.dtype.is_floating_point else torch.int64
            hc, hs = aggregated(self.executor.answer(view, Batch("aggregate", qhit, None, values, D, None), qhit, None, D),
                                 values, D, sum_dtype)
            count = torch.zeros(q, dtype=torch.int64, device=D).index_copy_(0, idx, hc)
            total = torch.zeros(q, dtype=sum_dtype, device=D).index_copy_(0, idx, hs)
            if miss.numel():
                mc, ms = self.executor.serve("aggregate", qmiss, None, values, D, key_order)
                count.index_copy_(0, miss, mc)
                total.index_copy_(0, miss, ms)
            return (count, total), hits
        _, hoff, hrows = self.executor.answer(view, Batch("csr", qhit, None, None, D, None), qhit, None, D)
        parts = [(idx, hoff, hrows)]
        if miss.numel():
            parts.append((miss, *self.executor.serve("csr", qmiss, None, None, D, key_order)))
        return combine_csr(q, parts, D), hits

    def learn(self, qlo: torch.Tensor, share: float) -> None:
        """Counts the keys of a sample of the batch into the candidates (decayed counts, the hot_capacity best
        kept) and rebuilds the tier when the candidates seen repeatedly would answer clearly more of a batch
        than the tier did (``share``); a tier that answers too little, with nothing better, is dropped."""
        if self.skip:
            self.skip -= 1
            return
        D, q = qlo.device, qlo.numel()
        if self.config.hot_sample is not None:
            S = min(q, self.config.hot_sample)
        else:
            S = min(q, HOT_SAMPLE_GPU if D.type == "cuda" else HOT_SAMPLE_CPU)
        # A stratified sample, one query from each of S strata spanning the whole batch: no query drawn twice
        # (drawing with replacement repeats about S^2 / 2q queries, which read as keys seen twice and built
        # tiers for uniform IDs), and no part of the batch left out.
        i = torch.arange(S, device=D)
        lo = i * q // S
        width = (i + 1) * q // S - lo
        idx = lo + (torch.rand(S, device=D) * width).long().clamp_(max=width - 1)
        keys, seen = torch.unique(qlo.index_select(0, idx) ^ TOP, return_counts=True)
        score = seen.to(torch.float32)
        if self.cand is not None:
            ck, cs = (t.to(D) for t in self.cand)
            allk = torch.cat([ck, keys])
            keys, inverse = torch.unique(allk, return_inverse=True)
            score = torch.zeros(keys.numel(), dtype=torch.float32, device=D).index_add_(
                0, inverse, torch.cat([cs * HOT_DECAY, score]))
        if keys.numel() > self.capacity:
            top = torch.topk(score, self.capacity).indices.sort().values  # keys stay sorted
            keys, score = keys[top], score[top]
        self.cand = (keys, score)
        # What the tier would answer of the next batch, by Good-Turing over this sample: a key seen r times in S
        # draws has probability about (r + 1) N_{r+1} / (N_r S) (N_r: keys seen r times), the raw r / S being
        # an overestimate for rare keys (uniform IDs seen twice by chance are no hotter than the rest); counts
        # from HOT_GT_EXACT up are accurate as they are. The tier holds the candidates with the highest scores,
        # so it is credited with the most probable keys of the sample, as many as it would hold. Keys seen once
        # join it when that adds a useful share (skewed IDs, not uniform ones; an underestimate for them, as their
        # scores also hold what earlier batches saw).
        levels = torch.bincount(seen, minlength=HOT_GT_EXACT + 1)[: HOT_GT_EXACT + 1].to(torch.float64)
        rate = torch.zeros(HOT_GT_EXACT + 1, dtype=torch.float64, device=D)  # per-key probability x S, by count
        r = torch.arange(1, HOT_GT_EXACT, device=D)
        rate[1:HOT_GT_EXACT] = (r + 1) * levels[2:] / levels[1:HOT_GT_EXACT].clamp(min=1)
        likely = torch.sort(torch.where(seen >= HOT_GT_EXACT, seen.to(torch.float64), rate[seen.clamp(max=HOT_GT_EXACT)]),
                            descending=True).values.cumsum(0) / S
        strong = score >= HOT_REPEAT
        n_strong, n_all = int(strong.sum()), int((score >= 1.0).sum())
        credit = lambda k: float(likely[min(k, likely.numel()) - 1]) if k else 0.0  # noqa: E731
        weak = credit(n_all) - credit(n_strong) >= HOT_USEFUL
        chosen = score >= 1.0 if weak else strong
        projected = credit(n_all if weak else n_strong)
        if projected < HOT_USEFUL:
            if share < HOT_USEFUL:
                self.tier = None
                self.skip = HOT_PAUSE
            return
        if projected - share > max(HOT_DRIFT, 0.1 * projected):
            order = torch.sort(torch.where(chosen, score, -1.0), descending=True).indices
            order = order[: int(chosen.sum())]
            self.rebuild(keys.index_select(0, order), D)
            if self.tier is None:  # not one candidate's rows fit the room: pause rather than fetch them every batch
                self.skip = HOT_PAUSE
