#include "kernels/cpu/moe.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/linear.h"

namespace trainyard::kernels::cpu {
namespace {

// One task of a grouped pass: expert `expert`'s rows (or weight-gradient rows) [begin, end).
struct Task {
  int64_t expert, begin, end;
};

// A block size that gives every thread about four tasks over `total` rows, none under
// `min_block` (GEMMs smaller than that run below the BLAS kernel's speed); one thread takes each
// expert whole.
int64_t BlockFor(int64_t total, int64_t min_block) {
  const int64_t threads = omp_get_max_threads();
  if (threads == 1) return std::max<int64_t>(total, 1);
  return std::max(min_block, (total + 4 * threads - 1) / (4 * threads));
}

// [begin, end) in equal blocks of at most `block` (no short tail).
void Split(std::vector<Task>& tasks, int64_t expert, int64_t begin, int64_t end, int64_t block) {
  const int64_t blocks = (end - begin + block - 1) / block;
  for (int64_t i = 0; i < blocks; ++i) {
    tasks.push_back(
        {expert, begin + (end - begin) * i / blocks, begin + (end - begin) * (i + 1) / blocks});
  }
}

// The forward's and the input gradients' tasks: blocks of each expert's token rows.
std::vector<Task> RowTasks(const ExpertMlpShape& s) {
  const int64_t block = BlockFor(s.offsets[s.experts] - s.offsets[0], 32);
  std::vector<Task> tasks;
  for (int64_t j = 0; j < s.experts; ++j) Split(tasks, j, s.offsets[j], s.offsets[j + 1], block);
  return tasks;
}

// The weight gradients' tasks: blocks of each expert's proj rows [0, width), then of its fc rows
// [width, width + fc_out); an expert without tokens has none.
std::vector<Task> WeightTasks(const ExpertMlpShape& s, int64_t fc) {
  int64_t active = 0;
  for (int64_t j = 0; j < s.experts; ++j) active += s.offsets[j + 1] > s.offsets[j] ? 1 : 0;
  const int64_t block = BlockFor(active * (s.width + fc), 16);
  std::vector<Task> tasks;
  for (int64_t j = 0; j < s.experts; ++j) {
    if (s.offsets[j + 1] == s.offsets[j]) continue;
    Split(tasks, j, 0, s.width, block);
    Split(tasks, j, s.width, s.width + fc, block);
  }
  return tasks;
}

// sums[c] += Σ_r x[r, c] over rows in order, for the columns [c0, c1) of a row stride n.
void ColumnSums(float* sums, const float* x, int64_t m, int64_t n, int64_t c0, int64_t c1) {
  for (int64_t r = 0; r < m; ++r) {
    const float* row = x + r * n;
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) sums[c] += row[c];
  }
}

}  // namespace

// The linear and activation kernels run inside the region on one thread each: OpenBLAS runs a call
// single-threaded when it is made from inside a parallel region (omp_in_parallel), and the
// kernels' own regions are nested ones of one thread.
void ExpertMlpForward(const ExpertMlpShape& s, const ExpertMlpWeights& w, const float* in,
                      float* hidden, float* act, float* out) {
  const int64_t width = s.width, ffn = s.ffn, fc = s.gated ? 2 * ffn : ffn;
  const std::vector<Task> tasks = RowTasks(s);
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t t = 0; t < tasks.size(); ++t) {
    const int64_t j = tasks[t].expert, r0 = tasks[t].begin, rows = tasks[t].end - r0;
    float* h = hidden + r0 * fc;
    float* a = act + r0 * ffn;
    LinearForward(h, in + r0 * width, w.fc_w + j * fc * width,
                  w.fc_b != nullptr ? w.fc_b + j * fc : nullptr, rows, fc, width);
    if (s.gated) {
      GluForward(a, h, rows, ffn, s.gate);
    } else {
      GeluForward(a, h, rows * ffn);
    }
    LinearForward(out + r0 * width, a, w.proj_w + j * width * ffn,
                  w.proj_b != nullptr ? w.proj_b + j * width : nullptr, rows, width, ffn);
  }
}

void ExpertMlpBackward(const ExpertMlpShape& s, const ExpertMlpWeights& w, const ExpertMlpGrads& g,
                       const float* dout, const float* in, const float* hidden, const float* act,
                       float* dact, float* dhidden, float* din) {
  const int64_t width = s.width, ffn = s.ffn, fc = s.gated ? 2 * ffn : ffn;
  const int64_t* offsets = s.offsets;
  // Row blocks: dact = dout · proj_w, dhidden = act'(hidden) ⊙ dact, din = dhidden · fc_w.
  const std::vector<Task> rows = RowTasks(s);
  const std::vector<Task> weights = WeightTasks(s, fc);
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (size_t t = 0; t < rows.size(); ++t) {
      const int64_t j = rows[t].expert, r0 = rows[t].begin, m = rows[t].end - r0;
      float* da = dact + r0 * ffn;
      float* dh = dhidden + r0 * fc;
      LinearBackward(da, nullptr, nullptr, dout + r0 * width, nullptr, w.proj_w + j * width * ffn,
                     m, width, ffn);
      if (s.gated) {
        GluBackward(dh, da, hidden + r0 * fc, m, ffn, s.gate);
      } else {
        GeluBackward(dh, da, hidden + r0 * fc, m * ffn);
      }
      LinearBackward(din + r0 * width, nullptr, nullptr, dh, nullptr, w.fc_w + j * fc * width, m,
                     fc, width);
    }
    // dproj_w[n0:n1] += dout[:, n0:n1]ᵀ · act and dfc_w[n0:n1] += dhidden[:, n0:n1]ᵀ · in over
    // the expert's rows, biases alike: each gradient row is one task's.
#pragma omp for schedule(dynamic, 1)
    for (size_t t = 0; t < weights.size(); ++t) {
      const int64_t j = weights[t].expert, r0 = offsets[j], m = offsets[j + 1] - r0;
      const bool proj = weights[t].begin < width;
      const int64_t n0 = proj ? weights[t].begin : weights[t].begin - width;
      const int64_t n1 = proj ? weights[t].end : weights[t].end - width;
      const int64_t n = proj ? width : fc, k = proj ? ffn : width;
      const float* dy = (proj ? dout + r0 * width : dhidden + r0 * fc);
      const float* x = proj ? act + r0 * ffn : in + r0 * width;
      float* dw = proj ? g.proj_w : g.fc_w;
      float* db = proj ? g.proj_b : g.fc_b;
      if (dw != nullptr) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n1 - n0, k, m, 1.0f, dy + n0, n, x, k,
                    1.0f, dw + (j * n + n0) * k, k);
      }
      if (db != nullptr) ColumnSums(db + j * n, dy, m, n, n0, n1);
    }
  }
}

void GatherRows(float* out, const float* inp, const int32_t* rows, const float* scale,
                int64_t count, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < count; ++r) {
    const float* from = inp + (rows != nullptr ? int64_t{rows[r]} : r) * cols;
    float* to = out + r * cols;
    const float s = scale != nullptr ? scale[r] : 1.0f;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) to[c] = s * from[c];
  }
}

void CombineRows(float* out, const float* inp, const int32_t* slots, const float* weights,
                 int64_t rows, int64_t k, int64_t cols, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    float* to = out + t * cols;
    if (!accumulate) std::fill_n(to, cols, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t slot = slots[t * k + j];
      if (slot < 0) continue;
      const float* from = inp + int64_t{slot} * cols;
      const float w = weights != nullptr ? weights[t * k + j] : 1.0f;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) to[c] += w * from[c];
    }
  }
}

void RowDots(float* out, const float* a, const int32_t* a_rows, const float* b, int64_t count,
             int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < count; ++r) {
    const float* x = a + int64_t{a_rows[r]} * cols;
    const float* y = b + r * cols;
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) sum += x[c] * y[c];
    out[r] = sum;
  }
}

void SigmoidGateRows(float* gate, const float* logits, float* x, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float g = 1.0f / (1.0f + std::exp(-logits[r]));
    gate[r] = g;
    float* row = x + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) row[c] *= g;
  }
}

void SigmoidGateBackward(float* dlogits, const float* gate, const float* act, const float* dact,
                         int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = act + r * cols;
    const float* y = dact + r * cols;
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) sum += x[c] * y[c];
    dlogits[r] = (1.0f - gate[r]) * sum;
  }
}

void LinearBackwardAccumulate(float* dinp, float* dweight, const float* dout, const float* inp,
                              const float* weight, int64_t m, int64_t n, int64_t k) {
  if (m == 0) return;
  if (dinp != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, dout, n, weight, k, 1.0f,
                dinp, k);
  }
  if (dweight != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, dout, n, inp, k, 1.0f,
                dweight, k);
  }
}

}  // namespace trainyard::kernels::cpu
