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

from torch_rtindex import IdToRow
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
    with pytest.raises(ValueError, match="miss"):
        IdToRow(torch.tensor([1, 2]), miss="ignore")
    with pytest.raises(ValueError, match="default_row"):
        IdToRow(torch.tensor([1, 2]), default_row=-1)
    with pytest.raises(TypeError, match="int64, int32 or uint64"):
        IdToRow(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D"):
        IdToRow(torch.tensor([[1, 2]]))
    m = IdToRow(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="dtype"):
        m(torch.tensor([1], dtype=torch.int32))


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
    other = IdToRow(torch.tensor([5, 6, 7], device=device), miss="default", default_row=7)
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

    # miss="error" must look at the answer on the host: a graph break, so fullgraph=True refuses it, and
    # without fullgraph the check runs eagerly between two graphs and raises as in eager mode.
    strict = IdToRow(ids.to(device), miss="error")
    reasons = torch._dynamo.explain(strict)(ids[:10].to(device)).break_reasons
    assert len(reasons) == 1 and "disable" in reasons[0].reason, reasons
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(strict, backend="eager", fullgraph=True)(ids[:10].to(device))
    torch._dynamo.reset()
    lenient = torch.compile(strict, backend="eager")
    np.testing.assert_array_equal(lenient(ids[:10].to(device)).cpu().numpy(), expected_rows(ids, ids[:10], -1))
    with pytest.raises(MissingIdError):
        lenient(raw.to(device))


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
