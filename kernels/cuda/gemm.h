// Row-major GEMMs for linear layers through cuBLASLt, with fused epilogues (bias; bias + GELU
// that also stores the pre-activation) and the algorithm and workspace chosen once per shape.
//
// Storage: activations `act` (fp32 or bf16); weights are given in the same type as the
// activations (the CUDA backend keeps fp32 master weights and hands a converted copy); weight
// gradients are fp32 and accumulated (beta = 1). Compute is fp32 (no TF32 for fp32 storage, so
// the fp32 path matches the CPU reference). Not thread-safe: one Gemm per stream/thread.
#ifndef TRAINYARD_KERNELS_CUDA_GEMM_H_
#define TRAINYARD_KERNELS_CUDA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "kernels/fp8_format.h"

namespace trainyard::kernels::cuda {

enum class GemmEpilogue { kNone, kBias, kGeluAuxBias, kGeluAux };

// A group of products of one kind, each with its own operands and row count m (a mixture of
// experts' experts, each on its own rows), as Gemm::Grouped runs them. The operands are named as
// the one-product calls name theirs: kForward (out, inp, weight), kBackwardInput (dinp, dout,
// weight), kBackwardWeight (dweight, dout, inp).
enum class GemmKind { kForward, kBackwardInput, kBackwardWeight };
struct GemmGroup {
  GemmKind kind = GemmKind::kForward;
  int count = 0;                   // products
  const int64_t* m = nullptr;      // host: each product's m (> 0)
  void* const* out = nullptr;      // host arrays of each product's operands
  const void* const* x = nullptr;  //   (out, inp, weight) / (dinp, dout, weight) /
  const void* const* y = nullptr;  //   (dweight, dout, inp)
  // The same pointers in device memory, laid out as GroupPointers gives them. cuBLAS's grouped
  // GEMM reads them there, so the caller uploads them in stream order before the call.
  const void* const* device = nullptr;
};

// The layout of GemmGroup::device, from the host arrays: out's pointers, then x's, then y's.
inline std::vector<const void*> GroupPointers(const GemmGroup& g) {
  std::vector<const void*> pointers(g.out, g.out + g.count);
  pointers.insert(pointers.end(), g.x, g.x + g.count);
  pointers.insert(pointers.end(), g.y, g.y + g.count);
  return pointers;
}

class Gemm {
 public:
  // Creates the cuBLASLt handle and a workspace of `workspace_bytes` on the current device.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Gemm>> Create(size_t workspace_bytes = 32
                                                                                             << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out[m, n] = inp[m, k] · weight[n, k]ᵀ (+ bias[n], bias of type `act`).
  // kGeluAux(Bias): pre[m, n] receives the pre-activation and out = gelu(pre) (tanh form).
  // `ld`: the row stride of out (and pre) in elements, at least n; 0 means n. A stride that is
  // a multiple of 8 keeps cuBLASLt's fast kernels for an odd n (GPT-2's 50257-wide logits).
  [[nodiscard]] absl::Status Forward(cudaStream_t stream, DType act, void* out, void* pre,
                                     const void* inp, const void* weight, const void* bias,
                                     int64_t m, int64_t n, int64_t k, GemmEpilogue epilogue,
                                     int64_t ld = 0);
  // dinp[m, k] = dout[m, n] · weight[n, k] (overwritten); `ld` is dout's row stride (0: n).
  [[nodiscard]] absl::Status BackwardInput(cudaStream_t stream, DType act, void* dinp,
                                           const void* dout, const void* weight, int64_t m,
                                           int64_t n, int64_t k, int64_t ld = 0);
  // dweight[n, k] += dout[m, n]ᵀ · inp[m, k] (fp32 accumulation into fp32 dweight); `ld` is
  // dout's row stride (0: n).
  [[nodiscard]] absl::Status BackwardWeight(cudaStream_t stream, DType act, float* dweight,
                                            const void* dout, const void* inp, int64_t m, int64_t n,
                                            int64_t k, int64_t ld = 0);

  // An FP8 product (cuBLASLt's FP8 kernels, sm_89 and later): out[m, n] = a_scale · b_scale ·
  // Σ_k a[m, k] · b[n, k], both operands FP8 codes (kernels/fp8_format.h) with the summed
  // dimension contiguous, as cuBLASLt takes FP8 operands, and not both E5M2; a_scale and b_scale
  // are fp32 in device memory (the quantizers' scale_inv). m, n and k are multiples of 16 and
  // the pointers 16-byte aligned. out is bf16 (overwritten) or fp32 (accumulated, out += ...:
  // weight gradients). `bias` (bf16, [n], bf16 out only; may be null) is added in the epilogue
  // before the one rounding. `fast_accum`: Hopper's faster accumulation of the tensor cores'
  // partial sums (fewer fp32 promotions; for forward products, as FP8 training recipes use it).
  [[nodiscard]] absl::Status Fp8(cudaStream_t stream, void* out, DType out_type, const void* a,
                                 Fp8Format a_format, const float* a_scale, const void* b,
                                 Fp8Format b_format, const float* b_scale, int64_t m, int64_t n,
                                 int64_t k, const void* bias = nullptr, bool fast_accum = false);

  // The group's products with the shared n and k, as the one-product calls define them (no
  // epilogue; weight gradients accumulated into fp32), in one cuBLAS grouped batched GEMM. Where
  // the library refuses the first call of a kind and type (too old, or not for these types), the
  // products of that kind and type run one by one from the host arrays instead, from then on.
  [[nodiscard]] absl::Status Grouped(cudaStream_t stream, DType act, const GemmGroup& group,
                                     int64_t n, int64_t k);
  // Whether Grouped runs this kind and type one product at a time (cuBLAS refused it).
  bool GroupedOneByOne(GemmKind kind, DType act) const {
    return !grouped_available_ ||
           one_by_one_.contains({static_cast<int>(kind), static_cast<int>(act)});
  }

  // Whether the fused GELU epilogue is available for this shape (cuBLASLt may offer no
  // algorithm); the caller falls back to a separate GELU kernel.
  bool SupportsGeluEpilogue(DType act, int64_t m, int64_t n, int64_t k);

  // Distinct problem shapes planned so far (each planned once, then reused).
  int planned_shapes() const { return static_cast<int>(plans_.size()); }

 private:
  struct Plan;
  // (act with the alignment and the FP8 bits folded in (gemm.cc), transa, transb, m, n, k,
  // epilogue, d_is_fp32, accumulate, ld of the operand whose rows are the caller's n: d when
  // transa, else b)
  using Key = std::tuple<int, int, int, int64_t, int64_t, int64_t, int, int, int, int64_t>;
  Gemm() = default;
  [[nodiscard]] absl::StatusOr<const Plan*> GetPlan(const Key& key);
  [[nodiscard]] absl::Status Run(cudaStream_t stream, const Key& key, const void* a, const void* b,
                                 void* d, const void* bias, void* aux,
                                 const float* a_scale = nullptr, const float* b_scale = nullptr);

  void* handle_ = nullptr;          // cublasLtHandle_t
  void* grouped_handle_ = nullptr;  // cublasHandle_t, made on the first Grouped call
  bool grouped_available_ = true;   // false: the handle could not be made
  // (kind, act) that cuBLAS refused on their first call, and those it has run.
  std::set<std::pair<int, int>> one_by_one_, grouped_ran_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<Key, absl::Status> no_algorithm_;  // shapes the heuristic found nothing for
};

}  // namespace trainyard::kernels::cuda

#endif  // TRAINYARD_KERNELS_CUDA_GEMM_H_
