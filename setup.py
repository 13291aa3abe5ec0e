"""Installs torch_rtindex.

``pip install -e .`` (editable): the extension is compiled just in time on first import, into the build cache
(torch_rtindex/_extension.py).

``pip wheel --no-build-isolation .`` or ``python -m build --wheel --no-isolation``: the wheel carries the CPU
extension compiled ahead of time against the torch installed here, or, with a CUDA torch and a CUDA toolkit, the
CUDA extension for ``TORCH_CUDA_ARCH_LIST`` (default: the data-center and consumer architectures this torch
supports, PTX for newer ones) and the OptiX programs as OptiX-IR for the same architectures. ``_prebuilt.json``
records what it was built against; at import the package uses it when the installed torch matches, else it
builds just in time and says why. The build needs the torch it is for, hence no build isolation: an isolated
build has no torch and makes a wheel without the prebuilt extension (it says so).

Every wheel also carries the C++ sources (torch_rtindex/_csrc) for that just-in-time fallback.
"""

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# An editable install keeps the just-in-time build: nothing is compiled at install time.
EDITABLE = any(cmd in sys.argv for cmd in ("develop", "editable_wheel"))
# The data-center and consumer GPUs a wheel targets by default, where the installed torch supports them.
DEFAULT_ARCHS = ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0")


class BuildPyWithSources(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "torch_rtindex" / "_csrc"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(ROOT / "csrc", target)


def _build_helpers():
    """torch_rtindex/_extension.py as a standalone module: the same build inputs as the JIT build, without
    importing the package (whose import would compile the extension)."""
    spec = importlib.util.spec_from_file_location("_torch_rtindex_build", ROOT / "torch_rtindex" / "_extension.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def default_arch_list(torch) -> str:
    """DEFAULT_ARCHS that this torch was built for, the newest also as PTX (JIT-compiled on newer GPUs)."""
    built_for = {a for a in torch.cuda.get_arch_list() if a.startswith("sm_")}
    if not built_for:  # no GPU on the build machine: torch answers nothing, so go by its CUDA version
        cuda = tuple(int(x) for x in torch.version.cuda.split(".")[:2])
        built_for = {f"sm_{a.replace('.', '')}" for a in DEFAULT_ARCHS if a not in ("10.0", "12.0") or cuda >= (12, 8)}
    archs = [a for a in DEFAULT_ARCHS if f"sm_{a.replace('.', '')}" in built_for]
    return ";".join(archs[:-1] + [archs[-1] + "+PTX"])


def _arch_names(arch_list: str) -> list[str]:
    """TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX") as nvcc arch names (sm_80, sm_90)."""
    out = []
    for item in arch_list.replace(",", ";").replace(" ", ";").split(";"):
        item = item.split("+")[0].strip()
        if item:
            out.append("sm_" + item.replace(".", ""))
    return out


def prebuilt_extension():
    """(ext_modules, cmdclass) of the ahead-of-time build, or nothing where it cannot or must not happen."""
    if EDITABLE:
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
    except ImportError:
        if "bdist_wheel" not in sys.argv:
            return [], {}
        print("torch_rtindex: torch is not importable in this build environment, so the wheel carries no prebuilt "
              "extension (it will compile on first import). Install torch first and build with "
              "`pip wheel --no-build-isolation .` or `python -m build --wheel --no-isolation`.", file=sys.stderr)
        return [], {}
    helpers = _build_helpers()
    with_cuda = helpers.cuda_build_enabled()
    if with_cuda and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        os.environ["TORCH_CUDA_ARCH_LIST"] = default_arch_list(torch)
    spec = helpers.extension_spec(with_cuda, jit_arch=False)
    kind = CUDAExtension if with_cuda else CppExtension
    ext = kind(
        name=f"torch_rtindex.{spec.name}",
        sources=[f"csrc/{s}" for s in spec.sources],
        include_dirs=[str(ROOT / "csrc")],
        # -g0: Python's own CFLAGS carry -g, which would make the wheel's library several times larger.
        extra_compile_args={"cxx": [*spec.cflags, "-g0"], "nvcc": list(spec.cuda_cflags)},
        extra_link_args=list(spec.ldflags),
    )

    class BuildPrebuilt(BuildExtension):
        """The extension, then the OptiX programs and _prebuilt.json next to it."""

        def run(self):
            super().run()
            library = Path(self.get_ext_fullpath(ext.name))
            package = library.parent
            record = {
                "name": spec.name, "library": library.name, "backend": spec.backend,
                "torch": helpers._torch_identity(), "python": helpers._python_identity(),
                "sources_digest": helpers.sources_digest(helpers.read_sources(ROOT / "csrc")),
                "cuda_arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST") if with_cuda else None,
                "optix_programs": {},
            }
            if with_cuda:
                (package / "_optix").mkdir(parents=True, exist_ok=True)
                for name, rel in spec.programs:
                    record["optix_programs"][name] = {}
                    for arch in _arch_names(os.environ["TORCH_CUDA_ARCH_LIST"]):
                        target = f"_optix/{name}_programs.{arch}.optixir"
                        helpers.compile_optix_program(helpers._nvcc(), ROOT / "csrc", rel, arch, package / target)
                        record["optix_programs"][name][arch] = target
            (package / "_prebuilt.json").write_text(json.dumps(record, indent=1))

    return [ext], {"build_ext": BuildPrebuilt}


ext_modules, cmdclass = prebuilt_extension()

setup(
    name="torch_rtindex",
    version="0.1.0",
    description="GPU database indexes (RX, cgRX) that turn lookups into ray tracing, as PyTorch operators",
    packages=find_packages(include=["torch_rtindex", "torch_rtindex.*"]),
    package_data={"torch_rtindex": ["py.typed"]},
    python_requires=">=3.10",
    # torch is deliberately unpinned above 2.4: install the build you want (CPU or CUDA) first.
    install_requires=["torch>=2.4", "ninja", "tqdm"],
    extras_require={"test": ["pytest", "numpy", "embreex", "matplotlib", "duckdb", "setuptools", "wheel"]},
    ext_modules=ext_modules,
    cmdclass={"build_py": BuildPyWithSources, **cmdclass},
)
