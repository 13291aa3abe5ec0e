"""The C++/CUDA extension and the OptiX device programs: a prebuilt extension from the wheel, else a just-in-time
build in a content-addressed cache.

**Prebuilt.** A wheel built with ``pip wheel --no-build-isolation .`` (setup.py) carries the compiled extension
and ``_prebuilt.json``, which records the torch, CUDA, C++ ABI and Python it was built against and the digest of
its sources. At import the prebuilt extension is loaded when all of those match; otherwise the package says why
and falls back to the JIT build.

**Just in time.** ``torch.utils.cpp_extension`` and ninja compile the extension on first use into
``<cache>/<backend>-<digest>/``, where the digest covers everything the binary depends on: the sources' contents,
the source list and flags, the compiler, and the torch, CUDA and Python versions. It never covers the checkout's
path: the sources are copied into that directory and built from there, since cpp_extension rebuilds whenever the
absolute paths of its sources change. So any number of checkouts and environments share one cache without
rebuilding each other; a finished build is never modified again and is loaded without running ninja. Every
build says why it happens (which input differs from the last build used). ``build_info.json`` records each
build's inputs. A file lock serialises concurrent builds of one digest; a build that was interrupted (Ctrl-C, a
killed job) leaves no state that blocks the next one.

The cache is ``$TORCH_RTINDEX_BUILD_DIR``, else ``$XDG_CACHE_HOME/torch_rtindex`` (``~/.cache/torch_rtindex``).
Without a CUDA toolkit, or with a CPU-only torch, only the CPU kernels are built; set ``TORCH_RTINDEX_CPU_ONLY=1``
to force that.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch

_PACKAGE_DIR = Path(__file__).resolve().parent
PREBUILT_INFO = _PACKAGE_DIR / "_prebuilt.json"


def _find_csrc() -> Path:
    for candidate in (_PACKAGE_DIR.parent / "csrc", _PACKAGE_DIR / "_csrc"):
        if (candidate / "ops.cpp").is_file():
            return candidate
    raise RuntimeError(
        "torch_rtindex: the C++ sources (csrc/) were not found next to the package; "
        "install from a source checkout with `pip install -e .`"
    )


CSRC = _find_csrc()

# One unit per feature: a feature's CPU sources always build, its CUDA sources only in CUDA builds.
_CPU_SOURCES = ["ops.cpp", "bound_lookups.cpp", "core/keys_cpu.cpp", "core/scene_cpu.cpp", "rx/rx_cpu.cpp", "cgrx/cgrx_cpu.cpp", "cgrx/cgrx_update_cpu.cpp",
                "distributed/partition_cpu.cpp"]
_CUDA_SOURCES = ["optix/optix_runtime.cpp", "optix/gas.cpp", "core/l2_residency.cpp", "core/keys_cuda.cu", "rx/rx_cuda.cu", "cgrx/cgrx_cuda.cu", "cgrx/cgrx_update_cuda.cu",
                 "distributed/partition_cuda.cu"]
# OptiX device programs, compiled to OptiX-IR by nvcc and loaded by the runtime at first use.
_OPTIX_PROGRAMS = {"rx": "rx/rx_programs.cu", "cgrx": "cgrx/cgrx_programs.cu"}
_SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
# Finished builds kept in one cache; older ones unused for a day are removed when a new one is made.
_KEEP_BUILDS = 8
_STALE_AFTER_S = 24 * 3600

_loaded: dict | None = None
_module = None  # the extension as a Python module: its bound lookups (csrc/bound_lookups.cpp)


def cuda_home() -> str | None:
    """The CUDA toolkit's folder, found as ``torch.utils.cpp_extension.CUDA_HOME`` is ($CUDA_HOME, $CUDA_PATH,
    nvcc on PATH, /usr/local/cuda), without importing that module: it imports setuptools, tenths of a second
    that every import of the package would pay. tests/test_install_first_call.py checks the two agree."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home is None:
        nvcc = shutil.which("nvcc")
        if nvcc is not None:
            home = os.path.dirname(os.path.dirname(nvcc))
        elif os.path.exists("/usr/local/cuda"):
            home = "/usr/local/cuda"
    return home


def cuda_build_enabled() -> bool:
    if os.environ.get("TORCH_RTINDEX_CPU_ONLY", "") not in ("", "0"):
        return False
    if torch.version.cuda is None:
        return False
    return cuda_home() is not None


def _build_root() -> Path:
    root = os.environ.get("TORCH_RTINDEX_BUILD_DIR")
    if root:
        return Path(root)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "torch_rtindex"


@contextlib.contextmanager
def build_lock(build_dir: Path):
    """Holds the build lock of ``build_dir``: builds there run one at a time across processes. An flock is
    released by the kernel when its holder dies, so an interrupted build (Ctrl-C, a killed job) never blocks the
    next; cpp_extension's own baton file, which such a build leaves behind and which would make every later
    build wait on it, is removed under the lock."""
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "rtindex.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists():
            stale.unlink()
        yield


def _say(msg: str) -> None:
    print(f"torch_rtindex: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ build inputs
def read_sources(csrc: Path) -> dict[str, bytes]:
    """Every C++/CUDA source and header under ``csrc`` by relative path. A build hashes and copies these very
    bytes, so the digest describes what was compiled even if a file changes meanwhile."""
    return {str(p.relative_to(csrc)): p.read_bytes() for p in sorted(csrc.rglob("*"))
            if p.suffix in _SOURCE_SUFFIXES and p.is_file()}


def _file_identity(path: str | None) -> dict:
    """A program by its resolved path, size and modification time: a changed or replaced compiler is a new one.
    Cheap (no process started), since it is part of every import's digest."""
    if not path:
        return {"path": None}
    found = shutil.which(path)
    if found is None:
        return {"path": path, "missing": True}
    real = os.path.realpath(found)
    st = os.stat(real)
    return {"path": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _torch_identity() -> dict:
    return {"version": torch.__version__, "cuda": torch.version.cuda, "git": torch.version.git_version,
            "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI)}


def _python_identity() -> dict:
    return {"version": sys.version.split()[0], "tag": sys.implementation.cache_tag, "abiflags": getattr(sys, "abiflags", "")}


@dataclass(frozen=True)
class BuildSpec:
    """What one build compiles and how: its name (the module's, ``torch_rtindex_cpu``/``_cuda``), the source
    tree, the sources (relative to it), the flags, and the OptiX program sets (name, source) with their arch."""

    name: str
    csrc: Path
    sources: tuple[str, ...]
    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    with_cuda: bool = False
    programs: tuple[tuple[str, str], ...] = ()
    program_arch: str = ""

    @property
    def backend(self) -> str:
        return "cuda" if self.with_cuda else "cpu"


def _load_nvml():
    import ctypes

    return ctypes.CDLL("libnvidia-ml.so.1")


@dataclass(frozen=True)
class GpuQueries:
    """What the build and the program choice ask about the GPUs, each a call (tests give their own answers
    instead of replacing torch's functions): whether CUDA is initialised, the visible devices, a device's
    capability (the current one's without an argument), a device's NVML index, and NVML itself."""

    initialized: Callable[[], bool] = lambda: torch.cuda.is_initialized()
    device_count: Callable[[], int] = lambda: torch.cuda.device_count()
    capability: Callable[..., tuple[int, int]] = lambda *device: torch.cuda.get_device_capability(*device)
    nvml_index: Callable[[int], int] = lambda i: torch.cuda._get_nvml_device_index(i)  # honours CUDA_VISIBLE_DEVICES
    load_nvml: Callable[[], object] = _load_nvml


TORCH_GPUS = GpuQueries()


def _nvml_capability(gpus: GpuQueries = TORCH_GPUS) -> tuple[int, int] | None:
    """The compute capability of the GPU a JIT build targets, read through NVML, which initialises no CUDA (as
    ``torch.cuda.device_count`` counts devices): that of every visible device where they all agree, else that of
    device 0 where CUDA numbers devices by PCI bus as NVML does (``CUDA_DEVICE_ORDER=PCI_BUS_ID``); None where
    NVML cannot tell (no NVML, devices it cannot map such as MIG, mixed GPUs in CUDA's default order)."""
    import ctypes

    try:
        count = gpus.device_count()
        if count == 0:
            return None
        nvml = gpus.load_nvml()
        indices = [gpus.nvml_index(i) for i in range(count)]
        if nvml.nvmlInit_v2() != 0:
            return None
        found = []
        try:
            for nvml_index in indices:
                handle, major, minor = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
                if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(nvml_index), ctypes.byref(handle)) != 0:
                    return None
                if nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != 0:
                    return None
                found.append((major.value, minor.value))
        finally:
            nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001  (whatever NVML or torch's mapping raises: torch's own query answers)
        return None
    if found[0][0] <= 0:
        return None
    if len(set(found)) == 1 or os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
        return found[0]
    return None  # CUDA's default order puts the fastest GPU first, NVML's the first on the bus


def _local_capability(nvml: Callable[[], tuple[int, int] | None],
                      gpus: GpuQueries = TORCH_GPUS) -> tuple[int, int] | None:
    """The compute capability of the GPU a JIT build targets (the current CUDA device), or None without one.
    The build's digest is computed at every import, and import must not initialise CUDA (a process that did
    cannot fork workers that use it): until something else has, the capability is read through NVML."""
    # Not torch.cuda.is_available(): it initialises the driver (cuInit), which is what import must not do.
    if not gpus.initialized():
        found = nvml()  # before CUDA is initialised the current device is device 0
        if found is not None:
            return found
    if gpus.device_count() == 0:
        return None
    return gpus.capability()


def extension_spec(with_cuda: bool, csrc: Path = CSRC, jit_arch: bool = True,
                   nvml: Callable[[], tuple[int, int] | None] = _nvml_capability,
                   gpus: GpuQueries = TORCH_GPUS) -> BuildSpec:
    """The package's extension. ``jit_arch``: target this machine's GPU (the JIT build; ``nvml`` reads its
    capability while CUDA is not initialised, ``gpus`` once it is); a wheel build instead leaves the
    architectures to ``TORCH_CUDA_ARCH_LIST`` (setup.py)."""
    defines = [f"-DRTINDEX_WITH_CUDA={1 if with_cuda else 0}"]
    # OpenMP: at::parallel_for is a header template whose `omp parallel` only exists where the including file is
    # compiled with -fopenmp; without it every CPU kernel runs on one core. The .cu files get it too, since inline
    # CPU helpers they share with the .cpp files must not be emitted in a serial version the linker may keep.
    # The runtime is the libgomp torch already loaded (same soname), so torch.set_num_threads governs it.
    cflags = ["-O3", "-std=c++17", "-fopenmp", *defines]
    cuda_flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler=-fopenmp", *defines]
    program_arch = ""
    if jit_arch and with_cuda:
        major, minor = _local_capability(nvml, gpus) or (9, 0)
        program_arch = f"sm_{major}{minor}"
        if not os.environ.get("TORCH_CUDA_ARCH_LIST"):  # else cpp_extension reads it (and the digest records it)
            cuda_flags.append(f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}")
    return BuildSpec(
        name=f"torch_rtindex_{'cuda' if with_cuda else 'cpu'}", csrc=csrc,
        sources=tuple(_CPU_SOURCES + (_CUDA_SOURCES if with_cuda else [])),
        cflags=tuple(cflags), cuda_cflags=tuple(cuda_flags) if with_cuda else (), ldflags=("-ldl", "-fopenmp"),
        with_cuda=with_cuda, programs=tuple(_OPTIX_PROGRAMS.items()) if with_cuda else (),
        program_arch=program_arch)


def _compilers(spec: BuildSpec) -> dict:
    cxx = os.environ.get("TORCH_RTINDEX_CXX") or os.environ.get("CXX") or "c++"
    out = {"cxx": _file_identity(cxx.split()[0]), "cxx_env": [os.environ.get("TORCH_RTINDEX_CXX"), os.environ.get("CXX")]}
    if spec.with_cuda:
        out["nvcc"] = _file_identity(_nvcc())
        out["cuda_arch_list"] = os.environ.get("TORCH_CUDA_ARCH_LIST")
    return out


def build_inputs(spec: BuildSpec, sources: dict[str, bytes]) -> dict:
    """Everything a build's binary depends on, as JSON: the digest is its hash, and a rebuild names the parts
    that differ from the previous build's."""
    return {
        "sources": {rel: hashlib.sha256(data).hexdigest()[:16] for rel, data in sources.items()},
        "build": {"name": spec.name, "sources": list(spec.sources), "cflags": list(spec.cflags),
                  "cuda_cflags": list(spec.cuda_cflags), "ldflags": list(spec.ldflags),
                  "programs": [list(p) for p in spec.programs], "program_arch": spec.program_arch,
                  "program_flags": optix_program_flags(spec.program_arch or "sm_XX", Path("src")) if spec.programs else []},
        "compiler": _compilers(spec),
        "torch": _torch_identity(),
        "python": _python_identity(),
    }


def digest_of(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]


def sources_digest(sources: dict[str, bytes]) -> str:
    """The digest of the source tree alone (what a prebuilt extension is checked against)."""
    return digest_of({rel: hashlib.sha256(data).hexdigest() for rel, data in sources.items()})


def explain_rebuild(previous: dict | None, inputs: dict) -> str:
    """Why a build happens, in words: which inputs differ from ``previous`` (the last build used)."""
    if previous is None:
        return "no earlier build in this cache"
    reasons = []
    old_src, new_src = previous.get("sources", {}), inputs["sources"]
    changed = sorted(k for k in new_src if k in old_src and old_src[k] != new_src[k])
    added = sorted(set(new_src) - set(old_src))
    removed = sorted(set(old_src) - set(new_src))
    for what, names in (("changed", changed), ("added", added), ("removed", removed)):
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            reasons.append(f"sources {what}: {', '.join(names[:3])}{more}")
    for key in ("build", "compiler", "torch", "python"):
        old, new = _flatten(previous.get(key, {})), _flatten(inputs[key])
        for field in sorted(set(old) | set(new)):
            was, now = old.get(field), new.get(field)
            if was == now:
                continue
            if isinstance(was, list) and isinstance(now, list):
                change = [f"+{x}" for x in now if x not in was] + [f"-{x}" for x in was if x not in now]
                reasons.append(f"{key} {field}: {' '.join(change) or 'reordered'}")
            else:
                reasons.append(f"{key} {field}: {_short(was)} -> {_short(now)}")
    return "; ".join(reasons) or "the previous build is incomplete"


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 100 else text[:97] + "..."


# ------------------------------------------------------------------------------------------------ OptiX programs
def optix_program_flags(arch: str, csrc: Path = CSRC) -> list[str]:
    """nvcc flags of the OptiX programs. RTINDEX_OPTIX_PROGRAMS turns the cache-hint loads (inline PTX that
    OptiX's compiler rejects) into plain loads there (csrc/core/cache_hints.h)."""
    return ["--optix-ir", f"-arch={arch}", "-std=c++17", "-O3", f"-I{csrc}", "-DRTINDEX_OPTIX_PROGRAMS=1"]


def compile_optix_program(nvcc: str, csrc: Path, rel: str, arch: str, target: Path) -> None:
    """nvcc --optix-ir of one program set, written atomically."""
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    cmd = [nvcc, *optix_program_flags(arch, csrc), str(csrc / rel), "-o", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"torch_rtindex: compiling the OptiX programs {rel} failed:\n{' '.join(cmd)}\n{res.stderr}")
    os.replace(tmp, target)


def _nvcc() -> str:
    return os.path.join(cuda_home(), "bin", "nvcc")


# ------------------------------------------------------------------------------------------------ the JIT build
def _cxx_for_build(build_dir: Path) -> str | None:
    """The C++ compiler to link with, if $CXX must be overridden.

    A compiler set up to link libstdc++ statically (some images wrap g++ that way) gives the extension its
    own C++ runtime, and the first exception thrown from it (every bad-input error) then crashes the process
    instead of reaching Python. That is checked by linking a probe library, when a build runs.
    """
    explicit = os.environ.get("TORCH_RTINDEX_CXX")
    if explicit:
        return explicit
    cxx = os.environ.get("CXX")
    if not cxx:
        return None
    if shutil.which(cxx.split()[0]) is None:
        raise RuntimeError(
            f"torch_rtindex: $CXX={cxx!r} names no compiler on this PATH, so the extension cannot be built; "
            "unset CXX or point it at an installed C++ compiler (g++, clang++)"
        )
    probe_dir = build_dir / "cxx_probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    src = probe_dir / "probe.cpp"
    src.write_text("#include <stdexcept>\nvoid rtindex_probe() { throw std::runtime_error(\"x\"); }\n")
    lib = probe_dir / "probe.so"
    res = subprocess.run([cxx, "-shared", "-fPIC", str(src), "-o", str(lib)], capture_output=True, text=True)
    if res.returncode != 0:
        return None
    deps = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    if "libstdc++" in deps:
        return None
    fallback = shutil.which("c++") or shutil.which("g++")
    _say(f"$CXX={cxx} links libstdc++ statically, which breaks C++ exceptions across torch; using {fallback}")
    return fallback


def _import_library(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_info(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _finished_builds(root: Path, name: str) -> list[tuple[float, Path, dict]]:
    """(last use, directory, build_info) of every finished build of ``name`` in ``root``, newest first."""
    found = []
    for info_path in root.glob("*/build_info.json"):
        info = _read_info(info_path)
        if info and info.get("inputs", {}).get("build", {}).get("name") == name:
            with contextlib.suppress(OSError):
                found.append((info_path.stat().st_mtime, info_path.parent, info))
    return sorted(found, key=lambda f: f[0], reverse=True)


def _prune(root: Path, pattern: str, keep: Path) -> None:
    """Removes the folders ``pattern`` of ``root`` past the newest few that nobody used for a day (a process
    that has a build loaded keeps its mapped library, but would lose its OptiX programs: hence the day)."""
    now = time.time()
    dirs = []
    for d in root.glob(pattern):
        with contextlib.suppress(OSError):
            dirs.append((max([d.stat().st_mtime, *(f.stat().st_mtime for f in d.glob("*.json"))]), d))
    for used, d in sorted(dirs, reverse=True)[_KEEP_BUILDS:]:
        if d != keep and now - used > _STALE_AFTER_S:
            shutil.rmtree(d, ignore_errors=True)


def _sync_sources(sources: dict[str, bytes], dest: Path) -> None:
    """Makes ``dest`` hold exactly ``sources``, rewriting only the files that differ: ninja then recompiles
    what changed and nothing else."""
    for rel, data in sources.items():
        path = dest / rel
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for path in dest.rglob("*"):
        if path.is_file() and str(path.relative_to(dest)) not in sources:
            path.unlink()


# Compiles in a child process, so that a failed build registers nothing here and the library this process
# imports is the published copy, never one an incremental rebuild of the workspace could overwrite.
_COMPILE = """
import json, sys
from torch.utils import cpp_extension
module = cpp_extension.load(**json.loads(sys.argv[1]))
print(json.dumps(module.__file__))
"""


def _compile(spec: BuildSpec, src: Path, workspace: Path) -> Path:
    """ninja-builds ``spec`` from the sources in ``src`` in ``workspace``; returns the library."""
    args = {"name": spec.name, "sources": [str(src / s) for s in spec.sources], "extra_cflags": list(spec.cflags),
            "extra_cuda_cflags": list(spec.cuda_cflags), "extra_ldflags": list(spec.ldflags),
            "extra_include_paths": [str(src)], "build_directory": str(workspace), "is_python_module": True,
            "verbose": os.environ.get("TORCH_RTINDEX_VERBOSE_BUILD", "") not in ("", "0")}
    env = dict(os.environ)
    cxx = _cxx_for_build(workspace)
    if cxx:
        env["CXX"] = cxx
    res = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(args)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"torch_rtindex: building the {spec.backend.upper()} extension failed in {workspace}:\n"
                           f"{res.stderr[-8000:]}\n{res.stdout[-4000:]}")
    if args["verbose"]:
        print(res.stderr, file=sys.stderr)
    return Path(json.loads(res.stdout.strip().splitlines()[-1]))


def jit_build(spec: BuildSpec, root: Path | None = None) -> tuple[ModuleType, dict]:
    """Loads the build of ``spec`` from the cache ``root``, compiling it first if the cache has none. Returns the
    module and its build_info.

    A finished build is ``<root>/<backend>-<digest>/`` (the library, its OptiX programs, build_info.json),
    published by a rename and never modified. Builds compile in a workspace ``<root>/work-<backend>-<key>/``
    shared by every build with the same flags, compiler, torch and Python, whose copy of the sources is updated
    file by file: after an edit, ninja recompiles only the files that changed."""
    root = _build_root() if root is None else root
    sources = read_sources(spec.csrc)
    inputs = build_inputs(spec, sources)
    digest = digest_of(inputs)
    build_dir = root / f"{spec.backend}-{digest}"
    info = _read_info(build_dir / "build_info.json")
    if info is None:
        workspace = root / f"work-{spec.backend}-{digest_of({k: v for k, v in inputs.items() if k != 'sources'})}"
        with build_lock(workspace):
            info = _read_info(build_dir / "build_info.json")  # another process may have built it meanwhile
            if info is None:
                info = _build(spec, sources, inputs, digest, root, build_dir, workspace)
    with contextlib.suppress(OSError):
        os.utime(build_dir / "build_info.json")  # last use: for pruning, and what the next rebuild compares with
    return _import_library(spec.name, build_dir / info["library"]), _describe(info, build_dir)


def _build(spec: BuildSpec, sources: dict[str, bytes], inputs: dict, digest: str, root: Path, build_dir: Path,
           workspace: Path) -> dict:
    """Compiles in ``workspace`` and publishes the result as ``build_dir``; returns its build_info."""
    previous = _finished_builds(root, spec.name)
    why = explain_rebuild(previous[0][2]["inputs"] if previous else None, inputs)
    _say(f"compiling the {spec.backend.upper()} extension for {build_dir} (~1-3 min); why: {why}")
    start = time.time()
    src = workspace / "src"
    _sync_sources(sources, src)
    library = _compile(spec, src, workspace)
    staging = root / f".staging-{digest}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copy2(library, staging / library.name)
    programs = {}
    for prog, rel in spec.programs:
        target = staging / f"{prog}_programs.{spec.program_arch}.optixir"
        compile_optix_program(_nvcc(), src, rel, spec.program_arch, target)
        programs[prog] = target.name
    info = {"digest": digest, "backend": spec.backend, "kind": "jit", "library": library.name,
            "optix_programs": programs, "built_s": round(time.time() - start, 1), "inputs": inputs}
    (staging / "build_info.json").write_text(json.dumps(info, indent=1))
    try:
        os.rename(staging, build_dir)  # atomic: a build folder is complete or absent
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # the same build, published by a process with another lock
        info = _read_info(build_dir / "build_info.json") or info
    _say(f"extension ready ({time.time() - start:.0f} s)")
    _prune(root, f"{spec.backend}-*", build_dir)
    _prune(root, f"work-{spec.backend}-*", workspace)
    return info


def _describe(info: dict, directory: Path) -> dict:
    """build_info with absolute paths: what load() returns and ``python -m torch_rtindex`` prints."""
    out = {k: v for k, v in info.items() if k != "inputs"}
    out["path"] = str(directory / info["library"])
    out["optix_programs"] = {k: str(directory / v) for k, v in info.get("optix_programs", {}).items()}
    out["torch"] = info["inputs"]["torch"]["version"]
    return out


# ------------------------------------------------------------------------------------------------ prebuilt
def prebuilt_mismatch(recorded: dict, sources: dict[str, bytes] | None) -> str | None:
    """Why the prebuilt extension described by ``recorded`` (its _prebuilt.json) cannot be used with this torch
    and these sources, or None if it can."""
    here = {"torch": _torch_identity(), "python": _python_identity()}
    for key, field in (("torch", "version"), ("torch", "cuda"), ("torch", "cxx11_abi"), ("python", "tag")):
        want, have = recorded[key].get(field), here[key][field]
        if want != have:
            return f"it was built for {key} {field} {want}, this is {have}"
    if recorded["backend"] == "cuda" and not _cuda_wanted():
        return "TORCH_RTINDEX_CPU_ONLY asks for the CPU build"
    if sources is not None and sources_digest(sources) != recorded["sources_digest"]:
        return "the sources next to it changed since it was built"
    return None


def _cuda_wanted() -> bool:
    return os.environ.get("TORCH_RTINDEX_CPU_ONLY", "") in ("", "0") and torch.version.cuda is not None


def pick_program_arch(archs: list[str], capability: tuple[int, int]) -> str:
    """The newest OptiX-IR arch a GPU of ``capability`` runs: the highest ``sm_XY`` not above it (the oldest
    one where none is)."""
    major, minor = capability

    def number(arch: str) -> int:  # sm_90 and sm_90a are both 90
        return int(re.match(r"sm_(\d+)", arch)[1])

    fits = [a for a in archs if number(a) <= major * 10 + minor]
    return max(fits, key=number) if fits else min(archs, key=number)


class ProgramChoice:
    """A prebuilt extension's OptiX programs by name, then architecture, chosen once and registered through
    ``set_path(name, path)`` before the first OptiX scene is built (its pipeline is made at its first lookup).
    Choosing asks the GPU for its capability, which import must not do: that would initialise CUDA in every
    process that imports the package, and a process that did cannot fork workers that use CUDA. The runtime
    keeps one program set per name, so they are chosen for the oldest GPU of the process (OptiX-IR of an older
    architecture runs on a newer one). A JIT build's programs target this GPU and are registered at load."""

    def __init__(self, set_path: Callable[[str, str], None], gpus: GpuQueries = TORCH_GPUS) -> None:
        self._set_path, self._gpus = set_path, gpus
        self._pending: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()  # two threads building their first OptiX indexes choose once

    def offer(self, choices: dict[str, dict[str, str]]) -> None:
        self._pending.update(choices)

    def register(self, device: torch.device, chosen: dict[str, str]) -> None:
        """Chooses and registers the offered programs for an OptiX scene on ``device`` (nothing for a CPU
        index, nothing once done), recording each in ``chosen``."""
        if device.type != "cuda" or not self._pending:
            return
        with self._lock:
            if not self._pending:
                return
            capability = min(self._gpus.capability(d) for d in range(self._gpus.device_count()))
            for name, by_arch in sorted(self._pending.items()):
                path = by_arch[pick_program_arch(list(by_arch), capability)]
                self._set_path(name, path)
                chosen[name] = path
            self._pending = {}


_programs = ProgramChoice(lambda name, path: torch.ops.rtindex_internal.set_program_path(name, path))


def register_optix_programs(device: torch.device) -> None:
    """The prebuilt extension's OptiX programs registered before the first OptiX scene on ``device`` (see
    :class:`ProgramChoice`); ``load()["optix_programs"]`` then names them."""
    _programs.register(device, load()["optix_programs"])


def _load_prebuilt() -> tuple[ModuleType, dict] | str:
    """The prebuilt extension and its description, or why it is not used (an empty string: there is none)."""
    recorded = _read_info(PREBUILT_INFO)
    if recorded is None:
        return ""
    why = prebuilt_mismatch(recorded, read_sources(CSRC))
    if why:
        return why
    module = _import_library(recorded["name"], _PACKAGE_DIR / recorded["library"])
    # The architecture of the programs is chosen by the first OptiX index (register_optix_programs).
    _programs.offer({prog: {arch: str(_PACKAGE_DIR / rel) for arch, rel in by_arch.items()}
                    for prog, by_arch in recorded.get("optix_programs", {}).items()})
    info = {"digest": recorded["sources_digest"], "backend": recorded["backend"], "kind": "prebuilt",
            "path": str(_PACKAGE_DIR / recorded["library"]), "optix_programs": {},
            "torch": recorded["torch"]["version"], "cuda_arch_list": recorded.get("cuda_arch_list")}
    return module, info


def load() -> dict:
    """Loads the extension (prebuilt, else built just in time if needed); returns what was loaded: ``backend``
    ("cpu"/"cuda"), ``kind`` ("prebuilt"/"jit"), ``path`` (the library), its OptiX programs (a prebuilt
    extension's once the first OptiX index chose them). Idempotent; initialises no CUDA."""
    global _loaded, _module
    if _loaded is not None:
        return _loaded
    found = _load_prebuilt()
    if isinstance(found, tuple):
        module, info = found
    else:
        if found:
            _say(f"not using the prebuilt extension in {_PACKAGE_DIR}: {found}; building just in time")
        module, info = jit_build(extension_spec(cuda_build_enabled()))
        if found:
            info["prebuilt_skipped"] = found
    for name, path in info["optix_programs"].items():  # a JIT build's, made for this GPU (nothing to choose)
        torch.ops.rtindex_internal.set_program_path(name, path)
    if info["backend"] == "cuda":
        # OptiX's disk cache of compiled modules and pipelines, next to the builds (optix_runtime.cpp says why).
        cache = _build_root() / "optix_cache"
        with contextlib.suppress(OSError):
            cache.mkdir(parents=True, exist_ok=True)
        torch.ops.rtindex_internal.set_optix_disk_cache(str(cache))
    _module = module
    _loaded = info
    return info


def bound_lookups(family: str, lead: tuple, config: int, dtype: torch.dtype, device: torch.device, lookup_type: type):
    """Point lookups of one index bound to its tensors (csrc/bound_lookups.cpp): ``lookup(q)`` (answers as
    ``lookup_type``) and ``lookup_rows(q, miss_row)`` call the ``<family>_lookup`` operators without boxing their
    arguments."""
    load()
    return _module.BoundLookups(family, list(lead), config, dtype, device, lookup_type)
