"""ShardedIndex: one index over the keys of every rank of a process group, range-partitioned by key.

Keys are routed by their ordered key (the package's order-preserving uint64 map, csrc/core/keys.h): splitters
cut the ordered-key space into one contiguous range per rank, rank order = key order. Each rank holds a local
index (any class of the package) over the ordered keys of its range, with ``key_type="uint64"``; its 32-bit
local row IDs translate to global int64 row IDs through ``local -> global``, which is ascending, so "smallest
local row" is "smallest global row" and (key, local row) order is (key, global row) order.

A lookup: owner per query (searchsorted in the splitters) -> counts exchanged -> queries exchanged
(``all_to_all_single`` with split sizes) -> local lookup -> answers returned the same way -> caller's order.
Every collective call starts with one small ``all_gather`` of a fixed-size header: each rank's status (its
input checks), operation, call number and sizes. Bad input on any rank is thus raised on every rank, before
any data moves, and the index stays as it was.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, NamedTuple

import torch
import torch.distributed as dist

from .. import _extension
from .._grouping import MAX_CUDA_BUCKETS, group_by
from .._keys import KEY_TYPES, MAX_KEYS, as_key_dtype, check_key_tensor, check_queries, resolve_key_type
from ..cgrx import CgRXIndex, CgRXSearch
from ..cgrx_updatable import UpdatableCgRXIndex
from ..chunked import ChunkedIndex
from ..results import Aggregate, CappedMatches, Lookup, Matches, UpdateResult
from ..rx import RXIndex

_SIGN = -(2**63)  # XOR with the sign bit: unsigned order of ordered keys as signed int64 order
_I64_MAX = 2**63 - 1
_FAILED = -2  # an answer slot of an owner whose local lookup failed (no real answer is ever -2)
# Point lookups on CUDA go out in this many chunks by default, so that exchanges overlap local lookups.
DEFAULT_CUDA_PIPELINE = 4
# Point lookups are split into pipeline chunks only where each chunk keeps at least this many queries of the
# largest rank's batch: every chunk costs two more collectives, which small batches pay without anything to overlap.
MIN_CHUNK_QUERIES = 1 << 20
# A cgRX shard answers its own point queries where they lie in groups of up to this many ranks: its pass over
# the whole batch costs a miss per other rank's query, which outweighs routing its own (1 / W of them) from
# three ranks on (measured at two and four: benchmarks/results/README.md).
OWN_IN_PLACE_MAX_WORLD = 2
# ... and on these devices: on the CPU that pass measured slower than looking up the own pieces the partition
# gathers (two gloo processes, results README).
OWN_IN_PLACE_DEVICES = ("cuda",)

_DTYPE_CODES = {torch.int64: 0, torch.int32: 1, torch.float32: 2, torch.float64: 3}
if hasattr(torch, "uint64"):
    _DTYPE_CODES[torch.uint64] = 4
_CODE_DTYPES = {v: k for k, v in _DTYPE_CODES.items()}
_KEY_TYPE_NAMES = {v: k for k, v in KEY_TYPES.items()}
_VALUE_DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64)

# Operation codes in the call header: a rank calling another operation than the others is a collective error.
_OPS = [
    "build", "build_done", "lookup", "range_lookup", "aggregate", "range_aggregate", "lookup_all", "range",
    "lookup_all_capped", "range_capped", "update", "update_apply", "update_done", "load_state_dict",
    "gathered_state_dict", "lookup_fixed", "range_lookup_fixed", "aggregate_fixed", "range_aggregate_fixed",
    "range_count", "lookup_rows", "lookup_all_capped_fixed", "range_capped_fixed",
]
_OP_CODES = {name: i for i, name in enumerate(_OPS)}
# Header columns: status, op, key type, key dtype, call number, values dtype, data device type; then
# 2 * world + 4 extra integers.
_HEAD = 7
_DEVICE_CODES = {"cpu": 0, "cuda": 1, "xpu": 2, "mps": 3, "hpu": 4, "meta": 5}

_LOCAL_CLASSES = {c.__name__: c for c in (CgRXIndex, UpdatableCgRXIndex, RXIndex, ChunkedIndex)}
STATE_FORMAT = "torch_rtindex.ShardedIndex"
GATHERED_FORMAT = "torch_rtindex.ShardedIndex.gathered"
STATE_VERSION = 1


class ShardedIndexError(RuntimeError):
    """Raised on every rank of a collective call when some rank's input was bad or the ranks disagreed
    (other operation, other sizes). ``errors`` maps each failing rank to its message. The index is unchanged."""

    def __init__(self, message: str, errors: dict[int, str] | None = None):
        super().__init__(message)
        self.errors = errors or {}


class Fixed(NamedTuple):
    """The answer of a fixed-capacity call (``*_fixed``, or a capped form with ``query_capacity``) and whether
    queries were dropped because more of them went to one rank than ``query_capacity`` allowed.

    ``overflowed`` is a 0-d bool tensor, the same on every rank (any rank's overflow): retry every rank's call
    with a larger ``query_capacity``. Dropped queries answer ``first_row = -1, count = -1`` (sum 0); in capped
    answers they count as having no matches.
    """

    answer: Any
    overflowed: torch.Tensor


def _ops():
    _extension.load()
    return torch.ops.rtindex


def _default_factory(updatable: bool) -> Callable[..., Any]:
    return UpdatableCgRXIndex if updatable else CgRXIndex


def _global_rows_in_shard(local: Any, local_to_global: torch.Tensor, num_rows: int) -> bool:
    """Whether the shard now answers in global rows: a read-only cgRX shard over aligned pairs keeps each pair's
    global row in the pair's spare word (written here), so its point and range lookups need no map
    (pack_answers' random reads of local_to_global). Other local indexes, and global rows from 2^32 on, keep
    the map. Runs where the shard is built, inside the agreed step (a failure is collective); the shard's rows
    never change without a rebuild (updates need node chains)."""
    attach = getattr(local, "_set_spare_rows", None)
    return attach is not None and num_rows <= 2**32 and bool(attach(local_to_global))


def _default_pipeline(device: torch.device) -> int:
    return DEFAULT_CUDA_PIPELINE if device.type == "cuda" else 1


def _internal():
    _extension.load()
    return torch.ops.rtindex_internal


class _Stages:
    """Per-stage wall time (device synchronized at each mark when profiling) and bytes moved."""

    NAMES = ("partition", "exchange", "local", "return", "scatter")

    def __init__(self, op: str, on: bool, device: torch.device, rank: int, check_s: float = 0.0):
        self.on, self.device, self.rank = on, device, rank
        self.stats: dict[str, Any] = {"op": op, "check_s": check_s if on else 0.0,
                                      **{f"{n}_s": 0.0 for n in self.NAMES}, "bytes_sent": 0,
                                      "bytes_sent_remote": 0, "bytes_received": 0}
        self._t = self._now() if on else 0.0

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def mark(self, stage: str) -> None:
        if self.on:
            t = self._now()
            self.stats[f"{stage}_s"] += t - self._t
            self._t = t

    def moved(self, send: torch.Tensor, recv: torch.Tensor, send_splits: list[int] | None) -> None:
        width = send.element_size() * (send[0].numel() if send.dim() > 1 and send.shape[0] else 1)
        self.stats["bytes_sent"] += send.numel() * send.element_size()
        self.stats["bytes_received"] += recv.numel() * recv.element_size()
        if send_splits is None:  # equal splits over the world
            world = max(1, send.shape[0])
            own = send.numel() * send.element_size() // world if send.shape[0] else 0
        else:
            own = send_splits[self.rank] * width
        self.stats["bytes_sent_remote"] += send.numel() * send.element_size() - own


class ShardedIndex:
    """One index over the keys of all ranks of a process group; every method is collective (every rank of
    the group calls it, in the same order, each with its own inputs, which may be empty).

    Args:
        keys: this rank's keys: a 1-D contiguous tensor of any key dtype the other indexes take (int64, int32,
            float32, float64, uint64), on this rank's device (CUDA with NCCL, CPU with gloo). Global row ID of a
            key = its position in the concatenation of all ranks' keys in rank order (int64).
        key_type: as for :class:`~torch_rtindex.CgRXIndex`; must be the same on every rank.
        group: the process group (default: the WORLD group); NCCL and gloo work alike.
        index_factory: builds each rank's local index: ``index_factory(ordered_keys, key_type="uint64")``, where
            ``ordered_keys`` are the rank's keys as ordered keys (int64 storage of the uint64 order-preserving
            map) in ascending global row order. Default: :class:`~torch_rtindex.CgRXIndex`, or
            :class:`~torch_rtindex.UpdatableCgRXIndex` with ``updatable=True``; pass e.g.
            ``functools.partial(CgRXIndex, backend="radix")`` to configure it, or
            ``functools.partial(ChunkedIndex, gpu_budget=...)`` for shards larger than a GPU (out of core).
        updatable: whether :meth:`update` / :meth:`insert` / :meth:`delete` are wanted (default local index
            :class:`~torch_rtindex.UpdatableCgRXIndex`).
        sample_size: keys per rank sampled to choose the splitters.
        pipeline: split the point lookups of :meth:`lookup` and :meth:`aggregate` into up to this many chunks
            (each keeps at least ``MIN_CHUNK_QUERIES`` of the largest rank's batch: small batches stay whole) whose
            exchanges run asynchronously, overlapping the local lookups of earlier chunks (1: no pipelining;
            the same on every rank). Default: ``DEFAULT_CUDA_PIPELINE`` on CUDA, 1 on the CPU (gloo's
            collectives block the caller, so there is nothing to overlap). The attribute may be changed between
            calls, on every rank alike. With NCCL the overlap needs the group's streams at high priority
            (``ProcessGroupNCCL.Options().is_high_priority_stream``): at normal priority NCCL's kernels wait
            for a lookup kernel's blocks to drain.
        profile: record per-stage times (synchronizing the device between stages) for :meth:`stats`.

    Shards hold nearly equal numbers of keys whatever their distribution, except that all keys equal to one
    another live on one rank (a key holding a large part of all keys makes its shard that large).

    Lookups answer global row IDs (int64) with the result types of the other indexes. Ranges spanning several
    shards are answered piecewise and their rows concatenated in rank order: with cgRX local indexes that is
    (key, row ID) order, as for :class:`~torch_rtindex.CgRXIndex`.

    Aggregates take the value column at the call, sharded like the keys: each rank passes the values of the
    rows it contributed (its build keys, then the keys it inserted, in that order; see :meth:`num_contributed`).

    Fixed-capacity forms (:meth:`lookup_fixed`, :meth:`range_lookup_fixed`, :meth:`aggregate_fixed`,
    :meth:`range_aggregate_fixed`, and :meth:`lookup_all_capped` / :meth:`range_capped` with ``query_capacity``):
    fixed shapes and no host synchronization, for CUDA graphs and ``torch.compile(fullgraph=True)``; they return
    :class:`Fixed` with an overflow flag. The other forms learn their exchange sizes on the host.

    Errors: every call first shares a small header (status of this rank's input checks, operation, call number,
    sizes) with one ``all_gather``; bad input on any rank, or ranks calling different methods, raises
    :class:`ShardedIndexError` on every rank before any data moves, and the index is unchanged. A local lookup
    that fails after the exchange (out of memory) raises on that rank and on every rank it owed answers (with
    the fixed-capacity forms: on every rank, unless checks are off). Whatever fails on one rank, every rank
    posts the same collectives. With NCCL, call ``torch.cuda.set_device`` on every rank first (headers go on
    the current GPU, and the error path gathers messages with ``all_gather_object``); inputs must be on a
    device the group's backend serves (NCCL: CUDA).

    Updates (``updatable=True``): :meth:`update`, :meth:`insert`, :meth:`delete`. State: :meth:`state_dict` /
    :meth:`from_state_dict` per rank, :meth:`gathered_state_dict` / :meth:`from_gathered_state` as one state.
    """

    def __init__(
        self,
        keys: torch.Tensor,
        *,
        key_type: str | None = None,
        group: dist.ProcessGroup | None = None,
        index_factory: Callable[..., Any] | None = None,
        updatable: bool = False,
        sample_size: int = 4096,
        pipeline: int | None = None,
        profile: bool = False,
    ) -> None:
        self._setup(group, index_factory, updatable, profile)
        failure = None  # a bad argument on one rank is raised on every rank by the build's header
        try:
            if pipeline is None:
                pipeline = _default_pipeline(keys.device if isinstance(keys, torch.Tensor) else torch.device("cpu"))
            if isinstance(pipeline, bool) or not isinstance(pipeline, int) or pipeline < 1:
                raise ValueError(f"pipeline must be a positive int, got {pipeline!r}")
            if isinstance(sample_size, bool) or not isinstance(sample_size, int) or sample_size < 1:
                raise ValueError(f"sample_size must be a positive int, got {sample_size!r}")
        except ValueError as e:
            failure, pipeline, sample_size = e, 1, 1
        self.pipeline = pipeline
        self.sample_size = sample_size
        self._build(keys, key_type, failure=failure)

    # -------------------------------------------------------------------------------------------- set-up
    def _setup(self, group, index_factory, updatable, profile) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "ShardedIndex needs an initialized process group: call torch.distributed.init_process_group "
                "(backend 'nccl' for GPUs, 'gloo' for CPU) on every rank first"
            )
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        self.updatable = bool(updatable)
        self.index_factory = index_factory or _default_factory(self.updatable)
        self.profile = bool(profile)
        self._calls = 0
        self.pipeline = 1
        self._check_s = 0.0
        self._last_stats: dict[str, Any] = {}
        self._values_cache: tuple | None = None
        # Every header goes on the device the group's object collectives use, chosen from the group alone,
        # never from a rank's inputs: a rank whose inputs are bad (a state without tensors, keys on the CPU
        # under NCCL) still posts its header on a device the backend serves, and raises with the others.
        self._head_device = _group_device(self.group)
        self._fault: Callable[[str], None] | None = None  # test hook: called with a stage name, may raise

    def _maybe_fault(self, stage: str) -> None:
        """Fault injection for tests (``self._fault``): stages "partition" (routing any call's pieces), "local"
        (every local lookup), "update_apply", "update_record" (bookkeeping after applying), "export"
        (gathered_state_dict)."""
        if self._fault is not None:
            self._fault(stage)

    def _check_served(self, device: torch.device, what: str) -> None:
        """Raises unless the group's backend serves ``device``'s type (NCCL: CUDA only)."""
        types = _group_device_types(self.group)
        if types and device.type not in types:
            raise ValueError(f"{what} are on {device}, a device type that the process group's backend does not "
                             f"serve (it serves {', '.join(sorted(types))}); with NCCL, put them on this rank's GPU")

    # ------------------------------------------------------------------------------------ collective checks
    def _agree(self, op: str, validate: Callable[[], Any] | None, extra: Callable[[Any], list[int]] | None = None,
               *, key_type: str | None = None, key_dtype: torch.dtype | None = None, values_code: int = -1,
               device: torch.device | None = None) -> tuple[Any, list[list[int]]]:
        """Runs the local checks, then shares every rank's header; raises :class:`ShardedIndexError` on every
        rank if any rank's checks failed or the ranks called different operations. Returns the local checks'
        result and the gathered headers ([world][_HEAD + 2 * world + 4] ints): one host synchronization.

        Whatever fails here on one rank (its checks, ``extra``, a header value that does not fit int64) becomes
        its status: every rank posts the same header ``all_gather`` on the group's device (``device``, the
        device of the call's data, only goes into the header), so no rank can leave the others' header
        unmatched."""
        t0 = time.perf_counter()
        result, err = None, None
        n_extra = 2 * self.world + 4
        op_code = _OP_CODES[op]
        try:
            if validate is not None:
                result = validate()
            vals = [0] * n_extra
            if extra is not None:
                got = extra(result)
                if len(got) > n_extra:
                    raise ValueError(f"{len(got)} header values for {n_extra} places")
                vals[: len(got)] = got
            kt = key_type if key_type is not None else getattr(self, "key_type", None)
            kd = key_dtype if key_dtype is not None else getattr(self, "key_dtype", None)
            dev = device if device is not None else getattr(self, "device", None)
            dev_code = _DEVICE_CODES.get(dev.type, len(_DEVICE_CODES)) if isinstance(dev, torch.device) else -1
            head = [0, op_code, KEY_TYPES.get(kt, -1), _DTYPE_CODES.get(kd, -1), self._calls, values_code,
                    dev_code, *vals]
            mine = torch.tensor(head, dtype=torch.int64, device=self._head_device)
        except Exception as e:  # noqa: BLE001  (any local failure becomes a collective error)
            err = e
            head = [1, op_code, -1, -1, self._calls, -1, -1] + [0] * n_extra
            mine = torch.tensor(head, dtype=torch.int64, device=self._head_device)
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine, group=self.group)
        heads = torch.stack(gathered).tolist()
        self._calls += 1
        self._check_s = time.perf_counter() - t0  # the header round trip (one host synchronization)
        failed = [r for r, h in enumerate(heads) if h[0]]
        if failed:
            msg = "" if err is None else f"{type(err).__name__}: {err}"
            msgs: list[Any] = [None] * self.world
            dist.all_gather_object(msgs, msg, group=self.group)
            errors = {r: msgs[r] for r in failed}
            text = "; ".join(f"rank {r}: {m}" for r, m in errors.items())
            raise ShardedIndexError(f"ShardedIndex.{op} failed on {len(failed)} of {self.world} ranks: {text}", errors) from err
        ops = {h[1] for h in heads}
        calls = {h[4] for h in heads}
        if len(ops) > 1 or len(calls) > 1:
            desc = ", ".join(f"rank {r}: {_OPS[h[1]]} (call {h[4]})" for r, h in enumerate(heads))
            raise ShardedIndexError(
                f"ShardedIndex: the ranks made different collective calls ({desc}); every rank must call the same "
                "methods in the same order"
            )
        return result, heads

    @staticmethod
    def _disagree(heads: list[list[int]], col: int, what: str, show: Callable[[int], str]) -> None:
        values = [h[col] for h in heads]
        if len(set(values)) > 1:
            desc = ", ".join(f"rank {r}: {show(v)}" for r, v in enumerate(values))
            raise ShardedIndexError(f"ShardedIndex: the ranks disagree on {what} ({desc}); pass the same on every rank")

    # ------------------------------------------------------------------------------------------ building
    def _check_keys(self, keys: torch.Tensor, key_type: str | None, what: str = "keys") -> str:
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(keys).__name__}")
        kt = resolve_key_type(keys, key_type)
        check_key_tensor(keys, what, dtype=keys.dtype, device=keys.device)
        if keys.dtype.is_floating_point and keys.numel() and bool(torch.isnan(keys).any()):
            raise ValueError(f"{what} contain NaN, which has no place in a key order; drop or replace those rows")
        return kt

    def _build(self, keys: torch.Tensor, key_type: str | None, rows: torch.Tensor | None = None,
               mapped: bool = False, num_rows: int | None = None, key_dtype: torch.dtype | None = None,
               failure: BaseException | None = None) -> None:
        """Collective build. ``rows``/``mapped``/``num_rows``: from a gathered state (ordered keys with their
        global row IDs). ``failure``: this rank's error while reading that state, raised on every rank."""
        device = keys.device if isinstance(keys, torch.Tensor) else torch.device("cpu")

        def validate():
            if failure is not None:
                raise failure
            if mapped:
                self._check_served(device, "the keys")
                return key_type, keys
            kt = self._check_keys(keys, key_type)
            self._check_served(device, "the keys")
            if keys.numel() > MAX_KEYS:
                raise ValueError(f"a rank holds at most 2^32 - 1 keys, got {keys.numel()}")
            return kt, _ops().map_keys(keys, KEY_TYPES[kt])  # mapped here: a failure is this rank's status

        (kt, ordered), heads = self._agree(
            "build", validate, lambda r: [keys.numel(), self.sample_size],
            key_type=key_type if mapped else _key_type_or_none(keys, key_type),
            key_dtype=key_dtype if mapped else getattr(keys, "dtype", None), device=device,
        )
        self._disagree(heads, 2, "the key type", lambda v: _KEY_TYPE_NAMES.get(v, "?"))
        self._disagree(heads, 3, "the key dtype", lambda v: str(_CODE_DTYPES.get(v, "?")))
        self._disagree(heads, 6, "the device type of the keys", _device_name)
        self._disagree(heads, _HEAD + 1, "sample_size", str)  # the sizes of the samples' all_gather
        self.key_type = kt
        self.key_dtype = key_dtype if mapped else keys.dtype
        self.device = device
        counts = [h[_HEAD] for h in heads]
        offset = sum(counts[: self.rank])
        st = _Stages("build", self.profile, device, self.rank)
        if rows is None:
            rows = torch.arange(offset, offset + ordered.numel(), dtype=torch.int64, device=device)
        self._splitters = self._choose_splitters(ordered, counts)

        def route():
            owner = self._route(ordered)
            return owner, [ordered, rows], owner

        got, _, send_splits, recv_splits, (owner,) = self._send_pieces("build", route, st)
        rkeys, rrows = got[:, 0].contiguous(), got[:, 1].contiguous()
        if mapped:  # from a gathered state: rows arrive in no particular order
            by_row = torch.argsort(rrows)
            rkeys, rrows = rkeys[by_row].contiguous(), rrows[by_row].contiguous()
            src_order = by_row
        else:
            src_order = None

        total_rows = int(num_rows) if num_rows is not None else sum(counts)

        def make_local():
            local = self.index_factory(rkeys, key_type="uint64")
            if self.updatable and not hasattr(local, "update"):
                raise TypeError(f"updatable=True needs a local index with update(); {type(local).__name__} has none")
            return local, _global_rows_in_shard(local, rrows, total_rows)

        (local, self._spare_rows), _ = self._agree("build_done", make_local, device=device)
        st.mark("local")
        self._local = local
        self._l2g = rrows
        # Where each local row's value comes from in an exchange of value columns (aggregate): its source rank
        # and its position among the rows that source sent here, in the source's contributed order.
        src = torch.repeat_interleave(torch.arange(self.world, device=device), torch.tensor(recv_splits, device=device),
                                      output_size=sum(recv_splits))
        starts = torch.tensor([0] + recv_splits, device=device).cumsum(0)[:-1]
        seq = torch.arange(src.numel(), device=device) - starts[src]
        if src_order is not None:
            src, seq = src[src_order], seq[src_order]
        self._src, self._seq = src, seq
        self._recv_totals = list(recv_splits)  # rows received from each source so far
        self._contrib_owner = owner  # owner of each row this rank contributed, in contributed order
        self._num_rows = total_rows
        self._num_keys = sum(counts)
        self._plan_values()
        st.stats.update(keys=ordered.numel(), local_keys=rkeys.numel())
        self._last_stats = st.stats

    def _choose_splitters(self, ordered: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """world - 1 splitters (ordered keys XOR the sign bit, ascending): key k goes to rank
        searchsorted(splitters, k ^ sign, right=True). Chosen from a fixed-size sample of every rank's keys,
        each sample key weighted by the number of keys it stands for; a splitter is always a sample key, placed
        before or after a run of equal keys, whichever leaves the shards closer to equal."""
        m, device = self.sample_size, ordered.device
        n = ordered.numel()
        if n:
            g = torch.Generator().manual_seed(12345 + self.rank)
            idx = torch.randint(0, n, (m,), generator=g).to(device)
            sample = ordered[idx] ^ _SIGN
        else:
            sample = torch.zeros(m, dtype=torch.int64, device=device)
        gathered = [torch.empty_like(sample) for _ in range(self.world)]
        dist.all_gather(gathered, sample, group=self.group)
        values = torch.stack(gathered).cpu()
        weights = torch.tensor([c / m for c in counts], dtype=torch.float64)[:, None].expand(-1, m).reshape(-1)
        values = values.reshape(-1)
        keep = weights > 0
        values, weights = values[keep], weights[keep]
        if values.numel() == 0 or self.world == 1:
            return torch.zeros(self.world - 1, dtype=torch.int64, device=device)
        values, order = torch.sort(values)
        weights = weights[order]
        distinct, inverse = torch.unique_consecutive(values, return_inverse=True)
        w = torch.zeros(distinct.numel(), dtype=torch.float64).index_add_(0, inverse, weights)
        before = torch.cumsum(w, 0) - w  # weight of the sample below each distinct value
        total = float(w.sum())
        chosen, last = [], 0
        for i in range(1, self.world):
            target = total * i / self.world
            j = int(torch.argmin((before - target).abs()))
            j = max(j, min(last + 1, distinct.numel() - 1)) if chosen else max(j, 1 if distinct.numel() > 1 else 0)
            chosen.append(j)
            last = j
        return distinct[torch.tensor(chosen)].to(device).contiguous()

    def _partition(self, owner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stable partition by owner: (order, counts), ``order[i]`` = the piece at send position i."""
        return group_by(owner, self.world)

    def _route(self, ordered: torch.Tensor) -> torch.Tensor:
        """The rank owning each ordered key."""
        if self.world == 1:
            return torch.zeros_like(ordered)
        return torch.searchsorted(self._splitters, ordered ^ _SIGN, right=True)

    # ---------------------------------------------------------------------------------------- exchanges
    def _a2a(self, send: torch.Tensor, send_splits: list[int] | None, recv_splits: list[int] | None,
             st: _Stages) -> torch.Tensor:
        send = send.contiguous()
        if recv_splits is None:
            out = torch.empty_like(send)
        else:
            out = send.new_empty((sum(recv_splits), *send.shape[1:]))
        dist.all_to_all_single(out, send, recv_splits, send_splits, group=self.group)
        st.moved(send, out, send_splits)
        return out

    # ----------------------------------------------------------------------------------- query checking
    def _as_key_dtype(self, lo: torch.Tensor, hi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The dtype policy alone, for the fixed forms without checks (compiling, capturing): no host sync."""
        conv = lambda t, name: as_key_dtype(t, name, dtype=self.key_dtype, key_type=self.key_type)  # noqa: E731
        return conv(lo, "queries" if hi is None else "lo"), None if hi is None else conv(hi, "hi")

    def _check_queries(self, lo: torch.Tensor, hi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The batch checked and converted to the key dtype (lossless conversions only, _keys.check_queries)."""
        return check_queries(lo, hi, dtype=self.key_dtype, device=self.device, key_type=self.key_type)

    def _map_queries(self, lo: torch.Tensor, hi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if hi is None:
            return _ops().map_keys(lo, KEY_TYPES[self.key_type]), None
        return _ops().map_ranges(lo, hi, KEY_TYPES[self.key_type])

    def _check_values(self, values: torch.Tensor) -> None:
        if not isinstance(values, torch.Tensor) or values.dim() != 1:
            raise ValueError("values must be a 1-D tensor with one value per row this rank contributed")
        if values.numel() != self.num_contributed():
            raise ValueError(
                f"values must hold one value per row this rank contributed ({self.num_contributed()}: its build "
                f"keys, then its inserted keys), got {values.numel()}"
            )
        if values.device != self.device:
            raise ValueError(f"values are on {values.device} but the index is on {self.device}")
        if values.dtype not in _VALUE_DTYPES:
            raise TypeError(f"values must be int32, int64, float32 or float64, got {values.dtype}")

    @staticmethod
    def _check_capacity(capacity: Any, name: str) -> int:
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            raise TypeError(f"{name} must be an int, got {type(capacity).__name__}")
        if capacity < 0:
            raise ValueError(f"{name} must be non-negative, got {capacity}")
        return capacity

    # ------------------------------------------------------------------------------------------ pieces
    def _pieces(self, qlo: torch.Tensor, qhi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Splits queries into pieces, one per (query, owner) a query touches, in (query, owner) order:
        (query of each piece, owner, lo, hi). A point query is one piece; a range one piece per shard it
        overlaps (an empty range one piece, at the owner of lo). One host synchronization for ranges."""
        n = qlo.numel()
        if qhi is None:
            return torch.arange(n, device=self.device), self._route(qlo), qlo, qlo
        o_lo, o_hi = self._route(qlo), self._route(qhi)
        o_hi = torch.maximum(o_lo, o_hi)  # an empty range (lo > hi) routes to lo's owner only
        if self.world == 1:
            return torch.arange(n, device=self.device), o_lo, qlo, qhi
        per = o_hi - o_lo + 1
        total = int(per.sum())
        query = torch.repeat_interleave(torch.arange(n, device=self.device), per, output_size=total)
        first = torch.cumsum(per, 0) - per
        owner = o_lo[query] + torch.arange(total, device=self.device) - first[query]
        return query, owner, qlo[query], qhi[query]

    def _exchange_counts(self, op: str, counts: torch.Tensor, err: BaseException | None) -> tuple[list, list]:
        """The counts exchange every dynamic call starts with, and its failure report: ``counts`` [world, k] (row
        d: what this rank sends rank d) goes out with this rank's status appended (1: its routing failed with
        ``err``). Returns (sent, received) as [world][k] lists (one host synchronization); if any rank's routing
        failed, every rank raises here, before a query moves, so no rank waits in a collective another skips."""
        head = torch.cat([counts, torch.full_like(counts[:, :1], int(err is not None))], dim=1)
        recv = torch.empty_like(head)
        dist.all_to_all_single(recv, head, group=self.group)
        sent, got = torch.stack([head, recv]).tolist()
        failed = [r for r in range(self.world) if got[r][-1]]
        if failed:
            here = "" if err is None else f"; here: {type(err).__name__}: {err}"
            raise ShardedIndexError(f"ShardedIndex.{op}: routing the queries failed on rank(s) {failed}{here}; "
                                    "nothing was exchanged, the index is unchanged",
                                    {self.rank: str(err)} if err is not None else {}) from err
        return [row[:-1] for row in sent], [row[:-1] for row in got]

    def _send_pieces(self, op: str, route: Callable[[], tuple], st: _Stages):
        """Dynamic exchange of pieces to their owners. ``route()`` gives (owner of each piece, its columns,
        *extra). The routing (``route``, the grouping, the payload) is guarded: a failure on any rank (out of
        memory) is reported through the counts exchange (:meth:`_exchange_counts`). Returns (received
        [R, len(cols)], send order, send splits, receive splits, extra)."""
        err, extra = None, ()
        try:
            self._maybe_fault("partition")
            owner, cols, *extra = route()
            order, send_counts = self._partition(owner)
            payload = cols[0][order].unsqueeze(1) if len(cols) == 1 else torch.stack([c[order] for c in cols], dim=1)
        except Exception as e:  # noqa: BLE001  (every rank raises in the counts exchange)
            err = e
            send_counts = torch.zeros(self.world, dtype=torch.int64, device=self.device)
        st.mark("partition")
        sent, got_counts = self._exchange_counts(op, send_counts[:, None], err)
        send_splits, recv_splits = [c for c, in sent], [c for c, in got_counts]
        got = self._a2a(payload, send_splits, recv_splits, st)
        st.mark("exchange")
        return got, order, send_splits, recv_splits, tuple(extra)

    def _range_route(self, lo: torch.Tensor, hi: torch.Tensor | None, with_owner: bool = False):
        """The route of :meth:`_send_pieces` for the CSR and capped forms: pieces as (lo, hi) pairs (a point
        query as lo = hi); extra: the query of each piece (and its owner)."""
        def route():
            qlo, qhi = self._map_queries(lo, hi)
            query, owner, plo, phi = self._pieces(qlo, qhi)
            return (owner, [plo, phi], query, owner) if with_owner else (owner, [plo, phi], query)
        return route

    def _to_global(self, rows: torch.Tensor) -> torch.Tensor:
        """Local row IDs (-1: none) to global ones."""
        if self._l2g.numel() == 0:
            return rows
        return torch.where(rows >= 0, self._l2g[rows.clamp(min=0)], -1)

    # -------------------------------------------------------------------------------- values for aggregates
    def num_contributed(self) -> int:
        """How many rows this rank contributed: its build keys, then the keys it inserted. A value column for
        :meth:`aggregate` holds one value per contributed row, in that order."""
        return self._contrib_owner.numel()

    def _route_values(self, values: torch.Tensor, st: _Stages, cached: bool) -> torch.Tensor:
        """The value column of the local rows, routed from the ranks that contributed them."""
        if cached:
            return self._values_cache[2]
        order, send_splits, gather = self._value_plan
        got = self._a2a(values[order], send_splits, self._recv_totals, st)
        local = got[gather]
        self._values_cache = (values, values._version, local)
        return local

    def _plan_values(self) -> None:
        """How value columns travel (send order and sizes, where each local row's value lands), planned when
        the rows change, so that routing a column needs no host synchronization (CUDA graphs)."""
        order, send_splits = self._partition(self._contrib_owner)
        starts = torch.tensor([0] + self._recv_totals, device=self.device).cumsum(0)[:-1]
        gather = starts[self._src] + self._seq if self._src.numel() else self._src
        self._value_plan = (order, send_splits.tolist(), gather)
        self._values_cache = None

    def _values_header(self, values: torch.Tensor | None) -> tuple[int, int]:
        if not isinstance(values, torch.Tensor) or values.dtype not in _VALUE_DTYPES:
            return -1, 0
        c = self._values_cache
        cached = c is not None and c[0] is values and c[1] == values._version
        return _VALUE_DTYPES.index(values.dtype), int(cached)

    # --------------------------------------------------------------------------------- per-query lookups
    def _per_query(self, op: str, lo: torch.Tensor, hi: torch.Tensor | None, values: torch.Tensor | None = None,
                   *, call: str | None = None, check: Callable[[], None] | None = None):
        """``call``: the method's name in the call header where it differs from ``op`` (lookup_rows answers
        through lookup); ``check``: one more local check of the call's arguments."""
        vcode, cached = self._values_header(values)

        def validate():
            if check is not None:
                check()
            batch = self._check_queries(lo, hi)
            if op.endswith("aggregate"):
                self._check_values(values)
            return batch

        (lo, hi), heads = self._agree(call or op, validate, lambda b: [b[0].numel(), cached, self.pipeline],
                                      values_code=vcode)
        self._disagree(heads, _HEAD + 2, "pipeline", str)
        st = _Stages(op, self.profile, self.device, self.rank, self._check_s)
        local_values = None
        if values is not None:
            self._disagree(heads, 5, "the value dtype", lambda v: str(_VALUE_DTYPES[v]) if v >= 0 else "?")
            local_values = self._route_values(values, st, all(h[_HEAD + 1] for h in heads))
        chunks = self._point_chunks(max(h[_HEAD] for h in heads)) if hi is None else 0
        if chunks:
            out = self._points(op, lo, local_values, values.dtype if values is not None else None, chunks, st)
            st.stats.update(queries=lo.numel(), pipelined=chunks)
            self._last_stats = st.stats
            return out
        def route():
            query, owner, plo, phi = self._pieces(*self._map_queries(lo, hi))
            return owner, [plo] if hi is None else [plo, phi], query

        got, order, send_splits, recv_splits, (query,) = self._send_pieces(op, route, st)
        rlo = got[:, 0].contiguous()
        rhi = None if hi is None else got[:, 1].contiguous()
        ans, err = self._guarded(lambda: self._local_per_query(op, rlo, rhi, local_values),
                                 lambda: torch.full((rlo.numel(), 2), _FAILED, dtype=torch.int64, device=self.device))
        st.mark("local")
        back = self._a2a(ans, recv_splits, send_splits, st)
        st.mark("return")
        self._raise_failed(op, err, (back == _FAILED).all(dim=1), send_splits)
        out = self._combine(op, back, order, query, lo.numel(), values.dtype if values is not None else None)
        st.mark("scatter")
        st.stats.update(queries=lo.numel(), pieces=order.numel(), received=rlo.numel())
        self._last_stats = st.stats
        return out

    def _guarded(self, fn, fallback):
        """Runs a local lookup; if it fails (out of memory, ...) returns (fallback(), error) instead of raising,
        so that this rank still takes part in the return exchange and nobody waits for it forever."""
        try:
            return fn(), None
        except Exception as e:  # noqa: BLE001  (raised after the exchange, see _raise_failed)
            return fallback(), e

    def _raise_failed(self, op: str, err: BaseException | None, flags: torch.Tensor, splits: list[int]) -> None:
        """After a return exchange: raise if this rank's local lookup failed, or if answers came back marked
        failed (``flags``: per received answer, ``splits[j]`` of them from rank j % world: rank order, or
        chunk-major, rank-minor). One host synchronization."""
        if err is not None:
            raise ShardedIndexError(f"ShardedIndex.{op}: the local lookup failed on rank {self.rank}: "
                                    f"{type(err).__name__}: {err}", {self.rank: str(err)}) from err
        if flags.numel() and bool(flags.any()):
            ends = torch.tensor(splits, device=flags.device).cumsum(0)
            segments = torch.searchsorted(ends, flags.nonzero()[:, 0], right=True)
            owners = sorted(set((segments % self.world).tolist()))
            raise ShardedIndexError(
                f"ShardedIndex.{op}: the local lookup failed on rank(s) {owners}, which own some of rank "
                f"{self.rank}'s queries (see the error raised there); the index is unchanged"
            )

    def _local_per_query(self, op: str, rlo: torch.Tensor, rhi: torch.Tensor | None,
                         values: torch.Tensor | None) -> torch.Tensor:
        """Local answers packed as int64 [R, 2]: (first global row, count) or (count, sum bits), written in one
        pass that also makes the local row IDs global and widens an int32 count (pack_answers)."""
        return _internal().pack_answers(*self._local_columns(op, rlo, rhi, values))

    def _local_columns(self, op: str, rlo: torch.Tensor, rhi: torch.Tensor | None, values: torch.Tensor | None,
                       key_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The local index's answers as two columns, (first row, count) or (count, sum bits), and the map the
        first column still goes through (empty: none). ``key_type``: ``rlo`` holds point queries of that type
        (the caller's, for :meth:`_own_answers`; the kernels map them) rather than ordered keys."""
        self._maybe_fault("local")
        loc, none = self._local, self._l2g[:0]
        if op == "range_count":  # the local index counts from positions where it can; no first row to map
            count = loc.range_count(rlo, rhi)
            return torch.full_like(count, -1, dtype=torch.int64), count, none
        if op.startswith("lookup") or op.startswith("range_lookup"):
            r = loc._spare_lookup(rlo, rhi, key_type) if self._spare_rows else None  # global rows from the shard
            if r is not None:
                return r.first_row, r.count, none
            if key_type is not None:
                r = Lookup(*loc._point_call_as("lookup", rlo, key_type))
            else:
                r = loc.lookup(rlo) if rhi is None else loc.range_lookup(rlo, rhi)
            return r.first_row, r.count, self._l2g
        if key_type is not None:
            a = Aggregate(*loc._point_call_as("aggregate", rlo, key_type, values))
        else:
            a = loc.aggregate(rlo, values) if rhi is None else loc.range_aggregate(rlo, rhi, values)
        s = a.sum.view(torch.int64) if a.sum.dtype == torch.float64 else a.sum.to(torch.int64)
        return a.count.to(torch.int64), s, none

    def _point_chunks(self, largest: int) -> int:
        """Chunks of a point lookup through partition_queries (0: through the pieces path instead): at most the
        pipeline setting, at least MIN_CHUNK_QUERIES of the ``largest`` rank's batch per chunk. The same on every
        rank: the pipeline setting and every rank's batch size are agreed in the call header."""
        if self.device.type == "cuda" and self.world > MAX_CUDA_BUCKETS:
            return 0
        most = self.pipeline if self.device.type != "cuda" else min(self.pipeline, MAX_CUDA_BUCKETS // self.world)
        return max(1, min(most, largest // MIN_CHUNK_QUERIES))

    def _own_in_place(self) -> bool:
        """Whether this rank answers its own point queries where they lie (:meth:`_own_answers`): a cgRX shard
        that searches (not one tracing rays, whose large batches want the query sort that pass skips), whose
        search of another rank's key ends at its first or last bucket (the same few cache lines for every such
        key), on a device of OWN_IN_PLACE_DEVICES, in a group of at most OWN_IN_PLACE_MAX_WORLD ranks (the
        others' keys are (W - 1) / W of the pass)."""
        return (self.device.type in OWN_IN_PLACE_DEVICES and isinstance(self._local, CgRXSearch)
                and not self._local._traces_rays() and self.world <= OWN_IN_PLACE_MAX_WORLD)

    def _own_answers(self, op: str, lo: torch.Tensor, values: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The local index's answers to the caller's whole batch, in its order and dtype (the kernels map the
        keys), as the two int64 columns of :meth:`_local_per_query`'s rows. Right for this rank's own queries;
        the others' keys lie outside its keys (misses), and their owners' answers overwrite them."""
        first, second, l2g = self._local_columns(op, lo, None, values, self.key_type)
        return (_internal().global_rows(first, l2g, 0) if l2g.numel() else first), second.to(torch.int64)

    def _points(self, op: str, lo: torch.Tensor, values: torch.Tensor | None, value_dtype, chunks: int,
                st: _Stages):
        """Point lookups: the queries mapped, routed and grouped by (chunk, owner) in one pass
        (partition_queries); the counts of every chunk exchanged at once (the only host synchronization before
        the answers are in); then per chunk the queries out, the local lookup and the answers back. With
        several chunks the exchanges are asynchronous, so on CUDA (NCCL runs them on its own stream) they
        overlap the local lookups of other chunks. Where :meth:`_own_in_place`, this rank's own queries stay
        out of the routing: the local index answers the caller's batch as it lies, while the first chunk's
        queries are in flight, and the owners' answers land over the others; otherwise the answers land in one
        buffer in send order. Either way one pass puts them in the caller's order (scatter_answers_into).

        Every rank posts the same collectives whatever fails where: a failed routing is this rank's status in
        the counts exchange (every rank raises before queries move); a failed local lookup answers _FAILED and
        is a flag in the all_reduce after the returns (its rank and every rank it owed answers raise)."""
        internal = _internal()
        n, C, W, r = lo.numel(), chunks, self.world, self.rank
        # Where this rank's own queries are answered: in place (:meth:`_own_in_place`: the partition leaves them
        # out); else, on the first and the last rank, as pieces: the partition puts the own piece of each chunk
        # at an end of the chunk's send buffer, looked up there instead of being copied to itself by the
        # exchange. A middle rank's piece lies between other ranks' pieces and goes through the exchange.
        in_place = self._own_in_place()
        pieces = not in_place and r in (0, W - 1)
        part_err = None
        try:
            self._maybe_fault("partition")
            keys, positions, counts = internal.partition_queries(lo, KEY_TYPES[self.key_type], self._splitters ^ _SIGN, C,
                                                                 r if in_place else -1)
        except Exception as e:  # noqa: BLE001  (reported through the counts exchange)
            part_err = e
            counts = torch.zeros((C, W), dtype=torch.int64, device=self.device)
        st.mark("partition")
        sent, got_counts = self._exchange_counts(op, counts.t(), part_err)  # row d: every chunk's count to rank d
        sc, rc = [list(col) for col in zip(*sent)], [list(col) for col in zip(*got_counts)]  # each [chunk][rank]
        starts = [0]
        for c in range(C):
            starts.append(starts[-1] + sum(sc[c]))

        def remote(c: int, row: list[int]) -> tuple[int, int, list[int]]:
            """The exchanged part of chunk c's buffer (start, end) and its splits, given one row of counts."""
            lo, hi = starts[c], starts[c + 1]
            if not pieces:
                return lo, hi, row
            lo, hi = (lo + row[r], hi) if r == 0 else (lo, lo + sum(row[:r]))
            return lo, hi, [0 if j == r else x for j, x in enumerate(row)]

        def failed_answers(*shape: int) -> torch.Tensor:
            return torch.full(shape, _FAILED, dtype=torch.int64, device=self.device)

        overlap = C > 1
        # The queries travel while the own ones are looked up, also in one chunk (unless profiling, which times
        # the exchange as a stage of its own).
        flight = overlap or not st.on
        outgoing = []
        for c in range(C):
            lo_c, hi_c, send = remote(c, sc[c])
            _, _, recv = remote(c, rc[c])
            part = keys[lo_c:hi_c]
            got = keys.new_empty(sum(recv))
            work = dist.all_to_all_single(got, part, recv, send, group=self.group, async_op=flight)
            st.moved(part, got, send)
            outgoing.append((got, work, lo_c, hi_c, send, recv))
        if not overlap:
            st.mark("exchange")
        # The own answers first: they need no exchange, so they run while the first chunk's queries are in flight.
        back = torch.empty((starts[-1], 2), dtype=torch.int64, device=self.device)
        err = None
        if in_place:
            (first, second), err = self._guarded(lambda: self._own_answers(op, lo, values),
                                                 lambda: (failed_answers(n), failed_answers(n)))
        else:
            first, second = (torch.empty(n, dtype=torch.int64, device=self.device) for _ in range(2))
        if pieces:
            for c in range(C):
                a = starts[c] + sum(sc[c][:r])
                mine = keys[a:a + sc[c][r]]
                if mine.numel():
                    ans, e = self._guarded(lambda: self._local_per_query(op, mine, None, values),
                                           lambda: failed_answers(mine.numel(), 2))
                    err = err or e
                    back[a:a + mine.numel()].copy_(ans)
        returns = []
        for c in range(C):
            got, work, lo_c, hi_c, send, recv = outgoing[c]
            if work is not None:
                work.wait()
            ans, e = self._guarded(lambda: self._local_per_query(op, got, None, values),
                                   lambda: failed_answers(got.numel(), 2))
            err = err or e
            if not overlap:
                st.mark("local")
            dest = back[lo_c:hi_c]
            work = dist.all_to_all_single(dest, ans, send, recv, group=self.group, async_op=overlap)
            st.moved(ans, dest, recv)
            returns.append((work, ans))  # ans stays referenced until its send is done
        # Whether any rank's local lookup failed: one integer, instead of a pass over every answer.
        failed = torch.zeros(1, dtype=torch.int64, device=self.device)
        if err is not None:
            failed.fill_(1)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self.group)
        for work, _ in returns:
            if work is not None:
                work.wait()
        st.mark("local" if overlap else "return")
        internal.scatter_answers_into(back, positions[:starts[-1]], first, second)
        if err is not None or bool(failed):
            count_col = 0 if "aggregate" in op else 1
            self._raise_failed(op, err, back[:, count_col] == _FAILED, [x for row in sc for x in row])
        st.mark("scatter")
        return _point_answer(op, first, second, value_dtype)

    def _combine(self, op: str, back: torch.Tensor, order: torch.Tensor, query: torch.Tensor, n: int,
                 value_dtype: torch.dtype | None, dropped: torch.Tensor | None = None):
        """Answers of pieces (in send order) to answers of queries in the caller's order."""
        if order is not None:  # column by column, so that the answers come out contiguous
            cols = [torch.empty(back.shape[0], dtype=torch.int64, device=back.device).index_copy_(0, order, back[:, j])
                    for j in range(2)]
        else:
            cols = [back[:, 0], back[:, 1]]
        is_agg = "aggregate" in op
        if is_agg:
            sum_dtype = torch.float64 if value_dtype is not None and value_dtype.is_floating_point else torch.int64
            count = cols[0]
            s = cols[1].view(torch.float64) if sum_dtype == torch.float64 else cols[1]
        else:
            first, count = cols
        if dropped is not None:
            count = torch.where(dropped, 0, count)
            if is_agg:
                s = torch.where(dropped, 0, s)
            else:
                first = torch.where(dropped, -1, first)
        if query.numel() == n and op in ("lookup", "aggregate", "lookup_fixed", "aggregate_fixed"):
            qcount = count  # one piece per query, in query order
            res = (first if not is_agg else s)
        else:
            qcount = torch.zeros(n, dtype=torch.int64, device=self.device).index_add_(0, query, count)
            if is_agg:
                res = torch.zeros(n, dtype=s.dtype, device=self.device).index_add_(0, query, s)
            else:
                big = torch.where(first < 0, _I64_MAX, first)
                m = torch.full((n,), _I64_MAX, dtype=torch.int64, device=self.device).scatter_reduce_(0, query, big, "amin")
                res = torch.where(m == _I64_MAX, -1, m)
        if dropped is not None:
            qdrop = torch.zeros(n, dtype=torch.int64, device=self.device).index_add_(0, query, dropped.to(torch.int64)) > 0
            qcount = torch.where(qdrop, -1, qcount)
        return Aggregate(qcount, res) if is_agg else Lookup(res, qcount)

    def lookup(self, queries: torch.Tensor) -> Lookup:
        """Point lookups (collective): per query the smallest matching global row ID (-1 on a miss) and the
        number of matches. ``queries``: this rank's 1-D batch (any size, empty too) of the index's key dtype."""
        return self._per_query("lookup", queries, None)

    def lookup_rows(self, queries: torch.Tensor, miss_row: int = -1) -> torch.Tensor:
        """Point lookups answered by the smallest matching global row ID alone, ``miss_row`` (an int) where a
        query has no match: ``lookup(queries).first_row`` with the misses replaced (collective; what
        :class:`~torch_rtindex.IdToRow` maps IDs with)."""
        def check():
            if isinstance(miss_row, bool) or not isinstance(miss_row, int):
                raise TypeError(f"miss_row must be an int, got {type(miss_row).__name__}")
            if not -(2**63) <= miss_row <= _I64_MAX:
                raise ValueError(f"miss_row must fit in int64 (the answers' dtype), got {miss_row}")

        first = self._per_query("lookup", queries, None, call="lookup_rows", check=check).first_row
        return first if miss_row == -1 else torch.where(first < 0, miss_row, first)

    def range_lookup(self, lo: torch.Tensor, hi: torch.Tensor) -> Lookup:
        """Range lookups ``[lo[i], hi[i]]`` (inclusive, in the key type's order) as (smallest global row ID or
        -1, match count), collective."""
        return self._per_query("range_lookup", lo, hi)

    def range_count(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """Per range the number of matching pairs over every shard (int64): ``range_lookup(lo, hi).count``, each
        shard's piece counted by its local index's ``range_count``; collective."""
        return self._per_query("range_count", lo, hi).count

    def aggregate(self, queries: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Point lookups as (match count, sum of the value column over the matches), collective. ``values``:
        this rank's part of the column, one value per row it contributed (see the class doc); passing the
        same unmodified tensor again on every rank skips routing it to the owners again."""
        return self._per_query("aggregate", queries, None, values)

    def range_aggregate(self, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Range lookups as (match count, sum of the value column over the matches), collective."""
        return self._per_query("range_aggregate", lo, hi, values)

    # ---------------------------------------------------------------------------------------- CSR lookups
    def _csr(self, op: str, lo: torch.Tensor, hi: torch.Tensor | None) -> Matches:
        (lo, hi), heads = self._agree(op, lambda: self._check_queries(lo, hi), lambda b: [b[0].numel()])
        st = _Stages(op, self.profile, self.device, self.rank, self._check_s)
        got, order, send_splits, recv_splits, (query,) = self._send_pieces(op, self._range_route(lo, hi), st)

        def local():
            self._maybe_fault("local")
            m = self._local.range(got[:, 0].contiguous(), got[:, 1].contiguous())
            return m.offsets[1:] - m.offsets[:-1], self._to_global(m.rows)

        (counts, rows), err = self._guarded(local, lambda: (
            torch.full((got.shape[0],), _FAILED, dtype=torch.int64, device=self.device),
            torch.empty(0, dtype=torch.int64, device=self.device)))
        st.mark("local")
        back_counts = self._a2a(counts, recv_splits, send_splits, st)
        # Rows per source / destination: sums of the piece counts over each block (one host sync). A failed
        # owner's counts are _FAILED and it sends no rows: counted as 0 on both sides.
        src_totals = _block_sums(counts.clamp(min=0), recv_splits).tolist()
        dst_totals = _block_sums(back_counts.clamp(min=0), send_splits).tolist()
        back_rows = self._a2a(rows, src_totals, dst_totals, st)
        self._raise_failed(op, err, back_counts == _FAILED, send_splits)
        st.mark("return")
        n, P = lo.numel(), order.numel()
        gen_counts = torch.empty_like(back_counts).index_copy_(0, order, back_counts)
        # Start of each piece's rows in back_rows (send order), moved to generation order.
        src_start = torch.empty_like(back_counts).index_copy_(0, order, torch.cumsum(back_counts, 0) - back_counts)
        dst_start = torch.cumsum(gen_counts, 0) - gen_counts
        total = int(back_rows.numel())
        gather = torch.arange(total, device=self.device) + torch.repeat_interleave(src_start - dst_start, gen_counts, output_size=total)
        out_rows = back_rows[gather]
        qcount = torch.zeros(n, dtype=torch.int64, device=self.device).index_add_(0, query, gen_counts) if P else \
            torch.zeros(n, dtype=torch.int64, device=self.device)
        offsets = torch.zeros(n + 1, dtype=torch.int64, device=self.device)
        offsets[1:] = torch.cumsum(qcount, 0)
        st.mark("scatter")
        st.stats.update(queries=n, pieces=P, received=int(got.shape[0]), matches=total)
        self._last_stats = st.stats
        return Matches(offsets, out_rows)

    def lookup_all(self, queries: torch.Tensor) -> Matches:
        """Point lookups returning every matching global row ID as CSR, ascending per query (collective)."""
        return self._csr("lookup_all", queries, None)

    def range(self, lo: torch.Tensor, hi: torch.Tensor) -> Matches:
        """Range lookups ``[lo[i], hi[i]]`` (inclusive), every matching global row ID as CSR, in the local
        index's order within each shard and shards in rank order: (key, row ID) order with cgRX local indexes
        (collective)."""
        return self._csr("range", lo, hi)

    # ------------------------------------------------------------------------------------- capped lookups
    def lookup_all_capped(self, queries: torch.Tensor, capacity: int) -> CappedMatches:
        """:meth:`lookup_all` into a fixed-size answer (:class:`~torch_rtindex.CappedMatches`: the full
        offsets, the first ``capacity`` rows, the true total), collective. The queries are exchanged with exact
        sizes (host synchronizations); :meth:`lookup_all_capped_fixed` has none."""
        return self._capped("lookup_all_capped", queries, None, capacity, None, None)

    def range_capped(self, lo: torch.Tensor, hi: torch.Tensor, capacity: int) -> CappedMatches:
        """:meth:`range` into a fixed-size answer (see :meth:`lookup_all_capped`), collective."""
        return self._capped("range_capped", lo, hi, capacity, None, None)

    def lookup_all_capped_fixed(self, queries: torch.Tensor, capacity: int, query_capacity: int, *,
                                check: bool | None = None) -> Fixed:
        """:meth:`lookup_all_capped` through the fixed-capacity exchange (see :meth:`lookup_fixed`): no host
        synchronization; the answer is :class:`Fixed` ``(CappedMatches, overflowed)``."""
        return self._capped("lookup_all_capped_fixed", queries, None, capacity, query_capacity, check)

    def range_capped_fixed(self, lo: torch.Tensor, hi: torch.Tensor, capacity: int, query_capacity: int, *,
                           check: bool | None = None) -> Fixed:
        """:meth:`range_capped` through the fixed-capacity exchange (see :meth:`lookup_fixed`); a range counts
        one slot at every shard it overlaps."""
        return self._capped("range_capped_fixed", lo, hi, capacity, query_capacity, check)

    def _capped(self, op: str, lo, hi, capacity, query_capacity, check):
        fixed = query_capacity is not None

        def validate():
            batch = self._check_queries(lo, hi)
            self._check_capacity(capacity, "capacity")
            if fixed:
                self._check_capacity(query_capacity, "query_capacity")
            return batch

        if fixed and not self._checks_wanted(check):
            self._check_s = 0.0
            lo, hi = self._as_key_dtype(lo, hi)
            return self._capped_fixed(op, lo, hi, capacity, query_capacity, checked=False)
        (lo, hi), heads = self._agree(op, validate, lambda b: [b[0].numel(), capacity, query_capacity if fixed else -1])
        self._disagree(heads, _HEAD + 1, "capacity", str)
        self._disagree(heads, _HEAD + 2, "query_capacity", str)
        if fixed:
            return self._capped_fixed(op, lo, hi, capacity, query_capacity, checked=True)
        st = _Stages(op, self.profile, self.device, self.rank, self._check_s)
        got, order, send_splits, recv_splits, (query, owner) = self._send_pieces(
            op, self._range_route(lo, hi, with_owner=True), st)
        rlo, rhi = got[:, 0].contiguous(), got[:, 1].contiguous()
        # Per source block: its pieces' full counts and the first `capacity` rows of its answer (never more of
        # a block's rows can land in the caller's first `capacity`).
        def local():
            self._maybe_fault("local")
            parts, start = [], 0
            for s in range(self.world):
                b = recv_splits[s]
                c = self._local.range_capped(rlo[start:start + b], rhi[start:start + b], capacity)
                parts.append(torch.cat([c.offsets[1:] - c.offsets[:-1], self._to_global(c.rows)]))
                start += b
            return torch.cat(parts)

        payload, err = self._guarded(local, lambda: torch.full((sum(recv_splits) + self.world * capacity,), _FAILED,
                                                               dtype=torch.int64, device=self.device))
        st.mark("local")
        back = self._a2a(payload, [b + capacity for b in recv_splits], [b + capacity for b in send_splits], st)
        st.mark("return")
        ends = torch.tensor([b + capacity for b in send_splits], device=self.device).cumsum(0)
        firsts = (ends - ends.new_tensor([b + capacity for b in send_splits]))
        marks = (back[firsts.clamp(max=max(back.numel() - 1, 0))] == _FAILED) & (ends > firsts) if back.numel() else \
            torch.zeros(self.world, dtype=torch.bool, device=self.device)
        self._raise_failed(op, err, marks, [1] * self.world)
        counts_send, rows_from = [], []
        start = 0
        for d in range(self.world):
            counts_send.append(back[start:start + send_splits[d]])
            rows_from.append(back[start + send_splits[d]:start + send_splits[d] + capacity])
            start += send_splits[d] + capacity
        counts_send = torch.cat(counts_send)
        rows_from = torch.cat(rows_from)
        gen_counts = torch.empty_like(counts_send).index_copy_(0, order, counts_send)
        out = self._assemble_capped(gen_counts, owner, query, lo.numel(), rows_from, capacity)
        st.mark("scatter")
        self._last_stats = st.stats
        return out

    def _assemble_capped(self, gen_counts, owner, query, n, rows_from, capacity) -> CappedMatches:
        """A capped answer from the pieces' full counts (generation order), their owners and queries, and each
        owner's first ``capacity`` rows of its block (rows_from [world * capacity]). No host sync."""
        dev = self.device
        P = gen_counts.numel()
        qcount = torch.zeros(n, dtype=torch.int64, device=dev).index_add_(0, query, gen_counts)
        offsets = torch.zeros(n + 1, dtype=torch.int64, device=dev)
        offsets[1:] = torch.cumsum(qcount, 0)
        total = offsets[-1]
        if P == 0 or capacity == 0:
            return CappedMatches(offsets, torch.full((capacity,), -1, dtype=torch.int64, device=dev), total)
        piece_end = torch.cumsum(gen_counts, 0)
        piece_start = piece_end - gen_counts
        # Offset of each piece inside its owner's block answer: exclusive cumsum of counts over the pieces sent
        # to the same owner, in generation order (the block order).
        key = owner * (P + 1) + torch.arange(P, device=dev)
        by_owner = torch.argsort(key)
        c_sorted = gen_counts[by_owner]
        excl = torch.cumsum(c_sorted, 0) - c_sorted
        o_sorted = owner[by_owner]
        block_first = torch.searchsorted(o_sorted, torch.arange(self.world, device=dev))
        base = excl - excl[block_first.clamp(max=P - 1)][o_sorted] if P else excl
        # excl at the block's first piece is the sum of earlier blocks; subtract it
        blk_off = torch.empty_like(base).index_copy_(0, by_owner, base)
        pos = torch.arange(capacity, device=dev)
        p = torch.searchsorted(piece_end, pos, right=True).clamp(max=P - 1)
        j = pos - piece_start[p]
        src = owner[p] * capacity + blk_off[p] + j
        valid = (pos < total) & (blk_off[p] + j < capacity)
        rows = torch.where(valid, rows_from[src.clamp(0, rows_from.numel() - 1)], -1)
        return CappedMatches(offsets, rows, total)

    # ---------------------------------------------------------------------------------- fixed capacity
    def _checks_wanted(self, check: bool | None) -> bool:
        if check is not None:
            return bool(check)
        return self._eager()

    def _eager(self) -> bool:
        """Neither compiling nor capturing a CUDA graph: Python exceptions can be caught and reported."""
        # is_compiling first: Dynamo cannot trace the capture query (it returns a bool, a graph break).
        if torch.compiler.is_compiling():
            return False
        return not (self.device.type == "cuda" and torch.cuda.is_current_stream_capturing())

    def _fixed_local(self, fn, shape: tuple[int, int]):
        """The local stage of a fixed-capacity call: (payload [world, 1 + per-rank answer] with this rank's
        status in column 0, error). In eager mode a failure (out of memory, ...) answers _FAILED with status 1,
        so that this rank still posts the return exchange; compiled or captured, the local stage runs as is."""
        if self._eager():
            ans, err = self._guarded(fn, lambda: torch.full(shape, _FAILED, dtype=torch.int64, device=self.device))
        else:
            ans, err = fn(), None
        status = torch.full((shape[0], 1), int(err is not None), dtype=torch.int64, device=self.device)
        return torch.cat([status, ans.reshape(shape)], dim=1), err

    def _fixed_failed(self, op: str, err: BaseException | None, status: torch.Tensor, checked: bool) -> None:
        """After a fixed-capacity return exchange (``status``: each owner's status): with checks, every rank
        raises if any owner failed (one host synchronization); without, only the failed rank raises (the
        others' answers from a failed owner are undefined: a call without checks reads no flag)."""
        if checked:
            self._raise_failed(op, err, status != 0, [1] * self.world)
        elif err is not None:
            self._raise_failed(op, err, status[:0], [])

    def lookup_fixed(self, queries: torch.Tensor, query_capacity: int, *, check: bool | None = None) -> Fixed:
        """:meth:`lookup` through the fixed-capacity exchange: every rank sends each rank a block of exactly
        ``query_capacity`` query slots (the same int on every rank) holding the block's count and an overflow
        flag, so there is no host synchronization and every shape is fixed (CUDA graphs, ``torch.compile``
        with ``fullgraph=True``). Queries beyond the capacity of their owner's block are dropped (answered
        ``-1, -1``) and :attr:`Fixed.overflowed` is set on every rank.

        ``check``: run the collective input check first (one small all_gather and a host sync). Default: in
        eager mode yes, while compiling or capturing a CUDA graph no; then the inputs' dtypes and shapes must
        match on every rank (they are fixed in a graph anyway).
        """
        return self._fixed("lookup_fixed", queries, None, None, query_capacity, check)

    def range_lookup_fixed(self, lo: torch.Tensor, hi: torch.Tensor, query_capacity: int, *,
                           check: bool | None = None) -> Fixed:
        """:meth:`range_lookup` through the fixed-capacity exchange (see :meth:`lookup_fixed`); a range counts
        one slot at every shard it overlaps."""
        return self._fixed("range_lookup_fixed", lo, hi, None, query_capacity, check)

    def aggregate_fixed(self, queries: torch.Tensor, values: torch.Tensor, query_capacity: int, *,
                        check: bool | None = None) -> Fixed:
        """:meth:`aggregate` through the fixed-capacity exchange (see :meth:`lookup_fixed`)."""
        return self._fixed("aggregate_fixed", queries, None, values, query_capacity, check)

    def range_aggregate_fixed(self, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor, query_capacity: int,
                              *, check: bool | None = None) -> Fixed:
        """:meth:`range_aggregate` through the fixed-capacity exchange (see :meth:`lookup_fixed`)."""
        return self._fixed("range_aggregate_fixed", lo, hi, values, query_capacity, check)

    def _fixed_pieces(self, qlo: torch.Tensor, qhi: torch.Tensor | None):
        """Pieces with fixed shapes: a point query is one piece, a range one piece per rank (valid where the
        range overlaps that rank's shard), in (query, owner) order."""
        n = qlo.numel()
        if qhi is None:
            return torch.arange(n, device=self.device), self._route(qlo), qlo, qlo, None
        o_lo, o_hi = self._route(qlo), self._route(qhi)
        o_hi = torch.maximum(o_lo, o_hi)
        ranks = torch.arange(self.world, device=self.device)
        valid = ((ranks[None] >= o_lo[:, None]) & (ranks[None] <= o_hi[:, None])).reshape(-1)
        query = torch.arange(n, device=self.device).repeat_interleave(self.world, output_size=n * self.world)
        owner = ranks.repeat(n)
        return query, owner, qlo[query], qhi[query], valid

    def _fixed_exchange(self, lo, hi, k: int, qcap: int, st: _Stages):
        """Padded exchange of the pieces of ``lo`` / ``hi`` (``k`` columns: 1 for points, 2 for ranges). Returns
        (received data [world * qcap, k], valid slots, global overflow (0-d bool), each rank's routing status,
        this rank's routing error, and the pieces: (query, owner, valid) of each piece, its position in the send
        buffer, dropped pieces). No host synchronization. In eager mode a failure while routing (out of memory)
        sends empty blocks and status 1 instead of raising, so that every rank posts both exchanges; the caller
        raises after the return (:meth:`_raise_routing`)."""
        dev, W = self.device, self.world
        err, pieces = None, None
        try:
            self._maybe_fault("partition")
            qlo, qhi = self._map_queries(lo, hi)
            query, owner, plo, phi, valid = self._fixed_pieces(qlo, qhi)
            cols = [plo] if k == 1 else [plo, phi]
            P = owner.numel()
            key = owner if valid is None else torch.where(valid, owner, W)
            order = torch.argsort(key, stable=True)
            skey = key[order]
            starts = torch.searchsorted(skey, torch.arange(W + 1, device=dev))
            slot = torch.empty_like(order).index_copy_(0, order, torch.arange(P, device=dev) - starts[skey])
            counts = starts[1:] - starts[:-1]
            live = torch.ones(P, dtype=torch.bool, device=dev) if valid is None else valid
            fits = slot < qcap
            dropped = live & ~fits
            overflow = dropped.any()
            trash = W * qcap
            pos = torch.where(live & fits, owner * qcap + slot, trash)
            data = torch.zeros(trash + 1, k, dtype=torch.int64, device=dev)
            data.index_copy_(0, pos, torch.stack(cols, dim=1))
            data = data[:trash].reshape(W, qcap * k)
            pieces = (query, owner, valid, pos.clamp(max=trash - 1) if trash else pos, dropped)
        except Exception as e:  # noqa: BLE001  (eager: this rank's status, raised after the return exchange)
            if not self._eager():
                raise
            err = e
            counts = torch.zeros(W, dtype=torch.int64, device=dev)
            overflow = torch.zeros((), dtype=torch.bool, device=dev)
            data = torch.zeros((W, qcap * k), dtype=torch.int64, device=dev)
        rdata, rcount, gover, routed = self._padded_exchange(counts, overflow, err, data, st)
        rvalid = (torch.arange(qcap, device=dev)[None] < rcount.clamp(max=qcap)[:, None]).reshape(-1)
        return rdata.reshape(W * qcap, k), rvalid, gover, routed, err, pieces

    def _padded_exchange(self, counts, overflow, err, data, st: _Stages):
        """The fixed-capacity query exchange: every rank sends every rank its block (``data`` [world, slots])
        behind a header of the block's count, this rank's overflow flag and its routing status (1: ``err``).
        Returns (received blocks, their counts, the overflow flag of any rank (0-d bool), each rank's status)."""
        W = self.world
        status = torch.full((W,), int(err is not None), dtype=torch.int64, device=self.device)
        head = torch.stack([counts, overflow.to(torch.int64).expand(W), status], dim=1)
        st.mark("partition")
        got = self._a2a(torch.cat([head, data], dim=1), None, None, st)
        st.mark("exchange")
        return got[:, 3:], got[:, 0], got[:, 1].amax() > 0, got[:, 2]

    def _fixed_answers(self, op: str, fn, shape: tuple[int, int], checked: bool, route_err: BaseException | None,
                       routed: torch.Tensor, st: _Stages) -> torch.Tensor:
        """The fixed-capacity local stage and return exchange: ``fn()`` answers the received blocks (reshaped to
        ``shape``, one row per source rank), the rows go back, and failures are raised (a failed local lookup,
        :meth:`_fixed_failed`; a failed routing, :meth:`_raise_routing`) once every rank has posted both
        exchanges. Returns the answers this rank got back, [world, shape[1]]."""
        payload, err = self._fixed_local(fn, shape)
        st.mark("local")
        got = self._a2a(payload, None, None, st)
        st.mark("return")
        self._fixed_failed(op, err, got[:, 0], checked)
        self._raise_routing(op, route_err, routed, checked)
        return got[:, 1:]

    def _raise_routing(self, op: str, err: BaseException | None, routed: torch.Tensor, checked: bool) -> None:
        """After a fixed-capacity return exchange: the rank whose routing failed raises; with checks every rank
        does (``routed``: each rank's status; one host synchronization)."""
        if err is not None:
            raise ShardedIndexError(f"ShardedIndex.{op}: routing the queries failed on rank {self.rank}: "
                                    f"{type(err).__name__}: {err}", {self.rank: str(err)}) from err
        if checked and bool(routed.any()):
            failed = (routed != 0).nonzero()[:, 0].tolist()
            raise ShardedIndexError(f"ShardedIndex.{op}: routing the queries failed on rank(s) {failed} (see the error "
                                    "raised there); the index is unchanged")

    def _fixed(self, op, lo, hi, values, query_capacity, check):
        checked = self._checks_wanted(check)
        if checked:
            vcode, cached = self._values_header(values)

            def validate():
                batch = self._check_queries(lo, hi)
                self._check_capacity(query_capacity, "query_capacity")
                if values is not None:
                    self._check_values(values)
                return batch

            (lo, hi), heads = self._agree(op, validate, lambda b: [b[0].numel(), query_capacity, cached],
                                          values_code=vcode)
            self._disagree(heads, _HEAD + 1, "query_capacity", str)
            if values is not None:
                self._disagree(heads, 5, "the value dtype", lambda v: str(_VALUE_DTYPES[v]) if v >= 0 else "?")
                cached = all(h[_HEAD + 2] for h in heads)
        else:
            # No check: the value column is routed again (whether every rank has it cached is not known here).
            cached = False
            self._check_s = 0.0
            lo, hi = self._as_key_dtype(lo, hi)
        st = _Stages(op, self.profile, self.device, self.rank, self._check_s)
        local_values = self._route_values(values, st, cached) if values is not None else None
        qcap = query_capacity
        if hi is None and (self.device.type != "cuda" or self.world <= MAX_CUDA_BUCKETS):
            return self._fixed_points(op, lo, local_values, values.dtype if values is not None else None, qcap,
                                      checked, st)
        rdata, rvalid, gover, routed, perr, pieces = self._fixed_exchange(lo, hi, 1 if hi is None else 2, qcap, st)
        rlo = rdata[:, 0].contiguous()
        rhi = None if hi is None else rdata[:, 1].contiguous()
        base = op.removesuffix("_fixed")
        back = self._fixed_answers(op, lambda: self._local_per_query(base, rlo, rhi, local_values),
                                   (self.world, qcap * 2), checked, perr, routed, st).reshape(self.world * qcap, 2)
        query, owner, valid, pos, dropped = pieces
        mine = back[pos] if back.shape[0] else torch.zeros(pos.numel(), 2, dtype=torch.int64, device=self.device)
        if valid is not None:  # a range's pieces at shards it does not overlap contribute nothing
            mine = torch.where(valid[:, None], mine, torch.tensor([-1, 0], device=self.device) if "lookup" in op
                               else torch.zeros(2, dtype=torch.int64, device=self.device))
        out = self._combine(op, mine, None, query, lo.numel(), values.dtype if values is not None else None, dropped)
        st.mark("scatter")
        self._last_stats = st.stats
        return Fixed(out, gover)

    def _fixed_points(self, op, lo, local_values, value_dtype, qcap: int, checked: bool, st: _Stages) -> Fixed:
        """Point queries through the fixed-capacity exchange: put into per-owner blocks of ``qcap`` slots in one
        pass (partition_padded; which queries of an overfull owner fill its block is not specified: the CUDA
        kernel is not stable), and their answers read back by slot in one pass (gather_answers). Fixed shapes,
        no host synchronization."""
        dev, W = self.device, self.world
        internal = _internal()
        part_err = None
        try:
            self._maybe_fault("partition")
            keys, slots, counts = internal.partition_padded(lo, KEY_TYPES[self.key_type], self._splitters ^ _SIGN, qcap)
        except Exception as e:  # noqa: BLE001  (eager: sent as this rank's status, raised after the exchanges)
            if not self._eager():
                raise
            part_err = e
            keys = torch.zeros(W * qcap, dtype=torch.int64, device=dev)
            slots = torch.full((lo.numel(),), -1, dtype=torch.int64, device=dev)
            counts = torch.zeros(W, dtype=torch.int64, device=dev)
        blocks, _, gover, routed = self._padded_exchange(counts, (counts > qcap).any(), part_err, keys.view(W, qcap), st)
        rlo = blocks.contiguous().view(W * qcap)  # slots past a block's count hold key 0: answered, never read
        base = op.removesuffix("_fixed")
        back = self._fixed_answers(op, lambda: self._local_per_query(base, rlo, None, local_values), (W, qcap * 2),
                                   checked, part_err, routed, st).contiguous().view(W * qcap, 2)
        # Dropped queries: first row -1 and count -1 (aggregates: count -1, sum 0).
        first, second = internal.gather_answers(back, slots, -1, 0 if "aggregate" in op else -1)
        st.mark("scatter")
        self._last_stats = st.stats
        return Fixed(_point_answer(op, first, second, value_dtype), gover)

    def _capped_fixed(self, op, lo, hi, capacity, qcap, checked: bool) -> Fixed:
        st = _Stages(op, self.profile, self.device, self.rank, self._check_s)
        rdata, rvalid, gover, routed, perr, pieces = self._fixed_exchange(lo, hi, 2, qcap, st)
        # Slots past a block's count become empty ranges (ordered lo 1 > hi 0), so they add no rows.
        rlo = torch.where(rvalid, rdata[:, 0], 1)
        rhi = torch.where(rvalid, rdata[:, 1], 0)
        def local():
            self._maybe_fault("local")
            parts = []
            for s in range(self.world):
                c = self._local.range_capped(rlo[s * qcap:(s + 1) * qcap].contiguous(), rhi[s * qcap:(s + 1) * qcap].contiguous(), capacity)
                parts.append(torch.cat([c.offsets[1:] - c.offsets[:-1], self._to_global(c.rows)]))
            return torch.stack(parts)

        back = self._fixed_answers(op, local, (self.world, qcap + capacity), checked, perr, routed, st)
        query, owner, valid, pos, dropped = pieces
        counts_from = back[:, :qcap].reshape(-1)
        rows_from = back[:, qcap:].reshape(-1)
        gen_counts = counts_from[pos] if counts_from.numel() else torch.zeros_like(owner)
        gone = dropped if valid is None else (dropped | ~valid)
        gen_counts = torch.where(gone, 0, gen_counts)
        out = self._assemble_capped(gen_counts, owner, query, lo.numel(), rows_from, capacity)
        st.mark("scatter")
        self._last_stats = st.stats
        return Fixed(out, gover)

    # -------------------------------------------------------------------------------------------- updates
    def update(self, insert_keys: torch.Tensor | None = None, insert_rows: torch.Tensor | None = None,
               delete_keys: torch.Tensor | None = None, delete_rows: torch.Tensor | None = None) -> UpdateResult:
        """One batch of insertions and deletions, collective and all-or-nothing across ranks: each rank's keys
        are routed to their owners, every owner checks its part, the ranks agree, and only then does any rank
        change its local index (insert first, delete second, as :meth:`UpdatableCgRXIndex.update`).

        Insertions get fresh global row IDs, numbered after every row ID so far, rank by rank (returned as
        ``rows`` to the rank that inserted them). Deletions remove every pair of a key, or with
        ``delete_rows`` (global row IDs; then on every rank) one pair each. ``inserted``, ``deleted`` and
        ``absent`` are totals over all ranks. Needs ``updatable=True``.

        ``insert_rows`` must be None: the global row IDs of inserted keys are numbered by the index, so that
        every shard's local -> global map stays ascending (pass the keys alone; ``rows`` says what they got).
        Keys and queries follow the dtype policy of :mod:`torch_rtindex.index` (lossless conversions only).
        """
        def validate():
            if not self.updatable:
                raise TypeError("this ShardedIndex was built without updatable=True; its local index takes no updates")
            if insert_rows is not None:
                raise NotImplementedError(
                    "ShardedIndex numbers inserted rows itself (fresh global row IDs after every row so far, rank by "
                    "rank, returned as UpdateResult.rows): pass insert_rows=None")
            ik = insert_keys if insert_keys is not None else torch.empty(0, dtype=self.key_dtype, device=self.device)
            dk = delete_keys if delete_keys is not None else torch.empty(0, dtype=self.key_dtype, device=self.device)
            ik = check_key_tensor(ik, "insert_keys", dtype=self.key_dtype, device=self.device, key_type=self.key_type)
            dk = check_key_tensor(dk, "delete_keys", dtype=self.key_dtype, device=self.device, key_type=self.key_type)
            for t, what in ((ik, "insert_keys"), (dk, "delete_keys")):
                if t.dtype.is_floating_point and t.numel() and bool(torch.isnan(t).any()):
                    raise ValueError(f"{what} contain NaN, which has no place in a key order")
            if delete_rows is not None:
                if not isinstance(delete_rows, torch.Tensor) or delete_rows.dim() != 1 or delete_rows.numel() != dk.numel():
                    raise ValueError("delete_rows must be a 1-D tensor with one global row ID per delete key")
                if delete_rows.dtype not in (torch.int64, torch.int32) or delete_rows.device != self.device:
                    raise TypeError(f"delete_rows must be int64 on {self.device}, got {delete_rows.dtype} on {delete_rows.device}")
            return ik, dk

        got, heads = self._agree("update", validate, lambda kk: [kk[0].numel(), kk[1].numel(), int(delete_rows is not None)])
        self._disagree(heads, _HEAD + 2, "whether delete_rows is given", lambda v: "given" if v else "not given")
        ik, dk = got
        st = _Stages("update", self.profile, self.device, self.rank)
        n_ins = [h[_HEAD] for h in heads]
        first_row = self._num_rows + sum(n_ins[: self.rank])
        new_rows = torch.arange(first_row, first_row + ik.numel(), dtype=torch.int64, device=self.device)
        def route_inserts():
            oi = _ops().map_keys(ik, KEY_TYPES[self.key_type])
            owner = self._route(oi)
            return owner, [oi, new_rows], owner

        def route_deletes():
            od = _ops().map_keys(dk, KEY_TYPES[self.key_type])
            drows = delete_rows.to(torch.int64) if delete_rows is not None else torch.full_like(od, -1)
            return self._route(od), [od, drows]

        ins, i_order, i_send, i_recv, (i_owner,) = self._send_pieces("update", route_inserts, st)
        dels, _, _, _, _ = self._send_pieces("update", route_deletes, st)
        rik, rir = ins[:, 0].contiguous(), ins[:, 1].contiguous()
        rdk, rdr = dels[:, 0].contiguous(), dels[:, 1].contiguous()
        L = self._l2g.numel()

        def plan():
            if L + rik.numel() > MAX_KEYS:
                raise ValueError(f"rank {self.rank}'s local index would exceed 2^32 - 1 row IDs; rebuild the index")
            local_ins = torch.arange(L, L + rik.numel(), dtype=torch.int64, device=self.device)
            if delete_rows is None:
                return local_ins, rdk, None, 0
            # Global -> local row IDs over the rows held so far and the batch's own inserts (inserts first,
            # deletes second): the inserts' global rows arrive in source-rank order, each source's ascending, all
            # above the rows so far, so the extended local -> global map stays ascending. Rows this rank does
            # not hold are absent.
            l2g = torch.cat([self._l2g, rir])
            n = l2g.numel()
            at = torch.searchsorted(l2g, rdr).clamp(max=max(n - 1, 0))
            found = (l2g[at] == rdr) if n else torch.zeros_like(rdr, dtype=torch.bool)
            return local_ins, rdk[found].contiguous(), at[found].contiguous(), int((~found).sum())

        planned, _ = self._agree("update_apply", plan)
        local_ins, pdk, pdr, absent_rows = planned

        # Apply, then record the new local rows before agreeing. If another rank failed to apply (out of
        # memory), this rank undoes its part (_undo_update), so the update is all-or-nothing across ranks.
        res, err, doomed = None, None, None
        saved = (self._l2g, self._src, self._seq, list(self._recv_totals), self._contrib_owner,
                 getattr(self._local, "_next_row", None))
        applied_here = False
        try:  # every local failure up to update_done is this rank's status there (no rank skips it)
            self._maybe_fault("update_apply")
            doomed = self._doomed_pairs(pdk, pdr)
            res = self._local.update(insert_keys=rik, insert_rows=local_ins if rik.numel() else None,
                                     delete_keys=pdk, delete_rows=pdr)
            applied_here = True
            self._maybe_fault("update_record")
            self._l2g = torch.cat([self._l2g, rir])
            srcs = torch.repeat_interleave(torch.arange(self.world, device=self.device),
                                           torch.tensor(i_recv, device=self.device), output_size=sum(i_recv))
            starts = torch.tensor([0] + i_recv, device=self.device).cumsum(0)[:-1]
            base = torch.tensor(self._recv_totals, device=self.device)
            self._src = torch.cat([self._src, srcs])
            self._seq = torch.cat([self._seq, base[srcs] + torch.arange(srcs.numel(), device=self.device) - starts[srcs]])
            self._recv_totals = [a + b for a, b in zip(self._recv_totals, i_recv)]
            self._contrib_owner = torch.cat([self._contrib_owner, i_owner])
            self._plan_values()
        except Exception as e:  # noqa: BLE001  (reported collectively below)
            err = e
            if applied_here:  # applied, but recording it failed: this rank takes its own part back now
                try:
                    self._undo_update(rik, local_ins, doomed, saved)
                except ShardedIndexError as undo_err:
                    err = undo_err
        self._num_rows += sum(n_ins)  # row IDs handed out are used up either way
        self._values_cache = None

        def applied():
            if isinstance(err, ShardedIndexError):  # this rank could not undo its part (message says so)
                raise err
            if err is not None:
                raise RuntimeError(
                    f"applying the update failed here ({type(err).__name__}: {err}); every rank undid its part, "
                    "the index is unchanged"
                ) from err
            return res

        try:
            res, heads2 = self._agree("update_done", applied, lambda r: [r.deleted, r.absent + absent_rows])
        except ShardedIndexError:
            if err is None:  # this rank applied its part and another rank could not: take it back
                self._undo_update(rik, local_ins, doomed, saved)
            raise
        deleted = sum(h[_HEAD] for h in heads2)
        absent = sum(h[_HEAD + 1] for h in heads2)
        self._num_keys += sum(n_ins) - deleted
        st.mark("local")
        self._last_stats = st.stats
        return UpdateResult(inserted=sum(n_ins), deleted=deleted, absent=absent, rows=new_rows)

    def _doomed_pairs(self, keys: torch.Tensor, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The local (ordered key, local row) pairs a deletion of ``keys`` (with ``rows``: of those exact pairs)
        will remove, read before the update so that it can be undone."""
        if keys.numel() == 0:
            return keys, keys.new_empty(0, dtype=torch.int64)
        uk = torch.unique(keys)
        m = self._local.lookup_all(uk)
        okeys = torch.repeat_interleave(uk, m.offsets.diff(), output_size=m.rows.numel())
        orows = m.rows
        if rows is not None:  # local row IDs are unique: a pair is doomed if its row is asked for with its key
            if orows.numel() == 0:
                return okeys, orows
            order = torch.argsort(orows)
            srows, skeys = orows[order], okeys[order]
            r = rows.to(torch.int64)
            pos = torch.searchsorted(srows, r).clamp(max=srows.numel() - 1)
            sel = torch.unique(pos[(srows[pos] == r) & (skeys[pos] == keys)])
            return skeys[sel], srows[sel]
        return okeys, orows

    def _undo_update(self, ins_keys: torch.Tensor, ins_rows: torch.Tensor, doomed, saved) -> None:
        """Takes back this rank's applied part of an update another rank failed to apply: the inserted pairs
        deleted, the deleted ones inserted again, the bookkeeping as it was."""
        try:
            dk, dr = doomed
            self._local.update(insert_keys=dk if dk.numel() else None, insert_rows=dr if dk.numel() else None,
                               delete_keys=ins_keys if ins_keys.numel() else None,
                               delete_rows=ins_rows if ins_keys.numel() else None)
        except Exception as e:  # noqa: BLE001
            raise ShardedIndexError(
                f"ShardedIndex.update: rank {self.rank} could not undo its part of an update another rank failed "
                f"to apply ({type(e).__name__}: {e}); its shard no longer matches the others: reload the index from "
                "a saved state", {self.rank: str(e)}
            ) from e
        self._l2g, self._src, self._seq, self._recv_totals, self._contrib_owner, next_row = saved
        if next_row is not None:
            self._local._next_row = next_row  # the undone insertions' row IDs are free again
        self._plan_values()

    def insert(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult:
        """Inserts this rank's keys (collective; see :meth:`update`: ``rows`` must be None, the index numbers
        the inserted rows)."""
        return self.update(insert_keys=keys, insert_rows=rows)

    def delete(self, keys: torch.Tensor, rows: torch.Tensor | None = None) -> UpdateResult:
        """Deletes every pair of each key, or with ``rows`` the pairs (key, global row ID) (collective)."""
        return self.update(delete_keys=keys, delete_rows=rows)

    # ------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """This rank's part of the index (not collective): its local index's state, the splitters, the
        local -> global row map and the bookkeeping of contributed rows. Load it on the same rank of a group of
        the same size with :meth:`from_state_dict` (collective). For one state of the whole index, see
        :meth:`gathered_state_dict`."""
        return {
            "format": STATE_FORMAT, "version": STATE_VERSION, "rank": self.rank, "world_size": self.world,
            "key_type": self.key_type, "key_dtype": str(self.key_dtype).removeprefix("torch."),
            "splitters": self._splitters, "local_to_global": self._l2g, "source": self._src, "sequence": self._seq,
            "received": list(self._recv_totals), "contributed_owner": self._contrib_owner,
            "num_rows": self._num_rows, "num_keys": self._num_keys, "updatable": self.updatable,
            "local_class": type(self._local).__name__, "local": self._local.state_dict(),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], *, group: dist.ProcessGroup | None = None,
                        device: torch.device | str | None = None, profile: bool = False,
                        local_options: dict[str, Any] | None = None) -> "ShardedIndex":
        """Collective: every rank loads the state its rank saved (:meth:`state_dict`), in a group of the same
        size. ``device``: where to build (default: where the state's tensors are). ``local_options``: keyword
        arguments for the local index class's ``from_state_dict``, for settings a state does not hold (e.g.
        ``{"gpu_budget": ...}`` for :class:`~torch_rtindex.ChunkedIndex` shards)."""
        self = cls.__new__(cls)
        self._setup(group, None, bool(state.get("updatable", False)) if isinstance(state, dict) else False, profile)
        dev_err = None
        try:  # a bad device= on one rank is reported by the header like any other bad input
            dev = torch.device(device) if device is not None else (
                state["local_to_global"].device if isinstance(state, dict) and isinstance(state.get("local_to_global"), torch.Tensor)
                else torch.device("cpu"))
        except Exception as e:  # noqa: BLE001
            dev, dev_err = torch.device("cpu"), e
        self.device = dev
        self.pipeline = _default_pipeline(dev)

        def validate():
            if dev_err is not None:
                raise dev_err
            return self._read_state(state, dev, local_options)

        got, heads = self._agree("load_state_dict", validate, lambda g: [int(state["num_rows"])], device=dev,
                                 key_type=state.get("key_type") if isinstance(state, dict) else None)
        self._disagree(heads, 2, "the key type", lambda v: _KEY_TYPE_NAMES.get(v, "?"))
        self._disagree(heads, 6, "the device type", _device_name)
        self._disagree(heads, _HEAD, "the number of rows", str)
        self._adopt_state(state, got)
        return self

    def _read_state(self, state: dict[str, Any], dev: torch.device, local_options: dict[str, Any] | None) -> tuple:
        """This rank's state checked and its local index rebuilt on ``dev`` (nothing collective)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
            raise ValueError("not a ShardedIndex state of version 1 (from ShardedIndex.state_dict())")
        self._check_served(dev, "the state's tensors (or device=)")
        if state["world_size"] != self.world or state["rank"] != self.rank:
            raise ValueError(
                f"this state is rank {state['rank']} of {state['world_size']}, loaded on rank {self.rank} of "
                f"{self.world}; load each rank's own state in a group of the same size, or use "
                "gathered_state_dict / from_gathered_state to change the number of ranks"
            )
        local_cls = _LOCAL_CLASSES.get(state["local_class"])
        if local_cls is None:
            raise ValueError(f"unknown local index class {state['local_class']!r}")
        t = lambda x: x.to(dev)  # noqa: E731
        local = local_cls.from_state_dict(state["local"], device=dev, **(local_options or {}))
        l2g = t(state["local_to_global"])
        spare = _global_rows_in_shard(local, l2g, int(state["num_rows"]))
        key_dtype = getattr(torch, state["key_dtype"])
        return local, key_dtype, t(state["splitters"]), l2g, t(state["source"]), \
            t(state["sequence"]), t(state["contributed_owner"]), spare

    def _adopt_state(self, state: dict[str, Any], got: tuple) -> None:
        local, self.key_dtype, self._splitters, self._l2g, self._src, self._seq, self._contrib_owner, spare = got
        self._local = local
        self.key_type = state["key_type"]
        self.sample_size = 4096
        self._recv_totals = list(state["received"])
        self._num_rows, self._num_keys = int(state["num_rows"]), int(state["num_keys"])
        self._spare_rows = spare
        self._plan_values()

    def _restore(self, state: dict[str, Any], group: dist.ProcessGroup | None, device: torch.device | None,
                 profile: bool) -> None:
        """Unpickling and deepcopy: this rank's state rebuilt without a collective (each rank reads its own),
        in ``group`` (unpickled: the default group), on the rank and group size it was saved from."""
        self._setup(group, None, bool(state.get("updatable", False)), profile)
        dev = device if device is not None else state["local_to_global"].device
        self.device = dev
        self.pipeline = _default_pipeline(dev)
        self._adopt_state(state, self._read_state(state, dev, None))

    def __getstate__(self) -> dict[str, Any]:
        # Pickling (torch.save(index)) and copy.deepcopy carry this rank's state_dict, never the process group
        # or device structures.
        return self.state_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._restore(state, None, None, False)

    def __deepcopy__(self, memo: dict[int, Any]) -> "ShardedIndex":
        # In this index's group (an unpickled copy takes the default group), with its settings.
        other = type(self).__new__(type(self))
        other._restore(copy.deepcopy(self.state_dict(), memo), self.group, self.device, self.profile)
        other.pipeline, other.sample_size = self.pipeline, self.sample_size
        other._calls = self._calls  # the ranks copy together or not at all: the copies' calls stay matched
        return other

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Collective: replaces this index by the one this rank's ``state`` (:meth:`state_dict`) describes, on
        this index's device and group. All-or-nothing: if any rank's state is rejected, every rank raises and
        keeps its index."""
        fresh = type(self).from_state_dict(state, group=self.group, device=self.device, profile=self.profile)
        pipeline = self.pipeline
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)
        self.pipeline = pipeline

    def gathered_state_dict(self) -> dict[str, Any]:
        """Collective: one state of the whole index on every rank (CPU tensors): every live (key, global row)
        pair, keys as ordered keys, sorted by row. Load it into a group of any size with
        :meth:`from_gathered_state`; it is what one rank would need to rebuild the index alone."""
        def export():  # before the header, so that a failure here is raised on every rank
            self._maybe_fault("export")
            if hasattr(self._local, "_export"):
                okeys, lrows = self._local._export()
            else:  # read-only local index: its keys are the ordered keys in local row order
                okeys = self._local.state_dict()["keys"]
                lrows = torch.arange(okeys.numel(), device=self.device)
            return okeys.cpu(), self._l2g[lrows].cpu() if lrows.numel() else lrows.cpu()

        pairs, _ = self._agree("gathered_state_dict", export)
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, pairs, group=self.group)
        keys = torch.cat([p[0] for p in everyone])
        rows = torch.cat([p[1] for p in everyone])
        rows, order = torch.sort(rows)
        return {"format": GATHERED_FORMAT, "version": STATE_VERSION, "keys": keys[order], "rows": rows,
                "keys_ordered": True, "key_type": self.key_type, "key_dtype": str(self.key_dtype).removeprefix("torch."),
                "num_rows": self._num_rows}

    @classmethod
    def from_gathered_state(cls, state: dict[str, Any], *, device: torch.device | str = "cpu",
                            group: dist.ProcessGroup | None = None, index_factory: Callable[..., Any] | None = None,
                            updatable: bool = False, sample_size: int = 4096, profile: bool = False) -> "ShardedIndex":
        """Collective: a sharded index over a :meth:`gathered_state_dict` state, in a group of any size; every
        rank passes the same state and takes an equal slice of its pairs (global row IDs are kept). Rank r's
        contributed rows (for value columns) are then its slice's."""
        self = cls.__new__(cls)
        self._setup(group, index_factory, updatable, profile)
        self.sample_size = sample_size
        # Everything read from the state is read before the first collective; what fails on one rank is raised
        # on every rank by the build's header (_build's ``failure``).
        try:
            if not isinstance(state, dict) or state.get("format") != GATHERED_FORMAT:
                raise ValueError("not a gathered ShardedIndex state (from ShardedIndex.gathered_state_dict())")
            if isinstance(sample_size, bool) or not isinstance(sample_size, int) or sample_size < 1:
                raise ValueError(f"sample_size must be a positive int, got {sample_size!r}")
            dev = torch.device(device)
            n = state["keys"].numel()
            a, b = n * self.rank // self.world, n * (self.rank + 1) // self.world
            keys = state["keys"][a:b].to(dev).contiguous()
            rows = state["rows"][a:b].to(dev).contiguous()
            key_type, num_rows, key_dtype = state["key_type"], state["num_rows"], getattr(torch, state["key_dtype"])
            failure = None
        except Exception as e:  # noqa: BLE001
            dev, failure = torch.device("cpu"), e
            self.sample_size = 1
            keys = rows = torch.empty(0, dtype=torch.int64)
            key_type, num_rows, key_dtype = None, 0, None
        self.pipeline = _default_pipeline(dev)
        self._build(keys, key_type, rows=rows, mapped=True, num_rows=num_rows, key_dtype=key_dtype, failure=failure)
        return self

    # ----------------------------------------------------------------------------------------- reporting
    @property
    def local_index(self):
        """This rank's local index (over ordered keys, ``key_type="uint64"``, 32-bit local row IDs)."""
        return self._local

    @property
    def splitters(self) -> torch.Tensor:
        """The world - 1 shard borders as keys (the index's key dtype): rank r holds the keys ``k`` with
        ``splitters[r - 1] <= k < splitters[r]`` in the key type's order (rank 0 from the smallest key, the
        last rank up to the largest)."""
        return _ops().unmap_keys(self._splitters ^ _SIGN, KEY_TYPES[self.key_type], self.key_dtype)

    def local_to_global(self) -> torch.Tensor:
        """Global row ID of each local row ID (ascending)."""
        return self._l2g

    def __len__(self) -> int:
        """Keys in the whole index (every rank's shard)."""
        return self._num_keys

    @property
    def local_len(self) -> int:
        """Keys in this rank's shard (not collective)."""
        return len(self._local)

    @property
    def capturable(self) -> bool:
        """Whether the fixed-capacity forms (``*_fixed`` with ``check=False``) can be captured in a CUDA graph:
        where the local index's lookups can (NCCL's ``all_to_all_single`` can); on the CPU trivially, as for the
        other classes. The other forms learn their exchange sizes on the host and cannot be captured."""
        c = getattr(self._local, "capturable", False)
        return bool(c() if callable(c) else c)

    def memory(self) -> dict[str, int]:
        """This rank's bytes (not collective): its local index's parts (``local_`` + the local index's names),
        the local -> global row map and the bookkeeping of contributed rows and value columns."""
        nbytes = lambda *ts: sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))  # noqa: E731
        cache = self._values_cache[2] if self._values_cache is not None else None
        return {
            **{f"local_{k}": v for k, v in self._local.memory().items()},
            "local_to_global": nbytes(self._l2g),
            "bookkeeping": nbytes(self._splitters, self._src, self._seq, self._contrib_owner, *self._value_plan[::2]),
            "value_cache": nbytes(cache),
        }

    def to(self, device: torch.device | str | int) -> "ShardedIndex":
        """Not available: each rank's shard lives on the device its process group serves. To move the index,
        save :meth:`gathered_state_dict` and load it with :meth:`from_gathered_state` (``device=``) in the
        group that serves the new device (or :meth:`state_dict` / :meth:`from_state_dict` per rank)."""
        raise NotImplementedError(
            "ShardedIndex cannot move between devices in place (its shards live where the process group's backend "
            "serves); use gathered_state_dict() and ShardedIndex.from_gathered_state(state, device=..., group=...), "
            "or state_dict() and ShardedIndex.from_state_dict(state, device=...) per rank")

    def cpu(self) -> "ShardedIndex":
        """Not available (see :meth:`to`)."""
        return self.to("cpu")

    def cuda(self, device: torch.device | str | int | None = None) -> "ShardedIndex":
        """Not available (see :meth:`to`)."""
        return self.to("cuda" if device is None else device)

    def stats(self) -> dict[str, Any]:
        """The last collective call on this rank: its per-stage seconds (``partition_s``, ``exchange_s``,
        ``local_s``, ``return_s``, ``scatter_s``; measured only with ``profile=True``, which synchronizes the
        device at each stage boundary) and the bytes it sent (all, and to other ranks) and received."""
        return dict(self._last_stats)

    def __repr__(self) -> str:
        return (f"ShardedIndex(rank={self.rank}/{self.world}, keys={self._num_keys}, local_keys={self.local_len}, "
                f"key_type={self.key_type}, device={self.device}, local={type(self._local).__name__})")


def _point_answer(op: str, first: torch.Tensor, second: torch.Tensor, value_dtype: torch.dtype | None):
    """The two answer columns of a point call as its result: (first row, count), or for aggregates (count, sum
    bits; a floating value column's sums are float64 bits)."""
    if "aggregate" not in op:
        return Lookup(first, second)
    if value_dtype is not None and value_dtype.is_floating_point:
        second = second.view(torch.float64)
    return Aggregate(first, second)


def _group_device_types(group: dist.ProcessGroup) -> frozenset[str]:
    """The device types the group's backend(s) serve (NCCL: cuda; gloo: cpu and cuda); empty if unknown."""
    try:
        return frozenset(d.type for d in group._device_types)
    except Exception:  # noqa: BLE001  (a ProcessGroup without the property: no check)
        return frozenset()


def _group_device(group: dist.ProcessGroup) -> torch.device:
    """The device of the call headers, from the group alone (the rule of ``all_gather_object``): the one device
    type its backend serves, else the CPU where served, else the first type; an accelerator's current device."""
    try:
        types = [d.type for d in group._device_types]
    except Exception:  # noqa: BLE001
        types = []
    kind = types[0] if len(types) == 1 else ("cpu" if not types or "cpu" in types else types[0])
    if kind == "cpu":
        return torch.device("cpu")
    module = getattr(torch, kind, None)
    current = getattr(module, "current_device", None)
    return torch.device(kind, current()) if callable(current) else torch.device(kind)


def _device_name(code: int) -> str:
    return {v: k for k, v in _DEVICE_CODES.items()}.get(code, "?")


def _key_type_or_none(keys: Any, key_type: str | None) -> str | None:
    """The key type for the call header; None where the keys are unusable (the validation reports why)."""
    try:
        return resolve_key_type(keys, key_type)
    except Exception:  # noqa: BLE001
        return None


def _block_sums(values: torch.Tensor, splits: list[int]) -> torch.Tensor:
    """Sums of consecutive blocks of ``values`` of the given sizes."""
    if values.numel() == 0:
        return torch.zeros(len(splits), dtype=torch.int64, device=values.device)
    c = torch.cumsum(values, 0)
    ends = torch.tensor(splits, device=values.device).cumsum(0)
    tot = torch.where(ends > 0, c[(ends - 1).clamp(min=0)], 0)
    return torch.diff(tot, prepend=torch.zeros(1, dtype=tot.dtype, device=tot.device))
