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

}  // namespace trainyard::kernels::cuda::gemm_args

#endif  // TRAINYARD_KERNELS_CUDA_GEMM_ARGS_H_
