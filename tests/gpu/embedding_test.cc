// The CUDA embedding against kernels/cpu/embedding: forward for both output dtypes, with and
// without a position table; backward accumulating into nonzero gradients, deterministic run to
// run. Token ids repeat (the backward's hard case) and some are −1 (another shard's).
#include "kernels/cuda/embedding.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/embedding.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using testing::DeviceInts;
using testing::DeviceMemory;
using testing::Download;
using testing::RandomVector;
using testing::RelativeError;
using testing::Tolerance;
using testing::Upload;

struct Shape {
  int64_t b, t, c, vocab;
};

constexpr Shape kShapes[] = {{1, 1, 8, 5}, {3, 37, 100, 1000}, {4, 128, 768, 50257}};
constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};

// Ids from a pool of about n/4 distinct tokens, so that most repeat; about one in ten is −1, and
// with several rows at least one is −1 and one is the last id of the vocabulary.
std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> pool(std::max<int64_t>(1, std::min(vocab, n / 4)));
  for (int32_t& id : pool) id = any(rng);
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  std::bernoulli_distribution foreign(0.1);
  std::vector<int32_t> tokens(n);
  for (int32_t& id : tokens) id = foreign(rng) ? -1 : pool[pick(rng)];
  if (n > 2) {
    tokens[n / 2] = -1;
    tokens[n - 1] = static_cast<int32_t>(vocab - 1);
  }
  return tokens;
}

TEST(CudaEmbedding, ForwardMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  for (const Shape& s : kShapes) {
    const int64_t n = s.b * s.t;
    const std::vector<int32_t> tokens = RandomTokens(n, s.vocab, rng);
    const std::vector<float> wte = RandomVector(s.vocab * s.c, rng);
    const std::vector<float> wpe = RandomVector(s.t * s.c, rng);
    const DeviceInts d_tokens(tokens);
    DeviceMemory d_wte(wte.size() * sizeof(float)), d_wpe(wpe.size() * sizeof(float));
    Upload(wte, DType::kF32, d_wte.get());
    Upload(wpe, DType::kF32, d_wpe.get());
    // Scale 1, and Gemma's √width (of 72.25 here).
    for (const auto& [with_wpe, scale] :
         {std::pair{true, 1.0f}, std::pair{false, 1.0f}, std::pair{false, 8.5f}}) {
      std::vector<float> want(n * s.c);
      cpu::EmbeddingForward(want.data(), tokens.data(), wte.data(), with_wpe ? wpe.data() : nullptr,
                            s.b, s.t, s.c, scale);
      for (DType dtype : kDTypes) {
        SCOPED_TRACE(::testing::Message()
                     << "b=" << s.b << " t=" << s.t << " c=" << s.c << " vocab=" << s.vocab
                     << " wpe=" << with_wpe << " scale=" << scale << " " << DTypeName(dtype));
        DeviceMemory out(n * s.c * DTypeBytes(dtype));
        out.Poison();
        ASSERT_TRUE(EmbeddingForward(nullptr, dtype, out.get(), d_tokens.get(), d_wte.as<float>(),
                                     with_wpe ? d_wpe.as<float>() : nullptr, s.b, s.t, s.c, scale)
                        .ok());
        TY_CUDA_ASSERT(cudaDeviceSynchronize());
        EXPECT_LE(RelativeError(Download(out.get(), n * s.c, dtype), want), Tolerance(dtype));
      }
    }
  }
}

// Runs the GPU backward from the initial gradients; returns (dwte, dwpe).
struct Grads {
  std::vector<float> dwte, dwpe;
};

Grads RunBackward(DType dtype, const Shape& s, const std::vector<float>& dwte0,
                  const std::vector<float>& dwpe0, const DeviceMemory& dout,
                  const DeviceInts& tokens, DeviceMemory& scratch, float scale) {
  DeviceMemory dwte(dwte0.size() * sizeof(float)), dwpe(dwpe0.size() * sizeof(float));
  Upload(dwte0, DType::kF32, dwte.get());
  Upload(dwpe0, DType::kF32, dwpe.get());
  scratch.Poison();
  const absl::Status status = EmbeddingBackward(
      nullptr, dtype, dwte.as<float>(), dwpe.as<float>(), dout.get(), tokens.get(), s.b, s.t, s.c,
      s.vocab, scale, scratch.get(), static_cast<size_t>(scratch.bytes()));
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {Download(dwte.get(), dwte0.size(), DType::kF32),
          Download(dwpe.get(), dwpe0.size(), DType::kF32)};
}

bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CudaEmbedding, BackwardMatchesCpuAndIsDeterministic) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  for (const Shape& s : kShapes) {
    const int64_t n = s.b * s.t;
    const std::vector<int32_t> tokens = RandomTokens(n, s.vocab, rng);
    const DeviceInts d_tokens(tokens);
    // Accumulated outputs start from the same nonzero values on both sides.
    const std::vector<float> dwte0 = RandomVector(s.vocab * s.c, rng);
    const std::vector<float> dwpe0 = RandomVector(s.t * s.c, rng);
    const size_t scratch_bytes = EmbeddingBackwardScratchBytes(n, s.vocab);
    ASSERT_GT(scratch_bytes, 0u);
    DeviceMemory scratch(static_cast<int64_t>(scratch_bytes));
    for (const auto& [dtype, scale] : {std::pair{DType::kF32, 1.0f}, std::pair{DType::kBF16, 1.0f},
                                       std::pair{DType::kF32, 8.5f}}) {
      SCOPED_TRACE(::testing::Message()
                   << "b=" << s.b << " t=" << s.t << " c=" << s.c << " vocab=" << s.vocab << " "
                   << DTypeName(dtype) << " scale=" << scale);
      std::vector<float> dout = RandomVector(n * s.c, rng);
      if (dtype == DType::kBF16) testing::RoundToBf16(dout);
      DeviceMemory d_dout(n * s.c * DTypeBytes(dtype));
      Upload(dout, dtype, d_dout.get());

      Grads want{dwte0, dwpe0};
      cpu::EmbeddingBackward(want.dwte.data(), want.dwpe.data(), dout.data(), tokens.data(), s.b,
                             s.t, s.c, scale);
      const Grads first = RunBackward(dtype, s, dwte0, dwpe0, d_dout, d_tokens, scratch, scale);
      EXPECT_LE(RelativeError(first.dwte, want.dwte), Tolerance(dtype));
      EXPECT_LE(RelativeError(first.dwpe, want.dwpe), Tolerance(dtype));
      // Both sides add the same fp32 values in the same (row) order (scaled ones may round apart
      // where one side fuses the multiply into the add).
      if (scale == 1.0f) {
        EXPECT_TRUE(BitIdentical(first.dwte, want.dwte));
        EXPECT_TRUE(BitIdentical(first.dwpe, want.dwpe));
      }

      const Grads second = RunBackward(dtype, s, dwte0, dwpe0, d_dout, d_tokens, scratch, scale);
      EXPECT_TRUE(BitIdentical(first.dwte, second.dwte)) << "dwte differs between runs";
      EXPECT_TRUE(BitIdentical(first.dwpe, second.dwpe)) << "dwpe differs between runs";
    }
  }
}

TEST(CudaEmbedding, BackwardWithoutPositionTable) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  const Shape s{2, 9, 33, 17};
  const int64_t n = s.b * s.t;
  const std::vector<int32_t> tokens = RandomTokens(n, s.vocab, rng);
  const std::vector<float> dwte0 = RandomVector(s.vocab * s.c, rng);
  const std::vector<float> dout = RandomVector(n * s.c, rng);
  std::vector<float> want = dwte0;
  cpu::EmbeddingBackward(want.data(), nullptr, dout.data(), tokens.data(), s.b, s.t, s.c, 1.0f);

  const DeviceInts d_tokens(tokens);
  DeviceMemory d_dout(dout.size() * sizeof(float)), dwte(dwte0.size() * sizeof(float));
  Upload(dout, DType::kF32, d_dout.get());
  Upload(dwte0, DType::kF32, dwte.get());
  const size_t bytes = EmbeddingBackwardScratchBytes(n, s.vocab);
  DeviceMemory scratch(static_cast<int64_t>(bytes));
  ASSERT_TRUE(EmbeddingBackward(nullptr, DType::kF32, dwte.as<float>(), nullptr, d_dout.get(),
                                d_tokens.get(), s.b, s.t, s.c, s.vocab, 1.0f, scratch.get(), bytes)
                  .ok());
  TY_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_LE(RelativeError(Download(dwte.get(), dwte0.size(), DType::kF32), want),
            Tolerance(DType::kF32));
}

// Token ids live on the device, so the launcher cannot check them: an id ≥ vocab gets no
// gradient (like −1) instead of a write outside dwte.
TEST(CudaEmbedding, BackwardIgnoresOutOfRangeTokens) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  const Shape s{1, 4, 16, 6};
  const std::vector<int32_t> tokens = {2, 6, 2, 1000};
  const std::vector<int32_t> valid_tokens = {2, -1, 2, -1};
  const std::vector<float> dwte0 = RandomVector(s.vocab * s.c, rng);
  const std::vector<float> dout = RandomVector(s.t * s.c, rng);
  std::vector<float> want = dwte0;
  cpu::EmbeddingBackward(want.data(), nullptr, dout.data(), valid_tokens.data(), s.b, s.t, s.c,
                         1.0f);

  const DeviceInts d_tokens(tokens);
  DeviceMemory d_dout(dout.size() * sizeof(float)), dwte(dwte0.size() * sizeof(float));
  Upload(dout, DType::kF32, d_dout.get());
  Upload(dwte0, DType::kF32, dwte.get());
  const size_t bytes = EmbeddingBackwardScratchBytes(s.t, s.vocab);
  DeviceMemory scratch(static_cast<int64_t>(bytes));
  ASSERT_TRUE(EmbeddingBackward(nullptr, DType::kF32, dwte.as<float>(), nullptr, d_dout.get(),
                                d_tokens.get(), s.b, s.t, s.c, s.vocab, 1.0f, scratch.get(), bytes)
                  .ok());
  TY_CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(BitIdentical(Download(dwte.get(), dwte0.size(), DType::kF32), want));
}

TEST(CudaEmbedding, RejectsBadArguments) {
  TY_SKIP_WITHOUT_GPU();
  const int64_t b = 2, t = 3, c = 4, vocab = 10;
  DeviceMemory tokens(b * t * sizeof(int32_t)), table(vocab * c * sizeof(float));
  DeviceMemory out(b * t * c * sizeof(float));
  const size_t bytes = EmbeddingBackwardScratchBytes(b * t, vocab);
  ASSERT_GT(bytes, 0u);
  DeviceMemory scratch(static_cast<int64_t>(bytes));
  EXPECT_EQ(EmbeddingBackward(nullptr, DType::kF32, table.as<float>(), nullptr, out.get(),
                              tokens.as<int32_t>(), b, t, c, vocab, 1.0f, scratch.get(), bytes - 1)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingBackward(nullptr, DType::kF32, table.as<float>(), nullptr, out.get(),
                              tokens.as<int32_t>(), b, t, c, vocab, 1.0f, nullptr, bytes)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingForward(nullptr, DType::kF32, out.get(), nullptr, table.as<float>(), nullptr,
                             b, t, c, 1.0f)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingForward(nullptr, DType::kF32, out.get(), tokens.as<int32_t>(),
                             table.as<float>(), nullptr, b, 0, c, 1.0f)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::kernels::cuda
