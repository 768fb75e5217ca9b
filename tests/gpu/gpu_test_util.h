// Shared by the gpu-labelled tests: skip without a device, RAII device memory, poisoned outputs,
// bf16 rounding on the host, and the error measure every kernel test uses.
#ifndef TRAINYARD_TESTS_GPU_GPU_TEST_UTIL_H_
#define TRAINYARD_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/device_probe.h"
#include "common/dtype.h"
#include "gtest/gtest.h"

namespace trainyard::testing {

// Skips the current test, saying why, when no CUDA device is usable.
#define TY_SKIP_WITHOUT_GPU()                                                          \
  do {                                                                                 \
    const ::trainyard::DeviceInfo ty_info_ = ::trainyard::SystemDeviceProbe().Probe(); \
    if (ty_info_.count == 0) GTEST_SKIP() << "no GPU: " << ty_info_.why_none;          \
  } while (false)

#define TY_CUDA_ASSERT(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Device memory of `bytes`, freed on destruction. Filled with 0xFF bytes (NaN for fp32 and bf16)
// on creation, so that anything a kernel forgets to write fails the comparison.
class DeviceMemory {
 public:
  explicit DeviceMemory(int64_t bytes) : bytes_(bytes) {
    if (bytes > 0 && cudaMalloc(&ptr_, bytes) == cudaSuccess) Poison();
  }
  ~DeviceMemory() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void Poison() {
    if (ptr_ != nullptr) cudaMemset(ptr_, 0xFF, bytes_);
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_;
};

// A host vector copied to the device as it is: token ids or targets, row offsets, pointer arrays.
template <typename T>
class DeviceValues {
 public:
  explicit DeviceValues(const std::vector<T>& host)
      : mem_(static_cast<int64_t>(host.size() * sizeof(T))) {
    cudaMemcpy(mem_.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  const T* get() const { return mem_.as<const T>(); }

 private:
  DeviceMemory mem_;
};
using DeviceInts = DeviceValues<int32_t>;

// Rounds every value to the nearest bf16 (what the device will see when the tensor is bf16).
inline void RoundToBf16(std::vector<float>& v) {
  for (float& x : v) x = __bfloat162float(__float2bfloat16_rn(x));
}

// Uploads host fp32 values as `dtype` (rounding to bf16 when asked).
inline void Upload(const std::vector<float>& host, DType dtype, void* device) {
  if (dtype == DType::kF32) {
    cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
    return;
  }
  std::vector<__nv_bfloat16> tmp(host.size());
  for (size_t i = 0; i < host.size(); ++i) tmp[i] = __float2bfloat16_rn(host[i]);
  cudaMemcpy(device, tmp.data(), tmp.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice);
}

// Downloads `count` values of `dtype` as fp32 (after a device synchronize).
inline std::vector<float> Download(const void* device, int64_t count, DType dtype) {
  cudaDeviceSynchronize();
  std::vector<float> out(count);
  if (dtype == DType::kF32) {
    cudaMemcpy(out.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost);
    return out;
  }
  std::vector<__nv_bfloat16> tmp(count);
  cudaMemcpy(tmp.data(), device, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost);
  for (int64_t i = 0; i < count; ++i) out[i] = __bfloat162float(tmp[i]);
  return out;
}

inline std::vector<float> RandomVector(int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// max |got − want| / max |want| over the tensor; infinity when any value is NaN or infinite, or
// the sizes differ. (A tensor-wide scale: bf16 errors are relative to the tensor's magnitude,
// not to entries that happen to cancel to ~0.)
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double max_diff = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(double{got[i]} - double{want[i]}));
    max_ref = std::max(max_ref, std::fabs(double{want[i]}));
  }
  return max_ref == 0.0 ? max_diff : max_diff / max_ref;
}

// The tolerance the issue sets for each storage type.
inline double Tolerance(DType dtype) { return dtype == DType::kBF16 ? 1e-2 : 1e-5; }

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_GPU_GPU_TEST_UTIL_H_
