"""A fast first call and the bug-report command.

Eager use of every index class imports nothing from torch._dynamo, torch.distributed or torch.fx beyond what
``import torch`` itself loads (those imports cost seconds on a first CUDA build); checked in a fresh process.
``python -m torch_rtindex`` prints what a bug report needs.
"""

import json
import re
import subprocess
import sys

import torch

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
heavy = ("torch._dynamo", "torch.distributed", "torch.fx", "torch._inductor", "torch._higher_order_ops")
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
