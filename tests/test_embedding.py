"""IdToRow: raw IDs of any shape to embedding rows, against a Python dict; miss policies; module behaviour
(.to, state_dict, load_state_dict, deepcopy); torch.compile; and the EmbeddingBag example."""

from __future__ import annotations

import copy
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._dynamo
from keysets import int64_keys

from torch_rtindex import CgRXIndex, ChunkedIndex, IdToRow, RXIndex, UpdatableCgRXIndex
from torch_rtindex.embedding import MissingIdError

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ROOT = Path(__file__).resolve().parent.parent


def expected_rows(table_ids: torch.Tensor, raw: torch.Tensor, miss_value: int) -> np.ndarray:
    """The reference: a dict from ID to its smallest row, applied element by element."""
    first = {}
    for row, i in enumerate(table_ids.cpu().tolist()):
        first.setdefault(i, row)
    flat = [first.get(i, miss_value) for i in raw.cpu().reshape(-1).tolist()]
    return np.array(flat, dtype=np.int64).reshape(tuple(raw.shape))


def table_and_queries(gen: torch.Generator, n: int = 2000):
    ids = int64_keys("duplicates", n, gen)  # many IDs on several rows: the smallest row must win
    known = ids[torch.randint(0, ids.numel(), (24, 10), generator=gen)]
    unknown = torch.randint(-(2**63), 2**63 - 1, (24, 10), generator=gen)
    raw = torch.where(torch.rand(24, 10, generator=gen) < 0.7, known, unknown)
    return ids, raw


@pytest.mark.parametrize("index", ["cgrx", "rx"])
@pytest.mark.parametrize("miss,default_row,miss_value", [("default", 0, 0), ("default", 2001, 2001),
                                                         ("minus_one", 0, -1)])
def test_maps_ids_of_any_shape(device, gen, miss, default_row, miss_value, index):
    ids, raw = table_and_queries(gen)
    m = IdToRow(ids.to(device), miss=miss, default_row=default_row, index=index)
    assert f"index={index}" in repr(m)
    for q in (raw, raw[0], raw.reshape(4, 6, 10), raw.t(), raw[3, 4], raw[:0]):  # 2-D, 1-D, 3-D, strided, 0-D, empty
        got = m(q.to(device))
        assert got.shape == q.shape and got.dtype == torch.int64 and got.device.type == device.type
        np.testing.assert_array_equal(got.cpu().numpy(), expected_rows(ids, q, miss_value))


@pytest.mark.parametrize("dtype", ["int32", "uint64"])
def test_other_id_dtypes(device, gen, dtype):
    if dtype == "uint64":
        if not hasattr(torch, "uint64"):
            pytest.skip("no torch.uint64 in this PyTorch")
        ids = int64_keys("uniform", 500, gen).view(torch.uint64)
        raw = torch.cat([ids[:50], torch.tensor([0, 2**64 - 1, 12345], dtype=torch.uint64)])
        as_int = lambda t: t.view(torch.int64)  # noqa: E731  (the reference compares bits)
    else:
        ids = torch.randint(-(2**31), 2**31 - 1, (500,), generator=gen, dtype=torch.int32)
        raw = torch.cat([ids[:50], torch.tensor([0, -1, 7], dtype=torch.int32)])
        as_int = lambda t: t  # noqa: E731
    m = IdToRow(ids.to(device), miss="minus_one")
    np.testing.assert_array_equal(m(raw.to(device)).cpu().numpy(), expected_rows(as_int(ids), as_int(raw), -1))


def test_miss_error(device, gen):
    ids, raw = table_and_queries(gen)
    m = IdToRow(ids.to(device), miss="error")
    hits = ids[:100].reshape(10, 10).to(device)
    np.testing.assert_array_equal(m(hits).cpu().numpy(), expected_rows(ids, hits, -1))
    unknown = raw[expected_rows(ids, raw, -1) < 0]
    with pytest.raises(MissingIdError, match=f"{unknown.numel()} of {raw.numel()} IDs are not in the table") as e:
        m(raw.to(device))
    assert str(unknown[0].item()) in str(e.value) and isinstance(e.value, KeyError)


def test_bad_arguments():
    with pytest.raises(ValueError, match="miss must be one of 'default', 'minus_one', 'error'"):
        IdToRow(torch.tensor([1, 2]), miss="ignore")
    with pytest.raises(ValueError, match="default_row"):
        IdToRow(torch.tensor([1, 2]), default_row=-1)
    with pytest.raises(TypeError, match="int64, int32 or uint64"):
        IdToRow(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D"):
        IdToRow(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="index must be one of 'cgrx', 'rx', 'chunked', 'sharded'"):
        IdToRow(torch.tensor([1, 2]), index="hash")
    with pytest.raises(TypeError, match="bucket_size"):
        IdToRow(torch.tensor([1, 2]), index_options={"bucket_size": 4, "bucket_sizes": 4})
    with pytest.raises(TypeError, match="index_options must be a dict"):
        IdToRow(torch.tensor([1, 2]), index_options=[("backend", "radix")])


def test_default_row_is_a_row_of_the_table():
    """default_row is checked where it is given: a row of the table or the one appended after it (an
    out-of-vocabulary row), not one the embedding would fail on later; a load that shrinks the table under it
    is refused and leaves the module as it was."""
    ids = torch.tensor([10, 20, 30])
    for ok in (0, 2, 3):
        assert IdToRow(ids, default_row=ok)(torch.tensor([20, 99])).tolist() == [1, ok]
    for bad in (4, 10**9):
        with pytest.raises(ValueError, match=rf"default_row={bad} is no row of a table of 3 IDs: pass a row in 0 .. 3"):
            IdToRow(ids, default_row=bad)
    assert IdToRow(ids, miss="minus_one", default_row=10**9)(torch.tensor([99])).tolist() == [-1]  # not used
    with pytest.raises(ValueError, match="default_row=3 is no row of a table of 1 IDs"):
        IdToRow(index=CgRXIndex(torch.tensor([7])), default_row=3)
    m = IdToRow(ids, default_row=3)
    with pytest.raises(RuntimeError, match="default_row=3 is no row of a table of 2 IDs"):
        m.load_state_dict({"ids": torch.tensor([1, 2])})
    assert len(m) == 3 and m(torch.tensor([30, 1])).tolist() == [2, 3]


@pytest.mark.parametrize("index", ["cgrx", "rx"])
@pytest.mark.parametrize("miss,default_row,miss_value", [("default", 5, 5), ("minus_one", 0, -1), ("error", 0, -1)])
def test_id_dtype_policy(device, gen, index, miss, default_row, miss_value):
    """int32 (and narrower) raw IDs on an int64 table are the same IDs; int64 IDs on an int32 table, floats, or
    signed IDs on a uint64 table are refused with a TypeError naming both dtypes and speaking of IDs and the table."""
    wide = int64_keys("uniform", 200, gen)
    small = torch.randint(-(2**31), 2**31 - 1, (300,), generator=gen)
    table = torch.cat([wide, small, torch.tensor([-(2**31), 2**31 - 1, 0, 7])])
    m = IdToRow(table.to(device), miss=miss, default_row=default_row, index=index)
    known = torch.cat([small[:50], torch.tensor([-(2**31), 2**31 - 1, 0, 7])])
    unknown = torch.tensor([2, 3, 4, -5])
    q = known if miss == "error" else torch.cat([known, unknown])
    for batch in (q.to(torch.int32), q.to(torch.int32).reshape(2, -1), torch.tensor([0, 7], dtype=torch.int16)):
        want = expected_rows(table, batch.to(torch.int64), miss_value)
        np.testing.assert_array_equal(m(batch.to(device)).cpu().numpy(), want)
    if miss == "error":
        with pytest.raises(MissingIdError, match="4 of 4 IDs"):
            m(unknown.to(torch.int32).to(device))
    narrow = IdToRow(small.to(torch.int32).to(device), index=index)
    for bad in (q.to(device), q.to(torch.float64).to(device)):
        with pytest.raises(TypeError, match=rf"^ids has dtype {bad.dtype} but the table holds int32 IDs \(torch.int32\)"):
            narrow(bad)
    if hasattr(torch, "uint64"):
        unsigned = IdToRow(wide.view(torch.uint64).to(device), index=index)
        with pytest.raises(TypeError, match="ids has dtype torch.int64 but the table holds uint64 IDs .*signed and unsigned"):
            unsigned(wide[:3].to(device))


@pytest.mark.parametrize("target", DEVICES)
def test_module_to_and_state_dict(device, gen, target):
    ids, raw = table_and_queries(gen)
    m = IdToRow(ids.to(device), miss="default", default_row=7)
    want = expected_rows(ids, raw, 7)
    moved = m.to(target)
    assert moved is m and m.ids.device.type == target  # nn.Module.to: in place; the index follows the buffer
    np.testing.assert_array_equal(m(raw.to(target)).cpu().numpy(), want)

    state = m.state_dict()
    assert list(state) == ["ids"] and torch.equal(state["ids"].cpu(), ids)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    # A module built over other (fewer) IDs takes the saved ones, on its own device.
    other = IdToRow(torch.arange(5, 12, device=device), miss="default", default_row=7)
    other.load_state_dict(torch.load(buf, weights_only=True))
    assert other.ids.device.type == device.type and len(other) == ids.numel()
    np.testing.assert_array_equal(other(raw.to(device)).cpu().numpy(), want)
    np.testing.assert_array_equal(copy.deepcopy(other)(raw.to(device)).cpu().numpy(), want)

    # The buffer inside a bigger model: prefixes, strict loading.
    model = torch.nn.Sequential(IdToRow(torch.tensor([1], device=device)), torch.nn.Identity())
    model.load_state_dict({"0.ids": ids.to(device)})
    np.testing.assert_array_equal(model(raw.to(device)).cpu().numpy(), expected_rows(ids, raw, 0))
    with pytest.raises(RuntimeError, match="Missing key"):
        model.load_state_dict({})


def test_changed_ids_are_picked_up(device, gen):
    ids, raw = table_and_queries(gen)
    m = IdToRow(ids.clone().to(device), miss="minus_one")
    m.ids[0] = 424242  # in place
    changed = ids.clone()
    changed[0] = 424242
    q = torch.cat([raw.reshape(-1), torch.tensor([424242, ids[0].item()])]).to(device)
    np.testing.assert_array_equal(m(q).cpu().numpy(), expected_rows(changed, q, -1))
    fresh = int64_keys("uniform", 300, gen)
    m.rebuild(fresh.to(device))
    np.testing.assert_array_equal(m(fresh[:40].to(device)).cpu().numpy(), np.arange(40))


def test_compiles_without_graph_breaks(device, gen):
    ids, raw = table_and_queries(gen)
    default = IdToRow(ids.to(device), miss="default", default_row=3)
    minus_one = IdToRow(ids.to(device), miss="minus_one")
    for m in (default, minus_one):
        explanation = torch._dynamo.explain(m)(raw.to(device))
        assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
    compiled = torch.compile(default, fullgraph=True, dynamic=True)
    for q in (raw, raw[:5], raw.reshape(-1)[:77]):
        q = q.to(device, copy=True)
        np.testing.assert_array_equal(compiled(q).cpu().numpy(), expected_rows(ids, q, 3))
        assert torch.equal(compiled(q), default(q))

    # miss="error" under fullgraph=True: the check is an operator of the graph, which raises MissingIdError when
    # the graph runs on a batch with misses and answers the others.
    strict = IdToRow(ids.to(device), miss="error")
    explanation = torch._dynamo.explain(strict)(ids[:10].to(device))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    for backend in ("eager", "inductor"):
        compiled = torch.compile(strict, backend=backend, fullgraph=True, dynamic=True)
        hits = ids[5:17].reshape(3, 4).to(device)
        np.testing.assert_array_equal(compiled(hits).cpu().numpy(), expected_rows(ids, hits, -1))
        unknown = raw[expected_rows(ids, raw, -1) < 0]
        with pytest.raises(MissingIdError, match=f"{unknown.numel()} of {raw.numel()} IDs are not in the table"):
            compiled(raw.to(device))
        np.testing.assert_array_equal(compiled(ids[:7].to(device)).cpu().numpy(), expected_rows(ids, ids[:7], -1))


def test_embedding_bag_example_trains():
    spec = importlib.util.spec_from_file_location("embedding_bag_example", ROOT / "examples" / "embedding_bag.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    losses = example.main(num_ids=2000, dim=8, batch=64, bag=4, steps=4)
    assert len(losses) == 4 and all(np.isfinite(losses))
    assert losses[-1] < losses[0]  # SGD on a fixed batch lowers the loss

    # The compiled model gives the eager model's answer (IdToRow's misses -> the out-of-vocabulary row).
    gen = torch.Generator().manual_seed(3)
    table = torch.randint(-(2**63), 2**63 - 1, (500,), generator=gen)
    model = example.ClickModel(table, dim=4)
    raw = torch.cat([table[:12], torch.tensor([1, 2, 3, 4])]).reshape(4, 4)
    assert torch.equal(model.id_to_row(raw), torch.tensor(expected_rows(table, raw, 500)))
    torch.testing.assert_close(torch.compile(model, fullgraph=True)(raw), model(raw))


CHUNKED_ROWS = pytest.mark.xfail(not hasattr(ChunkedIndex, "lookup_rows"), strict=True,
                                 reason="ChunkedIndex.lookup_rows lands with the chunked branch")
CHUNKED_DEVICES = [pytest.param("cpu", marks=CHUNKED_ROWS)] + (
    [pytest.param("cuda", marks=CHUNKED_ROWS)] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("chunked_device", CHUNKED_DEVICES)
@pytest.mark.parametrize("miss,miss_value", [("default", 4), ("minus_one", -1), ("error", -1)])
def test_over_a_chunked_index(gen, chunked_device, miss, miss_value):
    """IdToRow over the out-of-core index (index="chunked" with its options): the same rows and miss policies as
    over the single-device ones, state_dict and pickle round trips included."""
    ids, raw = table_and_queries(gen)
    options = {"device": chunked_device, "chunk_bytes": 1 << 14, "gpu_budget": 1 << 22 if chunked_device == "cuda" else 0}
    m = IdToRow(ids, miss=miss, default_row=4, index="chunked", index_options=options)
    assert type(m.index) is ChunkedIndex and len(m) == ids.numel() and "index=chunked" in repr(m)
    want = expected_rows(ids, raw, miss_value)
    hits = ids[torch.randperm(ids.numel(), generator=gen)[:60]].reshape(6, 10)
    for module in (m, copy.deepcopy(m)):
        np.testing.assert_array_equal(module(hits).numpy(), expected_rows(ids, hits, -1))
        if miss == "error":
            with pytest.raises(MissingIdError):
                module(raw)
        else:
            np.testing.assert_array_equal(module(raw).numpy(), want)
    other = IdToRow(torch.tensor([5, 6]), miss=miss, default_row=2, index="chunked", index_options=options)
    other.load_state_dict(m.state_dict())
    np.testing.assert_array_equal(other(hits).numpy(), expected_rows(ids, hits, -1))


@pytest.mark.parametrize("make", [lambda k: CgRXIndex(k, backend="binary_search"), RXIndex,
                                  lambda k: UpdatableCgRXIndex(k, node_size=4)], ids=["cgrx", "rx", "updatable"])
def test_over_an_index_built_already(device, gen, make):
    """IdToRow(index=<an index>) maps through that index's lookup_rows: rows, misses, state_dict (the index's
    state as the module's extra state), .to, pickling and deepcopy."""
    ids, raw = table_and_queries(gen)
    built = make(ids.to(device))
    m = IdToRow(index=built, miss="default", default_row=len(ids))
    assert m.index is built and len(m) == ids.numel() and list(m.state_dict()) == ["index_state"]
    want = expected_rows(ids, raw, len(ids))
    np.testing.assert_array_equal(m(raw.to(device)).cpu().numpy(), want)
    np.testing.assert_array_equal(m(raw.to(device).to(torch.int32)).cpu().numpy(),
                                  expected_rows(ids, raw.to(torch.int32).to(torch.int64), len(ids)))
    for copied in (copy.deepcopy(m), pickle_round_trip(m)):
        assert copied.index is not built
        np.testing.assert_array_equal(copied(raw.to(device)).cpu().numpy(), want)
    fresh = IdToRow(index=make(torch.tensor([1, 2], device=device)), default_row=2)
    fresh.load_state_dict(m.state_dict())
    fresh.default_row = len(ids)
    np.testing.assert_array_equal(fresh(raw.to(device)).cpu().numpy(), want)
    for target in DEVICES:
        np.testing.assert_array_equal(m.to(target)(raw.to(target)).cpu().numpy(), want)
        assert m.index.device.type == target
    with pytest.raises(ValueError, match="without ids"):
        IdToRow(ids, index=built)
    with pytest.raises(ValueError, match="maps no IDs"):
        IdToRow(index=CgRXIndex(torch.tensor([1.5])))
    with pytest.raises(TypeError, match="lookup_rows"):
        IdToRow(index=object())
    with pytest.raises(RuntimeError, match="built elsewhere"):
        m.rebuild()


def pickle_round_trip(module):
    buf = io.BytesIO()
    torch.save(module, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_over_a_sharded_index():
    """IdToRow over a ShardedIndex built over a process group of the caller's (one rank here: the multi-rank
    checks run in the sharded suite)."""
    import torch.distributed as dist

    from torch_rtindex.distributed import ShardedIndex

    if not hasattr(ShardedIndex, "lookup_rows"):
        pytest.xfail("ShardedIndex.lookup_rows lands with the sharded branch")
    if dist.is_initialized():
        pytest.skip("a process group is set up already")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        gen = torch.Generator().manual_seed(5)
        ids, raw = table_and_queries(gen)
        group = dist.new_group([0])
        for m in (IdToRow(index=ShardedIndex(ids, group=group), default_row=3),
                  IdToRow(ids, index="sharded", index_options={"group": group}, default_row=3)):
            np.testing.assert_array_equal(m(raw).numpy(), expected_rows(ids, raw, 3))
            np.testing.assert_array_equal(m(raw.to(torch.int32)).numpy(),
                                          expected_rows(ids, raw.to(torch.int32).to(torch.int64), 3))
    finally:
        dist.destroy_process_group()


def test_settings_are_checked_where_they_are_changed():
    m = IdToRow(torch.tensor([10, 20, 30]), miss="minus_one", default_row=9)  # default_row unused: not checked
    with pytest.raises(ValueError, match="default_row=9 is no row of a table of 3 IDs"):
        m.miss = "default"
    with pytest.raises(ValueError, match="miss must be one of"):
        m.miss = "skip"
    m.default_row = 3
    m.miss = "default"
    with pytest.raises(ValueError, match="default_row=4 is no row"):
        m.default_row = 4
    with pytest.raises(ValueError, match="an int >= 0"):
        m.default_row = -1
    assert (m.miss, m.default_row) == ("default", 3) and m(torch.tensor([20, 99])).tolist() == [1, 3]
