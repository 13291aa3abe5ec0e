"""The build cache and the prebuilt extension (torch_rtindex/_extension.py).

The cache is keyed by what a build depends on, never by the checkout's path: two copies of the sources at
different paths, imported alternately in fresh processes, compile once. A rebuild names the input that changed.
A prebuilt extension is used when it matches the installed torch, else the package says why and builds just in
time. Subprocesses load _extension.py on its own (as setup.py does) where the package's import is not the point.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torch_rtindex import _extension

REPO = Path(__file__).resolve().parent.parent
EXTENSION_PY = REPO / "torch_rtindex" / "_extension.py"

PROBE_CPP = """#include <pybind11/pybind11.h>
int answer() { return ANSWER; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }
"""
PROBE_H = "#define ANSWER {}\n"

# A tiny extension built through the package's own cache (jit_build), in a fresh process per import.
BUILD_PROBE = """
import importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("_rtindex_build", sys.argv[1])
ext = sys.modules["_rtindex_build"] = importlib.util.module_from_spec(spec); spec.loader.exec_module(ext)
probe = ext.BuildSpec(name="rtindex_cache_probe", csrc=Path(sys.argv[2]), sources=("probe.cpp",), cflags=("-O0",))
module, info = ext.jit_build(probe, Path(sys.argv[3]))
print(json.dumps({"answer": module.answer(), "path": info["path"]}))
"""


def _probe_sources(where: Path, answer: int) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "probe.cpp").write_text('#include "probe.h"\n' + PROBE_CPP)
    (where / "probe.h").write_text(PROBE_H.format(answer))
    return where


def _build_in_subprocess(csrc: Path, cache: Path) -> tuple[dict, str]:
    res = subprocess.run([sys.executable, "-c", BUILD_PROBE, str(EXTENSION_PY), str(csrc), str(cache)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr


def test_two_checkouts_alternately_compile_once(tmp_path):
    a = _probe_sources(tmp_path / "checkout_a" / "csrc", 42)
    b = _probe_sources(tmp_path / "elsewhere" / "checkout_b" / "csrc", 42)
    cache = tmp_path / "cache"
    results = [_build_in_subprocess(src, cache) for src in (a, b, a, b)]
    compiled = [i for i, (_, err) in enumerate(results) if "compiling" in err]
    assert compiled == [0], [err for _, err in results]
    assert "no earlier build" in results[0][1]
    assert {r["answer"] for r, _ in results} == {42}
    assert len({r["path"] for r, _ in results}) == 1

    # A changed header is a new build that says which file changed; the old one stays for checkout A.
    (b / "probe.h").write_text(PROBE_H.format(7))
    changed, err = _build_in_subprocess(b, cache)
    assert changed["answer"] == 7 and "sources changed: probe.h" in err
    again, err = _build_in_subprocess(a, cache)
    assert again["answer"] == 42 and "compiling" not in err and again["path"] == results[0][0]["path"]


def test_build_inputs_do_not_depend_on_the_checkout_path(tmp_path):
    shutil.copytree(_extension.CSRC, tmp_path / "a")
    shutil.copytree(_extension.CSRC, tmp_path / "b")
    inputs = [_extension.build_inputs(spec, _extension.read_sources(spec.csrc))
              for spec in (_extension.extension_spec(False, tmp_path / "a"), _extension.extension_spec(False, tmp_path / "b"))]
    assert inputs[0] == inputs[1]
    assert str(tmp_path) not in json.dumps(inputs[0])


def test_every_input_is_in_the_digest(tmp_path, monkeypatch):
    spec = _extension.extension_spec(False)
    sources = _extension.read_sources(spec.csrc)
    base = _extension.build_inputs(spec, sources)
    variants = {
        "source": _extension.build_inputs(spec, {**sources, "ops.cpp": sources["ops.cpp"] + b"\n"}),
        "flag": _extension.build_inputs(spec.__class__(**{**spec.__dict__, "cflags": spec.cflags + ("-g",)}), sources),
    }
    fake_cxx = tmp_path / "c++"
    fake_cxx.write_text("#!/bin/sh\n")
    fake_cxx.chmod(0o755)
    with monkeypatch.context() as patch:  # then CXX is as it was (a GPU machine sets it)
        patch.setenv("CXX", str(fake_cxx))
        variants["compiler"] = _extension.build_inputs(spec, sources)
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    variants["torch"] = _extension.build_inputs(spec, sources)
    digests = {name: _extension.digest_of(v) for name, v in variants.items()}
    assert _extension.digest_of(base) not in digests.values() and len(set(digests.values())) == len(digests)
    why = {name: _extension.explain_rebuild(base, v) for name, v in variants.items()}
    assert why["source"] == "sources changed: ops.cpp"
    assert why["flag"] == "build cflags: +-g"
    assert "compiler cxx.path: " in why["compiler"] and f"-> {fake_cxx}" in why["compiler"]
    assert why["torch"].startswith("torch version:") and "0.0.1" in why["torch"]
    assert _extension.explain_rebuild(None, base) == "no earlier build in this cache"


def _copy_package(dest: Path) -> Path:
    """The package and its sources at another path: a second checkout."""
    shutil.copytree(REPO / "torch_rtindex", dest / "torch_rtindex", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(_extension.CSRC, dest / "csrc")
    return dest


def _import_from(root: Path, build_dir: Path) -> tuple[dict, str]:
    code = "import json, torch_rtindex; print(json.dumps(torch_rtindex._extension.load()))"
    env = {**os.environ, "PYTHONPATH": str(root), "TORCH_RTINDEX_BUILD_DIR": str(build_dir)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, env=env, cwd=root)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1]), res.stderr


needs_jit = pytest.mark.skipif(_extension.load()["kind"] != "jit", reason="this session loaded a prebuilt extension")


@needs_jit
def test_copies_of_the_package_share_the_real_build(tmp_path):
    """The real extension, already in this session's cache: copies at other paths load it and compile nothing."""
    build_dir = _extension._build_root()
    a, b = _copy_package(tmp_path / "a"), _copy_package(tmp_path / "b")
    loaded = [_import_from(root, build_dir) for root in (a, b, a)]
    assert all("compiling" not in err for _, err in loaded), [err for _, err in loaded]
    assert {info["path"] for info, _ in loaded} == {_extension.load()["path"]}
    assert all(info["kind"] == "jit" for info, _ in loaded)


@needs_jit
def test_prebuilt_extension_is_used_when_it_matches_and_skipped_with_the_reason(tmp_path):
    """A package copy with a prebuilt extension (the library this session built, recorded as a wheel records
    it) loads it without the build cache; one recorded for another torch builds just in time and says why."""
    root = _copy_package(tmp_path / "pkg")
    pkg = root / "torch_rtindex"
    shutil.rmtree(root / "csrc")
    shutil.copytree(_extension.CSRC, pkg / "_csrc")  # as a wheel ships them
    loaded = _extension.load()  # the CUDA build on a GPU machine: its module name is the backend's
    name, library = f"torch_rtindex_{loaded['backend']}", Path(loaded["path"])
    shutil.copy(library, pkg / f"{name}.so")
    record = {"name": name, "library": f"{name}.so", "backend": loaded["backend"],
              "torch": _extension._torch_identity(), "python": _extension._python_identity(),
              "sources_digest": _extension.sources_digest(_extension.read_sources(_extension.CSRC)),
              "cuda_arch_list": None, "optix_programs": {}}
    (pkg / "_prebuilt.json").write_text(json.dumps(record))
    empty_cache = tmp_path / "no_cache"
    info, err = _import_from(root, empty_cache)
    assert info["kind"] == "prebuilt" and info["path"] == str(pkg / f"{name}.so")
    # Nothing built: the build cache holds at most the OptiX disk cache a CUDA extension points there at load.
    assert "compiling" not in err and {p.name for p in empty_cache.glob("*")} <= {"optix_cache"}

    record["torch"] = {**record["torch"], "version": "0.0.1"}
    (pkg / "_prebuilt.json").write_text(json.dumps(record))
    info, err = _import_from(root, _extension._build_root())
    assert info["kind"] == "jit" and "compiling" not in err
    assert "not using the prebuilt extension" in err and "torch version 0.0.1" in err
    assert "torch version 0.0.1" in info["prebuilt_skipped"]


def test_prebuilt_mismatch_names_what_differs():
    sources = _extension.read_sources(_extension.CSRC)
    record = {"backend": "cpu", "torch": _extension._torch_identity(), "python": _extension._python_identity(),
              "sources_digest": _extension.sources_digest(sources)}
    assert _extension.prebuilt_mismatch(record, sources) is None
    other_abi = {**record, "torch": {**record["torch"], "cxx11_abi": not record["torch"]["cxx11_abi"]}}
    assert "cxx11_abi" in _extension.prebuilt_mismatch(other_abi, sources)
    other_cuda = {**record, "torch": {**record["torch"], "cuda": "12.8"}}
    assert "cuda 12.8" in _extension.prebuilt_mismatch(other_cuda, sources)
    other_python = {**record, "python": {**record["python"], "tag": "cpython-39"}}
    assert "cpython-39" in _extension.prebuilt_mismatch(other_python, sources)
    edited = {**sources, "ops.cpp": b"// edited\n" + sources["ops.cpp"]}
    assert "sources" in _extension.prebuilt_mismatch(record, edited)
