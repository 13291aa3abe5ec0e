"""torch_rtindex.reserve_l2: the persisting-L2 set-aside for radix search tables. Answers with the set-aside must
equal the reference (the launch attribute changes caching only); bad arguments are clear errors."""

import numpy as np
import pytest
import torch

from keysets import int64_keys, point_queries
from reference import Reference, check_lookup
from torch_rtindex import CgRXIndex, UpdatableCgRXIndex, reserve_l2

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_bad_arguments():
    with pytest.raises(TypeError, match="nbytes must be an integer"):
        reserve_l2(1.5)
    with pytest.raises(TypeError, match="nbytes must be an integer"):
        reserve_l2(True)
    with pytest.raises(TypeError, match="device must be"):
        reserve_l2(0, device=1.0)
    with pytest.raises(ValueError, match="CUDA device's L2"):
        reserve_l2(0, device="cpu")
    with pytest.raises(ValueError, match="must be non-negative"):
        reserve_l2(-1)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            reserve_l2(0, device=torch.cuda.device_count())
    else:
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            reserve_l2(1 << 20)
        with pytest.raises(ValueError, match="no CUDA device"):
            reserve_l2(0, device=0)


@cuda
@pytest.mark.parametrize("layout", ["aligned_row", "packed_row"])
def test_lookups_with_the_table_in_l2(gen, layout):
    keys = int64_keys("uniform", 50000, gen)
    q = torch.cat([point_queries(keys, 20000, gen), keys + 1])
    first, count, _ = Reference(keys, "int64").points(q)
    index = CgRXIndex(keys.cuda(), layout=layout, backend="radix")
    updatable = UpdatableCgRXIndex(keys.cuda(), backend="radix")
    try:
        granted = reserve_l2(index.memory()["radix_table"] // 2)  # a share of the table: hitRatio < 1
        assert granted > 0
        for idx in (index, updatable):
            check_lookup(idx.lookup(q.cuda()), first, count)
        assert reserve_l2() >= granted  # the device's most
        check_lookup(index.lookup(q.cuda()), first, count)
        lo = q[:1000]
        hi = lo + 5
        np.testing.assert_array_equal(index.range_count(lo.cuda(), hi.cuda()).cpu().numpy(), Reference(keys, "int64").ranges(lo, hi)[1])
    finally:
        assert reserve_l2(0) == 0
    check_lookup(index.lookup(q.cuda()), first, count)


@cuda
def test_a_lookup_with_the_table_in_l2_replays_from_a_cuda_graph(gen):
    """The launch attribute is captured with the kernel: a graph captured under a set-aside replays new queries
    with the reference's answers."""
    keys = int64_keys("uniform", 50000, gen)
    index = CgRXIndex(keys.cuda(), backend="radix")
    q = point_queries(keys, 4096, gen).cuda()
    try:
        reserve_l2(index.memory()["radix_table"])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            index.lookup(q)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = index.lookup(q)
        for _ in range(2):
            new_q = point_queries(keys, 4096, gen)
            q.copy_(new_q)
            graph.replay()
            torch.cuda.synchronize()
            first, count, _ = Reference(keys, "int64").points(new_q)
            check_lookup(captured, first, count)
    finally:
        reserve_l2(0)
