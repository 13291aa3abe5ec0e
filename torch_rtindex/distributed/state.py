"""Building a sharded index (collective) and its states: per rank (``state_dict`` / ``from_state_dict``), one
gathered state of the whole index (``gathered_state_dict`` / ``from_gathered_state``, any group size), and the
non-collective rebuild behind pickling and deepcopy."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from .._keys import KEY_TYPES, MAX_KEYS, check_key_tensor, resolve_key_type
from ..cgrx import CgRXIndex
from ..cgrx_updatable import UpdatableCgRXIndex
from ..chunked import ChunkedIndex
from ..rx import RXIndex
from . import exchange, header, points, routing, stages
from .values import plan_values

_LOCAL_CLASSES = {c.__name__: c for c in (CgRXIndex, UpdatableCgRXIndex, RXIndex, ChunkedIndex)}
STATE_FORMAT = "torch_rtindex.ShardedIndex"
GATHERED_FORMAT = "torch_rtindex.ShardedIndex.gathered"
STATE_VERSION = 1


def default_factory(updatable: bool) -> Callable[..., Any]:
    return UpdatableCgRXIndex if updatable else CgRXIndex


def check_keys(ix, keys: torch.Tensor, key_type: str | None, what: str = "keys") -> str:
    if not isinstance(keys, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(keys).__name__}")
    kt = resolve_key_type(keys, key_type)
    check_key_tensor(keys, what, dtype=keys.dtype, device=keys.device)
    if keys.dtype.is_floating_point and keys.numel() and bool(torch.isnan(keys).any()):
        raise ValueError(f"{what} contain NaN, which has no place in a key order; drop or replace those rows")
    return kt


def build(ix, keys: torch.Tensor, key_type: str | None, rows: torch.Tensor | None = None,
           mapped: bool = False, num_rows: int | None = None, key_dtype: torch.dtype | None = None,
           failure: BaseException | None = None) -> None:
    """Collective build. ``rows``/``mapped``/``num_rows``: from a gathered state (ordered keys with their
    global row IDs). ``failure``: this rank's error while reading that state, raised on every rank."""
    device = keys.device if isinstance(keys, torch.Tensor) else torch.device("cpu")

    def validate():
        if failure is not None:
            raise failure
        if mapped:
            header.check_served(ix, device, "the keys")
            return key_type, keys
        kt = check_keys(ix, keys, key_type)
        header.check_served(ix, device, "the keys")
        if keys.numel() > MAX_KEYS:
            raise ValueError(f"a rank holds at most 2^32 - 1 keys, got {keys.numel()}")
        return kt, header.ops().map_keys(keys, KEY_TYPES[kt])  # mapped here: a failure is this rank's status

    (kt, ordered), heads = header.agree(
        ix, "build", validate, lambda r: [keys.numel(), ix.sample_size, *ix.point_routing.header()],
        key_type=key_type if mapped else header.key_type_or_none(keys, key_type),
        key_dtype=key_dtype if mapped else getattr(keys, "dtype", None), device=device,
    )
    header.disagree(heads, 2, "the key type", lambda v: header.KEY_TYPE_NAMES.get(v, "?"))
    header.disagree(heads, 3, "the key dtype", lambda v: str(header.CODE_DTYPES.get(v, "?")))
    header.disagree(heads, 6, "the device type of the keys", header.device_name)
    header.disagree(heads, header.HEAD + 1, "sample_size", str)  # the sizes of the samples' all_gather
    header.disagree(heads, header.HEAD + 2, "point_routing.min_chunk_queries", str)
    header.disagree(heads, header.HEAD + 3, "point_routing.own_queries", str)
    ix.key_type = kt
    ix.key_dtype = key_dtype if mapped else keys.dtype
    ix.device = device
    counts = [h[header.HEAD] for h in heads]
    offset = sum(counts[: ix.rank])
    st = stages.Stages("build", ix.profile, device, ix.rank)
    if rows is None:
        rows = torch.arange(offset, offset + ordered.numel(), dtype=torch.int64, device=device)
    routing.set_splitters(ix, routing.choose_splitters(ix, ordered, counts))

    def route():
        owner = routing.route(ix, ordered)
        return owner, [ordered, rows], owner

    got, _, send_splits, recv_splits, (owner,) = exchange.send_pieces(ix, "build", route, st)
    rkeys, rrows = got[:, 0].contiguous(), got[:, 1].contiguous()
    if mapped:  # from a gathered state: rows arrive in no particular order
        by_row = torch.argsort(rrows)
        rkeys, rrows = rkeys[by_row].contiguous(), rrows[by_row].contiguous()
        src_order = by_row
    else:
        src_order = None

    total_rows = int(num_rows) if num_rows is not None else sum(counts)

    def make_local():
        local = ix.index_factory(rkeys, key_type="uint64")
        if ix.updatable and not hasattr(local, "update"):
            raise TypeError(f"updatable=True needs a local index with update(); {type(local).__name__} has none")
        return local, routing.global_rows_in_shard(local, rrows, total_rows)

    (local, ix._spare_rows), _ = header.agree(ix, "build_done", make_local, device=device)
    st.mark("local")
    ix._local = local
    ix._l2g = rrows
    # Where each local row's value comes from in an exchange of value columns (aggregate): its source rank
    # and its position among the rows that source sent here, in the source's contributed order.
    src = torch.repeat_interleave(torch.arange(ix.world, device=device), torch.tensor(recv_splits, device=device),
                                  output_size=sum(recv_splits))
    starts = torch.tensor([0] + recv_splits, device=device).cumsum(0)[:-1]
    seq = torch.arange(src.numel(), device=device) - starts[src]
    if src_order is not None:
        src, seq = src[src_order], seq[src_order]
    ix._src, ix._seq = src, seq
    ix._recv_totals = list(recv_splits)  # rows received from each source so far
    ix._contrib_owner = owner  # owner of each row this rank contributed, in contributed order
    ix._num_rows = total_rows
    ix._num_keys = sum(counts)
    plan_values(ix)
    st.stats.update(keys=ordered.numel(), local_keys=rkeys.numel())
    ix._last_stats = st.stats


def state_dict(ix) -> dict[str, Any]:
    """This rank's part of the index (not collective): its local index's state, the splitters, the
    local -> global row map and the bookkeeping of contributed rows. Load it on the same rank of a group of
    the same size with :meth:`from_state_dict` (collective). For one state of the whole index, see
    :meth:`gathered_state_dict`."""
    return {
        "format": STATE_FORMAT, "version": STATE_VERSION, "rank": ix.rank, "world_size": ix.world,
        "key_type": ix.key_type, "key_dtype": str(ix.key_dtype).removeprefix("torch."),
        "splitters": ix._splitters, "local_to_global": ix._l2g, "source": ix._src, "sequence": ix._seq,
        "received": list(ix._recv_totals), "contributed_owner": ix._contrib_owner,
        "num_rows": ix._num_rows, "num_keys": ix._num_keys, "updatable": ix.updatable,
        "local_class": type(ix._local).__name__, "local": ix._local.state_dict(),
    }


def from_state_dict(cls, state: dict[str, Any], *, group: dist.ProcessGroup | None = None,
                    device: torch.device | str | None = None, profile: bool = False,
                    local_options: dict[str, Any] | None = None, point_routing: Any = None) -> Any:
    """Collective: every rank loads the state its rank saved (:meth:`state_dict`), in a group of the same
    size. ``device``: where to build (default: where the state's tensors are). ``local_options``: keyword
    arguments for the local index class's ``from_state_dict``, for settings a state does not hold (e.g.
    ``{"gpu_budget": ...}`` for :class:`~torch_rtindex.ChunkedIndex` shards)."""
    ix = cls.__new__(cls)
    ix._setup(group, None, bool(state.get("updatable", False)) if isinstance(state, dict) else False, profile,
              point_routing)
    dev_err = None
    try:  # a bad device= on one rank is reported by the header like any other bad input
        dev = torch.device(device) if device is not None else (
            state["local_to_global"].device if isinstance(state, dict) and isinstance(state.get("local_to_global"), torch.Tensor)
            else torch.device("cpu"))
    except Exception as e:  # noqa: BLE001
        dev, dev_err = torch.device("cpu"), e
    ix.device = dev
    ix.pipeline = points.default_pipeline(dev)

    def validate():
        if dev_err is not None:
            raise dev_err
        _check_routing(point_routing)
        return read_state(ix, state, dev, local_options)

    got, heads = header.agree(ix, "load_state_dict", validate,
                              lambda g: [int(state["num_rows"]), *ix.point_routing.header()], device=dev,
                              key_type=state.get("key_type") if isinstance(state, dict) else None)
    header.disagree(heads, 2, "the key type", lambda v: header.KEY_TYPE_NAMES.get(v, "?"))
    header.disagree(heads, 6, "the device type", header.device_name)
    header.disagree(heads, header.HEAD, "the number of rows", str)
    header.disagree(heads, header.HEAD + 1, "point_routing.min_chunk_queries", str)
    header.disagree(heads, header.HEAD + 2, "point_routing.own_queries", str)
    adopt_state(ix, state, got)
    return ix


def read_state(ix, state: dict[str, Any], dev: torch.device, local_options: dict[str, Any] | None) -> tuple:
    """This rank's state checked and its local index rebuilt on ``dev`` (nothing collective)."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
        raise ValueError("not a ShardedIndex state of version 1 (from ShardedIndex.state_dict())")
    header.check_served(ix, dev, "the state's tensors (or device=)")
    if state["world_size"] != ix.world or state["rank"] != ix.rank:
        raise ValueError(
            f"this state is rank {state['rank']} of {state['world_size']}, loaded on rank {ix.rank} of "
            f"{ix.world}; load each rank's own state in a group of the same size, or use "
            "gathered_state_dict / from_gathered_state to change the number of ranks"
        )
    local_cls = _LOCAL_CLASSES.get(state["local_class"])
    if local_cls is None:
        raise ValueError(f"unknown local index class {state['local_class']!r}")
    t = lambda x: x.to(dev)  # noqa: E731
    local = local_cls.from_state_dict(state["local"], device=dev, **(local_options or {}))
    l2g = t(state["local_to_global"])
    spare = routing.global_rows_in_shard(local, l2g, int(state["num_rows"]))
    key_dtype = getattr(torch, state["key_dtype"])
    return local, key_dtype, t(state["splitters"]), l2g, t(state["source"]), \
        t(state["sequence"]), t(state["contributed_owner"]), spare


def adopt_state(ix, state: dict[str, Any], got: tuple) -> None:
    local, ix.key_dtype, splitters, ix._l2g, ix._src, ix._seq, ix._contrib_owner, spare = got
    routing.set_splitters(ix, splitters)
    ix._local = local
    ix.key_type = state["key_type"]
    ix.sample_size = 4096
    ix._recv_totals = list(state["received"])
    ix._num_rows, ix._num_keys = int(state["num_rows"]), int(state["num_keys"])
    ix._spare_rows = spare
    plan_values(ix)


def restore(ix, state: dict[str, Any], group: dist.ProcessGroup | None, device: torch.device | None,
            profile: bool, point_routing: Any) -> None:
    """Unpickling and deepcopy: this rank's state rebuilt without a collective (each rank reads its own),
    in ``group`` (unpickled: the default group), on the rank and group size it was saved from."""
    ix._setup(group, None, bool(state.get("updatable", False)), profile, point_routing)
    dev = device if device is not None else state["local_to_global"].device
    ix.device = dev
    ix.pipeline = points.default_pipeline(dev)
    adopt_state(ix, state, read_state(ix, state, dev, None))


def gathered_state_dict(ix) -> dict[str, Any]:
    """Collective: one state of the whole index on every rank (CPU tensors): every live (key, global row)
    pair, keys as ordered keys, sorted by row. Load it into a group of any size with
    :meth:`from_gathered_state`; it is what one rank would need to rebuild the index alone."""
    def export():  # before the header, so that a failure here is raised on every rank
        ix._maybe_fault("export")
        if hasattr(ix._local, "_export"):
            okeys, lrows = ix._local._export()
        else:  # read-only local index: its keys are the ordered keys in local row order
            okeys = ix._local.state_dict()["keys"]
            lrows = torch.arange(okeys.numel(), device=ix.device)
        return okeys.cpu(), ix._l2g[lrows].cpu() if lrows.numel() else lrows.cpu()

    pairs, _ = header.agree(ix, "gathered_state_dict", export)
    everyone: list[Any] = [None] * ix.world
    dist.all_gather_object(everyone, pairs, group=ix.group)
    keys = torch.cat([p[0] for p in everyone])
    rows = torch.cat([p[1] for p in everyone])
    rows, order = torch.sort(rows)
    return {"format": GATHERED_FORMAT, "version": STATE_VERSION, "keys": keys[order], "rows": rows,
            "keys_ordered": True, "key_type": ix.key_type, "key_dtype": str(ix.key_dtype).removeprefix("torch."),
            "num_rows": ix._num_rows}


def from_gathered_state(cls, state: dict[str, Any], *, device: torch.device | str = "cpu",
                        group: dist.ProcessGroup | None = None, index_factory: Callable[..., Any] | None = None,
                        updatable: bool = False, sample_size: int = 4096, profile: bool = False,
                        point_routing: Any = None) -> Any:
    """Collective: a sharded index over a :meth:`gathered_state_dict` state, in a group of any size; every
    rank passes the same state and takes an equal slice of its pairs (global row IDs are kept). Rank r's
    contributed rows (for value columns) are then its slice's."""
    ix = cls.__new__(cls)
    ix._setup(group, index_factory, updatable, profile, point_routing)
    ix.sample_size = sample_size
    # Everything read from the state is read before the first collective; what fails on one rank is raised
    # on every rank by the build's header (:func:`build`'s ``failure``).
    try:
        if not isinstance(state, dict) or state.get("format") != GATHERED_FORMAT:
            raise ValueError("not a gathered ShardedIndex state (from ShardedIndex.gathered_state_dict())")
        if isinstance(sample_size, bool) or not isinstance(sample_size, int) or sample_size < 1:
            raise ValueError(f"sample_size must be a positive int, got {sample_size!r}")
        _check_routing(point_routing)
        dev = torch.device(device)
        n = state["keys"].numel()
        a, b = n * ix.rank // ix.world, n * (ix.rank + 1) // ix.world
        keys = state["keys"][a:b].to(dev).contiguous()
        rows = state["rows"][a:b].to(dev).contiguous()
        key_type, num_rows, key_dtype = state["key_type"], state["num_rows"], getattr(torch, state["key_dtype"])
        failure = None
    except Exception as e:  # noqa: BLE001
        dev, failure = torch.device("cpu"), e
        ix.sample_size = 1
        keys = rows = torch.empty(0, dtype=torch.int64)
        key_type, num_rows, key_dtype = None, 0, None
    ix.pipeline = points.default_pipeline(dev)
    build(ix, keys, key_type, rows=rows, mapped=True, num_rows=num_rows, key_dtype=key_dtype, failure=failure)
    return ix


def _check_routing(point_routing: Any) -> None:
    if point_routing is not None and not isinstance(point_routing, points.PointRouting):
        raise TypeError(f"point_routing must be a PointRouting, got {type(point_routing).__name__}")
