"""PinnedStaging (torch_rtindex.chunked.staging) through its own API, on the CPU (ordinary memory, the same
logic): buffers grow to a quarter more than asked, are reused while they fit, and hand out views of the asked
size and dtype."""

import pytest
import torch

from torch_rtindex.chunked.staging import PinnedStaging


def test_a_slot_grows_with_room_and_is_reused_while_it_fits():
    s = PinnedStaging(pin=False)
    a = s.take(1, 100, torch.int64)
    assert a.shape == (100,) and a.dtype == torch.int64 and s.nbytes() == 1000  # 800 bytes and a quarter
    a.copy_(torch.arange(100))
    b = s.take(1, 120, torch.int32)  # fits: the same memory, reinterpreted
    assert b.shape == (120,) and b.dtype == torch.int32 and b.data_ptr() == a.data_ptr() and s.nbytes() == 1000
    c = s.take(1, 125, torch.int64)  # 1000 bytes: still fits
    assert c.data_ptr() == a.data_ptr() and s.nbytes() == 1000
    d = s.take(1, 200, torch.int64)  # 1600 bytes: grown to 2000
    assert d.shape == (200,) and s.nbytes() == 2000


def test_slots_are_separate_and_copied_without_a_stream_is_a_no_op():
    s = PinnedStaging(pin=False)
    x, y = s.take(1, 8, torch.int64), s.take(2, 8, torch.int64)
    x.fill_(1)
    y.fill_(2)
    s.copied(1, None)
    s.copied(2, None)
    assert int(x.sum()) == 8 and int(y.sum()) == 16 and x.data_ptr() != y.data_ptr()
    assert s.take(1, 0, torch.int64).numel() == 0 and s.nbytes() == 160


def test_a_chunked_index_reports_its_staging_bytes():
    from torch_rtindex import ChunkedIndex

    idx = ChunkedIndex(torch.arange(1000), device="cpu", progress=False)
    mem = idx.memory()
    assert mem["staging"] == 0  # a CPU index answers on the CPU: nothing crosses


def test_a_failed_grow_keeps_the_staging_usable():
    s = PinnedStaging(pin=False)
    s.take(1, 8, torch.int64)
    with pytest.raises(RuntimeError):
        s.take(1, 1 << 58, torch.int64)  # 2 EiB: the allocation fails
    assert s.nbytes() == 0  # the old buffer went, and nothing broken stayed
    assert s.take(1, 8, torch.int64).numel() == 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_buffer_is_not_rewritten_while_its_copy_to_the_gpu_may_still_read_it():
    """Each copy waits behind a spin of the stream; the next take of the slot must wait for it, or the host's
    next write would reach the GPU in the earlier copy."""
    s = PinnedStaging(pin=True)
    stream = torch.cuda.current_stream()
    out = []
    for i in range(3):
        x = s.take(1, 1 << 20, torch.int64)
        x.fill_(i)
        torch.cuda._sleep(50_000_000)  # tens of milliseconds of GPU time ahead of the copy
        out.append(x.to("cuda", non_blocking=True))
        s.copied(1, stream)
    assert [(int(o.min()), int(o.max())) for o in out] == [(0, 0), (1, 1), (2, 2)]
