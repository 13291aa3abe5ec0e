"""Index state and devices (RXIndex, CgRXIndex, UpdatableCgRXIndex): state_dict / from_state_dict /
load_state_dict, torch.save / torch.load, pickling and deepcopy, .to() / .cpu() / .cuda(), memory() and repr;
answers compared before and after, and with the reference."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest
import torch
from keysets import ROW, int64_keys, keys_of_type, point_queries, range_queries
from reference import Reference, check_lookup, check_matches

from torch_rtindex import CgRXIndex, Matches, RXIndex, SceneConfig, UpdatableCgRXIndex

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def by_row(m: Matches) -> Matches:
    """A CSR answer with each query's rows in ascending order (cgRX ranges come in key order)."""
    owner = m.query_ids().cpu()
    return Matches(m.offsets.cpu(), torch.sort(owner * 2**32 + m.rows.cpu()).values & 0xFFFFFFFF)


def check_answers(index, keys: torch.Tensor, key_type: str, gen: torch.Generator) -> None:
    """Point and range lookups of ``index`` (on its device) against the reference over ``keys`` (CPU, the
    bits as int64 for uint64 keys)."""
    ref = Reference(keys, key_type)
    dev = lambda t: t.view(index.key_dtype).to(index.device)  # noqa: E731  (int64 bits -> torch.uint64 queries)
    q = point_queries(keys, 300, gen)
    first, count, rows = ref.points(q)
    check_lookup(index.lookup(dev(q)), first, count)
    check_matches(index.lookup_all(dev(q)), rows)
    width = 10.0 if keys.dtype.is_floating_point else 3 * ROW
    lo, hi = range_queries(keys, 100, gen, width)
    first, count, rows = ref.ranges(lo, hi)
    check_lookup(index.range_lookup(dev(lo), dev(hi)), first, count)
    m = index.range(dev(lo), dev(hi))
    check_matches(m if index.range_rows_ascending else by_row(m), rows)


def save_load(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


CONFIGS = [
    ("int64", {}),
    ("uint64", {"key_type": "uint64"}),  # unsigned values in int64 storage: the key type is part of the state
    ("float32", {"scene": SceneConfig(22, 21, 21), "max_range_rays": 7}),
    ("int32", {"allow_update": True}),
]


@pytest.mark.parametrize("key_type,options", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_state_dict_round_trip_through_torch_save(device, gen, tmp_path, key_type, options):
    keys = keys_of_type(key_type, 1500, gen).to(device)
    index = RXIndex(keys, **options)
    state = index.state_dict()
    assert torch.equal(state["keys"], keys) and state["keys"].dtype == keys.dtype  # exported from the index
    assert state["key_type"] == key_type
    assert state["scene"] == (options.get("scene") or SceneConfig()).as_list()
    assert state["allow_update"] == options.get("allow_update", False)
    assert state["max_range_rays"] == options.get("max_range_rays", 1024)

    path = tmp_path / "index.pt"
    torch.save(state, path)
    loaded = torch.load(path, weights_only=True)  # plain tensors, strings, ints: no pickled classes needed
    restored = RXIndex.from_state_dict(loaded)
    assert restored.device == index.device and restored.key_type == key_type
    assert (restored.scene, restored.allow_update, restored.max_range_rays, restored.unique_keys) == (
        index.scene, index.allow_update, index.max_range_rays, index.unique_keys)
    assert torch.equal(restored.state_dict()["keys"], keys)
    for a, b in zip(restored.lookup(keys), index.lookup(keys)):  # before and after agree
        assert torch.equal(a, b)
    check_answers(restored, keys.cpu(), key_type, gen)


def test_native_uint64_dtype_round_trip(device, gen):
    if not hasattr(torch, "uint64"):
        pytest.skip("no torch.uint64 in this PyTorch")
    keys = int64_keys("uniform", 500, gen).view(torch.uint64).to(device)
    restored = RXIndex.from_state_dict(save_load(RXIndex(keys).state_dict(), weights_only=True))
    assert restored.key_dtype == torch.uint64 and restored.key_type == "uint64"
    check_answers(restored, keys.cpu().view(torch.int64), "uint64", gen)


def test_load_state_dict_replaces_the_index_in_place(device, gen):
    old_keys = int64_keys("uniform", 800, gen)
    new_keys = int64_keys("duplicates", 1200, gen)
    index = RXIndex(old_keys.to(device))
    state = RXIndex(new_keys, max_range_rays=5).state_dict()  # saved from a CPU index
    index.load_state_dict(save_load(state))
    assert index.device.type == device.type  # built where the index was, not where the state's keys were
    assert index.max_range_rays == 5 and len(index) == new_keys.numel() and not index.unique_keys
    check_answers(index, new_keys, "int64", gen)

    # A malformed state, or keys the index rejects, leave the index as it was.
    with pytest.raises(KeyError, match="missing entries"):
        index.load_state_dict({k: v for k, v in state.items() if k != "scene"})
    with pytest.raises(KeyError, match="unexpected entries"):
        index.load_state_dict({**state, "bvh": torch.zeros(3)})
    with pytest.raises(ValueError, match="NaN"):
        nan_keys = torch.tensor([1.0, float("nan")], dtype=torch.float64)
        index.load_state_dict({**state, "keys": nan_keys, "key_type": "float64"})
    check_answers(index, new_keys, "int64", gen)


def test_state_follows_rebuild_and_refit(device, gen):
    keys = int64_keys("uniform", 600, gen).to(device)
    index = RXIndex(keys, allow_update=True)
    moved = keys + 3
    index.refit(moved)
    assert torch.equal(index.state_dict()["keys"], moved)
    fresh = int64_keys("dense", 400, gen).to(device)
    index.rebuild(fresh)
    assert torch.equal(index.state_dict()["keys"], fresh)
    check_answers(RXIndex.from_state_dict(save_load(index.state_dict())), fresh.cpu(), "int64", gen)


@pytest.mark.parametrize("write", ["in_place", "numpy", "data"])
@pytest.mark.parametrize("cls", [RXIndex, CgRXIndex])
def test_state_dict_saves_what_the_index_holds(device, gen, write, cls):
    """Keys written after the build, also where no version counter sees it (numpy's view, DLPack, .data):
    the state still equals the index, which answers for the old values."""
    keys = int64_keys("uniform", 100, gen).to(device)
    old = keys.clone()
    index = cls(keys)
    if write == "in_place":
        keys[0] += 1
    elif write == "numpy" and device.type == "cpu":
        keys.numpy()[0] += 1
    else:
        keys.data[0] += 1
    assert index.lookup(old[:1]).count.tolist() == [1]
    assert torch.equal(index.state_dict()["keys"], old)
    check_answers(cls.from_state_dict(save_load(index.state_dict())), old.cpu(), "int64", gen)
    index.rebuild(keys)
    assert torch.equal(index.state_dict()["keys"], keys)


def test_pickle_and_deepcopy_rebuild_the_structure(device, gen):
    keys = int64_keys("duplicates", 900, gen).to(device)
    index = RXIndex(keys)
    for clone in (copy.deepcopy(index), pickle.loads(pickle.dumps(index)), save_load(index, weights_only=False)):
        assert clone._structure.data_ptr() != index._structure.data_ptr()
        assert clone.device == index.device
        check_answers(clone, keys.cpu(), "int64", gen)


@pytest.mark.parametrize("target", DEVICES)
def test_to_builds_the_index_on_the_target_device(device, gen, target):
    keys = int64_keys("duplicates", 1000, gen)
    index = RXIndex(keys.to(device), max_range_rays=9)
    moved = index.to(target)
    if torch.device(target).type == device.type:
        assert moved is index  # already there, like Tensor.to
    else:
        assert moved is not index and moved.device.type == target
        assert moved.max_range_rays == 9 and moved.unique_keys == index.unique_keys
        part = "bvh" if target == "cuda" else "sorted_keys"
        assert set(moved.memory()) == {part, "keys"} and f"device={moved.device}" in repr(moved)
    check_answers(moved, keys, "int64", gen)
    check_answers(index.cpu(), keys, "int64", gen)
    assert index.cpu().device.type == "cpu"
    if torch.cuda.is_available():
        on_gpu = index.cuda()
        assert on_gpu.device.type == "cuda"
        q = point_queries(keys, 200, gen)
        for a, b in zip(on_gpu.lookup(q.cuda()), index.cpu().lookup(q)):
            assert torch.equal(a.cpu(), b)


def test_repr_and_memory_unchanged(device):
    index = RXIndex(torch.arange(1000, device=device))
    mem = index.memory()
    part = "bvh" if device.type == "cuda" else "sorted_keys"
    assert set(mem) == {part, "keys"} and mem["keys"] == 8000
    if device.type == "cpu":
        assert mem["sorted_keys"] == 2 * 8 * 1000
    assert repr(index).startswith("RXIndex(keys=1000, key_type=int64") and "unique=True" in repr(index)
    np.testing.assert_array_equal(index.lookup(torch.tensor([999, 1000], device=device)).first_row.cpu(), [999, -1])


# ---------------------------------------------------------------------------------------------------- cgRX
CGRX_CONFIGS = [
    ("int64", {}),
    ("uint64", {"key_type": "uint64", "backend": "binary_search"}),
    ("float32", {"bucket_size": 4, "layout": "column", "bucket_search": "linear"}),
    ("int32", {"backend": "optix", "representation": "naive", "layout": "aligned_row", "scene": SceneConfig(22, 21, 21)}),
]


@pytest.mark.parametrize("key_type,options", CGRX_CONFIGS, ids=[c[0] for c in CGRX_CONFIGS])
def test_cgrx_state_dict_round_trip_through_torch_save(device, gen, tmp_path, key_type, options):
    keys = keys_of_type(key_type, 1500, gen).to(device)
    index = CgRXIndex(keys, **options)
    state = index.state_dict()
    assert torch.equal(state["keys"], keys) and state["key_type"] == key_type  # exported from the index
    assert state["backend"] == options.get("backend", "auto")  # as requested: "auto" is resolved where it is loaded
    assert state["bucket_size"] == options.get("bucket_size", 16)
    assert state["layout"] == options.get("layout", "auto")  # as requested, like the backend
    path = tmp_path / "cgrx.pt"
    torch.save(state, path)
    restored = CgRXIndex.from_state_dict(torch.load(path, weights_only=True))
    for attr in ("device", "key_type", "key_dtype", "bucket_size", "layout", "bucket_search", "backend", "scene",
                 "representation", "num_buckets"):
        assert getattr(restored, attr) == getattr(index, attr), attr
    for a, b in zip(restored.lookup(keys), index.lookup(keys)):
        assert torch.equal(a, b)
    check_answers(restored, keys.cpu(), key_type, gen)


def test_cgrx_load_state_dict_pickle_and_refusals(device, gen):
    old_keys, new_keys = int64_keys("uniform", 800, gen), int64_keys("duplicates", 1200, gen)
    index = CgRXIndex(old_keys.to(device), backend="radix")
    state = CgRXIndex(new_keys, bucket_size=4).state_dict()  # saved from a CPU index
    index.load_state_dict(save_load(state))
    assert index.device.type == device.type and index.bucket_size == 4 and len(index) == new_keys.numel()
    check_answers(index, new_keys, "int64", gen)
    with pytest.raises(KeyError, match="missing entries"):
        index.load_state_dict({k: v for k, v in state.items() if k != "layout"})
    with pytest.raises(KeyError, match="unexpected entries"):
        index.load_state_dict({**state, "pairs": torch.zeros(3)})
    with pytest.raises(ValueError, match="not a CgRXIndex state of version 1"):
        index.load_state_dict({**state, "format": "torch_rtindex.RXIndex"})
    check_answers(index, new_keys, "int64", gen)  # unchanged by the failed loads

    for clone in (copy.deepcopy(index), pickle.loads(pickle.dumps(index)), save_load(index, weights_only=False)):
        assert clone._pairs.data_ptr() != index._pairs.data_ptr() and clone.device == index.device
        check_answers(clone, new_keys, "int64", gen)



@pytest.mark.parametrize("target", DEVICES)
@pytest.mark.parametrize("cls", [CgRXIndex, UpdatableCgRXIndex])
def test_cgrx_to_memory_and_repr(device, gen, target, cls):
    keys = int64_keys("duplicates", 1000, gen)
    index = cls(keys.to(device), backend="radix")
    moved = index.to(target)
    if torch.device(target).type == device.type:
        assert moved is index
    else:
        assert moved is not index and moved.device.type == target and moved.backend == "radix"
    check_answers(moved, keys, "int64", gen)
    assert index.cpu().device.type == "cpu"
    if torch.cuda.is_available():
        assert index.cuda().device.type == "cuda"
    mem = moved.memory()
    expected = {"pairs", "representatives", "radix_table", "bvh"} if cls is CgRXIndex else {
        "nodes", "free_node_space", "representatives", "radix_table", "bvh"}
    assert set(mem) == expected and all(isinstance(v, int) and v >= 0 for v in mem.values())
    assert mem["representatives"] == 8 * moved.num_buckets and mem["bvh"] == 0  # no OptiX scene for "radix"
    text = repr(moved)
    assert text.startswith(f"{cls.__name__}(keys={keys.numel()}, key_type=int64, device={moved.device}")
    assert "backend=radix" in text and "memory=" in text


# ------------------------------------------------------------------------------------- UpdatableCgRXIndex
def updated_index(device, gen, key_type: str = "int64"):
    """An updatable index after inserts and deletes, with the reference pairs (key value, row ID) it holds."""
    keys = keys_of_type(key_type, 600, gen)
    options = {"key_type": "uint64"} if key_type == "uint64" else {}
    index = UpdatableCgRXIndex(keys.to(device), node_size=8, **options)
    ins = keys_of_type(key_type, 300, gen)
    res = index.update(insert_keys=ins.to(device), delete_keys=keys[:40].to(device), delete_rows=torch.arange(40, device=device))
    index.delete(keys[100:110].to(device))  # every pair of those keys
    pairs = list(zip(keys.tolist(), range(keys.numel()))) + list(zip(ins.tolist(), res.rows.tolist()))
    gone = set(keys[100:110].tolist())
    pairs = [(k, r) for k, r in pairs if r >= 40 and k not in gone]
    return index, pairs, torch.cat([keys, ins])


@pytest.mark.parametrize("key_type", ["int64", "float32", "uint64"])
def test_updatable_state_holds_the_pairs_after_updates(device, gen, tmp_path, key_type):
    index, pairs, all_keys = updated_index(device, gen, key_type)
    state = index.state_dict()
    assert state["keys_ordered"] is True and state["key_dtype"] == str(index.key_dtype).removeprefix("torch.")
    assert state["next_row"] == index._next_row and state["keys"].dtype == torch.int64
    # The keys are the ordered-key map of the pairs' keys (csrc/core/keys.h), with their row IDs.
    vals = torch.tensor([k for k, _ in pairs], dtype=all_keys.dtype)
    want = sorted(zip(torch.ops.rtindex.map_keys(vals, {"int64": 0, "float32": 3, "uint64": 2}[key_type]).tolist(),
                      [r for _, r in pairs]))
    assert sorted(zip(state["keys"].cpu().tolist(), state["rows"].cpu().tolist())) == want

    path = tmp_path / "updatable.pt"
    torch.save(state, path)
    restored = UpdatableCgRXIndex.from_state_dict(torch.load(path, weights_only=True))
    assert (restored.key_dtype, restored.key_type, restored.node_size, restored.device, len(restored)) == (
        index.key_dtype, index.key_type, index.node_size, index.device, len(index))
    q = all_keys.to(device)
    for a, b in zip(restored.lookup(q), index.lookup(q)):
        assert torch.equal(a, b)
    for a, b in zip(restored.lookup_all(q), index.lookup_all(q)):
        assert torch.equal(a, b)
    # Row IDs continue where the saved index left off, on both.
    new = all_keys[:3].to(device)
    assert torch.equal(restored.insert(new).rows, index.insert(new).rows)
    values = torch.arange(index._next_row, dtype=torch.float64, device=device)
    for a, b in zip(restored.aggregate(q, values), index.aggregate(q, values)):
        assert torch.equal(a, b)


def test_updatable_load_state_dict_to_and_hand_made_states(device, gen):
    index, pairs, all_keys = updated_index(device, gen)
    q = all_keys.to(device)
    before = index.lookup_all(q)
    other = UpdatableCgRXIndex(torch.tensor([1, 2, 3]))
    other.load_state_dict(save_load(index.state_dict()))  # built on other's device (the CPU)
    assert other.device.type == "cpu"
    for a, b in zip(other.lookup_all(q.cpu()), before):
        assert torch.equal(a, b.cpu())
    for target in DEVICES:
        moved = index.to(target)
        for a, b in zip(moved.lookup_all(q.to(target)), before):
            assert torch.equal(a.cpu(), b.cpu())
    clone = copy.deepcopy(index)
    assert clone._pairs.data_ptr() != index._pairs.data_ptr()
    for a, b in zip(clone.lookup_all(q), before):
        assert torch.equal(a, b)

    # A state made by hand with keys of the key dtype (keys_ordered=False) works too.
    hand = {**index.state_dict(), "keys": torch.tensor([5, 7, 5], device=device), "rows": torch.tensor([0, 1, 9], device=device),
            "keys_ordered": False, "next_row": 10}
    small = UpdatableCgRXIndex.from_state_dict(hand)
    assert small.lookup_all(torch.tensor([5, 7, 6], device=device)).rows.tolist() == [0, 9, 1]
    assert small.insert(torch.tensor([6], device=device)).rows.tolist() == [10]
    with pytest.raises(ValueError, match="rows"):
        UpdatableCgRXIndex.from_state_dict({**hand, "rows": torch.tensor([0, 1], device=device)})
    with pytest.raises(KeyError, match="missing entries"):
        index.load_state_dict({k: v for k, v in hand.items() if k != "next_row"})
    for a, b in zip(index.lookup_all(q), before):  # unchanged by the failed load
        assert torch.equal(a, b)
