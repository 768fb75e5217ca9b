// The argument checks of kernels::cuda::Gemm (gemm.h), shared by its cuBLASLt implementation
// (gemm.cc) and the CPU emulator's (tools/cuda_emu/gemm_emu.cc), so that both refuse the same
// calls.
#ifndef TRAINYARD_KERNELS_CUDA_GEMM_ARGS_H_
#define TRAINYARD_KERNELS_CUDA_GEMM_ARGS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm.h"

namespace trainyard::kernels::cuda::gemm_args {

// The epilogues that apply GELU (and store the pre-activation).
inline bool HasGelu(GemmEpilogue epilogue) {
  return epilogue == GemmEpilogue::kGeluAux || epilogue == GemmEpilogue::kGeluAuxBias;
}

// Whether the GELU epilogues can store an output of rows of `n`: cuBLASLt requires their
// pre-activation's leading dimension (n) to be a multiple of 8. Other widths take the separate
// GELU kernel (Gemm::SupportsGeluEpilogue says no).
inline bool GeluEpilogueWidthAllowed(int64_t n) { return n % 8 == 0; }

// Every product: its three operands present, sizes positive, the row stride `ld` 0 or at least n.
inline absl::Status CheckProduct(const void* a, const void* b, const void* c, int64_t m, int64_t n,
                                 int64_t k, int64_t ld) {
  TY_REQUIRE(a != nullptr && b != nullptr && c != nullptr);
  TY_REQUIRE(m > 0 && n > 0 && k > 0 && (ld == 0 || ld >= n));
  return absl::OkStatus();
}

// Forward's epilogue: `pre` with the GELU forms, `bias` exactly with the biased ones.
inline absl::Status CheckEpilogue(GemmEpilogue epilogue, const void* pre, const void* bias) {
  TY_REQUIRE(!HasGelu(epilogue) || pre != nullptr);
  TY_REQUIRE((epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kGeluAuxBias) ==
             (bias != nullptr));
  return absl::OkStatus();
}

// An FP8 product: operands and scales present, sizes multiples of 16 (cuBLASLt's FP8 kernels
// need the summed dimension's stride and the output's in multiples of 16 bytes), pointers
// 16-byte aligned, not both operands E5M2, the output bf16 or fp32 (a bias only with bf16).
inline absl::Status CheckFp8(const void* out, DType out_type, const void* a, Fp8Format a_format,
                             const float* a_scale, const void* b, Fp8Format b_format,
                             const float* b_scale, int64_t m, int64_t n, int64_t k,
                             const void* bias) {
  TY_RETURN_IF_ERROR(CheckProduct(out, a, b, m, n, k, 0));
  TY_REQUIRE(a_scale != nullptr && b_scale != nullptr);
  TY_REQUIRE(m % 16 == 0 && n % 16 == 0 && k % 16 == 0);
  for (const void* p : {out, a, b}) TY_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0);
  TY_REQUIRE(a_format == Fp8Format::kE4M3 || b_format == Fp8Format::kE4M3);
  TY_REQUIRE(out_type == DType::kBF16 || out_type == DType::kF32);
  TY_REQUIRE(bias == nullptr || out_type == DType::kBF16);
  return absl::OkStatus();
}

// A grouped call: sizes positive and within cuBLAS's int arguments, every product's operands
// present (host arrays) and the device copy of them given.
inline absl::Status CheckGroup(const GemmGroup& g, int64_t n, int64_t k) {
  constexpr int64_t kMaxInt = 0x7fffffff;
  TY_REQUIRE(g.count >= 0 && n > 0 && k > 0 && n <= kMaxInt && k <= kMaxInt);
  if (g.count == 0) return absl::OkStatus();
  TY_REQUIRE(g.m != nullptr && g.out != nullptr && g.x != nullptr && g.y != nullptr &&
             g.device != nullptr);
  for (int i = 0; i < g.count; ++i) {
    TY_REQUIRE(g.m[i] > 0 && g.m[i] <= kMaxInt);
    TY_RETURN_IF_ERROR(CheckProduct(g.out[i], g.x[i], g.y[i], g.m[i], n, k, 0));
  }
  return absl::OkStatus();
}

// The group's i-th product through the one-product calls.
inline absl::Status RunOne(Gemm& gemm, cudaStream_t stream, DType act, const GemmGroup& g, int i,
                           int64_t n, int64_t k) {
  switch (g.kind) {
    case GemmKind::kForward:
      return gemm.Forward(stream, act, g.out[i], nullptr, g.x[i], g.y[i], nullptr, g.m[i], n, k,
                          GemmEpilogue::kNone);
    case GemmKind::kBackwardInput:
      return gemm.BackwardInput(stream, act, g.out[i], g.x[i], g.y[i], g.m[i], n, k);
    case GemmKind::kBackwardWeight:
      return gemm.BackwardWeight(stream, act, static_cast<float*>(g.out[i]), g.x[i], g.y[i], g.m[i],
                                 n, k);
  }
  return absl::InvalidArgumentError("unknown GEMM kind");
}

}  // namespace trainyard::kernels::cuda::gemm_args

#endif  // TRAINYARD_KERNELS_CUDA_GEMM_ARGS_H_
