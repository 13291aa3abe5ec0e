"""``python -m torch_rtindex``: what a bug report needs, on one screen.

The package, torch, CUDA and driver versions, each GPU with its architecture, RT cores and OptiX ABI, the
extension in use (prebuilt or built just in time, and its path), the backend each index class picks on each
device here, and the CPU thread count. Nothing here changes any state; every probe that fails says so instead of
stopping the report.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys


def _driver_version() -> str:
    """The NVIDIA driver's version as nvidia-smi reports it (torch exposes only the CUDA runtime's)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown (no nvidia-smi on PATH)"
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"


def _probe(what):
    try:
        return what()
    except Exception as e:  # a report must go on: the failure is itself what the reader needs to see
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _index_backends(device) -> list[tuple[str, str]]:
    """(class, what it uses) for a small index of every class built on ``device``."""
    import torch
    import torch_rtindex as ti

    keys = torch.arange(0, 4096, 3, device=device)

    def rx():
        index = ti.RXIndex(keys)
        return "OptiX BVH (ray tracing)" if "bvh" in index.memory() else "sorted keys (binary search)"

    def chunked():
        index = ti.ChunkedIndex(keys.cpu(), device=device)
        return f"backend={index.backend}"

    return [
        ("RXIndex", _probe(rx)),
        ("CgRXIndex", _probe(lambda: f"backend={ti.CgRXIndex(keys).backend}")),
        ("UpdatableCgRXIndex", _probe(lambda: f"backend={ti.UpdatableCgRXIndex(keys).backend}")),
        ("ChunkedIndex", _probe(chunked)),
        ("IdToRow", _probe(lambda: f"index={ti.IdToRow(keys).index_kind}")),
    ]


def report() -> list[tuple[str, str]]:
    lines: list[tuple[str, str]] = []
    import torch
    import torch_rtindex

    from torch_rtindex import _extension

    build = _extension.load()
    lines += [
        ("torch_rtindex", f"{torch_rtindex.__version__} ({os.path.dirname(torch_rtindex.__file__)})"),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("platform", platform.platform()),
        ("torch", f"{torch.__version__} (CUDA {torch.version.cuda}, C++11 ABI {torch._C._GLIBCXX_USE_CXX11_ABI})"),
        ("extension", f"{build['kind']} {build['backend'].upper()} build, {build['path']}"),
    ]
    if build.get("prebuilt_skipped"):
        lines.append(("prebuilt skipped", build["prebuilt_skipped"]))
    if build["kind"] == "jit":
        lines.append(("build cache", f"{_extension._build_root()} (digest {build['digest']})"))
    lines.append(("CPU threads", f"torch.get_num_threads()={torch.get_num_threads()}, os.cpu_count()={os.cpu_count()}, "
                                 f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"))
    cuda = torch.cuda.is_available()
    lines.append(("CUDA available", str(cuda)))
    devices = [torch.device("cpu")]
    if cuda:
        lines.append(("NVIDIA driver", _driver_version()))
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            lines.append((f"GPU {i}", f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                                      f"{p.total_memory / 2**30:.1f} GiB"))
            info = _probe(lambda: torch_rtindex.optix_info(i))
            if isinstance(info, dict):
                lines.append((f"GPU {i} OptiX", f"ABI {info['abi']}, RT cores: {'yes' if info['has_rt_cores'] else 'no'} "
                                               f"(rtcore version {info['rtcore_version']})"))
                lines.append((f"GPU {i} OptiX cache", _probe(lambda: torch.ops.rtindex_internal.optix_disk_cache(i) or "off")))
            else:
                lines.append((f"GPU {i} OptiX", info))
        devices.append(torch.device("cuda"))
        if build["backend"] != "cuda":
            lines.append(("note", "torch sees a GPU but the extension is a CPU build: CUDA tensors are refused"))
    for device in devices:
        if device.type == "cuda" and build["backend"] != "cuda":
            continue
        for name, what in _index_backends(device):
            lines.append((f"{name} on {device.type}", what))
    return lines


def main() -> None:
    lines = report()
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key.ljust(width)}  {value}")


if __name__ == "__main__":
    main()
