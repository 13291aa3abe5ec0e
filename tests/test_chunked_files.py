"""ChunkedIndex saved and opened: lazy, checked chunk files (a corrupt or truncated one named in its error), saves
as generations that readers keep, and a reader process that sees the old state or the new one, never a mix."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from chunked_support import ROOT, SMALL, check_all_forms, chunked
from keysets import I64_MIN, int64_keys, keys_of_type

from torch_rtindex import ChunkedIndex


# ------------------------------------------------------------------------------------------ save and open
def test_save_open_lazy_round_trip(tmp_path, gen):
    keys = keys_of_type("float64", 2000, gen)
    index = chunked(keys, "cpu")
    index.save(tmp_path / "idx")
    opened = ChunkedIndex.open(tmp_path / "idx", device="cpu", gpu_budget=3 * SMALL)
    assert not any(c["loaded"] for c in opened.chunk_info()) and len(opened) == len(index)
    q = keys[:5]  # touches a few chunks only
    assert torch.equal(opened.lookup_all(q).rows, index.lookup_all(q).rows)
    loaded = sum(c["loaded"] for c in opened.chunk_info())
    assert 0 < loaded < opened.num_chunks and opened.stats()["disk_loads"] == loaded
    check_all_forms(opened, keys, "float64", gen, "cpu", n_q=300)


def test_corrupt_and_truncated_chunk_files(tmp_path, gen):
    keys = int64_keys("uniform", 2000, gen)
    index = chunked(keys, "cpu")
    d = tmp_path / "idx"
    index.save(d)
    manifest = json.loads((d / (d / "CURRENT").read_text().strip()).read_text())
    f0 = d / manifest["chunks"][0]["file"]
    f1 = d / manifest["chunks"][1]["file"]
    data = bytearray(f0.read_bytes())
    data[len(data) // 2] ^= 0x40
    f0.write_bytes(bytes(data))
    f1.write_bytes(f1.read_bytes()[:-100])
    opened = ChunkedIndex.open(d, device="cpu", gpu_budget=0)
    in_chunk = [torch.tensor([c["lo"] ^ -(2**63)]) for c in opened.chunk_info()]  # a key of each chunk's range
    with pytest.raises(ValueError, match=f"{f0.name}.*corrupt.*CRC"):
        opened.lookup(torch.tensor([I64_MIN]))  # chunk 0 holds the smallest keys
    with pytest.raises(ValueError, match=f"{f1.name}.*truncated"):
        opened.range(in_chunk[1], in_chunk[1])
    for q in in_chunk[2:]:  # the other chunks still answer
        assert opened.lookup(q).count.item() >= 1
    with pytest.raises(ValueError, match=f"{f0.name}.*corrupt"):  # and the bad ones keep saying so
        opened.lookup(torch.tensor([I64_MIN]))


def test_saves_are_generations_readers_keep_theirs(tmp_path, gen):
    keys = int64_keys("uniform", 1500, gen)
    index = chunked(keys, "cpu")
    d = tmp_path / "idx"
    index.save(d)
    reader = ChunkedIndex.open(d, device="cpu", gpu_budget=0)  # old state, nothing loaded yet
    index.insert(torch.tensor([42, 42]))
    index.save(d)  # unchanged chunks are hard links, the touched one is new
    newer = ChunkedIndex.open(d, device="cpu", gpu_budget=0)
    q = torch.tensor([42])
    assert reader.lookup(q).count.item() == int((keys == 42).sum())  # the old generation, lazily, intact
    assert newer.lookup(q).count.item() == int((keys == 42).sum()) + 2
    assert len(newer) == len(keys) + 2 and newer.lookup_all(keys[:100]).rows.tolist() == index.lookup_all(keys[:100]).rows.tolist()
    gens = sorted(p.name for p in d.iterdir() if p.is_dir())
    assert gens == ["gen-000001", "gen-000002"]
    index.save(d)
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == ["gen-000002", "gen-000003"]
    with pytest.raises(ValueError, match="no readable ChunkedIndex"):
        ChunkedIndex.open(tmp_path / "nothing")


READER = r"""
import sys, time, torch
from torch_rtindex import ChunkedIndex
d, states = sys.argv[1], {}
for pair in sys.argv[2].split(","):
    n, c = pair.split(":")
    states[int(n)] = int(c)
import os
open(d + ".ready", "w").close()
seen, deadline = set(), time.time() + 60
while time.time() < deadline:
    done = os.path.exists(d + ".done")  # one more full read after the writer finished
    try:
        index = ChunkedIndex.open(d, device="cpu", gpu_budget=0)
        count = index.lookup(torch.tensor([42])).count.item()
        rows = index.range(torch.tensor([-2**63]), torch.tensor([2**63 - 1])).rows.numel()
    except FileNotFoundError:
        continue  # the generation this reader opened was removed meanwhile (saved over twice): open again
    except ValueError as e:
        if "no readable" in str(e):
            continue
        raise
    assert len(index) in states and states[len(index)] == count and rows == len(index), (len(index), count, rows)
    seen.add(len(index))
    if done:
        break
print("states seen", sorted(seen))
assert seen
"""


def test_a_reader_process_sees_old_or_new_state_never_a_mix(tmp_path, gen):
    keys = int64_keys("uniform", 1500, gen)
    index = chunked(keys, "cpu")
    d = tmp_path / "idx"
    index.save(d)
    n0, c0 = len(index), int((keys == 42).sum())
    proc = subprocess.Popen([sys.executable, "-c", READER, str(d), f"{n0}:{c0},{n0 + 2}:{c0 + 2}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    ready = Path(str(d) + ".ready")
    for _ in range(600):
        if ready.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    for i in range(30):  # alternate two states while the reader opens and reads
        if i % 2 == 0:
            added = index.insert(torch.tensor([42, 42])).rows
        else:
            assert index.delete(torch.tensor([42, 42]), rows=added).deleted == 2
        index.save(d)
        if proc.poll() is not None:
            break
    Path(str(d) + ".done").touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    print(out)
