"""RXIndex state and devices: state_dict / from_state_dict / load_state_dict, torch.save / torch.load,
pickling and deepcopy, .to() / .cpu() / .cuda(); answers compared before and after, and with the reference."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest
import torch
from keysets import ROW, int64_keys, keys_of_type, point_queries, range_queries
from reference import Reference, check_lookup, check_matches

from torch_rtindex import RXIndex, SceneConfig

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def check_answers(index: RXIndex, keys: torch.Tensor, key_type: str, gen: torch.Generator) -> None:
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
    check_matches(index.range(dev(lo), dev(hi)), rows)


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
    assert state["keys"] is keys  # the caller's tensor as given, not the mapped copy
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
    assert index.state_dict()["keys"] is moved
    fresh = int64_keys("dense", 400, gen).to(device)
    index.rebuild(fresh)
    assert index.state_dict()["keys"] is fresh
    check_answers(RXIndex.from_state_dict(save_load(index.state_dict())), fresh.cpu(), "int64", gen)


def test_state_dict_refuses_keys_modified_in_place(device, gen):
    keys = int64_keys("uniform", 100, gen).to(device)
    index = RXIndex(keys)
    keys[0] += 1  # the index still answers for the old value; the tensor no longer holds it
    assert index.lookup(keys[1:2]).count.tolist() == [1]
    with pytest.raises(RuntimeError, match="modified in place"):
        index.state_dict()
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
