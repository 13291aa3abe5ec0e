"""IdToRow: raw 64-bit IDs (user IDs, item IDs, hashed features) to the rows of an embedding table.

Recommendation and ranking models key their embedding tables by sparse 64-bit IDs; the table itself is dense.
:class:`IdToRow` holds the ID of every table row and maps a batch of raw IDs to row indices with one point
lookup, inside or outside ``torch.compile``::

    id_to_row = IdToRow(table_ids, miss="default", default_row=0)
    rows = id_to_row(raw_ids)          # same shape as raw_ids, int64
    out = embedding_bag(rows)
"""

from __future__ import annotations

from typing import Any

import torch

from ._base import _version_counter
from .cgrx import CgRXIndex
from .rx import RXIndex

MISS_POLICIES = ("default", "minus_one", "error")

# Integer ID dtypes. Point lookups compare bits, so int64 storage of unsigned IDs needs no key_type.
_ID_DTYPES = tuple(d for d in (torch.int64, torch.int32, getattr(torch, "uint64", None)) if d is not None)


class MissingIdError(KeyError):
    """Raised by :class:`IdToRow` with ``miss="error"`` when some IDs are not in the table."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


def _raise_on_misses(rows: torch.Tensor, ids: torch.Tensor) -> None:
    """miss="error": one host sync to learn whether any ID missed; runs outside any compiled graph (see
    _eager_miss_check)."""
    missed = rows < 0
    if bool(missed.any()):
        bad = ids.reshape(-1)[missed.reshape(-1)]
        examples = ", ".join(str(v) for v in bad[:5].tolist())
        raise MissingIdError(
            f"IdToRow: {bad.numel()} of {ids.numel()} IDs are not in the table (e.g. {examples}); "
            "use miss='default' or miss='minus_one' to map unknown IDs instead"
        )


_eager_miss_check = None


def _miss_check():
    """_raise_on_misses behind torch.compiler.disable, made on first use: the decorator imports torch._dynamo,
    which would otherwise cost every `import torch_rtindex` most of its time."""
    global _eager_miss_check
    if _eager_miss_check is None:
        _eager_miss_check = torch.compiler.disable(_raise_on_misses)
    return _eager_miss_check


INDEX_KINDS = {"cgrx": CgRXIndex, "rx": RXIndex}


def _index_class(kind: str):
    """The index class of an ``index=`` name; "sharded" is imported on first use (it imports torch.distributed)."""
    if kind == "sharded":
        from .distributed import ShardedIndex

        return ShardedIndex
    return INDEX_KINDS[kind]


class IdToRow(torch.nn.Module):
    """Maps raw IDs to embedding-table rows: row ``i`` of the table has ID ``ids[i]``.

    Args:
        ids: 1-D tensor of the table's IDs (int64, int32 or uint64), one per row, on the device the lookups
            will run on. Duplicate IDs are allowed; an ID then maps to the smallest of its rows.
        miss: what an ID that is not in the table maps to:

            - ``"default"``: ``default_row`` (e.g. a shared out-of-vocabulary row, or a padding row);
            - ``"minus_one"``: ``-1`` (mask it yourself; ``-1`` is no valid index for ``nn.Embedding``);
            - ``"error"``: raise :class:`MissingIdError` (a ``KeyError``) naming some missing IDs. This needs a
              host synchronization on every call, and under ``torch.compile`` it is a graph break (the check
              runs eagerly, so ``fullgraph=True`` refuses it). The other two policies are synchronization- and
              graph-break-free.
        default_row: the row misses map to with ``miss="default"`` (a non-negative int; it may be
            ``len(ids)``, a row appended to the table for unknown IDs).
        index: ``"cgrx"`` (default: :class:`CgRXIndex` with the backend chosen for the device, on GPUs without
            RT cores a radix-table search, faster than ``torch.searchsorted`` over the sorted IDs and
            capturable in CUDA graphs), ``"rx"`` (:class:`RXIndex`, one triangle per ID) or ``"sharded"``
            (:class:`~torch_rtindex.distributed.ShardedIndex` over the default process group: ``ids`` are this
            rank's rows of a row-wise sharded table, rows are global, and building and every call are
            collective).

    The IDs are the buffer ``ids``, so ``.to()``, ``.cuda()``, ``state_dict()`` and ``load_state_dict()``
    work as for any module; the index over them is rebuilt whenever the buffer moves or is loaded
    (``load_state_dict`` accepts a different number of IDs than the module holds). Assigning a new tensor
    to ``ids`` or modifying it in place is picked up by the next eager call; under ``torch.compile``
    call :meth:`rebuild` instead.
    """

    ids: torch.Tensor

    def __init__(self, ids: torch.Tensor, *, miss: str = "default", default_row: int = 0, index: str = "cgrx") -> None:
        super().__init__()
        if index not in INDEX_KINDS and index != "sharded":
            raise ValueError(f"index must be one of {sorted([*INDEX_KINDS, 'sharded'])}, got {index!r}")
        self.index_kind = index
        if miss not in MISS_POLICIES:
            raise ValueError(f"miss must be one of {MISS_POLICIES}, got {miss!r}")
        if isinstance(default_row, bool) or not isinstance(default_row, int) or not 0 <= default_row < 2**63:
            raise ValueError(
                f"default_row must be a non-negative int64, got {default_row!r}; use miss='minus_one' for -1"
            )
        self.miss = miss
        self.default_row = default_row
        self.register_buffer("ids", self._check_ids(ids))
        self._index: RXIndex | CgRXIndex | None = None
        self._indexed: tuple[torch.Tensor, int | None] | None = None
        self.rebuild()

    @staticmethod
    def _check_ids(ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dim() != 1:
            raise ValueError(f"ids must be 1-D (one ID per table row), got shape {tuple(ids.shape)}")
        if ids.dtype not in _ID_DTYPES:
            raise TypeError(f"ids must be int64, int32 or uint64, got {ids.dtype}")
        return ids

    def rebuild(self, ids: torch.Tensor | None = None) -> None:
        """Re-indexes the table IDs: the given ones (which replace the buffer) or the buffer's current ones."""
        if ids is not None:
            self.ids = self._check_ids(ids)
        ids = self.ids
        if ids.device.type == "meta":  # a module on the meta device has shapes, not IDs, to index
            self._index, self._indexed = None, None
            return
        self._index = _index_class(self.index_kind)(ids.contiguous())
        self._indexed = (ids, _version_counter(ids))

    def _index_is_current(self) -> bool:
        indexed = self._indexed
        if indexed is None:
            return False
        # The buffer straight from _buffers: Module.__getattr__ costs more than the rest of this check.
        ids = self._buffers.get("ids")
        # A version of None: an inference tensor, which has no version counter (and cannot be written in place).
        return indexed[0] is ids and (indexed[1] is None or ids._version == indexed[1])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Row indices (int64, same shape as ``ids``) of raw IDs of any shape; misses follow ``miss``.

        ``ids`` must have the dtype and device of the table's IDs.
        """
        if not torch.compiler.is_compiling():
            # An eager plain batch (1-D, contiguous, the IDs' dtype and device): the index's bound call, which
            # hands anything else back as None (csrc/bound_lookups.cpp).
            bound = getattr(self._index, "_bound", None)
            miss = self.miss
            if bound is not None and miss != "error" and type(ids) is torch.Tensor and self._index_is_current():
                rows = bound.lookup_rows(ids, self.default_row if miss == "default" else -1)
                if rows is not None:
                    return rows
            if not isinstance(ids, torch.Tensor):
                raise TypeError(f"IdToRow takes a torch.Tensor of IDs, got {type(ids).__name__}")
            if not self._index_is_current():
                self.rebuild()
        if self._index is None:
            raise RuntimeError(f"IdToRow holds no index on device {self.ids.device}; move it to a real device")
        index = self._index
        flat = ids if ids.dim() == 1 and ids.is_contiguous() else ids.reshape(-1).contiguous()
        default = self.miss == "default"
        if hasattr(index, "lookup_rows"):  # the miss row written by the lookup's own kernel: one operator call
            rows = index.lookup_rows(flat, self.default_row if default else -1)
        else:
            rows = index.lookup(flat).first_row
            if default:
                rows = torch.where(rows < 0, self.default_row, rows)
        if flat is not ids:
            rows = rows.view(ids.shape)
        if self.miss == "error":
            _miss_check()(rows, ids)
        return rows

    def __len__(self) -> int:
        return self.ids.numel()

    def extra_repr(self) -> str:
        default = f", default_row={self.default_row}" if self.miss == "default" else ""
        return f"num_ids={self.ids.numel()}, dtype={self.ids.dtype}, index={self.index_kind}, miss={self.miss!r}{default}"

    # nn.Module hooks: the index follows the buffer.
    def __getstate__(self) -> dict[str, Any]:
        # Pickling and copy.deepcopy carry the IDs buffer, not the index: the copy builds its own.
        state = super().__getstate__()
        state["_index"], state["_indexed"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # torch.load(weights_only=True) may build this from any file (torch_rtindex/_serialization.py): the
        # constructor's checks again before the index is built.
        kind, miss, row = (getattr(self, k, None) for k in ("index_kind", "miss", "default_row"))
        if kind not in INDEX_KINDS or miss not in MISS_POLICIES or type(row) is not int or row < 0:
            raise ValueError(f"not an IdToRow state: index={kind!r}, miss={miss!r}, default_row={row!r}")
        self._check_ids(getattr(self, "ids", None))
        self.rebuild()

    def _apply(self, fn: Any, recurse: bool = True) -> "IdToRow":
        super()._apply(fn, recurse)
        self.rebuild()
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
        loaded = state_dict.get(prefix + "ids")
        if isinstance(loaded, torch.Tensor):
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
        if isinstance(loaded, torch.Tensor):
            self.rebuild()
