#include "worker/shape/tensor_slices.h"

#include <algorithm>

namespace trainyard::worker {

int64_t Hyperslab::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::vector<Hyperslab> LocalPieces(const ParamTensor& t, int tp_rank, int tp_size) {
  if (t.experts > 0 && t.expert_count < t.experts) {
    // This rank's experts (expert parallelism): their pieces as a tensor of their own, moved to
    // where those experts start along the first dimension.
    ParamTensor held = t;
    const int64_t per_expert = t.global_shape[0] / t.experts;
    held.global_shape[0] = per_expert * t.expert_count;
    held.row_sections.resize(t.row_sections.size() / t.experts * t.expert_count);
    held.experts = 0;
    std::vector<Hyperslab> pieces = LocalPieces(held, tp_rank, tp_size);
    for (Hyperslab& piece : pieces) piece.offsets[0] += per_expert * t.expert_begin;
    return pieces;
  }
  const std::vector<int64_t>& shape = t.global_shape;
  Hyperslab whole{std::vector<int64_t>(shape.size(), 0), shape};
  switch (t.shard) {
    case ShardKind::kReplicated:
      return {whole};
    case ShardKind::kColumns: {
      const int64_t mine = shape.back() / tp_size;
      whole.offsets.back() = tp_rank * mine;
      whole.sizes.back() = mine;
      return {whole};
    }
    case ShardKind::kRows: {
      std::vector<Hyperslab> pieces;
      int64_t section_begin = 0;
      for (int64_t rows : t.row_sections) {
        const int64_t mine = rows / tp_size;
        Hyperslab piece = whole;
        piece.offsets[0] = section_begin + tp_rank * mine;
        piece.sizes[0] = mine;
        pieces.push_back(std::move(piece));
        section_begin += rows;
      }
      return pieces;
    }
  }
  return {whole};
}

void ForEachRun(const std::vector<int64_t>& global_shape, const Hyperslab& slab, int64_t begin,
                int64_t end, const std::function<void(int64_t, int64_t, int64_t)>& run) {
  const size_t dims = global_shape.size();
  std::vector<int64_t> stride(dims, 1);
  for (size_t d = dims; d-- > 1;) stride[d - 1] = stride[d] * global_shape[d];
  const int64_t row = slab.sizes.back();
  // Rows that continue each other in the global tensor (a slab spanning whole inner dimensions)
  // are merged into one run.
  int64_t run_global = 0, run_from = begin, run_count = 0;
  for (int64_t f = begin; f < end;) {
    int64_t r = f / row;
    const int64_t col = f % row;
    const int64_t count = std::min(row - col, end - f);
    int64_t global = slab.offsets.back() + col;
    for (size_t d = dims - 1; d-- > 0;) {
      global += (slab.offsets[d] + r % slab.sizes[d]) * stride[d];
      r /= slab.sizes[d];
    }
    if (run_count > 0 && global != run_global + run_count) {
      run(run_global, run_from, run_count);
      run_count = 0;
    }
    if (run_count == 0) {
      run_global = global;
      run_from = f;
    }
    run_count += count;
    f += count;
  }
  if (run_count > 0) run(run_global, run_from, run_count);
}

void ForEachLocalRun(const ParamTensor& t, int tp_rank, int tp_size,
                     const std::function<void(int64_t, int64_t, int64_t)>& run) {
  int64_t start = 0;  // where the piece begins in the local tensor
  for (const Hyperslab& slab : LocalPieces(t, tp_rank, tp_size)) {
    ForEachRun(t.global_shape, slab, 0, slab.numel(),
               [&](int64_t at, int64_t from, int64_t n) { run(at, start + from, n); });
    start += slab.numel();
  }
}

std::vector<PieceRange> SplitByPiece(const std::vector<Hyperslab>& pieces, int64_t lo, int64_t hi) {
  std::vector<PieceRange> out;
  int64_t start = 0;
  for (int i = 0; i < static_cast<int>(pieces.size()); ++i) {
    const int64_t n = pieces[i].numel();
    const int64_t b = std::max(lo, start), e = std::min(hi, start + n);
    if (e > b) out.push_back({i, b - start, e - start});
    start += n;
  }
  return out;
}

}  // namespace trainyard::worker
