"""torch.save(index) / torch.load(f) with the default weights_only=True (torch_rtindex/_serialization.py): every
index class and IdToRow come back with the same answers (checked against numpy brute force), inside containers
too; a file with a malformed state or a foreign global is still refused."""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest
import torch

from torch_rtindex import CgRXIndex, IdToRow, RXIndex, UpdatableCgRXIndex, join, range_join


def round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def brute_force(build: np.ndarray, rows: np.ndarray, match: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(probe, build row) pairs of a [probes, build] match matrix, by probe then row ID."""
    probe, at = np.nonzero(match)
    pairs = np.stack([probe, rows[at]])
    order = np.lexsort(pairs[::-1])
    return pairs[0][order], pairs[1][order]


def check_answers(index, build: np.ndarray, rows: np.ndarray, key_type: str) -> None:
    """Point and range joins of `index` equal brute force over the (key, row) table it should hold."""
    rng = np.random.default_rng(0)
    view = (lambda a: a.view(np.uint64)) if key_type == "uint64" else (lambda a: a)
    q = np.concatenate([build[rng.integers(0, build.size, 50)], build[:5] + np.array(1, build.dtype)])
    for got, match in (
        (join(index, torch.from_numpy(q)), view(q)[:, None] == view(build)[None, :]),
        (range_join(index, torch.from_numpy(q), torch.from_numpy(q[::-1].copy())),
         (view(build)[None, :] >= view(q)[:, None]) & (view(build)[None, :] <= view(q[::-1])[:, None])),
    ):
        want = brute_force(build, rows, match)
        np.testing.assert_array_equal(got[0].numpy(), want[0])
        np.testing.assert_array_equal(got[1].numpy(), want[1])


def keys_of(key_type: str) -> np.ndarray:
    rng = np.random.default_rng(1)
    if key_type in ("int64", "uint64"):
        k = rng.integers(-(2**63), 2**63 - 1, 100, dtype=np.int64)
        k = np.concatenate([k, [-(2**63), 2**63 - 1, 0, -1]])
    elif key_type == "int32":
        k = rng.integers(-(2**31), 2**31 - 1, 100, dtype=np.int32)
    else:
        k = (rng.standard_normal(100) * 1e3).astype(np.float32)
    return np.repeat(k, rng.integers(1, 4, k.size))  # duplicates


INDEXES = {
    "rx": lambda k, **kw: RXIndex(k, **kw),
    "cgrx_radix": lambda k, **kw: CgRXIndex(k, bucket_size=4, backend="radix", **kw),
    "cgrx_binary_search": lambda k, **kw: CgRXIndex(k, bucket_size=8, backend="binary_search", layout="column", **kw),
    "cgrx_optix": lambda k, **kw: CgRXIndex(k, backend="optix", **kw),
    "updatable": lambda k, **kw: UpdatableCgRXIndex(k, node_size=4, **kw),
}


@pytest.mark.parametrize("key_type", ["int64", "uint64", "int32", "float32"])
@pytest.mark.parametrize("kind", list(INDEXES))
def test_index_round_trip(kind, key_type):
    build = keys_of(key_type)
    index = INDEXES[kind](torch.from_numpy(build), **({"key_type": "uint64"} if key_type == "uint64" else {}))
    loaded = round_trip(index)  # torch.load's default: weights_only=True from torch 2.6 on
    explicit = round_trip(index, weights_only=True)
    for got in (loaded, explicit):
        assert type(got) is type(index) and got is not index and repr(got) == repr(index)
        assert got.key_type == index.key_type and got.key_dtype == index.key_dtype
        check_answers(got, build, np.arange(build.size), key_type)


def test_updated_index_round_trip():
    """The loaded index holds the updated pairs (row IDs that are not positions) and hands out the same next
    row ID."""
    build = keys_of("int64")
    index = UpdatableCgRXIndex(torch.from_numpy(build), node_size=4)
    new = np.array([7, 7, 2**62], dtype=np.int64)
    index.insert(torch.from_numpy(new))
    index.delete(torch.from_numpy(build[:10]))  # every pair of these keys
    keys = np.concatenate([build, new])
    rows = np.arange(keys.size)
    keep = ~np.isin(keys, build[:10])
    loaded = round_trip(index)
    check_answers(loaded, keys[keep], rows[keep], "int64")
    assert loaded.insert(torch.tensor([5])).rows.tolist() == index.insert(torch.tensor([5])).rows.tolist() == [keys.size]


def test_in_containers():
    build = keys_of("int64")
    saved = {"index": CgRXIndex(torch.from_numpy(build)), "table": torch.arange(3.0), "more": [RXIndex(torch.from_numpy(build))]}
    loaded = round_trip(saved)
    assert torch.equal(loaded["table"], saved["table"])
    check_answers(loaded["index"], build, np.arange(build.size), "int64")
    check_answers(loaded["more"][0], build, np.arange(build.size), "int64")


@pytest.mark.parametrize("index_kind", ["cgrx", "rx"])
def test_id_to_row_round_trip(index_kind):
    ids = torch.tensor([50, 10, 70, 30])
    module = IdToRow(ids, miss="default", default_row=4, index=index_kind)
    loaded = round_trip(module)
    assert type(loaded) is IdToRow and loaded.miss == "default" and loaded.default_row == 4
    assert loaded.index_kind == index_kind and torch.equal(loaded.ids, ids)
    q = torch.tensor([70, 10, 11, 30, 50, 99])
    assert loaded(q).tolist() == [2, 1, 4, 3, 0, 4]  # positions of the IDs; misses go to default_row


def forged(state: dict):
    """A CgRXIndex that pickles with an arbitrary state, as a hostile or corrupted file could hold."""
    index = CgRXIndex(torch.tensor([1, 2]))
    index.__getstate__ = lambda: state  # pickle asks the instance for its state
    return index


def test_malformed_state_refused():
    """The allowlisted classes check what they are built from: a wrong state is an error, not an index."""
    with pytest.raises((pickle.UnpicklingError, KeyError), match="not a CgRXIndex state"):
        round_trip(forged({"format": "torch_rtindex.CgRXIndex", "version": 1}))
    state = CgRXIndex(torch.tensor([1, 2])).state_dict()
    state["keys"] = [1, 2]  # not a tensor
    with pytest.raises((pickle.UnpicklingError, TypeError), match="keys must be a tensor"):
        round_trip(forged(state))
    module = IdToRow(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="miss must be one of"):
        module.miss = "anything"  # checked where it is set
    module.__dict__["_miss"] = "anything"  # as a forged file could hold it
    with pytest.raises((pickle.UnpicklingError, ValueError), match="not an IdToRow state"):
        round_trip(module)


def test_foreign_global_still_refused():
    """Allowlisting the index classes opens nothing else: a state naming any other callable is refused."""
    state = CgRXIndex(torch.tensor([1, 2])).state_dict()
    state["key_type"] = os.getcwd
    with pytest.raises(pickle.UnpicklingError, match="getcwd"):
        round_trip(forged(state))
