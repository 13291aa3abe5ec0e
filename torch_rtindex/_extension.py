"""Just-in-time build of the C++/CUDA extension and of the OptiX device programs.

The extension is compiled with ``torch.utils.cpp_extension`` and ninja on first use, into a cache directory
keyed by the torch/CUDA/Python versions, and rebuilt when a source or a flag changes. ``build_info.json`` in
that directory records what was built and with which flags. A file lock serialises concurrent builds; a
build that was interrupted (Ctrl-C, a killed job) leaves no state that blocks the next one.

Without a CUDA toolkit, or with a CPU-only torch, only the CPU kernels are built; set
``TORCH_RTINDEX_CPU_ONLY=1`` to force that.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

_PACKAGE_DIR = Path(__file__).resolve().parent


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

_loaded: dict | None = None
_module = None  # the extension as a Python module: its bound lookups (csrc/bound_lookups.cpp)


def cuda_build_enabled() -> bool:
    if os.environ.get("TORCH_RTINDEX_CPU_ONLY", "") not in ("", "0"):
        return False
    if torch.version.cuda is None:
        return False
    from torch.utils import cpp_extension

    return cpp_extension.CUDA_HOME is not None


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


def _cuda_arch_flags() -> list[str]:
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return []  # cpp_extension reads it itself
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]
    return ["-gencode=arch=compute_90,code=sm_90"]


def _program_arch() -> str:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return "sm_90"


def _sources_digest(paths: list[Path], flags: list[str]) -> str:
    h = hashlib.sha256()
    for p in sorted(CSRC.rglob("*")):
        if p.is_file() and p.suffix in (".h", ".cpp", ".cu", ".cuh"):
            h.update(str(p.relative_to(CSRC)).encode())
            h.update(p.read_bytes())
    for f in flags:
        h.update(f.encode())
    return h.hexdigest()[:16]


def _cxx_for_build(build_dir: Path) -> str | None:
    """The C++ compiler to link with, if $CXX must be overridden.

    A compiler set up to link libstdc++ statically (some images wrap g++ that way) gives the extension its
    own C++ runtime, and the first exception thrown from it (every bad-input error) then crashes the process
    instead of reaching Python. That is checked once per compiler by linking a probe library.
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
    probe_dir.mkdir(exist_ok=True)
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


def _say(msg: str) -> None:
    print(f"torch_rtindex: {msg}", file=sys.stderr, flush=True)


def optix_program_flags(arch: str) -> list[str]:
    """nvcc flags of the OptiX programs. RTINDEX_OPTIX_PROGRAMS turns the cache-hint loads (inline PTX that
    OptiX's compiler rejects) into plain loads there (csrc/core/cache_hints.h)."""
    return ["--optix-ir", f"-arch={arch}", "-std=c++17", "-O3", f"-I{CSRC}", "-DRTINDEX_OPTIX_PROGRAMS=1"]


def _compile_optix_programs(build_dir: Path) -> dict[str, Path]:
    """nvcc --optix-ir for each program set; cached by content, written atomically."""
    from torch.utils import cpp_extension

    nvcc = os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")
    arch = _program_arch()
    out = {}
    for name, rel in _OPTIX_PROGRAMS.items():
        flags = optix_program_flags(arch)
        digest = _sources_digest([], flags)
        target = build_dir / f"{name}_programs_{digest}.optixir"
        if not target.exists():
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            cmd = [nvcc, *flags, str(CSRC / rel), "-o", str(tmp)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(
                    f"torch_rtindex: compiling the OptiX programs {rel} failed:\n{' '.join(cmd)}\n{res.stderr}"
                )
            os.replace(tmp, target)
        out[name] = target
    return out


def load() -> dict:
    """Builds (if needed) and loads the extension; returns what was built. Idempotent."""
    global _loaded, _module
    if _loaded is not None:
        return _loaded
    from torch.utils import cpp_extension

    with_cuda = cuda_build_enabled()
    tag = "cuda" if with_cuda else "cpu"
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    cu = f"cu{torch.version.cuda.replace('.', '')}" if with_cuda else "cpu"
    build_dir = _build_root() / f"torch{torch.__version__.split('+')[0]}-{cu}-{py}" / tag
    build_dir.mkdir(parents=True, exist_ok=True)

    sources = _CPU_SOURCES + (_CUDA_SOURCES if with_cuda else [])
    cxx = _cxx_for_build(build_dir)
    # The linker is part of the build's identity: a changed compiler must rebuild, not reuse, the library.
    cxx_tag = int(hashlib.sha256((cxx or os.environ.get("CXX", "c++")).encode()).hexdigest()[:7], 16)
    defines = [f"-DRTINDEX_WITH_CUDA={1 if with_cuda else 0}", f"-DRTINDEX_CXX_TAG={cxx_tag}"]
    # OpenMP: at::parallel_for is a header template whose `omp parallel` only exists where the including file is
    # compiled with -fopenmp; without it every CPU kernel runs on one core. The .cu files get it too, since inline
    # CPU helpers they share with the .cpp files must not be emitted in a serial version the linker may keep.
    # The runtime is the libgomp torch already loaded (same soname), so torch.set_num_threads governs it.
    cflags = ["-O3", "-std=c++17", "-fopenmp", *defines]
    cuda_flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler=-fopenmp", *defines, *_cuda_arch_flags()]
    ldflags = ["-ldl", "-fopenmp"]
    digest = _sources_digest([], sources + cflags + cuda_flags + ldflags)
    info_path = build_dir / "build_info.json"

    with build_lock(build_dir):
        previous = json.loads(info_path.read_text()) if info_path.exists() else {}
        if previous.get("digest") != digest:
            _say(f"compiling the {tag.upper()} extension in {build_dir} (first use or sources changed; ~1-3 min)")
        start = time.time()
        saved_cxx = os.environ.get("CXX")
        if cxx:
            os.environ["CXX"] = cxx
        try:
            module = cpp_extension.load(
                name=f"torch_rtindex_{tag}",
                sources=[str(CSRC / s) for s in sources],
                extra_cflags=cflags,
                extra_cuda_cflags=cuda_flags,
                extra_ldflags=ldflags,
                extra_include_paths=[str(CSRC)],
                build_directory=str(build_dir),
                is_python_module=True,
                verbose=os.environ.get("TORCH_RTINDEX_VERBOSE_BUILD", "") not in ("", "0"),
            )
        finally:
            if cxx:
                if saved_cxx is None:
                    os.environ.pop("CXX", None)
                else:
                    os.environ["CXX"] = saved_cxx
        programs = _compile_optix_programs(build_dir) if with_cuda else {}
        info = {
            "digest": digest,
            "backend": tag,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": sys.version.split()[0],
            "sources": sources,
            "cflags": cflags,
            "cuda_cflags": cuda_flags,
            "ldflags": ldflags,
            "cxx": cxx or os.environ.get("CXX") or "c++",
            "optix_programs": {k: str(v) for k, v in programs.items()},
        }
        if previous.get("digest") != digest:
            info_path.write_text(json.dumps(info, indent=2))
            _say(f"extension ready ({time.time() - start:.0f} s)")
    for name, path in programs.items():
        torch.ops.rtindex_internal.set_program_path(name, str(path))
    _module = module
    _loaded = info
    return info


def bound_lookups(family: str, lead: tuple, config: int, dtype: torch.dtype, device: torch.device, lookup_type: type):
    """Point lookups of one index bound to its tensors (csrc/bound_lookups.cpp): ``lookup(q)`` (answers as
    ``lookup_type``) and ``lookup_rows(q, miss_row)`` call the ``<family>_lookup`` operators without boxing their
    arguments."""
    load()
    return _module.BoundLookups(family, list(lead), config, dtype, device, lookup_type)
