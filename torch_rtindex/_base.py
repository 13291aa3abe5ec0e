"""What every index class shares: the lookup methods over the index's operators, argument checks, state
(``state_dict`` / ``load_state_dict`` / ``from_state_dict``, pickling), moving between devices, CUDA stream
bookkeeping and the CUDA-graph capture checks.

A subclass names its operator family (``_OPS``: ``"rx"`` or ``"cgrx"``) and supplies the index-specific parts:
the index tensors every lookup operator takes first (:meth:`IndexBase._index_tensors`), its typed configuration
(:meth:`IndexBase._config`, torch_rtindex/_config.py), its state entries and how to build an index from them.
Every build ends with :meth:`IndexBase._prepare_lookups`, which decides once what each lookup call passes.
"""

from __future__ import annotations

import operator
import os
from typing import Any, ClassVar, TypeVar

import torch

from . import _extension
from ._keys import KEY_TYPES, MAX_KEYS, check_key_tensor, check_queries
from .results import Aggregate, CappedMatches, Lookup, Matches
from .scene import SceneConfig

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_as_lookup = tuple.__new__  # a named tuple from an operator's tuple, without the namedtuple's argument unpacking

IndexT = TypeVar("IndexT", bound="IndexBase")

VALUE_DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64)

# Why an OptiX launch is never captured in a CUDA graph (RX on CUDA, cgRX with backend="optix"): seen on an H100,
# the capture fails inside OptiX with an illegal memory access that poisons the CUDA context for the rest of the
# process, so the API refuses before launching.
OPTIX_CAPTURE_REASON = "OptiX launches fail under capture with an illegal memory access that poisons the CUDA context"

#: How many key bits a query sort orders by (see IndexBase.sort_queries): 2^24 groups of neighbouring keys,
#: three passes of CUB's 8-bit radix sort instead of the eight a full 64-bit sort takes.
QUERY_SORT_BITS = 24
#: The automatic policy sorts batches of at least this many queries before an OptiX traversal.
QUERY_SORT_MIN_BATCH = 1 << 18


def query_sort_bits(smallest: int, largest: int) -> tuple[int, int]:
    """The bit range [begin, end) of ordered keys a query sort orders by, for an index whose ordered keys span
    [smallest, largest] (as int64 bit patterns, in either signed or unsigned order): the QUERY_SORT_BITS bits
    under the highest bit in which the keys differ, since every bit above it is the same for all of them.
    (0, 0) when there is nothing to tell apart."""
    end = ((smallest ^ largest) & (2**64 - 1)).bit_length()
    return max(0, end - QUERY_SORT_BITS), end


def mark_static_address(t: torch.Tensor) -> None:
    """What ``torch._dynamo.mark_static_address(t)`` does (its ``guard=False`` form), without importing
    torch._dynamo: that import (torch.fx's symbolic shapes, torch.distributed's FSDP and more) costs seconds, and
    an index built by eager code must not pay it. tests/test_install_first_call.py checks the two agree."""
    t._dynamo_static_input_type = "unguarded"


def _ops():
    _extension.load()
    return torch.ops.rtindex


def _optix_ops(device: torch.device):
    """The operators, for a call that builds an OptiX scene on ``device``: its OptiX programs are registered
    first (a prebuilt extension picks their architecture for the GPU then, never at import)."""
    _extension.register_optix_programs(device)
    return torch.ops.rtindex


def _version_counter(t: torch.Tensor) -> int | None:
    """A tensor's in-place modification counter (None for inference tensors, which have none)."""
    try:
        return t._version
    except RuntimeError:
        return None


def resolve_device(device: torch.device | str | int) -> torch.device:
    """``device`` as a torch.device with an index for CUDA (an int is a CUDA ordinal, as in ``Tensor.to``)."""
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def check_int(value: Any, name: str, lo: int, hi: int) -> int:
    """An integer argument (Python int, numpy integer or anything with __index__, never a bool) in [lo, hi]."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    v = operator.index(value)
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be in {lo} .. {hi}, got {v}")
    return v


def check_bool(value: Any, name: str) -> bool:
    """A flag argument: True or False, never a truthy stand-in (``"no"`` would read as True)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def check_scene(scene: Any, default: SceneConfig) -> SceneConfig:
    """A ``scene=`` argument: a SceneConfig, or None for the index's default."""
    if scene is None:
        return default
    if not isinstance(scene, SceneConfig):
        raise TypeError(f"scene must be a torch_rtindex.SceneConfig or None, got {type(scene).__name__} {scene!r}")
    return scene


def device_bytes(device: torch.device) -> int:
    """The memory of ``device``, in bytes: the GPU's, or the host's physical memory."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): only the int64 bound below
        return 2**62


def check_capacity(capacity: Any, device: torch.device) -> int | torch.SymInt:
    """A fixed-size answer's capacity (``*_capped``): an int, a numpy integer or a 0-d integer tensor, from 0
    up to what ``device`` can hold: its rows (8 bytes each) are allocated up front, so a capacity past the
    device's memory can never be met and is refused here, with the way out, rather than by the allocator."""
    if isinstance(capacity, torch.Tensor):
        if capacity.dim() != 0 or capacity.dtype.is_floating_point or capacity.dtype.is_complex or capacity.dtype == torch.bool:
            raise TypeError(f"a tensor capacity must be a 0-d integer tensor, got shape {tuple(capacity.shape)} "
                            f"{capacity.dtype}; pass an int")
        capacity = int(capacity)
    elif isinstance(capacity, bool) or not isinstance(capacity, (int, torch.SymInt)):
        if isinstance(capacity, bool) or not hasattr(type(capacity), "__index__"):
            raise TypeError(f"capacity must be an integer, got {type(capacity).__name__} {capacity!r}")
        capacity = operator.index(capacity)  # numpy integers and the like
    if capacity < 0:
        raise ValueError(f"capacity must be non-negative, got {capacity}")
    # Not checked while compiling: a comparison on a symbolic capacity would be one more guard to recompile on.
    if isinstance(capacity, int) and not torch.compiler.is_compiling():
        have = device_bytes(device)
        if capacity > have // 8:
            raise ValueError(
                f"capacity={capacity} asks for {format_bytes(8 * capacity)} of row IDs up front (8 bytes each), more "
                f"than the {device.type} device's {format_bytes(have)} of memory; pass a capacity near the number of "
                "matches you expect (a capped answer's .total is the true count, to retry with)"
            )
    return capacity


def format_bytes(n: int) -> str:
    """Bytes for people: 512 B, 3.4 KiB, 12.0 MiB, 1.1 GiB, 8.0 TiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _article(name: str) -> str:
    return "an" if name[:1] in "AEIOUR" else "a"


class IndexBase:
    """The shared part of :class:`~torch_rtindex.RXIndex`, :class:`~torch_rtindex.CgRXIndex` and
    :class:`~torch_rtindex.UpdatableCgRXIndex` (see each class for its semantics)."""

    #: operator family: the index's operators are ``torch.ops.rtindex.<_OPS>_lookup`` etc.
    _OPS: ClassVar[str]
    #: the operator that counts ranges without visiting their matches (``range_count``), or None: count by lookup
    _RANGE_COUNT_OP: ClassVar[str | None] = None
    #: whether ``range`` returns each query's rows in ascending row order (True) or in key order (False)
    range_rows_ascending: ClassVar[bool]
    _STATE_FORMAT: ClassVar[str]
    _STATE_VERSION: ClassVar[int] = 1
    #: the state's entries besides "format" and "version", and which of them must be tensors
    _STATE_KEYS: ClassVar[tuple[str, ...]]
    _STATE_TENSORS: ClassVar[tuple[str, ...]] = ("keys",)

    key_type: str
    key_dtype: torch.dtype
    device: torch.device
    #: The settings a build fixes (packed into the operators' configuration, or shaping the structure): set once
    #: by the constructor, then refused (__setattr__), so that an attribute never shows a value the lookups ignore.
    _SETTINGS: ClassVar[frozenset[str]] = frozenset({"key_type", "key_dtype", "device"})

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._SETTINGS and name in self.__dict__:
            how = "index.to(device)" if name == "device" else f"a new index with {name}=..."
            raise AttributeError(f"{type(self).__name__}.{name} is fixed when the index is built; use {how}")
        object.__setattr__(self, name, value)

    #: Whether the lookups that answer one row per query (``lookup``, ``range_lookup``, ``aggregate``,
    #: ``range_aggregate``) first sort the queries by key, so that neighbouring threads walk neighbouring parts
    #: of the index, and put the answers back in the caller's order. ``None`` (the default) decides per call:
    #: on CUDA, for indexes that trace rays (where it pays most; see benchmarks/results), and batches of at
    #: least QUERY_SORT_MIN_BATCH queries. ``True`` / ``False`` force it; answers are identical either way.
    #: The sort (a radix sort over QUERY_SORT_BITS bits) is counted in every lookup time the benchmarks report.
    _sort_queries: bool | None = None
    _query_bits: tuple[int, int] = (0, 0)
    _bound: Any = None  # the eager point lookups bound to this index (csrc/bound_lookups.cpp), where they apply

    @property
    def sort_queries(self) -> bool | None:
        return self._sort_queries

    @sort_queries.setter
    def sort_queries(self, value: bool | None) -> None:
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"sort_queries must be True, False or None (decide per batch), got {value!r}")
        self._sort_queries = value
        if "_forms" in self.__dict__:
            self._sort_from = self._query_sort_threshold()
            self._direct_lookup = self._direct_lookup_form()

    # ------------------------------------------------------------------------------------ subclass hooks
    def _index_tensors(self) -> tuple[torch.Tensor, ...]:
        """The operator arguments before ``config, lo, hi``: the index structure the lookups read."""
        raise NotImplementedError

    def _config(self, key_type: str) -> int:
        """The operators' packed ``int config`` for queries of ``key_type`` (the index's own, or "uint64" for
        batches of ordered keys)."""
        raise NotImplementedError

    def _op_family(self) -> str:
        """The lookup operators' name prefix (``torch.ops.rtindex.<family>_lookup`` etc.)."""
        return self._OPS

    def _prepare_lookups(self) -> None:
        """Decides once per build what every lookup call needs: the operators, their leading arguments and the
        two configurations, so that a call is one operator call after its checks."""
        ops = _ops()
        family = self._op_family()
        # The overloads themselves: calling a packet resolves its overload on every call.
        self._forms = {f: getattr(ops, f"{family}_{f}").default for f in ("lookup", "lookup_rows", "lookup_csr", "lookup_csr_capped", "aggregate")}
        count_op = self._RANGE_COUNT_OP
        self._forms["range_count"] = None if count_op is None else getattr(ops, count_op).default
        self._lead = self._index_tensors()
        if self.device.type == "cuda":
            # Under torch.compile(mode="reduce-overhead") the index's tensors are graph inputs; marked static, the
            # CUDA graphs read them where they are instead of copying them into the graph's own buffers every call
            # (a guard recompiles when a rebuild replaces them).
            for t in self._lead:
                mark_static_address(t)
        self._cfg = self._config(self.key_type)
        self._cfg_ordered = self._config("uint64")
        self._cuda = self.device.type == "cuda"
        self._capture_blocked = self._capture_refusal() is not None  # the backend decides it, once
        self._sort_from = self._query_sort_threshold()
        self._direct_lookup = self._direct_lookup_form()

    def _direct_lookup_form(self):
        """The point-lookup operator when a well-formed batch needs nothing but the operator call (no query
        sort at any size, no capture refusal to make), else None: lookup() then skips _call's decisions.
        Also binds the eager form of that call (:attr:`_bound`, set exactly where this is not None)."""
        if self._sort_from != float("inf") or (self._cuda and self._capture_blocked):
            self._bound = None
            return None
        self._bound = _extension.bound_lookups(self._op_family(), self._lead, self._cfg, self.key_dtype, self.device,
                                               Lookup)
        return self._forms["lookup"]

    def _capture_refusal(self) -> str | None:
        """Why this index's CUDA lookups cannot be captured in a CUDA graph, or None if they can."""
        return None

    def _traces_rays(self) -> bool:
        """Whether this index's CUDA lookups are OptiX launches (the automatic query sort's criterion)."""
        return False

    def _num_values(self) -> tuple[int, bool]:
        """How many values a value column needs: (n, exact) — exactly n, or at least n."""
        return len(self), True

    def _state_entries(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _from_valid_state(cls: type[IndexT], state: dict[str, Any]) -> IndexT:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def memory(self) -> dict[str, int]:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ building
    def _check_build_keys(self, keys: torch.Tensor, what: str = "keys") -> torch.Tensor:
        """Checks keys to index (dtype, device, count, no NaN); returns them in the key dtype (lossless
        conversions only: int32 keys inserted into an int64 index)."""
        given, keys = keys, check_key_tensor(keys, what, dtype=self.key_dtype, device=self.device,
                                             key_type=self.key_type)
        if keys is not given:
            self._record_input_uses((given,))  # read by the conversion, on the current stream
        if keys.numel() > MAX_KEYS:
            raise ValueError(f"an index holds at most 2^32 - 1 keys, got {keys.numel()}")
        if keys.dtype.is_floating_point and keys.numel() and bool(torch.isnan(keys).any()):
            raise ValueError(f"{what} contain NaN, which has no place in a key order; drop or replace those rows")
        return keys

    def _map_keys(self, keys: torch.Tensor, what: str = "keys") -> torch.Tensor:
        """Checks keys to index (_check_build_keys) and maps them to ordered keys."""
        keys = self._check_build_keys(keys, what)
        ordered = _ops().map_keys(keys, KEY_TYPES[self.key_type])
        self._record_input_uses((keys,))
        return ordered

    def _note_raw_key_span(self, keys: torch.Tensor) -> None:
        """_note_key_span from keys in the index's key dtype, without an ordered copy of them all: the mapping
        is monotone, so the extremes' ordered keys are the ordered keys' extremes."""
        if keys.numel() == 0 or self.key_type == "uint64":  # ordered keys are the keys' own bits
            self._note_key_span(keys.view(torch.int64))
            return
        ends = torch.stack(list(torch.aminmax(keys)))
        self._note_key_span(_ops().map_keys(ends, KEY_TYPES[self.key_type]), already_sorted=True)

    def _note_key_span(self, ordered: torch.Tensor, already_sorted: bool = False) -> None:
        """Remembers which key bits a query sort should order by (query_sort_bits); called by every build.
        ``already_sorted``: ``ordered`` is sorted (as int64), so its ends are its extremes."""
        if ordered.numel() == 0:
            self._query_bits = (0, 0)
            return
        # Signed order either way: query_sort_bits says why that is enough.
        smallest, largest = (ordered[0], ordered[-1]) if already_sorted else torch.aminmax(ordered)
        self._query_bits = query_sort_bits(int(smallest), int(largest))

    def _keys_from_ordered(self, ordered: torch.Tensor) -> torch.Tensor:
        """Ordered keys (row order) back in the index's key dtype: what state_dict() saves, taken from the
        index's own structure, so a saved state equals the index even if the caller's key tensor changed since."""
        return _ops().unmap_keys(ordered, KEY_TYPES[self.key_type], self.key_dtype)

    def _all_or_nothing(self, build, *args: Any, **kwargs: Any) -> None:
        """Runs ``build``; if it raises, the index is restored exactly as it was."""
        saved = dict(self.__dict__)
        try:
            build(*args, **kwargs)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    # --------------------------------------------------------------------------- streams and CUDA graphs
    def _refuse_capture(self, method: str, needs_host_sync: bool) -> None:
        """Eager CUDA only: refuse, with the reason, a CUDA-graph capture that cannot work."""
        if self.device.type != "cuda" or torch.compiler.is_compiling() or not torch.cuda.is_current_stream_capturing():
            return
        name = type(self).__name__
        reason = self._capture_refusal()
        if reason is not None:  # a form this class cannot have: NotImplementedError (a RuntimeError too)
            raise NotImplementedError(
                f"{name} lookups on CUDA cannot be captured in a CUDA graph (torch.cuda.graph, or torch.compile "
                f"with mode='reduce-overhead'): {reason}"
            )
        if needs_host_sync:
            raise RuntimeError(
                f"{name}.{method} cannot be captured in a CUDA graph: its output size depends on the data, and "
                f"learning it needs a host synchronization; use {method}_capped(..., capacity), which returns a "
                "fixed-size answer and the true match count"
            )

    def _record_input_uses(self, inputs: tuple[torch.Tensor, ...]) -> None:
        """Eager CUDA builds: the inputs are read on the current stream, so a tensor made on another stream and
        freed by the caller right after the call must not be handed out again before they have been read.
        (Lookup operators record what they read themselves, in C++: csrc/core/cuda_utils.h record_uses.)"""
        if self.device.type != "cuda" or torch.compiler.is_compiling():
            return
        stream = torch.cuda.current_stream(self.device)
        for t in inputs:
            t.record_stream(stream)

    # --------------------------------------------------------------------------------------------- lookups
    def _plain_batch(self, t: Any) -> bool:
        """The common case every check passes without a word: a 1-D contiguous tensor of the key dtype, here."""
        return (type(t) is torch.Tensor and t.dtype == self.key_dtype and t.device == self.device and t.dim() == 1
                and t.is_contiguous())

    def _check_queries(self, lo: torch.Tensor, hi: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The checks every query batch passes: a fast test of the common case, the explaining one otherwise.
        Returns the batch in the key dtype (lossless conversions only)."""
        if hi is not None or not self._plain_batch(lo):
            return check_queries(lo, hi, dtype=self.key_dtype, device=self.device, key_type=self.key_type)
        return lo, hi

    def _call(self, form: str, lo: torch.Tensor, hi: torch.Tensor | None, method: str, needs_host_sync: bool = False,
              values: torch.Tensor | None = None, capacity: Any = None, miss_row: int = -1,
              configs: tuple[int, int] | None = None) -> Any:
        """One lookup: checks, then the index's operator on the caller's queries (mapped inside the kernels);
        answers that come one per query go through a query sort where :attr:`sort_queries` says so. ``configs``:
        the operator configurations for the caller's key type and for ordered keys, if not the index's own."""
        cfg, cfg_ordered = configs if configs is not None else (self._cfg, self._cfg_ordered)
        lo, hi = self._check_queries(lo, hi)
        if self._cuda and (needs_host_sync or self._capture_blocked):
            self._refuse_capture(method, needs_host_sync)
        extra = ()
        if values is not None:
            extra = (self._values(values),)  # the caller's column, or a contiguous copy of it
        elif capacity is not None:
            extra = (capacity,)
        elif form == "lookup_rows":
            extra = (miss_row,)
        op = self._forms[form]
        if form in ("lookup_csr", "lookup_csr_capped") or not self._wants_query_sort(lo.numel()):
            return op(*self._lead, cfg, lo, hi, *extra)
        # The query sort: the operator sees ordered keys in key order; its answers go back to the caller's order
        # (a permutation, so every answer lands exactly once).
        ops = _ops()
        kt = KEY_TYPES[self.key_type]
        qlo, qhi = (ops.map_keys(lo, kt), None) if hi is None else ops.map_ranges(lo, hi, kt)
        slo, order = ops.sort_queries(qlo, *self._query_bits)
        shi = None if qhi is None else qhi.index_select(0, order)
        out = op(*self._lead, cfg_ordered, slo, shi, *extra)
        if isinstance(out, torch.Tensor):
            return torch.empty_like(out).index_copy_(0, order, out)
        return tuple(torch.empty_like(t).index_copy_(0, order, t) for t in out)

    def _point_call_as(self, form: str, lo: torch.Tensor, key_type: str, values: torch.Tensor | None = None,
                       cfg: int | None = None) -> Any:
        """A point ``form`` ("lookup" or "aggregate") on queries of another key type whose ordered keys are this
        index's keys (an index over ordered keys, key type "uint64": a shard answering its caller's queries as
        they are, the kernels mapping them). The caller checked the queries; no query sort. ``cfg``: the operator
        configuration, if not this index's for ``key_type``."""
        extra = () if values is None else (self._values(values),)
        return self._forms[form](*self._lead, self._config(key_type) if cfg is None else cfg, lo, None, *extra)

    def _query_sort_threshold(self) -> float:
        """The batch size from which lookups sort their queries (infinite: never), decided once per build and
        per change of :attr:`sort_queries`, so that a call compares one number."""
        never = float("inf")
        if self._query_bits[1] == 0:
            return never  # one distinct key (or none): nothing to order by
        if self._sort_queries is not None:
            return 0 if self._sort_queries else never
        return QUERY_SORT_MIN_BATCH if self.device.type == "cuda" and self._traces_rays() else never

    def _wants_query_sort(self, n: int) -> bool:
        if self._sort_from == float("inf"):
            return False  # decided without looking at n (no guard on a symbolic batch size when compiling)
        return self._sort_from <= n < 2**31  # the sort takes fewer than 2^31 keys

    def _values(self, values: torch.Tensor) -> torch.Tensor:
        n, exact = self._num_values()
        if not isinstance(values, torch.Tensor) or values.dim() != 1 or values.numel() < n or (exact and values.numel() != n):
            need = f"one value per key ({n})" if exact else f"a value for every row ID (at least {n} values)"
            raise ValueError(f"values must be a 1-D tensor with {need}")
        if values.device != self.device:
            raise ValueError(f"values are on {values.device} but the index is on {self.device}")
        if values.dtype not in VALUE_DTYPES:
            raise TypeError(f"values must be int32, int64, float32 or float64, got {values.dtype}")
        return values.contiguous()

    def lookup(self, queries: torch.Tensor) -> Lookup:
        """Point lookups: per query the smallest matching row ID (-1 on a miss) and the match count.

        Args:
            queries: 1-D contiguous tensor with the index's key dtype, on the index's device.
        """
        # The direct paths leave the shape and contiguity checks to the operator, which makes them anyway, and run
        # the explaining checks only when it refused. Eager calls go through the bound call
        # (csrc/bound_lookups.cpp), which hands back (None) a batch that is not plain or a call under a
        # __torch_function__ mode; those, and torch.compile, call the operator. The dtype and device stay checked
        # on that path: the kernels also take int64 storage for a uint64 index's queries, which the Python API
        # refuses, and queries on another device would reach that device's kernel (a meta batch, the meta kernel).
        # lookup_rows does the same.
        direct = self._direct_lookup
        if direct is not None and type(queries) is torch.Tensor:
            try:
                if not torch.compiler.is_compiling():
                    out = self._bound.lookup(queries)
                    if out is not None:
                        return out
                if queries.dtype is self.key_dtype and queries.device == self.device:
                    return _as_lookup(Lookup, direct(*self._lead, self._cfg, queries, None))
            except RuntimeError:
                self._check_queries(queries, None)  # the explaining error, if the batch was what failed
                raise
        return Lookup(*self._call("lookup", queries, None, "lookup"))

    def lookup_rows(self, queries: torch.Tensor, miss_row: int = -1) -> torch.Tensor:
        """Point lookups answered by the smallest matching row ID alone, ``miss_row`` where a query has no
        match: ``lookup(queries).first_row`` with the misses replaced, in one operator call with one result
        tensor (what :class:`~torch_rtindex.IdToRow` maps IDs with).

        Args:
            queries: 1-D contiguous tensor with the index's key dtype, on the index's device.
            miss_row: the answer of a query without a match (an int; e.g. a default embedding row).
        """
        if (self._direct_lookup is not None and type(miss_row) is int and _I64_MIN <= miss_row <= _I64_MAX
                and type(queries) is torch.Tensor):  # as lookup()
            try:
                if not torch.compiler.is_compiling():
                    out = self._bound.lookup_rows(queries, miss_row)
                    if out is not None:
                        return out
                if queries.dtype is self.key_dtype and queries.device == self.device:
                    return self._forms["lookup_rows"](*self._lead, self._cfg, queries, None, miss_row)
            except RuntimeError:
                self._check_queries(queries, None)
                raise
        if isinstance(miss_row, bool) or not isinstance(miss_row, int):
            raise TypeError(f"miss_row must be an int, got {type(miss_row).__name__}")
        if not _I64_MIN <= miss_row <= _I64_MAX:
            raise ValueError(f"miss_row must fit in int64 (the answers' dtype), got {miss_row}")
        return self._call("lookup_rows", queries, None, "lookup_rows", miss_row=miss_row)

    def range_lookup(self, lo: torch.Tensor, hi: torch.Tensor) -> Lookup:
        """Range lookups ``[lo[i], hi[i]]`` (inclusive, in the key type's order; empty when ``lo[i] > hi[i]``)
        answered as (smallest matching row ID or -1, match count)."""
        return Lookup(*self._call("lookup", lo, hi, "range_lookup"))

    def range_count(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """Per range ``[lo[i], hi[i]]`` (inclusive; 0 when ``lo[i] > hi[i]``) the number of matching pairs, int64:
        ``range_lookup(lo, hi).count`` without the first row, so a cgRX index over sorted pairs answers it from
        the positions of the range's two ends (a search and a short scan, or two searches: whatever the range's
        width) instead of visiting every match."""
        if self._forms["range_count"] is None:
            return self.range_lookup(lo, hi).count
        return self._call("range_count", lo, hi, "range_count")

    def lookup_all(self, queries: torch.Tensor) -> Matches:
        """Point lookups returning every matching row ID (duplicates) as CSR, ascending row IDs per query.

        The output size depends on the data: one host synchronization, and under ``torch.compile`` it needs
        ``capture_dynamic_output_shape_ops``; :meth:`lookup_all_capped` has neither.
        """
        return Matches(*self._call("lookup_csr", queries, None, "lookup_all", True))

    def range(self, lo: torch.Tensor, hi: torch.Tensor) -> Matches:
        """Range lookups ``[lo[i], hi[i]]`` (inclusive), every matching row ID as CSR: ascending row IDs per query
        (RXIndex) or (key, row ID) order (cgRX indexes; see ``range_rows_ascending``).

        One host synchronization, as :meth:`lookup_all`; :meth:`range_capped` has none.
        """
        return Matches(*self._call("lookup_csr", lo, hi, "range", True))

    def lookup_all_capped(self, queries: torch.Tensor, capacity: int) -> CappedMatches:
        """:meth:`lookup_all` into a fixed-size answer: at most ``capacity`` row IDs, plus the true match count.

        No host synchronization and fixed output shapes: usable in CUDA graphs (where the index's lookups are,
        see :attr:`capturable`) and under ``torch.compile`` without ``capture_dynamic_output_shape_ops``.
        See :class:`~torch_rtindex.CappedMatches` for what a truncated answer holds.
        """
        capacity = check_capacity(capacity, self.device)
        return CappedMatches(*self._call("lookup_csr_capped", queries, None, "lookup_all_capped", capacity=capacity))

    def range_capped(self, lo: torch.Tensor, hi: torch.Tensor, capacity: int) -> CappedMatches:
        """:meth:`range` into a fixed-size answer of ``capacity`` row IDs plus the true match count (see
        :meth:`lookup_all_capped`)."""
        capacity = check_capacity(capacity, self.device)
        return CappedMatches(*self._call("lookup_csr_capped", lo, hi, "range_capped", capacity=capacity))

    def aggregate(self, queries: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Point lookups answered as (match count, sum of ``values[row]`` over the matches); sums of integer
        values are int64, of floating values float64."""
        return Aggregate(*self._call("aggregate", queries, None, "aggregate", values=values))

    def range_aggregate(self, lo: torch.Tensor, hi: torch.Tensor, values: torch.Tensor) -> Aggregate:
        """Range lookups answered as (match count, sum of ``values[row]`` over the matches)."""
        return Aggregate(*self._call("aggregate", lo, hi, "range_aggregate", values=values))

    @property
    def capturable(self) -> bool:
        """Whether this index's fixed-size lookups (``lookup``, ``range_lookup``, ``aggregate``,
        ``range_aggregate``, ``*_capped``) can be captured in a CUDA graph: CPU indexes trivially, CUDA indexes
        unless their lookups are OptiX launches."""
        return not self._cuda or not self._capture_blocked

    # ---------------------------------------------------------------------------------- state and devices
    def state_dict(self) -> dict[str, Any]:
        """The index's keys and configuration (never its device structures, which are rebuilt on load).

        Holds only tensors, strings, ints, floats, bools and lists, so ``torch.save(index.state_dict(), f)``
        and ``torch.load(f)`` (``weights_only=True``) round-trip it.
        """
        return {"format": self._STATE_FORMAT, "version": self._STATE_VERSION, **self._state_entries()}

    @classmethod
    def _check_state(cls, state: dict[str, Any]) -> None:
        name, a = cls.__name__, _article(cls.__name__)
        if not isinstance(state, dict):
            raise TypeError(f"{a} {name} state is a dict (from {name}.state_dict()), got {type(state).__name__}")
        expected = ("format", "version", *cls._STATE_KEYS)
        missing = [k for k in expected if k not in state]
        unexpected = sorted(str(k) for k in state if k not in expected)
        if missing or unexpected:
            raise KeyError(f"not {a} {name} state: missing entries {missing}, unexpected entries {unexpected}")
        if state["format"] != cls._STATE_FORMAT or state["version"] != cls._STATE_VERSION:
            raise ValueError(
                f"not {a} {name} state of version {cls._STATE_VERSION}: format {state['format']!r}, "
                f"version {state['version']!r}"
            )
        for k in cls._STATE_TENSORS:
            if not isinstance(state[k], torch.Tensor):
                raise TypeError(f"the state's {k} must be a tensor, got {type(state[k]).__name__}")

    @classmethod
    def from_state_dict(cls: type[IndexT], state: dict[str, Any], device: torch.device | str | None = None) -> IndexT:
        """A new index built from :meth:`state_dict`'s output, on ``device`` (default: where the state's keys are)."""
        cls._check_state(state)
        if device is not None:
            state = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
        return cls._from_valid_state(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replaces this index by the one ``state`` describes, built on this index's device.

        All-or-nothing: if the state is malformed or its keys are rejected, the index is unchanged.
        """
        fresh = type(self).from_state_dict(state, device=self.device)
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)

    def to(self: IndexT, device: torch.device | str | int) -> IndexT:
        """The index on ``device``: a new index built there from the state, or ``self`` if it is there already
        (as ``Tensor.to``). Device structures (an OptiX BVH is bound to its device address) are rebuilt, not copied.
        """
        target = resolve_device(device)
        if target == self.device:
            return self
        return type(self).from_state_dict(self.state_dict(), device=target)

    def cpu(self: IndexT) -> IndexT:
        """The index on the CPU (see :meth:`to`)."""
        return self.to("cpu")

    def cuda(self: IndexT, device: torch.device | str | int | None = None) -> IndexT:
        """The index on a CUDA device, the current one by default (see :meth:`to`)."""
        return self.to("cuda" if device is None else device if isinstance(device, (torch.device, str)) else int(device))

    def __getstate__(self) -> dict[str, Any]:
        # Pickling (torch.save(index), copy.deepcopy) goes through state_dict: structures are rebuilt, never copied.
        return self.state_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(type(self).from_state_dict(state).__dict__)
