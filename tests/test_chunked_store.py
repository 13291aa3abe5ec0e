"""The out-of-core index's chunk store and files through their own functions: the blob layout, rows stored as
offsets, chunk files and their checks, generations and the checksummed manifest."""

from __future__ import annotations

import json
import os

import pytest
import torch

from torch_rtindex.chunked.files import (load_manifest, read_chunk_file, save_generation, write_chunk_file)
from torch_rtindex.chunked.store import ALIGN, Chunk, blob_specs, pack, pair_rows, place_rows, views


def test_a_blob_holds_each_tensor_at_an_aligned_offset():
    gen = torch.Generator().manual_seed(5)
    tensors = {"pairs": torch.randint(-2**31, 2**31, (37,), dtype=torch.int32, generator=gen),
               "reps": torch.randint(-2**62, 2**62, (5,), generator=gen), "table": torch.empty(0, dtype=torch.int32),
               "l2g": torch.arange(3, dtype=torch.int64)}
    blob, specs = pack(tensors, pin=False)
    assert [s[0] for s in specs] == list(tensors) and all(s[3] % ALIGN == 0 for s in specs)
    assert blob.numel() == blob_specs(tensors)[1] and blob.numel() % ALIGN == 0
    for name, view in views(blob, specs).items():
        assert torch.equal(view, tensors[name])


@pytest.mark.parametrize("layout,width", [("packed_row", 3), ("aligned_row", 4)])
def test_rows_spanning_under_2_32_are_stored_as_offsets(layout, width):
    local = torch.tensor([3, 0, 2, 1], dtype=torch.int32)  # each pair's local row (row order = global order)
    pairs = torch.zeros(4 * width, dtype=torch.int32)
    pair_rows(pairs, 4, layout).copy_(local)
    narrow = torch.tensor([99, 100, 104, 2**31 + 99])  # ascending global rows, spanning < 2^32
    got = pairs.clone()
    base, row_map = place_rows(got, layout, narrow)
    assert base == 99 and row_map.numel() == 0
    words = pair_rows(got, 4, layout).to(torch.int64) & 0xFFFFFFFF
    assert words.tolist() == [(narrow[r] - 99).item() for r in local.tolist()]  # offsets from base, unsigned
    wide = torch.tensor([99, 100, 2**32 + 99, 2**32 + 100])  # spanning 2^32: local rows and a map
    got = pairs.clone()
    base, row_map = place_rows(got, layout, wide)
    assert base == 99 and row_map.tolist() == (wide - 99).tolist() and torch.equal(got, pairs)


def _chunk(blob, n=3):
    return Chunk(lo=0, n=n, base=0, kmin=None, kmax=None, specs=[["l2g", "int64", 0, 0]], size=blob.numel(),
                 host=blob)


def test_chunk_files_are_checked_for_size_kind_and_crc(tmp_path):
    blob = torch.arange(512, dtype=torch.int32).view(torch.uint8)
    path = str(tmp_path / "c.bin")
    crc = write_chunk_file(path, blob, "pairs")
    file = {"path": path, "size": blob.numel(), "crc32": crc, "kind": "pairs"}
    assert torch.equal(read_chunk_file(file, blob.numel(), pin=False), blob)
    with pytest.raises(ValueError, match="not a nodes chunk"):
        read_chunk_file(dict(file, kind="nodes"), blob.numel(), pin=False)
    data = bytearray(open(path, "rb").read())
    data[100] ^= 1
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match="CRC-32"):
        read_chunk_file(file, blob.numel(), pin=False)
    open(path, "wb").write(bytes(data[:-5]))
    with pytest.raises(ValueError, match="truncated"):
        read_chunk_file(file, blob.numel(), pin=False)
    os.remove(path)
    with pytest.raises(FileNotFoundError, match="open the directory again"):
        read_chunk_file(file, blob.numel(), pin=False)


def test_generations_keep_the_previous_one_and_the_manifest_is_checksummed(tmp_path):
    blobs = [torch.full((256,), i, dtype=torch.uint8) for i in range(3)]
    chunks = [_chunk(b) for b in blobs]
    settings = {"key_type": "int64", "key_dtype": "int64", "n": 9, "next_row": 9, "rows_are_positions": True,
                "chunk_bytes": 4096, "bucket_size": 16, "layout": "packed_row", "backend": "radix",
                "updatable": False, "node_size": 32, "growth": 1.25}
    for g in range(1, 4):
        save_generation(tmp_path, chunks, lambda c: c.host, settings, updatable=False)
        path, m = load_manifest(tmp_path)
        assert m["generation"] == g and m["n"] == 9 and len(m["chunks"]) == 3
        kept = sorted(p for p in os.listdir(tmp_path) if p.startswith("gen-") and not p.endswith(".json"))
        assert kept == [f"gen-{k:06d}" for k in range(max(1, g - 1), g + 1)]  # this one and the previous
    for c, b in zip(chunks, blobs):  # the chunks now name their files, which hold their blobs
        assert torch.equal(read_chunk_file(c.file, c.nbytes, pin=False), b)
    m["chunks"][0]["n"] = 4  # a hand edit
    with open(path, "w") as f:
        json.dump(m, f)
    with pytest.raises(ValueError, match="checksum does not match"):
        load_manifest(tmp_path)
    with open(tmp_path / "CURRENT", "w") as f:
        f.write("gen-999999.json\n")
    with pytest.raises(ValueError, match="holds no readable ChunkedIndex"):
        load_manifest(tmp_path)


def test_equal_indexes_save_equal_files(tmp_path):
    """Two builds over the same keys save byte-identical chunk files: the blobs' alignment padding is zeroed."""
    from torch_rtindex import ChunkedIndex

    g = torch.Generator().manual_seed(5)
    keys = torch.randint(-2**63, 2**63 - 1, (3000,), generator=g)[torch.randint(0, 3000, (3000,), generator=g)]
    for i in range(2):
        ChunkedIndex(keys, device="cpu", chunk_bytes=4096, progress=False).save(tmp_path / str(i))
    names = sorted(p.relative_to(tmp_path / "0") for p in (tmp_path / "0").rglob("*") if p.is_file())
    assert len(names) > 2
    for name in names:
        assert (tmp_path / "0" / name).read_bytes() == (tmp_path / "1" / name).read_bytes(), name
