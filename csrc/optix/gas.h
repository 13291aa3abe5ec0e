// Building and refitting GAS structures (host side); the layout is in gas_header.h.
#pragma once

#include "gas_header.h"

#include <ATen/ATen.h>

namespace rtindex::gas {

// Builds a GAS over `num_triangles` triangles (vertices: float32, 9 per triangle, on the GPU; triangles with
// NaN corners are inactive). Compacted unless `allow_update`, which keeps it refittable instead.
// Takes the vertices by value: a caller that moves them in lets the build free them before compacting.
at::Tensor build(at::Tensor vertices, int64_t num_triangles, bool allow_update);

// Moves the triangles of an updatable GAS in place (same count).
void refit(at::Tensor& structure, const at::Tensor& vertices, int64_t num_triangles);

GasHeader read_header(const at::Tensor& structure);

void check_structure(const at::Tensor& structure);

}  // namespace rtindex::gas
