"""tests/dist_harness.py: per-rank results, a collective over the pool's group, a failing rank's traceback, a
hung rank killing the pool, and the next call getting a fresh one."""

from __future__ import annotations

import os
import time

import pytest
import torch

from dist_harness import available, run_on_ranks

pytestmark = pytest.mark.skipif(not available(2)[0], reason=available(2)[1])


# What the ranks run (looked up as "test_dist_harness:<name>" in the workers).

def rank_sum(info, base: torch.Tensor):
    import torch.distributed as dist

    t = (base + info.rank).to(info.device)
    dist.all_reduce(t, group=info.group)
    return info.rank, info.world, str(info.device), t.cpu(), os.getpid(), os.environ.get("NCCL_NVLS_ENABLE")


def fail_on(info, bad_rank: int):
    if info.rank == bad_rank:
        raise ValueError(f"planted failure on rank {info.rank}")
    return info.rank


def fail_before_collective(info, bad_rank: int):
    import torch.distributed as dist

    if info.rank == bad_rank:
        raise ValueError("planted failure before the collective")
    dist.all_reduce(torch.zeros(1), group=info.group)  # waits for the failed rank forever


def hang_on(info, bad_rank: int, seconds: float):
    if info.rank == bad_rank:
        time.sleep(seconds)
    return info.rank


def test_results_in_rank_order_and_one_group():
    base = torch.arange(4, dtype=torch.int64)
    out = run_on_ranks(2, "test_dist_harness:rank_sum", base)
    assert [o[:3] for o in out] == [(0, 2, "cpu"), (1, 2, "cpu")]
    for o in out:
        assert torch.equal(o[3], 2 * base + 1)  # (base + 0) + (base + 1)
        assert o[5] == "0"
    # The same processes serve the next call (the pool is kept).
    again = run_on_ranks(2, "test_dist_harness:rank_sum", base)
    assert [o[4] for o in again] == [o[4] for o in out]


def test_failing_rank_reported_with_traceback():
    pids = [o[4] for o in run_on_ranks(2, "test_dist_harness:rank_sum", torch.zeros(1))]
    with pytest.raises(AssertionError) as e:
        run_on_ranks(2, "test_dist_harness:fail_on", 1)
    text = str(e.value)
    assert "ranks [1] raised" in text and "planted failure on rank 1" in text and "Traceback" in text
    assert "rank 0 ---" not in text
    # Every rank answered: the same processes go on, in a new group whose collectives work.
    out = run_on_ranks(2, "test_dist_harness:rank_sum", torch.ones(1))
    assert [o[4] for o in out] == pids and all(torch.equal(o[3], torch.tensor([3.0])) for o in out)


def test_rank_left_in_a_collective_after_a_failure_gets_the_pool_rebuilt():
    pids = [o[4] for o in run_on_ranks(2, "test_dist_harness:rank_sum", torch.zeros(1))]
    with pytest.raises(AssertionError, match=r"ranks \[0\] raised.*ranks \[1\] did not answer after the failure"):
        run_on_ranks(2, "test_dist_harness:fail_before_collective", 0)
    out = run_on_ranks(2, "test_dist_harness:rank_sum", torch.zeros(1))
    assert [o[0] for o in out] == [0, 1] and not {o[4] for o in out} & set(pids)


def test_hung_rank_times_out_and_next_call_gets_fresh_pool():
    # One rank: the cheapest pool to rebuild (the timeout path is the same for any size).
    pid = run_on_ranks(1, "test_dist_harness:rank_sum", torch.zeros(1))[0][4]
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"ranks \[0\] hung .*pool was killed"):
        run_on_ranks(1, "test_dist_harness:hang_on", 0, 600.0, timeout=3)
    assert time.monotonic() - t0 < 60
    out = run_on_ranks(1, "test_dist_harness:rank_sum", torch.zeros(1))
    assert out[0][:3] == (0, 1, "cpu") and out[0][4] != pid


def test_bad_target_is_a_rank_error():
    with pytest.raises(AssertionError, match="no_such_function"):
        run_on_ranks(2, "test_dist_harness:no_such_function")


@pytest.mark.skipif(not available(2, "nccl")[0], reason=available(2, "nccl")[1])
def test_nccl_two_ranks():
    out = run_on_ranks(2, "test_dist_harness:rank_sum", torch.arange(3), backend="nccl")
    assert [o[2] for o in out] == ["cuda:0", "cuda:1"]
    assert all(torch.equal(o[3], 2 * torch.arange(3) + 1) for o in out)
