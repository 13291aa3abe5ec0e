"""``torch.save(index, f)`` then ``torch.load(f)`` with torch.load's default ``weights_only=True`` (torch >= 2.6).

An index pickles as its ``state_dict()`` (``IndexBase.__getstate__``): tensors, strings, ints, floats, bools and
lists, which the weights-only unpickler reads by itself. What it refuses is the class that rebuilds the index from
that state, so the index classes are allowlisted here, at import of torch_rtindex. That is safe because loading
runs nothing the file names: the unpickler creates the bare object and calls its ``__setstate__`` with data of
those plain types, which checks the state (``from_state_dict``: format, version, entries, types, then the
constructor's own checks) and builds the index from its keys. ``IdToRow`` (an ``nn.Module`` holding only its ID
buffer and plain settings) re-checks its settings and rebuilds its index the same way.

A file saved with an index has to be loaded in a process that has imported torch_rtindex; otherwise torch's
error names the class to pass to ``torch.serialization.add_safe_globals``.
"""

from __future__ import annotations

import torch

from .cgrx import CgRXIndex
from .cgrx_updatable import UpdatableCgRXIndex
from .chunked import ChunkedIndex
from .embedding import IdToRow
from .rx import RXIndex

SAFE_CLASSES = (RXIndex, CgRXIndex, UpdatableCgRXIndex, ChunkedIndex, IdToRow)


def allow_weights_only_load() -> None:
    add = getattr(torch.serialization, "add_safe_globals", None)  # torch >= 2.4
    if add is not None:
        add(list(SAFE_CLASSES))


allow_weights_only_load()
