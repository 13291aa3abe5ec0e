"""torch.compile over the index API (RXIndex, CgRXIndex, UpdatableCgRXIndex): one graph, no graph breaks
(fullgraph=True), dynamic batch sizes, and the same answers as eager mode and as the numpy reference.

Fixed-size outputs (lookup, range_lookup, aggregate, and the fixed-capacity lookup_all_capped / range_capped /
join_capped) compile as they are. The CSR forms (lookup_all, range) have data-dependent sizes; they need
torch._dynamo.config.capture_dynamic_output_shape_ops = True, without which Dynamo breaks the graph there
(checked too; fullgraph=True implies the flag on recent PyTorch).
Inductor compiles on the CPU here (a C++ compiler is all it needs); compiled functions are kept few, for time.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo
from keysets import ROW, int64_keys, point_queries, range_queries
from reference import Reference, check_lookup, check_matches
from torch._dynamo.testing import CompileCounterWithBackend

from torch_rtindex import CgRXIndex, IdToRow, Matches, RXIndex, UpdatableCgRXIndex, join_capped

def rtindex_ops_in(graphs) -> set[str]:
    """The rtindex operators called in Dynamo's captured FX graphs."""
    found = set()
    for gm in graphs:
        for node in gm.graph.nodes:
            parts = str(node.target).split(".")  # "rtindex.rx_lookup" or "rtindex.rx_lookup.default"
            if node.op == "call_function" and "rtindex" in parts[:-1]:
                found.add(parts[parts.index("rtindex") + 1])
    return found


class Scorer(torch.nn.Module):
    """A module that answers point lookups, range lookups and per-query sums of a value column."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, make_index=None) -> None:
        super().__init__()
        self.index = make_index(keys) if make_index else RXIndex(keys, max_range_rays=16)
        self.register_buffer("values", values)

    def forward(self, q: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
        point = self.index.lookup(q)
        ranged = self.index.range_lookup(lo, hi)
        agg = self.index.aggregate(q, self.values)
        return point, ranged, agg, self.index.range_count(lo, hi)


def make_data(gen: torch.Generator, n_keys: int, n_queries: int):
    keys = int64_keys("duplicates", n_keys, gen)
    q = point_queries(keys, n_queries, gen)
    lo, hi = range_queries(keys, n_queries, gen, 40 * ROW)  # up to 41 scene rows: rays and the scan path
    values = torch.randn(keys.numel(), generator=gen, dtype=torch.float64)
    return keys, q, lo, hi, values


def check_fixed(out, keys, values, q, lo, hi) -> None:
    point, ranged, agg, counted = out
    ref = Reference(keys, "int64")
    first, count, rows = ref.points(q)
    check_lookup(point, first, count)
    np.testing.assert_array_equal(agg.count.cpu().numpy(), count)
    np.testing.assert_allclose(agg.sum.cpu().numpy(), Reference.sums(rows, values), rtol=1e-9)
    first, count, _ = ref.ranges(lo, hi)
    check_lookup(ranged, first, count)
    np.testing.assert_array_equal(counted.cpu().numpy(), count)


# Every index: RX; cgRX with the radix table (the default without RT cores) and with the optix backend (OptiX rays
# on CUDA; on the CPU the same answer by binary search); the updatable cgRX (node chains, layout 3).
INDEXES = {
    "rx": lambda k: RXIndex(k, max_range_rays=16),
    "cgrx-radix": lambda k: CgRXIndex(k, bucket_size=8, backend="radix"),
    "cgrx-optix": lambda k: CgRXIndex(k, bucket_size=8, backend="optix"),
    "updatable": lambda k: UpdatableCgRXIndex(k, node_size=8, backend="radix"),
}


@pytest.mark.parametrize("kind", list(INDEXES))
def test_fixed_size_lookups_compile_without_graph_breaks(device, gen, kind):
    keys, q, lo, hi, values = make_data(gen, 2000, 300)
    model = Scorer(keys.to(device), values.to(device), INDEXES[kind])
    dev = lambda *ts: [t.to(device, copy=True) for t in ts]  # fresh tensors, not views of one batch  # noqa: E731

    explanation = torch._dynamo.explain(model)(*dev(q, lo, hi))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
    prefix = model.index._op_family()
    ops_in_graph = rtindex_ops_in(explanation.graphs)
    # One operator per lookup: the key mapping runs inside its kernels, not as map_keys / map_ranges first.
    assert {f"{prefix}_lookup", f"{prefix}_aggregate"} <= ops_in_graph and not {"map_keys", "map_ranges"} & ops_in_graph

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    for n in (300, 177, 2):  # dynamic=True: one graph for every batch size (sizes 0 and 1 are specialized)
        args = (q[:n], lo[:n], hi[:n])
        out = compiled(*dev(*args))
        check_fixed(out, keys, values, *args)
        for got, want in zip(out, model(*dev(*args))):
            for a, b in zip(got, want):
                assert torch.equal(a, b)
    assert counter.frame_count == 1

    # A rebuilt index (new keys, new count) is what the compiled module answers from next: the structure
    # and keys are graph inputs, not constants baked into the graph.
    fresh, q2, lo2, hi2, values2 = make_data(gen, 900, 100)
    model.index.rebuild(fresh.to(device))
    model.values = values2.to(device)
    check_fixed(compiled(*dev(q2, lo2, hi2)), fresh, values2, q2, lo2, hi2)


@pytest.mark.parametrize("kind", ["rx", "cgrx-radix"])
def test_csr_lookups_compile_with_dynamic_output_shapes(device, gen, kind):
    keys, q, lo, hi, _ = make_data(gen, 1500, 200)
    index = INDEXES[kind](keys.to(device))
    op = "rx_lookup_csr" if kind == "rx" else "cgrx_lookup_csr"

    def every_match(q: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
        points = index.lookup_all(q)
        ranges = index.range(lo, hi)
        return points, ranges, points.query_ids()

    # Without the flag (and without fullgraph=True, which implies it on recent PyTorch), Dynamo breaks the
    # graph at the CSR operator, which then runs outside every graph (the lookup is its first operator, so
    # the graph before the break is empty); with it, the whole function is one graph.
    small = [t[:5].to(device, copy=True) for t in (q, lo, hi)]
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=False):
        explanation = torch._dynamo.explain(every_match)(*small)
    assert op not in rtindex_ops_in(explanation.graphs)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        explanation = torch._dynamo.explain(every_match)(*small)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons

    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        counter = CompileCounterWithBackend("inductor")
        compiled = torch.compile(every_match, backend=counter, fullgraph=True, dynamic=True)
        ref = Reference(keys, "int64")
        for n in (200, 61):
            args = [t[:n].to(device, copy=True) for t in (q, lo, hi)]
            points, ranges, owner = compiled(*args)
            check_matches(Matches(*points), ref.points(q[:n])[2])
            if index.range_rows_ascending:
                check_matches(Matches(*ranges), ref.ranges(lo[:n], hi[:n])[2])
            else:  # cgRX: (key, row ID) order, as in eager mode (test_cgrx.py checks that order)
                eager = every_match(*args)[1]
                assert torch.equal(ranges.offsets, eager.offsets) and torch.equal(ranges.rows, eager.rows)
            counts = [len(r) for r in ref.points(q[:n])[2]]
            np.testing.assert_array_equal(owner.cpu().numpy(), np.repeat(np.arange(n), counts))
        assert counter.frame_count == 1
        assert op in rtindex_ops_in(counter.graphs) and not {"map_keys", "map_ranges"} & rtindex_ops_in(counter.graphs)


def test_argument_checks_still_apply_when_compiled(device):
    index = RXIndex(torch.tensor([5, 6, 7], device=device))
    lookup = lambda q: index.lookup(q)  # noqa: E731
    bad = torch.tensor([6.0], dtype=torch.float32, device=device)
    # Without fullgraph, the check's exception leaves the compiled region as it is in eager mode.
    with pytest.raises(TypeError, match="dtype torch.float32 but the index holds int64 keys"):
        torch.compile(lookup, backend="eager", dynamic=True)(bad)
    # With fullgraph=True, Dynamo reports it as Unsupported, quoting the check's message.
    torch._dynamo.reset()  # forget that the first compile gave up on this code
    with pytest.raises(torch._dynamo.exc.Unsupported, match="dtype torch.float32 but the index holds int64 keys"):
        torch.compile(lookup, backend="eager", fullgraph=True, dynamic=True)(bad)
    good = torch.compile(lookup, backend="eager", fullgraph=True, dynamic=True)(torch.tensor([7, 8], device=device))
    assert good.first_row.tolist() == [2, -1] and good.count.tolist() == [1, 0]


@pytest.mark.parametrize("make", [RXIndex, CgRXIndex, lambda k: UpdatableCgRXIndex(k, node_size=4)],
                         ids=["rx", "cgrx", "updatable"])
def test_lossless_query_dtypes_compile_in_one_graph(device, gen, make):
    """int32 queries on an int64 index under fullgraph=True: the conversion is part of the graph, and the
    answers are the converted batch's (which the reference answers)."""
    keys = torch.cat([int64_keys("uniform", 300, gen), torch.randint(-(2**31), 2**31 - 1, (300,), generator=gen)])
    index = make(keys.to(device))
    q = torch.cat([keys[300:400], torch.tensor([-(2**31), 2**31 - 1, 0, 5])]).to(torch.int32).to(device)
    ref = Reference(keys, "int64")

    def answer(q):
        return index.lookup(q), index.lookup_rows(q, -3), index.lookup_all_capped(q, 512)

    counter = CompileCounterWithBackend("eager")
    point, rows, capped = torch.compile(answer, backend=counter, fullgraph=True, dynamic=True)(q)
    first, count, matches = ref.points(q.cpu().to(torch.int64))
    check_lookup(point, first, count)
    np.testing.assert_array_equal(rows.cpu().numpy(), np.where(count > 0, first, -3))
    check_matches(capped.to_matches(), matches)
    assert counter.frame_count == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
def test_cuda_graph_capture_is_refused_cleanly(gen):
    """Capturing an RX lookup in a CUDA graph fails inside OptiX and poisons the CUDA context; the API refuses
    it with a clear error instead, and the index (and the process's CUDA context) stay usable."""
    keys, q, _, _, _ = make_data(gen, 2000, 256)
    index = RXIndex(keys.cuda())
    q = q.cuda()
    first, count, _ = Reference(keys, "int64").points(q.cpu())
    check_lookup(index.lookup(q), first, count)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph"):
        with torch.cuda.graph(graph):
            index.lookup(q)
    torch.cuda.synchronize()
    check_lookup(index.lookup(q), first, count)


# ------------------------------------------------------------------------------------- fixed-capacity CSR
def test_optix_operators_are_tagged_cudagraph_unsafe():
    """OptiX launches cannot be captured in a CUDA graph (a probe found so, deleted once answered), so the
    operators that make them carry the tag Inductor partitions its CUDA graphs around; the plain-kernel cgRX
    operators do not."""
    ops = torch.ops.rtindex
    for form in ("lookup", "lookup_csr", "lookup_csr_capped", "aggregate"):
        assert torch.Tag.cudagraph_unsafe in getattr(ops, f"rx_{form}").default.tags
        assert torch.Tag.cudagraph_unsafe in getattr(ops, f"cgrx_optix_{form}").default.tags
        assert torch.Tag.cudagraph_unsafe not in getattr(ops, f"cgrx_{form}").default.tags


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("kind", ["rx", "cgrx-optix", "cgrx-radix"])
def test_reduce_overhead_runs_around_optix_lookups(gen, kind):
    """torch.compile(mode="reduce-overhead") of a function around a lookup: the OptiX operators run outside the
    CUDA graphs (graph partitioning), the radix ones inside; answers equal eager ones on every replay."""
    keys, q, _, _, _ = make_data(gen, 3000, 512)
    if kind == "rx":
        index = RXIndex(keys.cuda())
    else:
        index = CgRXIndex(keys.cuda(), backend=kind.split("-")[1])

    def step(q: torch.Tensor) -> torch.Tensor:
        hit = index.lookup(q * 1)  # work before and after the lookup, for the graphs around it
        return torch.where(hit.count > 0, hit.first_row, -7) + 1

    with torch._inductor.config.patch(graph_partition=True):
        torch._dynamo.reset()
        compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        for i in range(4):
            batch = q.cuda()[torch.randperm(q.numel(), generator=gen).cuda()]
            assert torch.equal(compiled(batch), step(batch)), i
    torch.cuda.synchronize()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
def test_reduce_overhead_follows_a_rebuilt_index(gen):
    """The index's tensors are static graph inputs under mode="reduce-overhead" (no copy per call): a rebuild
    that replaces them is seen by the next compiled call, and IdToRow inside the graph answers as eager."""
    keys, q, _, _, _ = make_data(gen, 3000, 512)
    index = CgRXIndex(keys.cuda(), backend="radix")
    to_row = IdToRow(keys.cuda(), miss="default", default_row=5)

    def step(q: torch.Tensor):
        return index.lookup(q).first_row + 1, to_row(q) * 2

    torch._dynamo.reset()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for i in range(6):
        if i == 3:
            index.rebuild(keys.flip(0).cuda())
            to_row.rebuild(keys.flip(0).cuda())
        batch = q.cuda()[torch.randperm(q.numel(), generator=gen).cuda()]
        got, want = compiled(batch), step(batch)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), i


@pytest.mark.parametrize("kind", ["rx", "cgrx"])
def test_capped_lookups_compile_without_dynamic_output_shapes(device, gen, kind):
    """lookup_all_capped, range_capped and join_capped have fixed output shapes: one graph with no graph break
    and no capture_dynamic_output_shape_ops, one compilation for every batch size and capacity."""
    keys, q, lo, hi, _ = make_data(gen, 1500, 200)
    index = RXIndex(keys.to(device), max_range_rays=16) if kind == "rx" else CgRXIndex(keys.to(device), backend="radix")

    def capped(q: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, capacity: int):
        points = index.lookup_all_capped(q, capacity)
        ranges = index.range_capped(lo, hi, capacity)
        return points, ranges, points.query_ids(), join_capped(index, q, capacity, how="left")

    dev = lambda *ts: [t.to(device, copy=True) for t in ts]  # noqa: E731
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=False):
        explanation = torch._dynamo.explain(capped)(*dev(q, lo, hi), 64)
        assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
        assert f"{kind}_lookup_csr_capped" in rtindex_ops_in(explanation.graphs)
        counter = CompileCounterWithBackend("inductor")
        compiled = torch.compile(capped, backend=counter, fullgraph=True, dynamic=True)
        for n, capacity in ((200, 5000), (177, 300), (50, 7)):  # room to spare, and cut answers
            args = (*dev(q[:n], lo[:n], hi[:n]), capacity)
            got, want = compiled(*args), capped(*args)
            for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
                assert torch.equal(a, b)
            assert got[0].rows.shape == (capacity,)
        assert counter.frame_count == 1
