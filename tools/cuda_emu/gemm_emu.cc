// kernels/cuda/gemm.h on the CPU emulator: the products cuBLASLt computes for the CUDA backend,
// as plain loops with the device's types (operands of the storage type `act`, fp32 accumulation,
// one rounding of each output to its type), so that the backend itself can run on the
// emulator. Arithmetic follows the header's contract, not cuBLASLt's summation order: results
// agree with the device's to the rounding of the sums.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_args.h"

namespace trainyard::kernels::cuda {

struct Gemm::Plan {};

namespace {

float Load(DType act, const void* p, int64_t i) {
  if (act == DType::kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

void Store(DType act, void* p, int64_t i, float v) {
  if (act == DType::kBF16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// The tanh form, as the GELU kernels compute it.
float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(size_t workspace_bytes) {
  std::unique_ptr<Gemm> gemm(new Gemm());
  gemm->workspace_bytes_ = workspace_bytes;
  return gemm;
}

Gemm::~Gemm() = default;

// c(r, s) = Σ_p a[r·a_r + p·a_p] · b[s·b_s + p·b_p] over p < depth, for r < rows and s < cols,
// each sum in fp32 in p's order, handed to `store` (r, s, sum). Operands of the storage type.
template <typename Store>
void Product(DType act, const void* a, int64_t a_r, int64_t a_p, const void* b, int64_t b_s,
             int64_t b_p, int64_t rows, int64_t cols, int64_t depth, Store store) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < cols; ++s) {
      float sum = 0.0f;
      for (int64_t p = 0; p < depth; ++p) {
        sum += Load(act, a, r * a_r + p * a_p) * Load(act, b, s * b_s + p * b_p);
      }
      store(r, s, sum);
    }
  }
}

absl::Status Gemm::Forward(cudaStream_t, DType act, void* out, void* pre, const void* inp,
                           const void* weight, const void* bias, int64_t m, int64_t n, int64_t k,
                           GemmEpilogue epilogue, int64_t ld) {
  TY_RETURN_IF_ERROR(gemm_args::CheckProduct(out, inp, weight, m, n, k, ld));
  TY_RETURN_IF_ERROR(gemm_args::CheckEpilogue(epilogue, pre, bias));
  const bool gelu = gemm_args::HasGelu(epilogue);
  if (ld == 0) ld = n;
  // out[i, j] = Σ_p inp[i, p] · weight[j, p]
  Product(act, inp, k, 1, weight, k, 1, m, n, k, [&](int64_t i, int64_t j, float sum) {
    if (bias != nullptr) sum += Load(act, bias, j);
    if (gelu) {
      Store(act, pre, i * ld + j, sum);
      sum = GeluTanh(sum);
    }
    Store(act, out, i * ld + j, sum);
  });
  return absl::OkStatus();
}

absl::Status Gemm::BackwardInput(cudaStream_t, DType act, void* dinp, const void* dout,
                                 const void* weight, int64_t m, int64_t n, int64_t k, int64_t ld) {
  TY_RETURN_IF_ERROR(gemm_args::CheckProduct(dinp, dout, weight, m, n, k, ld));
  if (ld == 0) ld = n;
  // dinp[i, p] = Σ_j dout[i, j] · weight[j, p]
  Product(act, dout, ld, 1, weight, 1, k, m, k, n,
          [&](int64_t i, int64_t p, float sum) { Store(act, dinp, i * k + p, sum); });
  return absl::OkStatus();
}

absl::Status Gemm::BackwardWeight(cudaStream_t, DType act, float* dweight, const void* dout,
                                  const void* inp, int64_t m, int64_t n, int64_t k, int64_t ld) {
  TY_RETURN_IF_ERROR(gemm_args::CheckProduct(dweight, dout, inp, m, n, k, ld));
  if (ld == 0) ld = n;
  // dweight[j, p] += Σ_i dout[i, j] · inp[i, p]
  Product(act, dout, 1, ld, inp, 1, k, n, k, m,
          [&](int64_t j, int64_t p, float sum) { dweight[j * k + p] += sum; });
  return absl::OkStatus();
}

// FP8 codes decoded with CUDA's own conversion (not the project's reference, which the
// quantizers are checked against), the sum in fp32 in k's order, times both scales, rounded once
// to bf16 (with the bias) or added to the fp32 output. Fast accumulation changes nothing here.
absl::Status Gemm::Fp8(cudaStream_t, void* out, DType out_type, const void* a, Fp8Format a_format,
                       const float* a_scale, const void* b, Fp8Format b_format,
                       const float* b_scale, int64_t m, int64_t n, int64_t k, const void* bias,
                       bool) {
  TY_RETURN_IF_ERROR(gemm_args::CheckFp8(out, out_type, a, a_format, a_scale, b, b_format, b_scale,
                                         m, n, k, bias));
  auto decode = [](const void* codes, int64_t i, Fp8Format f) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(codes)[i],
                                                 f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
  };
  const float scale = *a_scale * *b_scale;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int64_t p = 0; p < k; ++p) {
        sum += decode(a, i * k + p, a_format) * decode(b, j * k + p, b_format);
      }
      if (out_type == DType::kF32) {
        static_cast<float*>(out)[i * n + j] += scale * sum;
      } else {
        const float biased = scale * sum + (bias != nullptr ? Load(DType::kBF16, bias, j) : 0.0f);
        Store(DType::kBF16, out, i * n + j, biased);
      }
    }
  }
  return absl::OkStatus();
}

bool Gemm::SupportsGeluEpilogue(DType, int64_t, int64_t n, int64_t) {
  return gemm_args::GeluEpilogueWidthAllowed(n);
}

// As cuBLAS's grouped GEMM: the operands are read from the device copy of the pointer arrays
// (so a caller that uploads wrong or stale pointers gets wrong results here too).
absl::Status Gemm::Grouped(cudaStream_t stream, DType act, const GemmGroup& g, int64_t n,
                           int64_t k) {
  TY_RETURN_IF_ERROR(gemm_args::CheckGroup(g, n, k));
  GemmGroup device = g;
  device.out = const_cast<void* const*>(g.device);
  device.x = g.device + g.count;
  device.y = g.device + 2 * g.count;
  for (int i = 0; i < g.count; ++i) {
    TY_RETURN_IF_ERROR(gemm_args::RunOne(*this, stream, act, device, i, n, k));
  }
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
