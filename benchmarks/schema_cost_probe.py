"""What an operator's schema costs a call from Python: no-op custom operators (each allocates one 16-element result)
with the argument lists the lookup operators had and have, called through ``torch.ops`` as the indexes call
theirs. It measured why the lookup operators take their typed configuration as one packed ``int`` rather than an
``int[]`` (csrc/core/config.h). CPU only; builds a tiny extension with torch.utils.cpp_extension (about 30 s).

    python3 benchmarks/schema_cost_probe.py
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch
from torch.utils.cpp_extension import load_inline

T = "const at::Tensor&"
OPT = "const c10::optional<at::Tensor>&"
# name: (schema arguments, C++ parameters, results)
OPS = {
    "one_tensor": ("Tensor a", f"{T} a", 1),
    "five_tensors": ("Tensor a, Tensor b, Tensor c, Tensor d, Tensor e", f"{T} a, {T} b, {T} c, {T} d, {T} e", 1),
    "five_tensors_int_list": ("Tensor a, Tensor b, Tensor c, Tensor d, int[] l, Tensor e",
                              f"{T} a, {T} b, {T} c, {T} d, at::IntArrayRef l, {T} e", 1),
    "lookup_before (int[] config, Tensor? hi)": ("Tensor a, Tensor b, Tensor c, Tensor d, int[] l, Tensor e, Tensor? f",
                                                 f"{T} a, {T} b, {T} c, {T} d, at::IntArrayRef l, {T} e, {OPT} f", 1),
    "lookup_before, two results": ("Tensor a, Tensor b, Tensor c, Tensor d, int[] l, Tensor e, Tensor? f",
                                   f"{T} a, {T} b, {T} c, {T} d, at::IntArrayRef l, {T} e, {OPT} f", 2),
    "lookup_now (int config, Tensor? hi)": ("Tensor a, Tensor b, Tensor c, Tensor d, int l, Tensor e, Tensor? f",
                                            f"{T} a, {T} b, {T} c, {T} d, int64_t l, {T} e, {OPT} f", 1),
    "lookup_now, two results": ("Tensor a, Tensor b, Tensor c, Tensor d, int l, Tensor e, Tensor? f",
                                f"{T} a, {T} b, {T} c, {T} d, int64_t l, {T} e, {OPT} f", 2),
}


def source() -> str:
    fns, defs, impls = [], [], []
    for i, (schema, params, results) in enumerate(OPS.values()):
        out = "at::empty({16}, a.options())"
        if results == 2:
            fns.append(f"std::tuple<at::Tensor, at::Tensor> op{i}({params}) {{ return {{{out}, {out}}}; }}")
            defs.append(f'm.def("op{i}({schema}) -> (Tensor, Tensor)");')
        else:
            fns.append(f"at::Tensor op{i}({params}) {{ return {out}; }}")
            defs.append(f'm.def("op{i}({schema}) -> Tensor");')
        impls.append(f'm.impl("op{i}", &op{i});')
    return ("#include <torch/library.h>\n#include <ATen/ATen.h>\n" + "\n".join(fns)
            + "\nTORCH_LIBRARY(schema_probe, m) {\n" + "\n".join(defs) + "\n}\n"
            + "TORCH_LIBRARY_IMPL(schema_probe, CPU, m) {\n" + "\n".join(impls) + "\n}\n")


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        load_inline("schema_probe", cpp_sources=source(), is_python_module=False, build_directory=d,
                    extra_cflags=["-O2"])
    ops = torch.ops.schema_probe
    a = torch.zeros(16, dtype=torch.int64)
    config_list, config_int = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 17603426056
    calls = {}
    for i, (name, (schema, _, _)) in enumerate(OPS.items()):
        op = getattr(ops, f"op{i}").default
        args = []
        for arg in schema.split(", "):
            kind = arg.split()[0]
            args.append({"Tensor": a, "int[]": config_list, "int": config_int, "Tensor?": None}[kind])
        calls[name] = (op, tuple(args))
    calls["torch.empty(16) (for scale)"] = (torch.empty, (16,))
    times = {k: [] for k in calls}
    for _ in range(11):  # alternating rounds: a slow moment of the machine hits every form alike
        for name, (op, args) in calls.items():
            t0 = time.perf_counter()
            for _ in range(10000):
                op(*args)
            times[name].append((time.perf_counter() - t0) / 10000 * 1e6)
    print(f"torch {torch.__version__}; us per call, min / median of 11 rounds of 10000 calls")
    for name, t in times.items():
        print(f"{name:45s} {min(t):6.2f} {statistics.median(t):6.2f}")


if __name__ == "__main__":
    main()
