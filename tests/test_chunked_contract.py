"""ChunkedIndex against the contract of torch_rtindex.index (the Index and UpdatableIndex protocols): the forms it
shares with every class, its state, pickling and devices, and the checks of every option where it is given. Each
answer is checked against an independent reference through the public API."""

from __future__ import annotations

import copy
import inspect
import io
import json
import pickle

import numpy as np
import pytest
import torch
from keysets import int64_keys, point_queries, range_queries
from reference import Multiset, Reference, check_lookup

import torch_rtindex
from torch_rtindex import ChunkedIndex, UpdatableIndex
from torch_rtindex.cgrx import default_layout
from torch_rtindex.chunked import ChunkedConfig

SMALL = 4096  # chunk_bytes: ~240 keys per chunk


def small(keys, **kw):
    kw.setdefault("chunk_bytes", SMALL)
    kw.setdefault("gpu_budget", 1 << 20)
    kw.setdefault("device", "cpu")
    return ChunkedIndex(keys, **kw)


def same_answers(a, b, keys, gen):
    q = point_queries(keys, 400, gen)
    lo, hi = range_queries(keys, 100, gen, 2**40)
    for x, y in ((a.lookup(q), b.lookup(q)), (a.lookup_all(q), b.lookup_all(q)), (a.range(lo, hi), b.range(lo, hi))):
        for u, v in zip(x, y):
            assert torch.equal(u, v)


def test_it_is_an_updatable_index_with_the_protocol_signatures():
    index = small(torch.arange(100))
    assert isinstance(index, torch_rtindex.Index) and isinstance(index, UpdatableIndex)
    for name in ("update", "insert", "delete", "lookup_rows", "lookup_all_capped", "to", "load_state_dict"):
        want = inspect.signature(getattr(UpdatableIndex, name))
        got = inspect.signature(getattr(ChunkedIndex, name))
        assert list(got.parameters) == list(want.parameters), name
        assert [p.default for p in got.parameters.values()] == [p.default for p in want.parameters.values()], name


def test_lookup_rows_answers_the_first_row_or_miss_row(gen):
    keys = int64_keys("duplicates", 3000, gen)
    index = small(keys)
    q = torch.cat([point_queries(keys, 500, gen), torch.tensor([-(2**63), 2**63 - 1])])
    first, count, _ = Reference(keys, "int64").points(q)
    np.testing.assert_array_equal(index.lookup_rows(q).numpy(), first)
    np.testing.assert_array_equal(index.lookup_rows(q, miss_row=7).numpy(), np.where(count > 0, first, 7))
    with pytest.raises(TypeError, match="miss_row must be an int"):
        index.lookup_rows(q, miss_row=1.5)
    with pytest.raises(ValueError, match="miss_row must fit in int64"):
        index.lookup_rows(q, miss_row=2**63)


def test_int32_queries_on_an_int64_index_and_float_refused(gen):
    keys = int64_keys("uniform", 2000, gen) % 1000
    index = small(keys)
    q = torch.arange(-5, 1005, dtype=torch.int32)
    want = index.lookup(q.to(torch.int64))
    got = index.lookup(q)
    assert torch.equal(got.first_row, want.first_row) and torch.equal(got.count, want.count)
    with pytest.raises(TypeError, match="float32.*int64|int64.*float32"):
        index.lookup(q.to(torch.float32))


def test_defaults_by_device_as_cgrx():
    index = small(torch.arange(100))
    assert index.backend == "radix" and index.layout == default_layout("radix")
    assert small(torch.arange(100), layout="packed_row").layout == "packed_row"


def test_capturable_is_false_and_capture_is_refused_naming_the_alternative():
    index = small(torch.arange(100))
    assert index.capturable is False
    if not torch.cuda.is_available():
        return
    gpu = small(torch.arange(100), device="cuda")
    q = torch.arange(10, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(NotImplementedError, match="CUDA graph.*CgRXIndex"):
        with torch.cuda.graph(graph):
            gpu.lookup(q)


def test_to_and_cpu_keep_the_answers(gen):
    keys = int64_keys("uniform", 2000, gen)
    index = small(keys, processors="cpu", pipeline_depth=3)
    assert index.to("cpu") is index and index.cpu() is index
    if torch.cuda.is_available():
        moved = index.to("cuda")
        assert moved.device.type == "cuda" and moved.processors == "cpu" and moved.pipeline_depth == 3
        back = moved.cpu()
        same_answers(back, index, keys, gen)
    else:
        with pytest.raises(ValueError, match="CUDA is not available"):
            index.to("cuda")
        with pytest.raises(ValueError, match="CUDA is not available"):
            index.cuda()


@pytest.mark.parametrize("updatable", [False, True])
def test_load_state_dict_replaces_the_index_all_or_nothing(gen, updatable):
    keys = int64_keys("duplicates", 2000, gen)
    other = small(keys, updatable=updatable)
    other.update(insert_keys=keys[:50] + 1, delete_keys=keys[100:120])
    index = small(torch.arange(10), processors="cpu")
    index.load_state_dict(other.state_dict())
    assert len(index) == len(other) and index.processors == "cpu" and index.updatable == updatable
    same_answers(index, other, keys, gen)
    with pytest.raises(ValueError, match="not a ChunkedIndex state"):
        index.load_state_dict({"format": "nonsense"})
    same_answers(index, other, keys, gen)  # unchanged


def _states(gen, updatable):
    """An index fresh, after lookups of every form and the hot tier's learning, and after updates."""
    keys = int64_keys("duplicates", 3000, gen)
    fresh = small(keys, updatable=updatable, hot_keys=64)
    yield "fresh", fresh, keys
    used = small(keys, updatable=updatable, hot_keys=64)
    q = keys[torch.randint(0, 20, (2000,), generator=gen)]
    for _ in range(3):
        used.lookup(q)
        used.lookup_all(q)
        used.range(keys[:10], keys[:10] + 5)
    yield "after lookups", used, keys
    used.update(insert_keys=keys[:40] + 3, delete_keys=keys[500:530])
    used.lookup(q)
    yield "after updates", used, keys


@pytest.mark.parametrize("updatable", [False, True])
def test_pickle_deepcopy_and_torch_save_round_trips(gen, updatable):
    for state, index, keys in _states(gen, updatable):
        copies = [pickle.loads(pickle.dumps(index)), copy.deepcopy(index)]
        buf = io.BytesIO()
        torch.save(index, buf)
        buf.seek(0)
        copies.append(torch.load(buf))  # weights_only=True by default: plain values only
        for c in copies:
            assert type(c) is ChunkedIndex and len(c) == len(index), state
            assert c.updatable == index.updatable and c.hot_capacity == index.hot_capacity, state
            same_answers(c, index, keys, gen)
            c.insert(torch.tensor([5]))  # a copy is independent
            assert len(c) == len(index) + 1


@pytest.mark.parametrize("updatable", [False, True])
@pytest.mark.parametrize("row", [3, 2**40])
def test_a_row_given_to_several_keys_survives_every_round_trip(tmp_path, updatable, row):
    """An insert may give a row ID already in use (rows are the caller's payload, as with UpdatableCgRXIndex):
    the index answers it for every key holding it, and its state, copies and saved directory do too."""
    keys = torch.arange(1000, dtype=torch.int64) * 7
    index = small(keys, updatable=updatable)
    ref = Multiset(keys, "int64")
    for batch in ({"insert_keys": torch.tensor([1, 2]), "insert_rows": torch.tensor([row, row])},
                  {"insert_keys": torch.tensor([14]), "insert_rows": torch.tensor([5])}):  # key 35's row too
        index.update(**batch)
        ref.update(**batch)
    queries = torch.tensor([0, 1, 2, 14, 35, 21, 3, 6993])
    first, count = Multiset.first_count(ref.point_rows(queries))
    index.save(str(tmp_path / "saved"))
    fresh = small(keys[:1], updatable=updatable)
    fresh.load_state_dict(index.state_dict())
    copies = (index, copy.deepcopy(index), pickle.loads(pickle.dumps(index)), fresh,
              ChunkedIndex.open(str(tmp_path / "saved")))
    for c in copies:
        check_lookup(c.lookup(queries), first, count)


@pytest.mark.parametrize("option,value,error,match", [
    ("processors", "bogus", ValueError, "processors must be one of"),
    ("critical_mass", -5, ValueError, "critical_mass must be at least 0"),
    ("progress", "x", TypeError, "progress must be None"),
    ("eviction", "fifo", ValueError, "eviction must be one of"),
    ("pipeline_depth", 0, ValueError, "pipeline_depth must be in 1"),
    ("hot_keys", -1, ValueError, "hot_keys must be at least 0"),
    ("hot_sample", 0, ValueError, "hot_sample must be at least 1"),
    ("read_in_place", "yes", TypeError, "read_in_place must be None"),
    ("gpu_budget", 2**60, ValueError, "gpu_budget must be in 0"),
    ("chunk_bytes", 10, ValueError, "chunk_bytes must be at least 1024"),
    ("backend", "optix", ValueError, "OptiX scene is bound"),
    ("layout", "nodes", ValueError, "layout must be one of"),
    ("node_size", 3, ValueError, "even integer"),
    ("growth", 0.5, ValueError, "growth must be in"),
    ("in_place_window", -1, ValueError, "in_place_window must be at least 0"),
    ("device", "mps", ValueError, "device must be 'cpu' or 'cuda'"),
    ("updatable", 1, TypeError, "updatable must be True or False"),
])
def test_every_option_is_checked_where_it_is_given(option, value, error, match):
    with pytest.raises(error, match=match):
        ChunkedIndex(torch.arange(100), **{option: value})


def test_serving_options_are_checked_where_they_are_set():
    index = small(torch.arange(1000), gpu_budget=0)
    with pytest.raises(ValueError, match="gpu_budget > 0"):
        ChunkedIndex(torch.arange(100), device="cpu", gpu_budget=0, processors="gpu")
    with pytest.raises(ValueError, match="needs a CUDA index"):
        small(torch.arange(100), processors="zero_copy")
    with pytest.raises(ValueError, match="processors must be one of"):
        index.processors = "bogus"
    with pytest.raises(ValueError, match="gpu_budget > 0"):
        index.processors = "gpu"
    assert index.processors == "auto"  # a refused setting changes nothing
    with pytest.raises(ValueError, match="critical_mass must be at least 0"):
        index.critical_mass = -5
    with pytest.raises(AttributeError):
        index.chunk_bytes = 1 << 20
    index.processors, index.critical_mass = "cpu", 10
    assert index.lookup(torch.tensor([5])).count.tolist() == [1]
    with pytest.raises(TypeError, match="hot_tier must be True or False"):
        index.hot_tier = "no"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for machines without CUDA")
def test_cuda_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA is not available here; pass device='cpu'"):
        ChunkedIndex(torch.arange(100), device="cuda")


def test_a_config_is_typed_and_frozen():
    config = ChunkedConfig(critical_mass=torch.tensor(5))
    assert config.critical_mass == 5 and type(config.critical_mass) is int
    with pytest.raises(AttributeError):
        config.processors = "cpu"
    assert config.replace(processors="cpu").processors == "cpu"


def test_capacity_as_a_0d_tensor_and_a_capacity_past_memory(gen):
    keys = int64_keys("duplicates", 2000, gen)
    index = small(keys)
    q = keys[:50]
    want = index.lookup_all_capped(q, 30)
    got = index.lookup_all_capped(q, torch.tensor(30))
    assert torch.equal(got.rows, want.rows) and int(got.total) == int(want.total)
    assert index.range_capped(q, q, torch.tensor(4)).rows.numel() == 4
    with pytest.raises(ValueError, match="capacity=1099511627776 asks for"):
        index.lookup_all_capped(q, 2**40)
    with pytest.raises(TypeError, match="capacity must be an integer"):
        index.lookup_all_capped(q, 3.0)


def test_row_ids_past_2_48_are_refused_before_anything_changes(gen):
    keys = int64_keys("uniform", 1000, gen)
    index = small(keys)
    with pytest.raises(ValueError, match=r"insert rows must be row IDs in 0 \.\. 2\^48 - 1, got 4611686018427387904"):
        index.insert(torch.tensor([5]), rows=torch.tensor([2**62]))
    n = keys.numel()
    assert len(index) == n and index.insert(torch.tensor([5])).rows.tolist() == [n]
    values = torch.arange(n + 1, dtype=torch.float64)
    assert index.aggregate(torch.tensor([5]), values).count.tolist() == [1 + int((keys == 5).sum())]


def test_a_hand_edited_manifest_is_refused(tmp_path, gen):
    keys = int64_keys("uniform", 2000, gen)
    small(keys).save(tmp_path)
    current = (tmp_path / "CURRENT").read_text().strip()
    path = tmp_path / current
    m = json.loads(path.read_text())
    assert ChunkedIndex.open(tmp_path, device="cpu").lookup(keys[:5]).count.tolist() == [1] * 5
    m["n"] = 5
    path.write_text(json.dumps(m, indent=1))
    with pytest.raises(ValueError, match="checksum does not match"):
        ChunkedIndex.open(tmp_path, device="cpu")
    del m["checksum"]  # even without its checksum (as older code wrote), n must be its chunks' sum
    path.write_text(json.dumps(m, indent=1))
    with pytest.raises(ValueError, match="key count n=5 is not the sum"):
        ChunkedIndex.open(tmp_path, device="cpu")


def test_open_and_from_state_dict_take_the_constructor_options(tmp_path, gen):
    keys = int64_keys("uniform", 2000, gen)
    index = small(keys)
    index.save(tmp_path)
    opened = ChunkedIndex.open(tmp_path, device="cpu", processors="cpu", in_place_window=0)
    assert opened.processors == "cpu" and opened.in_place_window == 0
    check_lookup(opened.lookup(keys[:100]), *Reference(keys, "int64").points(keys[:100])[:2])
    with pytest.raises(TypeError, match="come from the saved index"):
        ChunkedIndex.open(tmp_path, device="cpu", chunk_bytes=1 << 20)
    with pytest.raises(TypeError, match="the options are"):
        ChunkedIndex.from_state_dict(index.state_dict(), device="cpu", bogus=1)
