// Where a rank's local tensors sit in the global (unsharded) tensors, which is what lets a
// checkpoint written under one mesh load under another.
//
// A rank's local tensor is the row-major concatenation of one or more hyperslabs of its global
// tensor ("pieces"): the whole tensor when replicated, one block of columns for a row-parallel
// weight, and one block of rows per section for a column-parallel weight whose rows are made of
// sections (the q, k and v parts of a fused projection).
//
// Threading: plain functions.
#ifndef TRAINYARD_WORKER_SHAPE_TENSOR_SLICES_H_
#define TRAINYARD_WORKER_SHAPE_TENSOR_SLICES_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "worker/shape/parameters.h"

namespace trainyard::worker {

struct Hyperslab {
  std::vector<int64_t> offsets;  // per dimension, in the global tensor
  std::vector<int64_t> sizes;
  int64_t numel() const;
};

// The pieces of `t`'s global tensor that tensor-parallel rank `tp_rank` of `tp_size` holds, in
// the order of its local elements (of an expert tensor, within the experts the rank holds:
// ParamTensor::expert_begin, expert_count).
std::vector<Hyperslab> LocalPieces(const ParamTensor& t, int tp_rank, int tp_size);

// Calls `run(global_offset, slab_index, count)` for elements [begin, end) of `slab` (row-major
// positions within it), one call per maximal run of elements contiguous in the global tensor:
// element slab_index + i of the slab is element global_offset + i of the global tensor.
void ForEachRun(const std::vector<int64_t>& global_shape, const Hyperslab& slab, int64_t begin,
                int64_t end, const std::function<void(int64_t, int64_t, int64_t)>& run);

// Calls `run(global_offset, local_index, count)` for every element of `t` that tensor-parallel
// rank `tp_rank` of `tp_size` holds, one call per run contiguous in the global tensor: element
// local_index + i of the local tensor (from its own start, not t.offset) is element
// global_offset + i of the global tensor. LocalPieces and ForEachRun together.
void ForEachLocalRun(const ParamTensor& t, int tp_rank, int tp_size,
                     const std::function<void(int64_t, int64_t, int64_t)>& run);

// Elements [lo, hi) of a local tensor, split by piece: (piece index, begin, end) with begin/end
// relative to that piece.
struct PieceRange {
  int piece;
  int64_t begin;
  int64_t end;
};
std::vector<PieceRange> SplitByPiece(const std::vector<Hyperslab>& pieces, int64_t lo, int64_t hi);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_SHAPE_TENSOR_SLICES_H_
