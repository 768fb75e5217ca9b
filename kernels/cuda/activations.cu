// GELU and the gated units (SwiGLU, GeGLU) are memory-bound: the aim is to move each byte once, 16
// bytes an access.
// The floor, with bf16 storage: GELU's forward reads x and writes y (4 bytes an element), its
// backward reads dy and x and writes dx (6). SwiGLU's forward reads gate and up and writes y
// (6 bytes an output element), its backward reads dy, gate and up and writes dgate and dup (10).
// Fwd+bwd, as bench/gpu_kernel_cases.cc counts them:
//   gpt2-124m GELU,   16384 × 3072:           10 B × 50.3 M =  503 MB, 126 µs at 4 TB/s
//   llama-1b SwiGLU,   8192 × 2·8192 → 8192:  16 B × 67.1 M = 1074 MB, 268 µs at 4 TB/s
// Each kernel reads every input element once and writes every output element once.
//
// Every kernel is a grid-stride loop over units of 16 bytes (8 bf16 or 4 fp32), or of single
// elements when a pointer (or SwiGLU's f) does not allow 16-byte accesses; GELU takes its last
// n mod 8 elements one at a time. The grid is one wave of kStrideBlocksPerSm blocks a
// multiprocessor. At this bandwidth a bf16 element of the backward has ~50 instructions' worth of
// time, so tanh and the sigmoid use the fast exponential and division (MUFU) instead of tanhf and
// expf.
#include <algorithm>
#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/memory_bound.cuh"

namespace trainyard::kernels::cuda {
namespace {

// The GPT-2 tanh approximation; the constants are the CPU reference's.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

// tanh as the CPU reference computes it, 1 − 2/(e^{2u} + 1): absolute error about 1e-6 with the
// fast intrinsics. It saturates to ±1 (e^{2u} = inf gives 2/inf = 0) and propagates NaN.
__device__ __forceinline__ float FastTanh(float u) {
  return 1.0f - __fdividef(2.0f, __expf(2.0f * u) + 1.0f);
}
__device__ __forceinline__ float FastSigmoid(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-x));
}

__device__ __forceinline__ float Gelu(float x) {
  return 0.5f * x * (1.0f + FastTanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x)));
}
__device__ __forceinline__ float GeluGradient(float x, float dy) {
  const float t = FastTanh(kSqrt2OverPi * (x + kGeluCoeff * x * x * x));
  const float dt = (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x * x);
  return dy * (0.5f * (1.0f + t) + 0.5f * x * dt);
}

// The operations, applied to kVec consecutive elements: at flat index i (GELU), or at row r,
// column j of [rows, f] (SwiGLU). Each loads all its inputs before it stores, so an output may
// alias an input laid out like it (dinp = dout for GELU, dinp = inp for SwiGLU).
template <typename T>
struct GeluForwardOp {
  using Elem = T;
  T* out;
  const T* inp;
  template <int kVec>
  __device__ __forceinline__ void Apply(int64_t i) const {
    const Vec<T, kVec> x = LoadVec<T, kVec>(inp + i);
    Vec<T, kVec> y;
#pragma unroll
    for (int k = 0; k < kVec; ++k) y.v[k] = FromFloat<T>(Gelu(ToFloat(x.v[k])));
    StoreVec(out + i, y);
  }
};

template <typename T>
struct GeluBackwardOp {
  using Elem = T;
  T* dinp;
  const T* dout;
  const T* inp;
  template <int kVec>
  __device__ __forceinline__ void Apply(int64_t i) const {
    const Vec<T, kVec> x = LoadVec<T, kVec>(inp + i), dy = LoadVec<T, kVec>(dout + i);
    Vec<T, kVec> dx;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      dx.v[k] = FromFloat<T>(GeluGradient(ToFloat(x.v[k]), ToFloat(dy.v[k])));
    }
    StoreVec(dinp + i, dx);
  }
};

// The gate's value g(x); SwiGLU's is silu(x) = x · sigmoid(x).
template <GluGate kGate>
__device__ __forceinline__ float GateValue(float x) {
  if constexpr (kGate == GluGate::kSilu) {
    return x * FastSigmoid(x);
  } else {
    return Gelu(x);
  }
}

// Row r of inp is (gate[f], up[f]).
template <typename T, GluGate kGate>
struct GluForwardOp {
  using Elem = T;
  T* out;
  const T* inp;
  int64_t f;
  template <int kVec>
  __device__ __forceinline__ void Apply(int64_t r, int64_t j) const {
    const T* gate_at = inp + r * 2 * f + j;
    const Vec<T, kVec> gate = LoadVec<T, kVec>(gate_at), up = LoadVec<T, kVec>(gate_at + f);
    Vec<T, kVec> y;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      y.v[k] = FromFloat<T>(GateValue<kGate>(ToFloat(gate.v[k])) * ToFloat(up.v[k]));
    }
    StoreVec(out + r * f + j, y);
  }
};

template <typename T, GluGate kGate>
struct GluBackwardOp {
  using Elem = T;
  T* dinp;
  const T* dout;
  const T* inp;
  int64_t f;
  template <int kVec>
  __device__ __forceinline__ void Apply(int64_t r, int64_t j) const {
    const int64_t gate_at = r * 2 * f + j, up_at = gate_at + f;
    const Vec<T, kVec> gate = LoadVec<T, kVec>(inp + gate_at), up = LoadVec<T, kVec>(inp + up_at);
    const Vec<T, kVec> dy = LoadVec<T, kVec>(dout + r * f + j);
    Vec<T, kVec> dgate, dup;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float g = ToFloat(gate.v[k]), u = ToFloat(up.v[k]), d = ToFloat(dy.v[k]);
      if constexpr (kGate == GluGate::kSilu) {
        const float s = FastSigmoid(g);
        dgate.v[k] = FromFloat<T>(d * u * s * (1.0f + g * (1.0f - s)));
        dup.v[k] = FromFloat<T>(d * (g * s));
      } else {
        dgate.v[k] = FromFloat<T>(GeluGradient(g, d * u));
        dup.v[k] = FromFloat<T>(d * Gelu(g));
      }
    }
    StoreVec(dinp + gate_at, dgate);
    StoreVec(dinp + up_at, dup);
  }
};

absl::Status CheckDType(DType dtype) {
  TY_REQUIRE(dtype == DType::kF32 || dtype == DType::kBF16);
  return absl::OkStatus();
}

}  // namespace

absl::Status GeluForward(cudaStream_t stream, DType dtype, void* out, const void* inp, int64_t n) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(n >= 0);
  if (n == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr && inp != nullptr);
  const bool aligned = Aligned16(out) && Aligned16(inp);
  TY_DISPATCH_DTYPE(dtype, T, {
    const GeluForwardOp<T> op{static_cast<T*>(out), static_cast<const T*>(inp)};
    TY_RETURN_IF_ERROR(LaunchElements(stream, "GeluForwardKernel", op, n, aligned));
  });
  return absl::OkStatus();
}

absl::Status GeluBackward(cudaStream_t stream, DType dtype, void* dinp, const void* dout,
                          const void* inp, int64_t n) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(n >= 0);
  if (n == 0) return absl::OkStatus();
  TY_REQUIRE(dinp != nullptr && dout != nullptr && inp != nullptr);
  const bool aligned = Aligned16(dinp) && Aligned16(dout) && Aligned16(inp);
  TY_DISPATCH_DTYPE(dtype, T, {
    const GeluBackwardOp<T> op{static_cast<T*>(dinp), static_cast<const T*>(dout),
                               static_cast<const T*>(inp)};
    TY_RETURN_IF_ERROR(LaunchElements(stream, "GeluBackwardKernel", op, n, aligned));
  });
  return absl::OkStatus();
}

absl::Status GluForward(cudaStream_t stream, DType dtype, void* out, const void* inp, int64_t rows,
                        int64_t f, GluGate gate) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(rows >= 0 && f >= 1);
  if (rows == 0) return absl::OkStatus();
  TY_REQUIRE(out != nullptr && inp != nullptr);
  const bool aligned = Aligned16(out) && Aligned16(inp);
  TY_DISPATCH_DTYPE(dtype, T, {
    auto launch = [&](auto op, const char* name) {
      return LaunchRows(stream, name, op, rows, f, aligned);
    };
    T* y = static_cast<T*>(out);
    const T* x = static_cast<const T*>(inp);
    TY_RETURN_IF_ERROR(
        gate == GluGate::kSilu
            ? launch(GluForwardOp<T, GluGate::kSilu>{y, x, f}, "SwigluForwardKernel")
            : launch(GluForwardOp<T, GluGate::kGeluTanh>{y, x, f}, "GegluForwardKernel"));
  });
  return absl::OkStatus();
}

absl::Status GluBackward(cudaStream_t stream, DType dtype, void* dinp, const void* dout,
                         const void* inp, int64_t rows, int64_t f, GluGate gate) {
  TY_RETURN_IF_ERROR(CheckDType(dtype));
  TY_REQUIRE(rows >= 0 && f >= 1);
  if (rows == 0) return absl::OkStatus();
  TY_REQUIRE(dinp != nullptr && dout != nullptr && inp != nullptr);
  const bool aligned = Aligned16(dinp) && Aligned16(dout) && Aligned16(inp);
  TY_DISPATCH_DTYPE(dtype, T, {
    auto launch = [&](auto op, const char* name) {
      return LaunchRows(stream, name, op, rows, f, aligned);
    };
    T* dx = static_cast<T*>(dinp);
    const T* dy = static_cast<const T*>(dout);
    const T* x = static_cast<const T*>(inp);
    TY_RETURN_IF_ERROR(
        gate == GluGate::kSilu
            ? launch(GluBackwardOp<T, GluGate::kSilu>{dx, dy, x, f}, "SwigluBackwardKernel")
            : launch(GluBackwardOp<T, GluGate::kGeluTanh>{dx, dy, x, f}, "GegluBackwardKernel"));
  });
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
