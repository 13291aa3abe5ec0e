"""DLPack interop: keys and queries that arrive from other libraries through ``torch.from_dlpack`` (numpy on the
CPU, always; CuPy on CUDA and JAX where installed) are indexed and looked up without copies: the build's key
mapping and the lookup operators (which map queries in their kernels) read the other library's memory itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference import Reference, check_lookup
from torch.utils._python_dispatch import TorchDispatchMode

from torch_rtindex import CgRXIndex, RXIndex, UpdatableCgRXIndex

INDEXES = {
    "rx": RXIndex,
    "cgrx": lambda k: CgRXIndex(k, bucket_size=4, backend="radix"),
    "updatable": lambda k: UpdatableCgRXIndex(k, node_size=4, backend="radix"),
}


class MappedInputs(TorchDispatchMode):
    """The data pointers of the tensors the key mapping operators (map_keys, map_ranges) read, and of the queries
    (lo, hi: the last two arguments) the lookup operators read."""

    def __init__(self) -> None:
        super().__init__()
        self.ptrs: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._opname in ("map_keys", "map_ranges", "cgrx_build"):  # cgrx_build maps the keys it sorts
            self.ptrs += [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
        elif func._opname.endswith("_lookup"):
            self.ptrs += [a.data_ptr() for a in args[-2:] if isinstance(a, torch.Tensor)]
        return func(*args, **(kwargs or {}))


def check_zero_copy(index_factory, keys_arr, queries_arr, ptr_of, to_reference) -> None:
    keys = torch.from_dlpack(keys_arr)
    queries = torch.from_dlpack(queries_arr)
    assert keys.data_ptr() == ptr_of(keys_arr) and queries.data_ptr() == ptr_of(queries_arr)  # DLPack shares
    with MappedInputs() as seen:
        index = index_factory(keys)
    assert ptr_of(keys_arr) in seen.ptrs  # the index read the other library's keys in place
    with MappedInputs() as seen:
        result = index.lookup(queries)
        index.range_lookup(queries, queries)
    assert seen.ptrs == [ptr_of(queries_arr)] * 3  # the lookup's queries, then the range lookup's lo and hi
    ref = Reference(to_reference(keys), "uint64" if keys.dtype == getattr(torch, "uint64", None) else "int64")
    first, count, _ = ref.points(to_reference(queries))
    check_lookup(result, first, count)


@pytest.mark.parametrize("kind", list(INDEXES))
@pytest.mark.parametrize("dtype", ["int64", "int32", "float64", "uint64"])
def test_numpy_through_dlpack(kind, dtype):
    rng = np.random.default_rng(5)
    if dtype == "float64":
        keys = rng.normal(size=2000) * 1e6
    else:
        info = np.iinfo(dtype)
        keys = rng.integers(info.min, info.max, size=2000, dtype=dtype, endpoint=True)
    keys = np.concatenate([keys, keys[:300]])  # duplicates
    queries = np.concatenate([keys[rng.integers(0, keys.size, 500)], keys[:100] + keys.dtype.type(1)])
    if dtype == "uint64" and not hasattr(torch, "uint64"):
        pytest.skip("no torch.uint64 in this PyTorch")
    # The reference compares values: int64 views keep uint64 bits, other dtypes compare as they are.
    to_ref = (lambda t: t.view(torch.int64)) if dtype == "uint64" else (lambda t: t)
    check_zero_copy(INDEXES[kind], keys, queries, lambda a: a.ctypes.data, to_ref)
    if kind != "updatable":  # the state holds what the index holds, even after numpy writes the keys
        k = torch.from_dlpack(keys)
        index = INDEXES[kind](k)
        saved = keys.copy()
        keys[:10] += keys.dtype.type(1)
        assert np.array_equal(index.state_dict()["keys"].numpy(), saved)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CuPy arrays live on CUDA")
@pytest.mark.parametrize("kind", ["rx", "cgrx"])
def test_cupy_through_dlpack(kind):
    cp = pytest.importorskip("cupy")
    keys = cp.random.randint(-(2**62), 2**62, size=3000, dtype=cp.int64)
    queries = cp.concatenate([keys[:200], keys[:200] + 1])
    check_zero_copy(INDEXES[kind], keys, queries, lambda a: a.data.ptr, lambda t: t.cpu())


def test_jax_through_dlpack():
    jnp = pytest.importorskip("jax.numpy")
    keys_np = np.random.default_rng(3).integers(-(2**31), 2**31 - 1, size=1000, dtype=np.int32)
    keys = torch.from_dlpack(jnp.asarray(keys_np))  # int32: JAX's default integer width
    queries = torch.from_dlpack(jnp.asarray(np.concatenate([keys_np[:100], keys_np[:100] + 1])))
    index = CgRXIndex(keys.contiguous(), backend="radix")
    first, count, _ = Reference(torch.from_numpy(keys_np), "int32").points(queries.cpu())
    check_lookup(index.lookup(queries.contiguous()), first, count)
