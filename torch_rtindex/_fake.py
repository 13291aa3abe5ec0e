"""Fake (meta) kernels: output shapes and dtypes of every operator, for torch.compile and opcheck.

Outputs whose size depends on the data (CSR row lists, a BVH's byte size) get unbacked sizes; compiling
code that uses them needs ``torch._dynamo.config.capture_dynamic_output_shape_ops = True``. The fixed-capacity
CSR operators (``*_lookup_csr_capped``) size their rows by the caller's capacity and need nothing else.
"""

from __future__ import annotations

import torch
from torch.library import register_fake

from ._config import PADDED_HEADER


def _dynamic_size() -> torch.SymInt:
    return torch.library.get_ctx().new_dynamic_size()


@register_fake("rtindex::map_keys")
def _(keys, key_type):
    return keys.new_empty(keys.shape, dtype=torch.int64)


@register_fake("rtindex::unmap_keys")
def _(ordered, key_type, dtype):
    return ordered.new_empty(ordered.shape, dtype=dtype)


@register_fake("rtindex::map_ranges")
def _(lo, hi, key_type):
    return lo.new_empty(lo.shape, dtype=torch.int64), hi.new_empty(hi.shape, dtype=torch.int64)


@register_fake("rtindex::sort_queries")
def _(keys, begin_bit, end_bit):
    return keys.new_empty(keys.shape, dtype=torch.int64), keys.new_empty(keys.shape, dtype=torch.int64)


@register_fake("rtindex::rx_build")
def _(keys, scene, allow_update):
    if keys.device.type == "cpu":
        return keys.new_empty((2, keys.shape[0]), dtype=torch.int64)
    return keys.new_empty((_dynamic_size(),), dtype=torch.uint8)


@register_fake("rtindex::rx_refit")
def _(structure, keys, scene):
    return None


def _capped_csr(lo: torch.Tensor, capacity):
    """offsets [q + 1], rows [capacity], total (0-d): the fixed-capacity CSR's outputs."""
    return (
        lo.new_empty((lo.shape[0] + 1,), dtype=torch.int64),
        lo.new_empty((capacity,), dtype=torch.int64),
        lo.new_empty((), dtype=torch.int64),
    )


def _register_lookups(prefix: str) -> None:
    """The five lookup forms of an operator family; every index argument precedes ``config, lo, hi``."""

    @register_fake(f"rtindex::{prefix}_lookup")
    def _(*args):
        lo = args[-2]
        return lo.new_empty(lo.shape, dtype=torch.int64), lo.new_empty(lo.shape, dtype=torch.int64)

    @register_fake(f"rtindex::{prefix}_lookup_rows")
    def _(*args):
        lo = args[-3]
        return lo.new_empty(lo.shape, dtype=torch.int64)

    @register_fake(f"rtindex::{prefix}_lookup_csr")
    def _(*args):
        lo = args[-2]
        return lo.new_empty((lo.shape[0] + 1,), dtype=torch.int64), lo.new_empty((_dynamic_size(),), dtype=torch.int64)

    @register_fake(f"rtindex::{prefix}_lookup_csr_capped")
    def _(*args):
        return _capped_csr(args[-3], args[-1])

    @register_fake(f"rtindex::{prefix}_aggregate")
    def _(*args):
        lo, values = args[-3], args[-1]
        sum_dtype = torch.float64 if values.dtype.is_floating_point else torch.int64
        return lo.new_empty(lo.shape, dtype=torch.int64), lo.new_empty(lo.shape, dtype=sum_dtype)


for _prefix in ("rx", "cgrx", "cgrx_optix"):
    _register_lookups(_prefix)


@register_fake("rtindex::cgrx_range_count")
def _(*args):
    lo = args[-2]
    return lo.new_empty(lo.shape, dtype=torch.int64)


@register_fake("rtindex_internal::scene_triangles")
def _(keys, scene):
    return keys.new_empty((keys.shape[0], 3, 3), dtype=torch.float32)


@register_fake("rtindex_internal::scene_point_rays")
def _(queries, scene):
    return queries.new_empty((queries.shape[0], 8), dtype=torch.float32)


@register_fake("rtindex_internal::scene_range_rays")
def _(lo, hi, scene, max_range_rays):
    n = _dynamic_size()
    return lo.new_empty((n,), dtype=torch.int64), lo.new_empty((n, 8), dtype=torch.float32)


@register_fake("rtindex::cgrx_nodes_stats")
def _(nodes, node_size, num_buckets):
    return nodes.new_empty((num_buckets, 3), dtype=torch.int64)


@register_fake("rtindex::cgrx_pairs_export")
def _(pairs, layout):
    n = pairs.shape[0] // (4 if layout == 1 else 3)  # words per pair (cgrx_core.h layout_words)
    return pairs.new_empty((n,), dtype=torch.int64), pairs.new_empty((n,), dtype=torch.int64)


@register_fake("rtindex::cgrx_set_spare_rows")
def _(pairs, layout, rows):
    return None


@register_fake("rtindex::cgrx_build")
def _(keys, bucket_size, layout, key_type=2):
    return (
        keys.new_empty((_dynamic_size(),), dtype=torch.int32),
        keys.new_empty((_dynamic_size(),), dtype=torch.int64),
        keys.new_empty((_dynamic_size(),), dtype=torch.int32),
    )


@register_fake("rtindex::cgrx_build_scene")
def _(reps, num_reps, scene, representation=0, pairs=None, bucket_size=1, layout=0):
    if reps.device.type == "cpu":
        return reps.new_empty((_dynamic_size(), 3, 3), dtype=torch.float32)
    return reps.new_empty((_dynamic_size(),), dtype=torch.uint8)


@register_fake("rtindex_internal::cgrx_scene_rays")
def _(queries, scene, reps, num_reps, representation=0, state=None, hits=None):
    n = queries.shape[0]
    return queries.new_empty((n, 2), dtype=torch.int64), queries.new_empty((n, 8), dtype=torch.float32)


@register_fake("rtindex::cgrx_nodes_load")
def _(keys, rows, node_size, growth):
    return (
        keys.new_empty((_dynamic_size(),), dtype=torch.int32),
        keys.new_empty((_dynamic_size(),), dtype=torch.int64),
        keys.new_empty((_dynamic_size(),), dtype=torch.int32),
        _dynamic_size(),
    )


@register_fake("rtindex::cgrx_find_buckets")
def _(reps, table, keys):
    return keys.new_empty(keys.shape, dtype=torch.int64)


@register_fake("rtindex::cgrx_nodes_plan")
def _(nodes, node_size, del_keys, del_rows, del_offsets, ins_keys, ins_rows, ins_offsets):
    return del_offsets.new_empty((del_offsets.shape[0] - 1, 6), dtype=torch.int64)


@register_fake("rtindex::cgrx_nodes_apply")
def _(nodes, node_size, del_keys, del_rows, del_offsets, ins_keys, ins_rows, ins_offsets, first_new):
    return del_offsets.new_empty((del_offsets.shape[0] - 1, 2), dtype=torch.int64)


@register_fake("rtindex::cgrx_nodes_export")
def _(nodes, node_size, num_buckets):
    n = _dynamic_size()
    return nodes.new_empty((n,), dtype=torch.int64), nodes.new_empty((n,), dtype=torch.int32)


@register_fake("rtindex_internal::partition_queries")
def _(queries, key_type, splitters, chunks, skip=-1):
    n = queries.shape[0]
    return (
        queries.new_empty((n,), dtype=torch.int64),
        queries.new_empty((n,), dtype=torch.int64),
        queries.new_empty((chunks, splitters.shape[0] + 1), dtype=torch.int64),
    )


@register_fake("rtindex_internal::partition_padded")
def _(queries, key_type, splitters, capacity):
    world = splitters.shape[0] + 1
    return (
        queries.new_empty((world, PADDED_HEADER + capacity), dtype=torch.int64),
        queries.new_empty((queries.shape[0],), dtype=torch.int64),
    )


@register_fake("rtindex_internal::gather_answers")
def _(answers, slots, fill_first, fill_second, received):
    n = slots.shape[0]
    return (answers.new_empty((n,), dtype=torch.int64), answers.new_empty((n,), dtype=torch.int64),
            answers.new_empty((), dtype=torch.bool))


@register_fake("rtindex_internal::pack_answers")
def _(a, b, local_to_global):
    return a.new_empty((a.shape[0], 2), dtype=torch.int64)


@register_fake("rtindex_internal::global_rows")
def _(local, local_to_global, base):
    return torch.empty_like(local)


@register_fake("rtindex_internal::cgrx_lookup_queues")
def _(pairs, reps, tables, config, queries, starts, sizes, bases, window=0):
    n = sum(sizes)
    return queries.new_empty((n,), dtype=torch.int64), queries.new_empty((n,), dtype=torch.int64)


@register_fake("rtindex_internal::scatter_answers_into")
def _(answers, positions, first, second):
    return None
