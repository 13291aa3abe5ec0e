"""The user's guide runs as written: every ```python block of README.md and docs/*.md is executed (on CUDA when
available, else on the CPU) in a fresh module, and its asserts hold.

Two README sections are run by their own classes' tests instead: "Indexes larger than GPU memory"
(tests/test_chunked.py) and "Sharded index" (tests/test_sharded.py, as a two-process script). A block that must not
run here is fenced as ```py instead of ```python.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
import torch
import torch._dynamo

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RUN_ELSEWHERE = {"Indexes larger than GPU memory", "Sharded index"}
DEVICE_LINE = 'device = "cuda" if torch.cuda.is_available() else "cpu"'


def python_blocks(section: str) -> list[str]:
    """The ```python blocks of the README's section ``## <section>`` (other tests import this)."""
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", README.read_text(), flags=re.M | re.S)
    assert match, f"README has no section '## {section}'"
    return blocks_of(match.group(1))


def blocks_of(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def readme_sections_with_code() -> list[str]:
    text = README.read_text()
    names = re.findall(r"^## (.+)$", text, flags=re.M)
    return [n for n in names if n not in RUN_ELSEWHERE and python_blocks(n)]


def run_blocks(blocks: list[str], where: str) -> None:
    saved = torch._dynamo.config.capture_dynamic_output_shape_ops  # an example may set it; keep it local
    try:
        for i, code in enumerate(blocks):
            assert DEVICE_LINE in code, f"{where}, block {i}: examples run on CUDA when available ({DEVICE_LINE})"
            # Run as a real module: Dynamo looks functions' globals up through sys.modules[__name__].
            module = types.ModuleType(f"guide_example_{abs(hash(where))}_{i}")
            sys.modules[module.__name__] = module
            try:
                exec(compile(code, f"{where} (block {i})", "exec"), module.__dict__)
            finally:
                del sys.modules[module.__name__]
    finally:
        torch._dynamo.config.capture_dynamic_output_shape_ops = saved


def test_readme_covers_the_guide():
    """The sections every user reads first have runnable examples, and the ones run elsewhere still exist."""
    sections = readme_sections_with_code()
    assert {"Quickstart", "Updates", "Embedding-ID remapping", "Feature-store joins"} <= set(sections), sections
    for name in RUN_ELSEWHERE:
        assert python_blocks(name), name


@pytest.mark.parametrize("section", readme_sections_with_code())
def test_readme_section_runs(section):
    run_blocks(python_blocks(section), f"README.md ({section})")


DOC_FILES = sorted(p.name for p in DOCS.glob("*.md") if blocks_of(p.read_text()))


def test_docs_have_examples():
    assert {"cgrx.md", "state-and-devices.md", "torch-compile.md", "cuda-graphs-and-streams.md", "dlpack.md",
            "joins.md"} <= set(DOC_FILES), DOC_FILES


@pytest.mark.parametrize("name", DOC_FILES)
def test_docs_page_runs(name):
    run_blocks(blocks_of((DOCS / name).read_text()), f"docs/{name}")


def test_guide_links_resolve():
    """Every relative link of the README and docs/ names a file of the repository."""
    missing = []
    for page in [README, *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing
