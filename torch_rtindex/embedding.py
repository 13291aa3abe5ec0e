"""IdToRow: raw 64-bit IDs (user IDs, item IDs, hashed features) to the rows of an embedding table.

Recommendation and ranking models key their embedding tables by sparse 64-bit IDs; the table itself is dense.
:class:`IdToRow` holds the ID of every table row and maps a batch of raw IDs to row indices with one point
lookup, inside or outside ``torch.compile``::

    id_to_row = IdToRow(table_ids, miss="default", default_row=0)
    rows = id_to_row(raw_ids)          # same shape as raw_ids, int64
    out = embedding_bag(rows)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

import torch

from ._base import _version_counter
from ._config import check_option
from ._keys import as_key_dtype
from .index import Index, IndexKind, MissPolicy

# The table's ID dtypes (an index over them answers point lookups by their bits, so int64 storage of unsigned IDs
# needs no key_type) and the key types of an index built elsewhere that maps IDs.
_ID_DTYPES = tuple(d for d in (torch.int64, torch.int32, getattr(torch, "uint64", None)) if d is not None)
_ID_KEY_TYPES = ("int64", "int32", "uint64")


class MissingIdError(KeyError):
    """Raised by :class:`IdToRow` with ``miss="error"`` when some IDs are not in the table."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


def _raise_on_misses(rows: torch.Tensor, ids: torch.Tensor) -> None:
    """miss="error": one host sync to learn whether any ID missed (rows of -1)."""
    missed = rows < 0
    if bool(missed.any()):
        bad = ids.reshape(-1)[missed.reshape(-1)]
        examples = ", ".join(str(v) for v in bad[:5].tolist())
        raise MissingIdError(
            f"IdToRow: {bad.numel()} of {ids.numel()} IDs are not in the table (e.g. {examples}); "
            "use miss='default' or miss='minus_one' to map unknown IDs instead"
        )


_miss_op_defined = False


def _define_miss_op() -> None:
    """``torch.ops.rtindex_embedding.raise_on_misses``: miss="error" inside a compiled graph. An operator, so
    that torch.compile(fullgraph=True) keeps the check in the graph (a Python branch on the answer's values would
    break it) and it raises MissingIdError when the graph runs; it returns the rows (a copy: an operator's output
    may not alias its input), so that the check is never dropped. Defined when a module first takes
    miss="error", eagerly, rather than at import (defining an operator costs every import a noticeable time)."""
    global _miss_op_defined
    if _miss_op_defined:
        return

    @torch.library.custom_op("rtindex_embedding::raise_on_misses", mutates_args=())
    def raise_on_misses(rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        _raise_on_misses(rows, ids)
        return rows.clone()

    @raise_on_misses.register_fake
    def _(rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(rows)

    _miss_op_defined = True


def _index_class(kind: str):
    """The index class of an ``index=`` name, imported on first use ("sharded" imports torch.distributed)."""
    if kind == "cgrx":
        from .cgrx import CgRXIndex

        return CgRXIndex
    if kind == "rx":
        from .rx import RXIndex

        return RXIndex
    if kind == "chunked":
        from .chunked import ChunkedIndex

        return ChunkedIndex
    from .distributed import ShardedIndex

    return ShardedIndex


class IdToRow(torch.nn.Module):
    """Maps raw IDs to embedding-table rows: row ``i`` of the table has ID ``ids[i]``.

    Args:
        ids: 1-D tensor of the table's IDs (int64, int32 or uint64), one per row, on the device the lookups
            will run on. Duplicate IDs are allowed; an ID then maps to the smallest of its rows. ``None`` where
            ``index`` is an index built already.
        miss: what an ID that is not in the table maps to:

            - ``"default"``: ``default_row`` (e.g. a shared out-of-vocabulary row, or a padding row);
            - ``"minus_one"``: ``-1`` (mask it yourself; ``-1`` is no valid index for ``nn.Embedding``);
            - ``"error"``: raise :class:`MissingIdError` (a ``KeyError``) naming some missing IDs. This needs a
              host synchronization on every call; under ``torch.compile`` (``fullgraph=True`` too) the check is
              an operator of the graph, which raises when the graph runs. The other two policies are
              synchronization-free.
        default_row: the row misses map to with ``miss="default"``: a row of the table, ``0 .. len(ids)``
            (``len(ids)``: a row appended to the table for unknown IDs).
        index: the index that maps the IDs, through its ``lookup_rows`` (the :class:`~torch_rtindex.Index`
            protocol). A name builds it over ``ids``: ``"cgrx"`` (default: :class:`~torch_rtindex.CgRXIndex`
            with the backend chosen for the device, on GPUs without RT cores a radix-table search, faster than
            ``torch.searchsorted`` over the sorted IDs and capturable in CUDA graphs), ``"rx"``
            (:class:`~torch_rtindex.RXIndex`), ``"chunked"`` (:class:`~torch_rtindex.ChunkedIndex`: more IDs than
            the GPU holds, in host memory) or ``"sharded"``
            (:class:`~torch_rtindex.distributed.ShardedIndex`: ``ids`` are this rank's rows of a row-wise sharded
            table, rows are global, and building and every call are collective). Or an index built already over
            the table's IDs (any class, e.g. a ``ShardedIndex`` over a process group of your own), with ``ids``
            None: row ``i`` is then the index's row ID ``i``.
        index_options: keyword arguments of the named index's constructor (e.g. ``{"backend": "radix"}``,
            ``{"gpu_budget": 2**30}``, ``{"group": group}``); only with a name.

    With a name, the IDs are the buffer ``ids``, so ``.to()``, ``.cuda()``, ``state_dict()`` and
    ``load_state_dict()`` work as for any module; the index over them is rebuilt whenever the buffer moves or is
    loaded (``load_state_dict`` accepts a different number of IDs than the module holds). Assigning a new tensor
    to ``ids`` or modifying it in place is picked up by the next eager call; under ``torch.compile`` call
    :meth:`rebuild` instead. With an index built already, the module holds that index: ``state_dict()`` holds
    the index's state, ``.to()`` moves it (``index.to``), and pickling pickles it.
    """

    def __init__(self, ids: torch.Tensor | None = None, *, miss: MissPolicy = "default", default_row: int = 0,
                 index: IndexKind | Index = "cgrx", index_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.miss = miss
        self._index: Index | None = None
        self.default_row = default_row
        self._indexed: tuple[torch.Tensor, int | None] | None = None
        if isinstance(index, str):
            self.index_kind = check_option(index, "index", IndexKind)
            if index_options is not None and not isinstance(index_options, Mapping):
                raise TypeError(f"index_options must be a dict of the {index!r} index's keyword arguments, got "
                                f"{type(index_options).__name__}")
            self.index_options = dict(index_options or {})
            self.register_buffer("ids", self._check_ids(ids))
            self.rebuild()
            return
        if ids is not None or index_options is not None:
            raise ValueError("an index built already holds the table's IDs: pass IdToRow(index=index) without ids "
                             "and index_options, or ids with index='cgrx', 'rx', 'chunked' or 'sharded'")
        self.index_kind, self.index_options = None, {}
        self._index = self._check_index(index)
        self._check_default_row(len(index))

    @property
    def miss(self) -> MissPolicy:
        """The miss policy; it may be changed between calls."""
        return self._miss

    @miss.setter
    def miss(self, value: MissPolicy) -> None:
        check_option(value, "miss", MissPolicy)
        if value == "default" and self.__dict__.get("_index") is not None:
            self._check_default_row(len(self._index), value)
        self._miss = value
        if value == "error":
            _define_miss_op()

    @property
    def default_row(self) -> int:
        """The row misses map to with miss="default"; it may be changed between calls (checked as at
        construction)."""
        return self._default_row

    @default_row.setter
    def default_row(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"default_row must be a row of the table (an int >= 0), got {value!r}; "
                             "use miss='minus_one' for -1")
        if self.__dict__.get("_index") is not None:
            self._check_default_row(len(self._index), default_row=value)
        self._default_row = value

    # ------------------------------------------------------------------------------------------ checks
    @staticmethod
    def _check_ids(ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dim() != 1:
            raise ValueError(f"ids must be 1-D (one ID per table row), got shape {tuple(ids.shape)}")
        if ids.dtype not in _ID_DTYPES:
            raise TypeError(f"ids must be int64, int32 or uint64, got {ids.dtype}")
        return ids

    @staticmethod
    def _check_index(index: Any) -> Index:
        if not callable(getattr(index, "lookup_rows", None)) or not hasattr(index, "key_type"):
            raise TypeError(
                "index must be 'cgrx', 'rx', 'chunked', 'sharded' or an index built already (a torch_rtindex.Index: "
                f"IdToRow maps IDs with its lookup_rows(ids, miss_row)), got {type(index).__name__}"
            )
        if index.key_type not in _ID_KEY_TYPES:
            raise ValueError(f"IDs are integers: an index over {index.key_type} keys maps no IDs; build it over "
                             f"int64, int32 or uint64 IDs")
        return index

    def _check_default_row(self, num_ids: int, miss: str | None = None, default_row: int | None = None) -> None:
        """default_row names a row of the table: one of its ``num_ids`` rows, or the row appended after them.
        ``miss`` / ``default_row``: values about to be set, if not the current ones."""
        miss = self.miss if miss is None else miss
        row = self.default_row if default_row is None else default_row
        if miss == "default" and row > num_ids:
            raise ValueError(
                f"default_row={row} is no row of a table of {num_ids} IDs: pass a row in 0 .. {num_ids} "
                f"({num_ids}: a row appended for unknown IDs), or miss='minus_one' to mask misses yourself"
            )

    # ------------------------------------------------------------------------------------------ the index
    @property
    def index(self) -> Index | None:
        """The index that maps the IDs (None on the meta device, which has no IDs to index)."""
        return self._index

    def rebuild(self, ids: torch.Tensor | None = None) -> None:
        """Re-indexes the table IDs: the given ones (which replace the buffer) or the buffer's current ones.
        All-or-nothing: if the IDs are refused, the module is unchanged."""
        if self.index_kind is None:
            raise RuntimeError("this IdToRow maps IDs with an index built elsewhere: update or rebuild that index")
        ids = self.ids if ids is None else self._check_ids(ids)
        if ids.device.type == "meta":  # a module on the meta device has shapes, not IDs, to index
            self.ids, self._index, self._indexed = ids, None, None
            return
        index = self._check_index(_index_class(self.index_kind)(ids.contiguous(), **self.index_options))
        self._check_default_row(len(index))
        self.ids, self._index, self._indexed = ids, index, (ids, _version_counter(ids))

    def _index_is_current(self) -> bool:
        if self.index_kind is None:
            return True  # an index built elsewhere is the caller's to keep current
        indexed = self._indexed
        if indexed is None:
            return False
        # The buffer straight from _buffers: Module.__getattr__ costs more than the rest of this check.
        ids = self._buffers.get("ids")
        # A version of None: an inference tensor, which has no version counter (and cannot be written in place).
        return indexed[0] is ids and (indexed[1] is None or ids._version == indexed[1])

    # ------------------------------------------------------------------------------------------- mapping
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Row indices (int64, same shape as ``ids``) of raw IDs of any shape; misses follow ``miss``.

        ``ids`` are on the table's device, in the table IDs' dtype or one that converts to it exactly (int32 IDs
        on an int64 table).
        """
        if not torch.compiler.is_compiling():
            # An eager plain batch (1-D, contiguous, the IDs' dtype and device): the index's bound call, which
            # hands anything else back as None (csrc/bound_lookups.cpp).
            bound = getattr(self._index, "_bound", None)
            miss = self._miss  # the properties' values, without their calls
            if bound is not None and miss != "error" and type(ids) is torch.Tensor and self._index_is_current():
                rows = bound.lookup_rows(ids, self._default_row if miss == "default" else -1)
                if rows is not None:
                    return rows
            if not isinstance(ids, torch.Tensor):
                raise TypeError(f"IdToRow takes a torch.Tensor of IDs, got {type(ids).__name__}")
            if not self._index_is_current():
                self.rebuild()
        index = self._index
        if index is None:
            raise RuntimeError(f"IdToRow holds no index on device {self.ids.device}; move it to a real device")
        flat = ids if ids.dim() == 1 and ids.is_contiguous() else ids.reshape(-1).contiguous()
        flat = as_key_dtype(flat, "ids", dtype=index.key_dtype, key_type=index.key_type, holder="the table",
                            noun="IDs")
        rows = index.lookup_rows(flat, self.default_row if self.miss == "default" else -1)
        if self.miss == "error":
            if torch.compiler.is_compiling():
                rows = torch.ops.rtindex_embedding.raise_on_misses(rows, flat)
            else:
                _raise_on_misses(rows, flat)
        return rows if rows.shape == ids.shape else rows.view(ids.shape)

    def __len__(self) -> int:
        return self.ids.numel() if self.index_kind is not None else len(self._index)

    def extra_repr(self) -> str:
        default = f", default_row={self.default_row}" if self.miss == "default" else ""
        if self.index_kind is None:
            return f"index={type(self._index).__name__}, num_ids={len(self)}, miss={self.miss!r}{default}"
        options = f", index_options={self.index_options}" if self.index_options else ""
        return (f"num_ids={self.ids.numel()}, dtype={self.ids.dtype}, index={self.index_kind}{options}, "
                f"miss={self.miss!r}{default}")

    # ------------------------------------------------------------- nn.Module hooks: the index follows the IDs
    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.index_kind is None:  # an index built elsewhere has no IDs buffer: its own state stands for it
            destination[prefix + "index_state"] = self._index.state_dict()

    def __getstate__(self) -> dict[str, Any]:
        # Pickling and copy.deepcopy carry the IDs buffer, not an index built over it: the copy builds its own.
        # An index built elsewhere is carried (it pickles as its state).
        state = super().__getstate__()
        if self.index_kind is not None:
            state["_index"], state["_indexed"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # torch.load(weights_only=True) may build this from any file (torch_rtindex/_serialization.py): the
        # constructor's checks again before the index is built. ("miss" and "default_row": states saved before
        # they were properties.)
        state = dict(state)
        miss = state.pop("_miss", state.pop("miss", None))
        row = state.pop("_default_row", state.pop("default_row", None))
        kind, options = state.get("index_kind"), state.setdefault("index_options", {})
        built = state.get("_index") if kind is None else None
        state["_index"] = None  # until the settings are checked
        super().__setstate__(state)
        try:
            if kind not in (None, *get_args(IndexKind)) or not isinstance(options, dict):
                raise ValueError("unknown index")
            self.miss, self.default_row = miss, row
        except ValueError:
            raise ValueError(f"not an IdToRow state: index={kind!r}, miss={miss!r}, default_row={row!r}") from None
        if kind is None:
            self._index = self._check_index(built)
            self._check_default_row(len(self._index))
            return
        self._check_ids(getattr(self, "ids", None))
        self.rebuild()

    def _apply(self, fn: Any, recurse: bool = True) -> "IdToRow":
        super()._apply(fn, recurse)
        if self.index_kind is not None:
            self.rebuild()
        elif self._index is not None:
            # Where fn sends a tensor of the index's device (.to, .cuda, .cpu): the index goes there too.
            target = fn(torch.empty(0, dtype=torch.int64, device=self._index.device)).device
            if target != self._index.device:
                self._index = self._index.to(target)
        return self

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        if self.index_kind is None:
            key = prefix + "index_state"
            super()._load_from_state_dict(
                state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
            )
            if key not in state_dict:
                missing_keys.append(key)
                return
            unexpected_keys[:] = [k for k in unexpected_keys if k != key]
            try:
                self._index.load_state_dict(state_dict[key])  # all-or-nothing: a refused state changes nothing
                self._check_default_row(len(self._index))
            except (TypeError, ValueError, KeyError) as e:
                error_msgs.append(f"{key}: {e}")
            return
        loaded = state_dict.get(prefix + "ids")
        before = (self.ids, self._index, self._indexed) if isinstance(loaded, torch.Tensor) else None
        if before is not None:
            try:
                # A table may have grown or shrunk since it was saved: take the saved IDs as they are
                # (dtype and length), on this module's device, instead of copying into the current buffer.
                self.ids = self._check_ids(loaded.detach().to(self.ids.device, copy=True))
            except (TypeError, ValueError) as e:
                error_msgs.append(f"{prefix}ids: {e}")
                return
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if before is not None:
            try:
                self.rebuild()
            except (TypeError, ValueError) as e:  # e.g. default_row past the loaded table: keep the module as it was
                self.ids, self._index, self._indexed = before
                error_msgs.append(f"{prefix}ids: {e}")
