"""A saved ChunkedIndex on disk: one file per chunk and a manifest per generation, ``CURRENT`` naming the live one.

A save writes a new generation and then replaces ``CURRENT`` atomically, so a reader sees the old or the new
state; the previous generation is kept for readers that opened it. A chunk file is a header (its kind's magic and
the payload size) and the blob; the manifest lists each file's size and CRC-32 and carries a CRC-32 of its own
content (``checksum``), so a hand-edited or damaged manifest is refused on open rather than answering wrongly.
The manifest is version 3 where a chunk of sorted pairs holds row offsets (older code would answer them without
the chunk's base), else version 2 for an updatable index, else version 1.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from typing import Any, Callable, Iterable

import torch

FORMAT = "torch_rtindex.ChunkedIndex"
VERSIONS = (1, 2, 3)
# A chunk file's first bytes say its kind: sorted cgRX pairs, or node chains (updatable=True).
MAGICS = {"pairs": b"RTXCHNK1", "nodes": b"RTXNODE1"}


def _manifest_crc(manifest: dict[str, Any]) -> int:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def generations(directory: str) -> list[int]:
    out = []
    for name in os.listdir(directory):
        if name.startswith("gen-") and name.endswith(".json"):
            try:
                out.append(int(name[4:-5]))
            except ValueError:
                pass
        elif name.startswith("gen-") and not name.endswith(".tmp") and name[4:].isdigit():
            out.append(int(name[4:]))
    return sorted(set(out))


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def write_chunk_file(path: str, blob: torch.Tensor, kind: str = "pairs") -> int:
    """Header (magic of the chunk's kind, payload size) and the blob; returns the CRC-32 of the whole file."""
    header = MAGICS[kind] + blob.numel().to_bytes(8, "little")
    data = memoryview(blob.numpy())
    with open(path, "wb") as f:
        f.write(header)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return zlib.crc32(data, zlib.crc32(header))


def read_chunk_file(file: dict | None, size: int, pin: bool) -> torch.Tensor:
    """A chunk's blob read from its file, checked: size, header, then CRC-32."""
    if file is None:
        raise RuntimeError("ChunkedIndex: a chunk has neither a host copy nor a file (internal error)")
    path = file["path"]
    try:
        actual = os.path.getsize(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"ChunkedIndex chunk file {path} is gone (the directory was saved over at least twice since this index "
            "was opened, or files were removed); open the directory again"
        ) from None
    if actual != size + 16:
        raise ValueError(f"ChunkedIndex chunk file {path} is truncated or corrupt: {actual} bytes, expected {size + 16}")
    buf = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
    with open(path, "rb") as f:
        header = f.read(16)
        got = f.readinto(memoryview(buf.numpy()))
    magic = MAGICS[file.get("kind", "pairs")]
    if got != size or header[:8] != magic or int.from_bytes(header[8:], "little") != size:
        raise ValueError(f"ChunkedIndex chunk file {path} is corrupt: bad header (not a {file.get('kind', 'pairs')} "
                         "chunk) or short read")
    crc = zlib.crc32(memoryview(buf.numpy()), zlib.crc32(header))
    if crc != file["crc32"]:
        raise ValueError(
            f"ChunkedIndex chunk file {path} is corrupt: CRC-32 {crc:#010x}, the manifest says {file['crc32']:#010x}"
        )
    return buf


def save_generation(directory: str | os.PathLike, chunks: Iterable, host: Callable[[Any], torch.Tensor],
                    settings: dict[str, Any], updatable: bool) -> None:
    """Writes ``chunks`` (read through ``host``) and a manifest holding ``settings`` as a new generation of
    ``directory``, switches ``CURRENT`` to it, keeps the previous generation and removes older ones. Chunks
    unchanged since they were read from or written to this directory are hard-linked, not rewritten; each
    chunk's ``file`` then names its new file."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    chunks = list(chunks)
    gens = generations(directory)
    g = (max(gens) + 1) if gens else 1
    name = f"gen-{g:06d}"
    tmp = os.path.join(directory, name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    entries, files = [], []
    # Version 2 where node chunks are (or will be made), 3 where pairs hold row offsets: older readers refuse
    # what they would misread and open the rest.
    nodes = updatable or any(c.kind == "nodes" for c in chunks)
    offsets = any(c.kind == "pairs" and c.n and c.rows_in_place() for c in chunks)
    for i, chunk in enumerate(chunks):
        fname = f"chunk-{i:06d}.bin"
        path = os.path.join(tmp, fname)
        if chunk.file is not None and os.path.exists(chunk.file["path"]):
            try:
                os.link(chunk.file["path"], path)
            except OSError:
                shutil.copyfile(chunk.file["path"], path)
            crc = chunk.file["crc32"]
        else:
            crc = write_chunk_file(path, host(chunk), chunk.kind)
        entry = {"file": f"{name}/{fname}", "size": chunk.nbytes, "crc32": crc, "n": chunk.n,
                 "lo": chunk.lo, "base": chunk.base, "kmin": chunk.kmin, "kmax": chunk.kmax,
                 "specs": chunk.specs}
        if nodes:
            entry.update(kind=chunk.kind, used=chunk.used)
        entries.append(entry)
        files.append((chunk, fname, crc))
    manifest = {"format": FORMAT, "version": 3 if offsets else 2 if nodes else 1, "generation": g,
                **{k: v for k, v in settings.items() if k not in ("updatable", "node_size", "growth")},
                "chunks": entries}
    if nodes:
        manifest.update(updatable=updatable, node_size=settings["node_size"], growth=settings["growth"])
    manifest["checksum"] = _manifest_crc(manifest)
    fsync_dir(tmp)
    os.replace(tmp, os.path.join(directory, name))
    atomic_write(os.path.join(directory, name + ".json"), json.dumps(manifest, indent=1).encode())
    atomic_write(os.path.join(directory, "CURRENT"), (name + ".json\n").encode())
    for chunk, fname, crc in files:
        chunk.file = {"path": os.path.join(directory, name, fname), "size": chunk.nbytes, "crc32": crc,
                      "kind": chunk.kind}
    for old in gens:
        if old < g - 1:
            shutil.rmtree(os.path.join(directory, f"gen-{old:06d}"), ignore_errors=True)
            try:
                os.remove(os.path.join(directory, f"gen-{old:06d}.json"))
            except FileNotFoundError:
                pass


def load_manifest(directory: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """The current generation's manifest of ``directory`` (its path and content), checked: format, version,
    its checksum (where written: manifests of older code have none) and that its key count is its chunks'."""
    directory = os.fspath(directory)
    try:
        with open(os.path.join(directory, "CURRENT")) as f:
            mpath = os.path.join(directory, f.read().strip())
        with open(mpath) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{directory} holds no readable ChunkedIndex (CURRENT and its manifest): {e}") from e
    if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("version") not in VERSIONS:
        raise ValueError(f"{mpath} is not a {FORMAT} manifest of a version this code reads {VERSIONS}")
    if "checksum" in m and m["checksum"] != _manifest_crc(m):
        raise ValueError(f"{mpath} is corrupt or was edited: its checksum does not match its content; save the "
                         "index again (or restore the file)")
    try:
        counted = sum(int(e["n"]) for e in m["chunks"])
        consistent = counted == m["n"]
    except (KeyError, TypeError, ValueError):
        consistent = False
    if not consistent:
        raise ValueError(f"{mpath} is corrupt: its key count n={m.get('n')!r} is not the sum of its chunks'")
    return mpath, m
