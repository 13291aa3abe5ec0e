"""Installs the Python package; the C++/CUDA extension is compiled just in time on first import.

`pip install -e .` keeps the sources in place (csrc/ next to the package). A regular install copies csrc/
into the package as torch_rtindex/_csrc so the JIT build finds it.
"""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithSources(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "torch_rtindex" / "_csrc"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(ROOT / "csrc", target)


setup(
    name="torch_rtindex",
    version="0.1.0",
    description="GPU database indexes (RX, cgRX) that turn lookups into ray tracing, as PyTorch operators",
    packages=find_packages(include=["torch_rtindex", "torch_rtindex.*"]),
    package_data={"torch_rtindex": ["py.typed"]},
    python_requires=">=3.10",
    # torch is deliberately unpinned above 2.4: install the build you want (CPU or CUDA) first.
    install_requires=["torch>=2.4", "ninja"],
    extras_require={"test": ["pytest", "numpy", "embreex", "matplotlib", "duckdb"]},
    cmdclass={"build_py": BuildPyWithSources},
)
