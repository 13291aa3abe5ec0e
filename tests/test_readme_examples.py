"""The README's usage sections run as written (on CUDA when available, else on the CPU) and their asserts hold.

Every ```python block of the sections below is executed in a fresh namespace. (The README's opening example
allocates on "cuda" unconditionally and is not part of this.)
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
import torch
import torch._dynamo

README = Path(__file__).resolve().parent.parent / "README.md"
SECTIONS = [
    "cgRX: the coarse-granular index", "Embedding-ID remapping", "torch.compile", "Feature-store joins", "State and devices",
    "CUDA graphs and streams", "DLPack (CuPy, JAX, numpy)",
]


def python_blocks(section: str) -> list[str]:
    text = README.read_text()
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"README has no section '## {section}'"
    return re.findall(r"^```python\n(.*?)^```", match.group(1), flags=re.M | re.S)


@pytest.mark.parametrize("section", SECTIONS)
def test_readme_section_runs(section):
    blocks = python_blocks(section)
    assert blocks, f"section '{section}' has no python example"
    saved = torch._dynamo.config.capture_dynamic_output_shape_ops  # an example may set it; keep it local
    try:
        for i, code in enumerate(blocks):
            assert 'device = "cuda" if torch.cuda.is_available() else "cpu"' in code
            # Run as a real module: Dynamo looks functions' globals up through sys.modules[__name__].
            module = types.ModuleType(f"readme_example_{SECTIONS.index(section)}_{i}")
            sys.modules[module.__name__] = module
            try:
                exec(compile(code, f"README.md ({section})", "exec"), module.__dict__)
            finally:
                del sys.modules[module.__name__]
    finally:
        torch._dynamo.config.capture_dynamic_output_shape_ops = saved
