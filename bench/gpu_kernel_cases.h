// The kernels trainyard-bench-gpu-kernels times, at the shapes one training step of each preset
// runs them, with how each counts its work (FLOPs or the fewest bytes moved).
// bench/torch_gpu_kernels.py holds the PyTorch counterpart of every case, under the same name,
// with the same counts.
#ifndef TRAINYARD_BENCH_GPU_KERNEL_CASES_H_
#define TRAINYARD_BENCH_GPU_KERNEL_CASES_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/gpu_bench_util.h"
#include "config/model_config.h"
#include "kernels/cuda/gemm.h"

namespace trainyard::bench {

struct BenchModel {
  std::string name;  // the preset
  config::ModelConfig config;
  int64_t batch = 0, seq = 0;   // the training shape: batch · seq token rows
  int64_t ce_rows = 4096;       // rows of one cross-entropy / LM-head chunk
  bool attention_only = false;  // only the attention cases (a shape for attention alone)
};

// GPT-2 124M at 16 × 1024 tokens, Llama 1B at 4 × 2048, and "attn-d128": attention alone at
// head dim 128 (32 query heads over 8 key/value heads) at 2 × 4096.
std::vector<BenchModel> BenchModels();

struct CaseContext {
  cudaStream_t stream;
  EventTimer* timer;
  kernels::cuda::Gemm* gemm;
};

struct Case {
  std::string kernel;  // the row's name, e.g. "attention fwd+bwd"
  // Sets row->shape first, then allocates, fills, times and sets flop or bytes.
  std::function<absl::Status(const CaseContext&, Row*)> run;
};

// The cases of one model, in table order (family-specific: LayerNorm and GELU for GPT-2,
// RMSNorm and SwiGLU for Llama).
std::vector<Case> CasesFor(const BenchModel& model);

}  // namespace trainyard::bench

#endif  // TRAINYARD_BENCH_GPU_KERNEL_CASES_H_
