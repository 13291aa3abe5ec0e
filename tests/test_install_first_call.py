"""A fast first call and the bug-report command.

Eager use of every index class imports nothing from torch._dynamo, torch.distributed or torch.fx beyond what
``import torch`` itself loads (those imports cost seconds on a first CUDA build); checked in a fresh process.
``python -m torch_rtindex`` prints what a bug report needs.
"""

import json
import re
import subprocess
import sys

import pytest
import torch

from torch_rtindex import _extension
from torch_rtindex._base import mark_static_address

FIRST_USE = r"""
import json, sys
import torch
before_package = set(sys.modules)
import torch_rtindex as ti
after_import = set(sys.modules)
keys = torch.tensor([5, -3, 2**62, -2**63, 2**63 - 1, 5, 0])
queries = torch.tensor([5, 7, -2**63, 2**63 - 1, 0])
expected = [[i for i, k in enumerate(keys.tolist()) if k == q] for q in queries.tolist()]
answers = {}
for name, build in [("RXIndex", lambda: ti.RXIndex(keys)), ("CgRXIndex", lambda: ti.CgRXIndex(keys)),
                    ("UpdatableCgRXIndex", lambda: ti.UpdatableCgRXIndex(keys)),
                    ("ChunkedIndex", lambda: ti.ChunkedIndex(keys))]:
    index = build()
    found = index.lookup(queries)
    answers[name] = [found.count.tolist(), found.first_row.tolist()]
    index.lookup_all(queries)
    index.range(torch.tensor([-10]), torch.tensor([10]))
if True:
    up = ti.UpdatableCgRXIndex(keys)
    up.insert(torch.tensor([7]))
    up.delete(torch.tensor([5]))
    answers["updated"] = up.lookup(queries).count.tolist()
    ids = ti.IdToRow(torch.tensor([3, 1, 2]))
    answers["IdToRow"] = ids(torch.tensor([2, 3])).tolist()
    answers["join"] = [t.tolist() for t in ti.join(ti.CgRXIndex(keys), queries)]
heavy = ("torch._dynamo", "torch.distributed", "torch.fx", "torch._inductor", "torch._higher_order_ops",
         "torch.utils.cpp_extension", "setuptools")
print(json.dumps({
    "answers": answers, "expected": expected,
    "dynamo_after_import": "torch._dynamo" in after_import,
    "by_import": sorted(m for m in after_import - before_package if m.startswith(heavy)),
    "by_first_use": sorted(m for m in set(sys.modules) - after_import if m.startswith(heavy)),
}))
"""


def test_first_use_imports_no_compiler_stack():
    res = subprocess.run([sys.executable, "-c", FIRST_USE], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert not out["dynamo_after_import"]
    assert out["by_import"] == [] and out["by_first_use"] == []
    # The calls really answered (against the multiset of keys).
    counts = [len(e) for e in out["expected"]]
    firsts = [e[0] if e else -1 for e in out["expected"]]
    for name in ("RXIndex", "CgRXIndex", "UpdatableCgRXIndex", "ChunkedIndex"):
        assert out["answers"][name][0] == counts, name
        assert [f if c else -1 for f, c in zip(out["answers"][name][1], counts)] == firsts, name
    assert out["answers"]["updated"] == [0, 1, 1, 1, 1]
    assert out["answers"]["IdToRow"] == [2, 0]
    pairs = [tuple(p) for p in zip(*out["answers"]["join"])]
    assert pairs == [(q, r) for q, e in enumerate(out["expected"]) for r in e]


NO_CUDA_AT_IMPORT = r"""
import json
import sys
import threading
import torch

# Every way torch_rtindex could ask the GPU (all initialise CUDA; is_available starts the driver), watched while
# the package is imported: a call of any of them fails the import.
names = {"get_device_capability", "get_device_properties", "_lazy_init", "init", "is_available"}
asked = []

def watch(frame, event, arg):
    if event == "call" and frame.f_code.co_name in names and frame.f_code.co_filename == torch.cuda.__file__:
        asked.append(frame.f_code.co_name)

sys.setprofile(watch)
threading.setprofile(watch)
import torch_rtindex as ti
sys.setprofile(None)
threading.setprofile(None)
if asked:
    raise AssertionError(f"CUDA was queried: {asked}")
found = ti.CgRXIndex(torch.tensor([3, 1, 2])).lookup(torch.tensor([2, 5]))
print(json.dumps({"initialized": torch.cuda.is_initialized(), "count": found.count.tolist()}))
"""


def test_import_initialises_no_cuda():
    """Import queries no GPU (which would initialise CUDA, and a process that did cannot fork workers that use
    it): a JIT build reads the GPU's architecture through NVML, a prebuilt one picks its OptiX programs at the
    first OptiX index."""
    res = subprocess.run([sys.executable, "-c", NO_CUDA_AT_IMPORT], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"initialized": False, "count": [1, 0]}


def _refuse(*args, **kwargs):
    raise AssertionError("CUDA was queried")


def gpus(**answers) -> _extension.GpuQueries:
    """GPU queries that answer as given and refuse the rest (each would initialise CUDA or load NVML)."""
    fields = ("initialized", "device_count", "capability", "nvml_index", "load_nvml")
    return _extension.GpuQueries(**{f: answers.get(f, _refuse) for f in fields})


def test_jit_build_reads_the_gpu_architecture_without_initialising_cuda(monkeypatch):
    """A CUDA JIT build's digest covers the GPU's architecture and is computed at every import: read through
    NVML while CUDA is not initialised, through torch where NVML cannot tell."""
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    spec = _extension.extension_spec(True, nvml=lambda: (8, 6), gpus=gpus(initialized=lambda: False))
    assert spec.program_arch == "sm_86" and "-gencode=arch=compute_86,code=sm_86" in spec.cuda_cflags

    torch_answers = {"device_count": lambda: 1, "capability": lambda device=None: (9, 0)}
    spec = _extension.extension_spec(True, nvml=lambda: None, gpus=gpus(initialized=lambda: False, **torch_answers))
    assert spec.program_arch == "sm_90" and "-gencode=arch=compute_90,code=sm_90" in spec.cuda_cflags
    # Once CUDA is initialised, torch answers (it is the current device's).
    initialized = gpus(initialized=lambda: True, **torch_answers)
    assert _extension.extension_spec(True, nvml=_refuse, gpus=initialized).program_arch == "sm_90"


def test_nvml_capability_is_none_where_nvml_cannot_tell():
    def no_library():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    assert _extension._nvml_capability(gpus(device_count=lambda: 2, nvml_index=lambda i: i,
                                            load_nvml=no_library)) is None


class _FakeNvml:
    """libnvidia-ml's calls that _nvml_capability makes, over GPUs of the given capabilities (bus order)."""

    def __init__(self, capabilities):
        self.capabilities = capabilities

    def nvmlInit_v2(self):
        return 0

    def nvmlShutdown(self):
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        handle._obj.value = index.value + 1
        return 0

    def nvmlDeviceGetCudaComputeCapability(self, handle, major, minor):
        major._obj.value, minor._obj.value = self.capabilities[handle.value - 1]
        return 0


@pytest.mark.parametrize("capabilities, order, want", [
    ([(9, 0), (9, 0)], None, (9, 0)),         # alike: whatever the order
    ([(7, 5), (8, 9)], None, None),           # mixed, CUDA's fastest-first order: NVML cannot say which is 0
    ([(7, 5), (8, 9)], "PCI_BUS_ID", (7, 5)),  # mixed, CUDA numbers them by bus as NVML does
])
def test_nvml_capability_of_mixed_gpus(capabilities, order, want, monkeypatch):
    fake = gpus(device_count=lambda: len(capabilities), nvml_index=lambda i: i,
                load_nvml=lambda: _FakeNvml(capabilities))
    if order is None:
        monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    else:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", order)
    assert _extension._nvml_capability(fake) == want


@pytest.mark.parametrize("capability, arch", [((8, 0), "sm_80"), ((8, 9), "sm_86"), ((9, 0), "sm_90"),
                                              ((12, 0), "sm_100"), ((7, 5), "sm_80")])
def test_program_arch_is_the_newest_the_gpu_runs(capability, arch):
    assert _extension.pick_program_arch(["sm_90", "sm_80", "sm_100", "sm_86"], capability) == arch
    assert _extension.pick_program_arch(["sm_90a", "sm_80", "sm_100a", "sm_86"], capability) == arch + (
        "a" if arch in ("sm_90", "sm_100") else "")


def test_prebuilt_programs_are_chosen_by_the_first_optix_index():
    """A wheel's OptiX programs for several architectures: none is chosen at load, the one for the GPU of the
    first index that builds an OptiX scene then (ProgramChoice.register), once."""
    choices = {"rx": {"sm_80": "/w/rx.sm_80.optixir", "sm_90": "/w/rx.sm_90.optixir"},
               "cgrx": {"sm_80": "/w/cgrx.sm_80.optixir", "sm_90": "/w/cgrx.sm_90.optixir"}}
    registered = []  # the runtime's registry is process-wide: these made-up paths must not reach it
    answering = []  # the GPUs' capabilities while the test lets them be asked
    fake = gpus(device_count=lambda: len(answering),
                capability=lambda device=None: answering[device] if answering else _refuse())
    programs = _extension.ProgramChoice(lambda name, path: registered.append((name, path)), fake)
    programs.offer(choices)
    info = {"optix_programs": {}}
    programs.register(torch.device("cpu"), info["optix_programs"])  # a CPU index needs no programs
    assert info["optix_programs"] == {}
    # One program set per process: chosen for its oldest GPU (device 0, sm_86, here), which every GPU runs.
    answering[:] = [(8, 6), (9, 0)]
    programs.register(torch.device("cuda", 1), info["optix_programs"])
    assert info["optix_programs"] == {"rx": "/w/rx.sm_80.optixir", "cgrx": "/w/cgrx.sm_80.optixir"}
    assert sorted(registered) == sorted(info["optix_programs"].items())
    answering.clear()
    programs.register(torch.device("cuda", 0), info["optix_programs"])  # registered already: nothing asked
    assert info["optix_programs"]["rx"] == "/w/rx.sm_80.optixir" and len(registered) == 2


@pytest.mark.parametrize("env", ["CUDA_HOME", "CUDA_PATH", "nvcc on PATH", "none"])
def test_cuda_home_is_found_as_cpp_extension_finds_it(env, tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    if env in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.setenv(env, str(tmp_path / "toolkit"))
    elif env == "nvcc on PATH":
        (tmp_path / "toolkit" / "bin").mkdir(parents=True)
        nvcc = tmp_path / "toolkit" / "bin" / "nvcc"
        nvcc.write_text("#!/bin/sh\n")
        nvcc.chmod(0o755)
        monkeypatch.setenv("PATH", str(nvcc.parent))
    assert _extension.cuda_home() == cpp_extension._find_cuda_home()
    if env != "none":
        assert _extension.cuda_home() == str(tmp_path / "toolkit")


def test_static_address_mark_matches_dynamo():
    """The package marks an index's CUDA tensors static as torch._dynamo.mark_static_address does, without
    importing torch._dynamo on the eager path."""
    import torch._dynamo

    ours, theirs = torch.empty(3), torch.empty(3)
    mark_static_address(ours)
    torch._dynamo.mark_static_address(theirs)
    assert ours._dynamo_static_input_type == theirs._dynamo_static_input_type


def test_bug_report_command():
    res = subprocess.run([sys.executable, "-m", "torch_rtindex"], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    report = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in res.stdout.splitlines() if line.strip())
    import torch_rtindex

    assert report["torch_rtindex"].startswith(torch_rtindex.__version__)
    assert report["torch"].startswith(torch.__version__)
    assert report["extension"].split()[0] in ("jit", "prebuilt") and torch_rtindex._extension.load()["path"] in report["extension"]
    assert f"torch.get_num_threads()={torch.get_num_threads()}" in report["CPU threads"]
    assert report["CUDA available"] == str(torch.cuda.is_available())
    assert report["CgRXIndex on cpu"] == "backend=radix"
    assert report["RXIndex on cpu"].startswith("sorted keys")
    assert all(not v.startswith("failed") for v in report.values()), res.stdout


@pytest.mark.parametrize("capability, rt_cores, want", [((9, 0), None, "radix"), ((8, 0), None, "radix"),
                                                          ((8, 6), True, "optix"), ((8, 6), False, "radix")])
def test_default_backend_asks_optix_only_where_the_capability_leaves_rt_cores_open(capability, rt_cores, want):
    """A first build's default backend: GPUs whose capability has no RT cores (data-center parts) get the radix
    table without OptiX's first device context; others ask OptiX. CPU-run with the GPU's answers given."""
    from torch_rtindex.cgrx import default_backend, gpu_backend

    asked = []

    def optix_rt_cores():
        asked.append(capability)
        if rt_cores is None:
            raise AssertionError("OptiX asked where the capability tells")
        return rt_cores

    assert gpu_backend(capability, optix_rt_cores) == want
    assert len(asked) == (0 if rt_cores is None else 1)
    assert default_backend(torch.device("cpu")) == "radix"
