"""Bad input gets a clear Python exception; the index stays usable afterwards."""

import pytest
import torch

from torch_rtindex import RXIndex, SceneConfig
from torch_rtindex._config import rx_config


def test_bad_keys(device):
    with pytest.raises(TypeError, match="dtype"):
        RXIndex(torch.tensor([1, 2], dtype=torch.int16, device=device))
    with pytest.raises(ValueError, match="1-D"):
        RXIndex(torch.zeros(2, 2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="contiguous"):
        RXIndex(torch.arange(10, device=device)[::2])
    with pytest.raises(ValueError, match="NaN"):
        RXIndex(torch.tensor([1.0, float("nan")], device=device))
    with pytest.raises(TypeError, match="torch.Tensor"):
        RXIndex([1, 2, 3])
    with pytest.raises(TypeError, match="key_type"):
        RXIndex(torch.tensor([1.0], device=device), key_type="uint64")
    with pytest.raises(ValueError, match="key_type"):
        RXIndex(torch.tensor([1], device=device), key_type="int128")


def test_bad_queries_leave_the_index_usable(device):
    index = RXIndex(torch.tensor([5, 6, 7], device=device))
    with pytest.raises(TypeError, match="dtype"):
        index.lookup(torch.tensor([5.0], dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="1-D"):
        index.lookup(torch.tensor([[5]], device=device))
    with pytest.raises(ValueError, match="contiguous"):
        index.lookup(torch.arange(10, device=device)[::2])
    with pytest.raises(ValueError, match="same length"):
        index.range(torch.tensor([1, 2], device=device), torch.tensor([3], device=device))
    with pytest.raises(ValueError, match="values"):
        index.aggregate(torch.tensor([5], device=device), torch.ones(2, device=device))
    other = "cpu" if device.type == "cuda" else "meta"
    with pytest.raises(ValueError, match="index is on"):
        index.lookup(torch.tensor([5], device=other))
    assert index.lookup(torch.tensor([6], device=device)).first_row.tolist() == [1]


def test_bad_configuration(device):
    with pytest.raises(ValueError, match="64"):
        SceneConfig(20, 20, 20)
    with pytest.raises(ValueError, match="23"):
        SceneConfig(30, 17, 17)
    with pytest.raises(ValueError, match="max_range_rays"):
        RXIndex(torch.tensor([1], device=device), max_range_rays=0)
    index = RXIndex(torch.tensor([1, 2], device=device))
    with pytest.raises(RuntimeError, match="allow_update"):
        index.refit(torch.tensor([3, 4], device=device))
    updatable = RXIndex(torch.tensor([1, 2], device=device), allow_update=True)
    with pytest.raises(ValueError, match="number of keys"):
        updatable.refit(torch.tensor([3], device=device))


def test_failed_rebuild_keeps_the_old_keys(device):
    index = RXIndex(torch.tensor([1.0, 2.0, 3.0], device=device))
    with pytest.raises(ValueError, match="NaN"):
        index.rebuild(torch.tensor([1.0, float("nan")], device=device))
    with pytest.raises(TypeError, match="dtype"):
        index.rebuild(torch.tensor([1, 2], device=device))
    assert index.lookup(torch.tensor([2.0], device=device)).first_row.tolist() == [1]


def test_operators_check_their_arguments(device):
    ops = torch.ops.rtindex
    keys = torch.tensor([1, 2, 3], device=device)
    s = ops.rx_build(keys, [23, 23, 18, 0, 0], False)
    with pytest.raises(RuntimeError, match="scene"):
        ops.rx_build(keys, [23, 23], False)
    config = rx_config("int64", True, 16, [23, 23, 18, 0, 0])
    with pytest.raises(RuntimeError, match="int64"):
        ops.rx_lookup(s, keys, config, keys.int(), None)
    with pytest.raises(RuntimeError, match="config"):
        ops.rx_lookup(s, keys, -1, keys, None)
    with pytest.raises(RuntimeError, match="past its last field"):
        ops.rx_lookup(s, keys, config | 1 << 62, keys, None)
    with pytest.raises(RuntimeError, match="key_type"):
        ops.rx_lookup(s, keys, config | 7, keys, None)  # key type 7 does not exist
    with pytest.raises(RuntimeError, match="scene"):
        ops.rx_lookup(s, keys, config & ~(31 << 4), keys, None)  # scene bits_x 0
    with pytest.raises(ValueError, match="fit"):
        rx_config("int64", True, 2**31, [23, 23, 18, 0, 0])
    with pytest.raises(RuntimeError, match="same length"):
        ops.rx_lookup(s, keys, config, keys, keys[:2])
    with pytest.raises(RuntimeError, match="key_type|dtype"):
        ops.map_keys(keys, 3)


def test_bad_capacity(device):
    from torch_rtindex import CgRXIndex

    for index in (RXIndex(torch.tensor([5, 6, 6], device=device)), CgRXIndex(torch.tensor([5, 6, 6], device=device))):
        q = torch.tensor([6, 7], device=device)
        with pytest.raises(ValueError, match="capacity must be non-negative"):
            index.lookup_all_capped(q, -1)
        with pytest.raises(TypeError, match="capacity must be an int"):
            index.range_capped(q, q, 2.5)
        op = getattr(torch.ops.rtindex, f"{index._OPS}_lookup_csr_capped")
        with pytest.raises(RuntimeError, match="capacity must be non-negative"):  # the operator checks too
            op(*index._lead, index._cfg, q, None, -1)
        got = index.lookup_all_capped(q, 1)
        assert got.rows.tolist() == [1] and int(got.total) == 2 and bool(got.overflowed())
