// A host vector's copy on the device, for kernel tests that move many tensors back and forth.
#ifndef TRAINYARD_TESTS_GPU_DEVICE_TENSOR_H_
#define TRAINYARD_TESTS_GPU_DEVICE_TENSOR_H_

#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::testing {

// `count` values stored as `dtype` in device memory that starts poisoned (NaN), or holding a
// host vector's values (rounded to bf16 when dtype is bf16).
class DeviceTensor {
 public:
  DeviceTensor(int64_t count, DType dtype)
      : mem_(count * DTypeBytes(dtype)), count_(count), dtype_(dtype) {}
  DeviceTensor(const std::vector<float>& host, DType dtype)
      : DeviceTensor(static_cast<int64_t>(host.size()), dtype) {
    Write(host);
  }

  // Empty tensors make no CUDA call: a failed zero-byte copy would leave an error behind for the
  // next launch check to report.
  void Write(const std::vector<float>& host) {
    if (count_ > 0) Upload(host, dtype_, mem_.get());
  }
  std::vector<float> Read() const {
    return count_ > 0 ? Download(mem_.get(), count_, dtype_) : std::vector<float>();
  }
  void Poison() { mem_.Poison(); }

  void* get() const { return mem_.get(); }
  // The fp32 view; only for tensors created with DType::kF32.
  float* f32() const { return mem_.as<float>(); }
  int64_t count() const { return count_; }

 private:
  DeviceMemory mem_;
  int64_t count_;
  DType dtype_;
};

// Random normal values of standard deviation `scale` around `offset`, rounded to bf16 when the
// device stores them as bf16 (so that the CPU reference sees exactly what the device sees).
inline std::vector<float> RandomActivation(int64_t n, DType dtype, std::mt19937& rng,
                                           float scale = 1.0f, float offset = 0.0f) {
  std::vector<float> v = RandomVector(n, rng, scale);
  for (float& x : v) x += offset;
  if (dtype == DType::kBF16) RoundToBf16(v);
  return v;
}

}  // namespace trainyard::testing

#endif  // TRAINYARD_TESTS_GPU_DEVICE_TENSOR_H_
