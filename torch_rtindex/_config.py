"""The typed configuration every index hands its lookup operators: Python mirrors of the C++ enums and of the
``int[] config`` layouts (csrc/ops.cpp ``config_schema``, csrc/cgrx/cgrx_args.h, csrc/rx/rx_args.h), checked
against the C++ side when the package is imported, so an integer never silently changes its meaning."""

from __future__ import annotations

from enum import IntEnum

import torch


class KeyType(IntEnum):
    int64 = 0
    int32 = 1
    uint64 = 2  # also: queries that are ordered keys already
    float32 = 3
    float64 = 4


class Layout(IntEnum):
    packed_row = 0
    aligned_row = 1
    column = 2
    nodes = 3


class Backend(IntEnum):
    radix = 0
    optix = 1
    binary_search = 2


class BucketSearch(IntEnum):
    binary = 0
    linear = 1


class Representation(IntEnum):
    naive = 0
    optimized = 1


CGRX_CONFIG_FIELDS = ("key_type", "layout", "bucket_size", "bucket_search", "backend", "scene*5")
RX_CONFIG_FIELDS = ("key_type", "unique_keys", "max_range_rays", "scene*5")


def cgrx_config(key_type: str, layout: str, bucket_size: int, bucket_search: str, backend: str,
                scene: list[int]) -> list[int]:
    """The ``int[] config`` of the cgRX lookup operators, in CGRX_CONFIG_FIELDS order."""
    # Plain ints: what the operator takes (and what torch.compile guards on by value).
    return [int(KeyType[key_type]), int(Layout[layout]), bucket_size, int(BucketSearch[bucket_search]),
            int(Backend[backend]), *scene]


def rx_config(key_type: str, unique_keys: bool, max_range_rays: int, scene: list[int]) -> list[int]:
    """The ``int[] config`` of the RX lookup operators, in RX_CONFIG_FIELDS order."""
    return [int(KeyType[key_type]), int(unique_keys), max_range_rays, *scene]


def _schema() -> str:
    enums = [("key_type", KeyType), ("layout", Layout), ("backend", Backend), ("bucket_search", BucketSearch),
             ("representation", Representation)]
    parts = [f"{name}:" + ",".join(f"{m.name}={m.value}" for m in enum) for name, enum in enums]
    parts += ["cgrx_config:" + ",".join(CGRX_CONFIG_FIELDS), "rx_config:" + ",".join(RX_CONFIG_FIELDS)]
    return ";".join(parts)


def check_against_extension() -> None:
    """Raises if the compiled extension's enums or config layouts differ from these mirrors."""
    native = torch.ops.rtindex_internal.config_schema()
    if native != _schema():
        raise RuntimeError(
            "torch_rtindex: the compiled extension's configuration schema differs from the Python package's "
            f"(a stale build?): C++ {native!r}, Python {_schema()!r}; delete the build cache and import again"
        )
