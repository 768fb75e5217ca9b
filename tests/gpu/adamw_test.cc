// The CUDA multi-tensor AdamW against kernels/cpu/adamw: one, three and a hundred tensors (more
// than one launch holds), sizes from 1 to 1,000,003, decayed and undecayed tensors, with and
// without a clipping factor, at the first step and a later one; every other tensor with its bf16
// copy written in the same pass.
#include "kernels/cuda/adamw.h"

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/adamw.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using testing::DeviceMemory;
using testing::Download;
using testing::RandomVector;
using testing::RelativeError;
using testing::RoundToBf16;
using testing::Tolerance;
using testing::Upload;

constexpr float kLr = 1e-3f, kBeta1 = 0.9f, kBeta2 = 0.95f, kEps = 1e-8f;

// One tensor's state on the host and on the device.
struct Tensor {
  int64_t n;
  float weight_decay;
  std::vector<float> param, grad, m, v;
  std::unique_ptr<DeviceMemory> d_param, d_grad, d_m, d_v;
  std::unique_ptr<DeviceMemory> d_copy;  // every other tensor's bf16 copy
};

std::unique_ptr<DeviceMemory> ToDevice(const std::vector<float>& host) {
  auto mem = std::make_unique<DeviceMemory>(static_cast<int64_t>(host.size() * sizeof(float)));
  Upload(host, DType::kF32, mem->get());
  return mem;
}

Tensor MakeTensor(int64_t n, float weight_decay, std::mt19937& rng) {
  Tensor t{n, weight_decay};
  t.param = RandomVector(n, rng);
  t.grad = RandomVector(n, rng);
  t.m = RandomVector(n, rng, 0.1f);
  t.v = RandomVector(n, rng, 0.1f);
  for (float& x : t.v) x = x * x;  // a second moment is never negative
  t.d_param = ToDevice(t.param);
  t.d_grad = ToDevice(t.grad);
  t.d_m = ToDevice(t.m);
  t.d_v = ToDevice(t.v);
  return t;
}

std::vector<int64_t> Sizes(int count) {
  if (count == 1) return {1000003};
  if (count == 3) return {1, 4097, 1000003};
  constexpr int64_t kCycle[] = {1, 2, 31, 1000, 4096, 4097, 65537};
  std::vector<int64_t> sizes;
  for (int i = 0; i < count; ++i) sizes.push_back(i == 50 ? 1000003 : kCycle[i % 7]);
  return sizes;
}

void CheckUpdate(int count, float grad_scale, int64_t step) {
  SCOPED_TRACE(::testing::Message()
               << count << " tensors, grad_scale " << grad_scale << ", step " << step);
  std::mt19937 rng(31 + count + step);
  std::vector<Tensor> tensors;
  std::vector<AdamWTensor> args;
  for (int64_t n : Sizes(count)) {
    const float weight_decay = tensors.size() % 2 == 0 ? 0.1f : 0.0f;
    tensors.push_back(MakeTensor(n, weight_decay, rng));
    Tensor& t = tensors.back();
    if (tensors.size() % 2 == 1) t.d_copy = std::make_unique<DeviceMemory>(n * 2);
    args.push_back({t.d_param->as<float>(), t.d_grad->as<float>(), t.d_m->as<float>(),
                    t.d_v->as<float>(), n, weight_decay,
                    t.d_copy != nullptr ? t.d_copy->get() : nullptr});
  }
  const absl::Status status =
      MultiTensorAdamW(nullptr, args, AdamWHyper{kLr, kBeta1, kBeta2, kEps, step, grad_scale});
  ASSERT_TRUE(status.ok()) << status;
  TY_CUDA_ASSERT(cudaDeviceSynchronize());

  const double tolerance = Tolerance(DType::kF32);
  for (size_t i = 0; i < tensors.size(); ++i) {
    Tensor& t = tensors[i];
    SCOPED_TRACE(::testing::Message() << "tensor " << i << " of " << t.n);
    // The CPU kernel takes the gradient as is: scale it the way the device does (one fp32
    // multiply).
    std::vector<float> g = t.grad;
    for (float& x : g) x *= grad_scale;
    cpu::AdamWUpdate(t.param.data(), g.data(), t.m.data(), t.v.data(), t.n,
                     cpu::AdamWStep{kLr, kBeta1, kBeta2, kEps, t.weight_decay, step});
    std::vector<float> updated = Download(t.d_param->get(), t.n, DType::kF32);
    EXPECT_LE(RelativeError(updated, t.param), tolerance);
    if (t.d_copy != nullptr) {  // the device's own update, rounded to nearest even
      RoundToBf16(updated);
      EXPECT_TRUE(Download(t.d_copy->get(), t.n, DType::kBF16) == updated) << "bf16 copy";
    }
    EXPECT_LE(RelativeError(Download(t.d_m->get(), t.n, DType::kF32), t.m), tolerance);
    EXPECT_LE(RelativeError(Download(t.d_v->get(), t.n, DType::kF32), t.v), tolerance);
    // The gradient is read, never written.
    EXPECT_TRUE(Download(t.d_grad->get(), t.n, DType::kF32) == t.grad);
  }
}

TEST(CudaAdamW, MatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  for (int count : {1, 3, 100}) {
    for (float grad_scale : {0.37f, 1.0f}) {
      for (int64_t step : {1, 10}) CheckUpdate(count, grad_scale, step);
    }
  }
}

TEST(CudaAdamW, EmptyListAndEmptyTensorsAreNoOps) {
  TY_SKIP_WITHOUT_GPU();
  const AdamWHyper hyper{kLr, kBeta1, kBeta2, kEps, 1, 1.0f};
  EXPECT_TRUE(MultiTensorAdamW(nullptr, {}, hyper).ok());
  EXPECT_TRUE(
      MultiTensorAdamW(nullptr, {{nullptr, nullptr, nullptr, nullptr, 0, 0.0f}}, hyper).ok());
  TY_CUDA_ASSERT(cudaDeviceSynchronize());
}

TEST(CudaAdamW, RejectsBadArguments) {
  TY_SKIP_WITHOUT_GPU();
  DeviceMemory buf(4 * sizeof(float));
  float* p = buf.as<float>();
  const AdamWTensor good{p, p + 1, p + 2, p + 3, 1, 0.0f};
  const AdamWTensor no_grad{p, nullptr, p + 2, p + 3, 1, 0.0f};
  const AdamWHyper hyper{kLr, kBeta1, kBeta2, kEps, 1, 1.0f};
  EXPECT_EQ(MultiTensorAdamW(nullptr, {good, no_grad}, hyper).code(),
            absl::StatusCode::kInvalidArgument);
  AdamWHyper step0 = hyper;
  step0.step = 0;
  EXPECT_EQ(MultiTensorAdamW(nullptr, {good}, step0).code(), absl::StatusCode::kInvalidArgument);
  AdamWHyper beta1 = hyper;
  beta1.beta1 = 1.0f;
  EXPECT_EQ(MultiTensorAdamW(nullptr, {good}, beta1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::kernels::cuda
