"""The CUDA sources compile, even on a machine without a GPU or a CUDA build of torch.

CI has nvcc but only a CPU torch. The CPU wheel still ships torch's CUDA headers (ATen/cuda, c10/cuda); what it
lacks are the CUDA math libraries' headers those include (cuSPARSE, cuBLAS, cuSOLVER) and one generated macro
header. This test writes stand-ins that declare just the handle types the headers name, and compiles every
.cu and CUDA-side .cpp of the extension to an object file (no linking, nothing runs), so a CUDA compile error
is caught in CI instead of at a GPU user's first import.
"""

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

from torch_rtindex import _extension

NVCC = shutil.which("nvcc") or (cpp_extension.CUDA_HOME and str(Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc"))
STUBS = {
    "cusparse.h": "typedef struct cusparseContext* cusparseHandle_t;",
    "cublas_v2.h": "typedef struct cublasContext* cublasHandle_t; typedef int cublasStatus_t;",
    "cublasLt.h": "typedef struct cublasLtContext* cublasLtHandle_t;",
    "cusolverDn.h": "typedef struct cusolverDnContext* cusolverDnHandle_t;",
    "cusolver_common.h": "typedef int cusolverStatus_t;\n#define CUSOLVER_STATUS_SUCCESS 0",
    "c10/cuda/impl/cuda_cmake_macros.h": "#define C10_CUDA_BUILD_SHARED_LIBS",
}

pytestmark = pytest.mark.skipif(
    torch.version.cuda is not None or not NVCC or not Path(NVCC).exists(),
    reason="needs nvcc; with a CUDA torch the real build (and the GPU tests) cover this",
)


def include_flags(tmp_path: Path) -> list[str]:
    stubs = tmp_path / "stubs"
    for name, text in STUBS.items():
        (stubs / name).parent.mkdir(parents=True, exist_ok=True)
        (stubs / name).write_text(f"#pragma once\n{text}\n")
    torch_inc = Path(torch.__file__).parent / "include"
    flags = [f"-I{_extension.CSRC}", f"-I{stubs}", "-DRTINDEX_WITH_CUDA=1", "-std=c++17"]
    for system in (torch_inc, torch_inc / "torch/csrc/api/include", sysconfig.get_paths()["include"]):
        flags += ["-isystem", str(system)]
    return flags


# The extension's sources, and the benchmarks' own JIT baselines (built on the GPU machine only otherwise).
BASELINES = Path(__file__).resolve().parent.parent / "benchmarks" / "baselines"
CU_SOURCES = [_extension.CSRC / s for s in _extension._CUDA_SOURCES if s.endswith(".cu")] + sorted(BASELINES.glob("*.cu"))


@pytest.mark.parametrize("source", CU_SOURCES, ids=lambda p: p.name)
def test_cuda_source_compiles(tmp_path, source):
    cmd = [NVCC, "-c", "-O0", "--expt-relaxed-constexpr", "-gencode=arch=compute_90,code=sm_90",
           "--compiler-options", "-fPIC", *include_flags(tmp_path), "-DTORCH_EXTENSION_NAME=probe", str(source),
           "-o", str(tmp_path / "out.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]


# The CUDA build's .cpp files: its own, and the shared ones with CUDA-only parts (#if RTINDEX_WITH_CUDA).
CUDA_SIDE_CPP = [s for s in _extension._CUDA_SOURCES if s.endswith(".cpp")] + [
    s for s in _extension._CPU_SOURCES if "#if RTINDEX_WITH_CUDA" in (_extension.CSRC / s).read_text()]


@pytest.mark.parametrize("source", CUDA_SIDE_CPP)
def test_cuda_side_cpp_compiles(tmp_path, source):
    # nvcc knows where its own headers are; ask it rather than guessing from its path (it may be a wrapper).
    listing = subprocess.run([NVCC, "--dryrun", "-c", "-x", "cu", "/dev/null"], capture_output=True, text=True).stderr
    words = [w.strip('"') for w in listing.split()]
    found = [w[len("-I"):] for w in words if w.startswith("-I") and "include" in w]
    cuda_inc = next((p for p in found if (Path(p) / "cuda_runtime.h").exists()), "/usr/local/cuda/include")
    cmd = ["c++", "-c", "-O0", "-fPIC", *include_flags(tmp_path), "-isystem", str(cuda_inc), "-DTORCH_EXTENSION_NAME=probe",
           str(_extension.CSRC / source), "-o", str(tmp_path / "out.o")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]


@pytest.mark.parametrize("program", list(_extension._OPTIX_PROGRAMS.values()))
def test_optix_programs_compile(tmp_path, program):
    cmd = [NVCC, *_extension.optix_program_flags("sm_90"), str(_extension.CSRC / program), "-o", str(tmp_path / "out.optixir")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
