// The CUDA softmax cross-entropy against kernels/cpu/cross_entropy, for both logit dtypes and
// vocabularies that are tiny, odd-sized (rows start at every alignment) and Llama-3-sized; and the
// vocabulary-parallel pieces (shard statistics, their merge, the shard gradient); the logits'
// soft cap and the loss through it; the z-loss's gradient.
#include "kernels/cuda/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cross_entropy.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using testing::DeviceInts;
using testing::DeviceMemory;
using testing::Download;
using testing::RelativeError;
using testing::Tolerance;
using testing::Upload;

constexpr int64_t kRows[] = {1, 5, 64};
constexpr int64_t kVocabs[] = {2, 257, 50257, 128256};
constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};
constexpr float kGradScale = 0.37f;

// Logits as the device stores them: random, rounded to bf16 when the dtype is bf16.
std::vector<float> RandomLogits(int64_t count, DType dtype, std::mt19937& rng) {
  return testing::RandomActivation(count, dtype, rng, 2.0f);
}

// Targets in [0, vocab); with `foreign_fraction` > 0 some are −1 (another shard's).
std::vector<int32_t> RandomTargets(int64_t rows, int64_t vocab, double foreign_fraction,
                                   std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(vocab - 1));
  std::bernoulli_distribution foreign(foreign_fraction);
  std::vector<int32_t> targets(rows);
  for (int32_t& t : targets) t = foreign(rng) ? -1 : any(rng);
  return targets;
}

// Column k of a [rows, 3] stats tensor.
std::vector<float> StatsColumn(const std::vector<float>& stats, int k) {
  std::vector<float> column(stats.size() / 3);
  for (size_t r = 0; r < column.size(); ++r) column[r] = stats[3 * r + k];
  return column;
}

#define TY_SHAPE_TRACE(rows, vocab, dtype) \
  SCOPED_TRACE(::testing::Message()        \
               << "rows=" << (rows) << " vocab=" << (vocab) << " " << DTypeName(dtype))

TEST(CudaCrossEntropy, LossAndGradientMatchCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  for (int64_t rows : kRows) {
    for (int64_t vocab : kVocabs) {
      for (DType dtype : kDTypes) {
        TY_SHAPE_TRACE(rows, vocab, dtype);
        const std::vector<float> logits = RandomLogits(rows * vocab, dtype, rng);
        const std::vector<int32_t> targets = RandomTargets(rows, vocab, 0.0, rng);
        // The CPU kernel returns a sum; one call per row gives each row's loss.
        std::vector<float> want_grad = logits, want_loss(rows);
        for (int64_t r = 0; r < rows; ++r) {
          want_loss[r] = static_cast<float>(cpu::SoftmaxCrossEntropy(
              want_grad.data() + r * vocab, &targets[r], 1, vocab, vocab, kGradScale, true));
        }

        DeviceMemory d_logits(rows * vocab * DTypeBytes(dtype)), losses(rows * sizeof(float));
        const DeviceInts d_targets(targets);
        for (bool write_grad : {true, false}) {
          SCOPED_TRACE(write_grad ? "write_grad" : "loss only");
          Upload(logits, dtype, d_logits.get());
          losses.Poison();
          const absl::Status status =
              SoftmaxCrossEntropy(nullptr, dtype, d_logits.get(), d_targets.get(), rows, vocab,
                                  vocab, kGradScale, write_grad, losses.as<float>());
          ASSERT_TRUE(status.ok()) << status;
          TY_CUDA_ASSERT(cudaDeviceSynchronize());
          // Losses are fp32 arithmetic on identical inputs, whatever the logits' dtype.
          EXPECT_LE(RelativeError(Download(losses.get(), rows, DType::kF32), want_loss),
                    Tolerance(DType::kF32));
          const std::vector<float> got = Download(d_logits.get(), rows * vocab, dtype);
          if (write_grad) {
            EXPECT_LE(RelativeError(got, want_grad), Tolerance(dtype));
          } else {
            EXPECT_TRUE(got == logits) << "logits changed without write_grad";
          }
        }
      }
    }
  }
}

// Padded rows (the engine rounds the LM head's width up to a multiple of 128): the columns past
// the vocabulary hold values that would dominate the softmax; they must be neither read nor
// written, and every row's loss and gradient equal the unpadded row's.
TEST(CudaCrossEntropy, PaddedRowsIgnoreTheirPadding) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(24);
  const int64_t rows = 5, vocab = 133, ld = 256;
  for (DType dtype : kDTypes) {
    TY_SHAPE_TRACE(rows, vocab, dtype);
    const std::vector<float> logits = RandomLogits(rows * vocab, dtype, rng);
    const std::vector<int32_t> targets = RandomTargets(rows, vocab, 0.0, rng);
    std::vector<float> padded(rows * ld, 8192.0f);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(logits.begin() + r * vocab, vocab, padded.begin() + r * ld);
    }
    std::vector<float> want_grad = padded;
    const double want = cpu::SoftmaxCrossEntropy(want_grad.data(), targets.data(), rows, vocab, ld,
                                                 kGradScale, true);
    std::vector<float> unpadded_grad = logits;
    EXPECT_DOUBLE_EQ(want, cpu::SoftmaxCrossEntropy(unpadded_grad.data(), targets.data(), rows,
                                                    vocab, vocab, kGradScale, true));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < ld; ++j) {
        ASSERT_EQ(want_grad[r * ld + j], j < vocab ? unpadded_grad[r * vocab + j] : 8192.0f)
            << "CPU row " << r << " column " << j;
      }
    }

    DeviceMemory d_logits(rows * ld * DTypeBytes(dtype)), losses(rows * sizeof(float));
    const DeviceInts d_targets(targets);
    Upload(padded, dtype, d_logits.get());
    ASSERT_TRUE(SoftmaxCrossEntropy(nullptr, dtype, d_logits.get(), d_targets.get(), rows, vocab,
                                    ld, kGradScale, true, losses.as<float>())
                    .ok());
    TY_CUDA_ASSERT(cudaDeviceSynchronize());
    const std::vector<float> got_losses = Download(losses.get(), rows, DType::kF32);
    double got = 0.0;
    for (float l : got_losses) got += l;
    EXPECT_NEAR(got, want, Tolerance(DType::kF32) * std::abs(want));
    const std::vector<float> got_grad = Download(d_logits.get(), rows * ld, dtype);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = vocab; j < ld; ++j) {
        ASSERT_EQ(got_grad[r * ld + j], 8192.0f) << "padding written: row " << r << " column " << j;
      }
    }
    EXPECT_LE(RelativeError(got_grad, want_grad), Tolerance(dtype));
  }
}

TEST(CudaCrossEntropy, ShardStatsAndGradMatchCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(22);
  for (int64_t rows : kRows) {
    for (int64_t vocab : kVocabs) {
      for (DType dtype : kDTypes) {
        TY_SHAPE_TRACE(rows, vocab, dtype);
        const std::vector<float> logits = RandomLogits(rows * vocab, dtype, rng);
        const std::vector<int32_t> targets = RandomTargets(rows, vocab, 0.3, rng);
        std::vector<float> want_stats(rows * 3);
        cpu::CrossEntropyShardStats(logits.data(), targets.data(), rows, vocab, want_stats.data());

        DeviceMemory d_logits(rows * vocab * DTypeBytes(dtype)), stats(rows * 3 * sizeof(float));
        const DeviceInts d_targets(targets);
        Upload(logits, dtype, d_logits.get());
        stats.Poison();
        ASSERT_TRUE(CrossEntropyShardStats(nullptr, dtype, d_logits.get(), d_targets.get(), rows,
                                           vocab, stats.as<float>())
                        .ok());
        TY_CUDA_ASSERT(cudaDeviceSynchronize());
        const std::vector<float> got_stats = Download(stats.get(), rows * 3, DType::kF32);
        // Each statistic on its own scale: the sums would hide an error in the maxima.
        for (int k = 0; k < 3; ++k) {
          EXPECT_LE(RelativeError(StatsColumn(got_stats, k), StatsColumn(want_stats, k)),
                    Tolerance(DType::kF32))
              << "stats column " << k;
        }

        std::vector<float> lse(rows);
        for (int64_t r = 0; r < rows; ++r) {
          lse[r] = want_stats[3 * r] + std::log(want_stats[3 * r + 1]);
        }
        std::vector<float> want_grad = logits;
        cpu::CrossEntropyShardGrad(want_grad.data(), targets.data(), lse.data(), rows, vocab,
                                   kGradScale);
        DeviceMemory d_lse(rows * sizeof(float));
        Upload(lse, DType::kF32, d_lse.get());
        ASSERT_TRUE(CrossEntropyShardGrad(nullptr, dtype, d_logits.get(), d_targets.get(),
                                          d_lse.as<float>(), rows, vocab, kGradScale)
                        .ok());
        TY_CUDA_ASSERT(cudaDeviceSynchronize());
        EXPECT_LE(RelativeError(Download(d_logits.get(), rows * vocab, dtype), want_grad),
                  Tolerance(dtype));
      }
    }
  }
}

// PaLM's z-loss: the whole-row kernel and the shard gradient scale the softmax term by
// 1 + 2·z·lse, with and without the soft cap, as the CPU kernels do; the losses stay the
// cross-entropy's and the rows' log-sum-exps come back.
TEST(CudaCrossEntropy, ZLossMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(27);
  const int64_t rows = 5;
  const float z_loss = 0.05f;
  for (int64_t vocab : {int64_t{257}, int64_t{50257}}) {
    for (DType dtype : kDTypes) {
      for (float cap : {0.0f, 1.5f}) {
        TY_SHAPE_TRACE(rows, vocab, dtype);
        SCOPED_TRACE(::testing::Message() << "cap " << cap);
        const std::vector<float> logits = RandomLogits(rows * vocab, dtype, rng);
        const std::vector<int32_t> targets = RandomTargets(rows, vocab, 0.0, rng);
        std::vector<float> want_grad = logits, want_lse(rows), want_loss(rows);
        for (int64_t r = 0; r < rows; ++r) {
          want_loss[r] = static_cast<float>(
              cpu::SoftmaxCrossEntropy(want_grad.data() + r * vocab, &targets[r], 1, vocab, vocab,
                                       kGradScale, true, cap, z_loss, &want_lse[r]));
        }
        DeviceMemory d_logits(rows * vocab * DTypeBytes(dtype)), losses(rows * sizeof(float)),
            lse(rows * sizeof(float));
        const DeviceInts d_targets(targets);
        Upload(logits, dtype, d_logits.get());
        lse.Poison();
        ASSERT_TRUE(SoftmaxCrossEntropy(nullptr, dtype, d_logits.get(), d_targets.get(), rows,
                                        vocab, vocab, kGradScale, true, losses.as<float>(), cap,
                                        z_loss, lse.as<float>())
                        .ok());
        TY_CUDA_ASSERT(cudaDeviceSynchronize());
        EXPECT_LE(RelativeError(Download(losses.get(), rows, DType::kF32), want_loss),
                  Tolerance(DType::kF32));
        EXPECT_LE(RelativeError(Download(lse.get(), rows, DType::kF32), want_lse),
                  Tolerance(DType::kF32));
        EXPECT_LE(RelativeError(Download(d_logits.get(), rows * vocab, dtype), want_grad),
                  Tolerance(dtype));

        // The shard gradient from the same log-sum-exps: the whole row as one shard.
        std::vector<float> want_shard = logits;
        cpu::CrossEntropyShardGrad(want_shard.data(), targets.data(), want_lse.data(), rows, vocab,
                                   kGradScale, cap, z_loss);
        EXPECT_LE(RelativeError(want_shard, want_grad), Tolerance(DType::kF32));
        Upload(logits, dtype, d_logits.get());
        Upload(want_lse, DType::kF32, lse.get());
        ASSERT_TRUE(CrossEntropyShardGrad(nullptr, dtype, d_logits.get(), d_targets.get(),
                                          lse.as<float>(), rows, vocab, kGradScale, cap, z_loss)
                        .ok());
        TY_CUDA_ASSERT(cudaDeviceSynchronize());
        EXPECT_LE(RelativeError(Download(d_logits.get(), rows * vocab, dtype), want_shard),
                  Tolerance(dtype));
      }
    }
  }
}

// The vocabulary-parallel merge: a row's logits split over `ranks` shards, each shard's stats
// gathered rank by rank with `stride` rows apart (the rows past `rows` NaN, never read), merge to
// the whole row's log-sum-exp and loss, on the CPU (in double) and on the GPU alike.
TEST(CudaCrossEntropy, MergedShardStatsAreTheWholeRowsLoss) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(24);
  const int64_t vocab = 257;
  for (int ranks : {1, 2, 4}) {
    for (int64_t rows : {1, 5, 300}) {
      SCOPED_TRACE(::testing::Message() << "ranks=" << ranks << " rows=" << rows);
      const int64_t stride = rows + 3, shard = (vocab + ranks - 1) / ranks;
      const std::vector<float> logits = RandomLogits(rows * vocab, DType::kF32, rng);
      const std::vector<int32_t> targets = RandomTargets(rows, vocab, 0.0, rng);
      std::vector<float> gathered(3 * stride * ranks, NAN);
      for (int k = 0; k < ranks; ++k) {
        const int64_t begin = k * shard, width = std::min(vocab, begin + shard) - begin;
        std::vector<float> part(rows * width);
        std::vector<int32_t> local(rows);
        for (int64_t r = 0; r < rows; ++r) {
          std::copy_n(&logits[r * vocab + begin], width, &part[r * width]);
          const int32_t t = targets[r] - static_cast<int32_t>(begin);
          local[r] = t >= 0 && t < width ? t : -1;
        }
        cpu::CrossEntropyShardStats(part.data(), local.data(), rows, width,
                                    &gathered[3 * k * stride]);
      }
      std::vector<float> want_lse(rows), want_loss(rows);
      const double total = cpu::CrossEntropyMergeShardStats(gathered.data(), ranks, stride, rows,
                                                            want_lse.data(), want_loss.data());
      double direct = 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, double{logits[r * vocab + j]});
        for (int64_t j = 0; j < vocab; ++j) sum += std::exp(logits[r * vocab + j] - mx);
        const double lse = mx + std::log(sum);
        EXPECT_NEAR(want_lse[r], lse, 1e-5 * std::abs(lse));
        direct += lse - logits[r * vocab + targets[r]];
      }
      EXPECT_NEAR(total, direct, 1e-5 * std::abs(direct));

      DeviceMemory d_gathered(gathered.size() * sizeof(float)), lse(rows * sizeof(float)),
          loss(rows * sizeof(float));
      Upload(gathered, DType::kF32, d_gathered.get());
      lse.Poison();
      loss.Poison();
      ASSERT_TRUE(CrossEntropyMergeShardStats(nullptr, d_gathered.as<float>(), ranks, stride, rows,
                                              lse.as<float>(), loss.as<float>())
                      .ok());
      TY_CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_LE(RelativeError(Download(lse.get(), rows, DType::kF32), want_lse), 1e-6);
      EXPECT_LE(RelativeError(Download(loss.get(), rows, DType::kF32), want_loss), 1e-6);
    }
  }
  DeviceMemory out(4 * sizeof(float));
  EXPECT_EQ(CrossEntropyMergeShardStats(nullptr, out.as<float>(), 1, 1, 2, out.as<float>(),
                                        out.as<float>())
                .code(),
            absl::StatusCode::kInvalidArgument)
      << "stride below rows";
}

// Gemma 2's final logits: capped at 1.5 (logits up to ±6 mostly where tanh bends), the loss over
// the capped logits and the gradient through the cap, whole rows (padded) and vocabulary shards.
TEST(CudaCrossEntropy, SoftCappedLogitsMatchCpu) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(25);
  constexpr float kCap = 1.5f;
  const int64_t rows = 5;
  for (const int64_t vocab : {int64_t{257}, int64_t{50257}}) {
    for (DType dtype : kDTypes) {
      TY_SHAPE_TRACE(rows, vocab, dtype);
      const int64_t ld = vocab + 3;  // a padded row: the cap leaves the padding alone
      std::vector<float> logits = RandomLogits(rows * ld, dtype, rng);
      const std::vector<int32_t> targets = RandomTargets(rows, vocab, 0.0, rng);
      std::vector<float> capped = logits;
      cpu::SoftCap(capped.data(), rows, vocab, ld, kCap);
      DeviceMemory d_logits(rows * ld * DTypeBytes(dtype)), losses(rows * sizeof(float));
      const DeviceInts d_targets(targets);
      Upload(logits, dtype, d_logits.get());
      ASSERT_TRUE(SoftCap(nullptr, dtype, d_logits.get(), rows, vocab, ld, kCap).ok());
      TY_CUDA_ASSERT(cudaDeviceSynchronize());
      const std::vector<float> got_capped = Download(d_logits.get(), rows * ld, dtype);
      EXPECT_LE(RelativeError(got_capped, capped), Tolerance(dtype));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = vocab; j < ld; ++j) ASSERT_EQ(got_capped[r * ld + j], logits[r * ld + j]);
      }
      // The loss over the capped logits the device holds (rounded to `dtype`), in place.
      capped = got_capped;
      std::vector<float> want_grad = capped, want_loss(rows);
      for (int64_t r = 0; r < rows; ++r) {
        want_loss[r] = static_cast<float>(cpu::SoftmaxCrossEntropy(
            want_grad.data() + r * ld, &targets[r], 1, vocab, ld, kGradScale, true, kCap));
      }
      ASSERT_TRUE(SoftmaxCrossEntropy(nullptr, dtype, d_logits.get(), d_targets.get(), rows, vocab,
                                      ld, kGradScale, true, losses.as<float>(), kCap)
                      .ok());
      TY_CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_LE(RelativeError(Download(losses.get(), rows, DType::kF32), want_loss),
                Tolerance(DType::kF32));
      EXPECT_LE(RelativeError(Download(d_logits.get(), rows * ld, dtype), want_grad),
                Tolerance(dtype));

      // A vocabulary shard's gradient through the cap, from the rows' log-sum-exp.
      std::vector<float> shard(rows * vocab), stats(rows * 3), lse(rows);
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(capped.begin() + r * ld, vocab, shard.begin() + r * vocab);
      }
      cpu::CrossEntropyShardStats(shard.data(), targets.data(), rows, vocab, stats.data());
      for (int64_t r = 0; r < rows; ++r) lse[r] = stats[3 * r] + std::log(stats[3 * r + 1]);
      std::vector<float> want_shard = shard;
      cpu::CrossEntropyShardGrad(want_shard.data(), targets.data(), lse.data(), rows, vocab,
                                 kGradScale, kCap);
      DeviceMemory d_shard(rows * vocab * DTypeBytes(dtype)), d_lse(rows * sizeof(float));
      Upload(shard, dtype, d_shard.get());
      Upload(lse, DType::kF32, d_lse.get());
      ASSERT_TRUE(CrossEntropyShardGrad(nullptr, dtype, d_shard.get(), d_targets.get(),
                                        d_lse.as<float>(), rows, vocab, kGradScale, kCap)
                      .ok());
      TY_CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_LE(RelativeError(Download(d_shard.get(), rows * vocab, dtype), want_shard),
                Tolerance(dtype));
    }
  }
}

// Targets live on the device, so the launcher cannot check them; a bad one must show up as a
// NaN loss for its row, not as a memory fault or a plausible number.
TEST(CudaCrossEntropy, OutOfRangeTargetGivesNaNLoss) {
  TY_SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  const int64_t rows = 3, vocab = 37;
  const std::vector<float> logits = RandomLogits(rows * vocab, DType::kF32, rng);
  const std::vector<int32_t> targets = {5, static_cast<int32_t>(vocab), -1};
  DeviceMemory d_logits(rows * vocab * sizeof(float)), losses(rows * sizeof(float));
  const DeviceInts d_targets(targets);
  Upload(logits, DType::kF32, d_logits.get());
  ASSERT_TRUE(SoftmaxCrossEntropy(nullptr, DType::kF32, d_logits.get(), d_targets.get(), rows,
                                  vocab, vocab, 1.0f, true, losses.as<float>())
                  .ok());
  TY_CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got = Download(losses.get(), rows, DType::kF32);
  EXPECT_TRUE(std::isfinite(got[0]));
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_TRUE(std::isnan(got[2]));
}

TEST(CudaCrossEntropy, RejectsBadArguments) {
  TY_SKIP_WITHOUT_GPU();
  DeviceMemory logits(4 * sizeof(float)), targets(2 * sizeof(int32_t)), out(6 * sizeof(float));
  EXPECT_EQ(SoftmaxCrossEntropy(nullptr, DType::kF32, logits.get(), targets.as<int32_t>(), 2, 2, 2,
                                1.0f, true, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SoftmaxCrossEntropy(nullptr, DType::kF32, logits.get(), targets.as<int32_t>(), 0, 2, 2,
                                1.0f, true, out.as<float>())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SoftmaxCrossEntropy(nullptr, DType::kF32, logits.get(), targets.as<int32_t>(), 2, 2, 1,
                                1.0f, true, out.as<float>())
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CrossEntropyShardStats(nullptr, DType::kF32, logits.get(), nullptr, 2, 2, out.as<float>())
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CrossEntropyShardGrad(nullptr, DType::kF32, logits.get(), targets.as<int32_t>(),
                                  out.as<float>(), 2, 0, 1.0f)
                .code(),
            absl::StatusCode::kInvalidArgument);
  for (const float cap : {0.0f, -1.0f, INFINITY}) {
    EXPECT_EQ(SoftCap(nullptr, DType::kF32, logits.get(), 2, 2, 2, cap).code(),
              absl::StatusCode::kInvalidArgument)
        << cap;
  }
  EXPECT_EQ(SoftmaxCrossEntropy(nullptr, DType::kF32, logits.get(), targets.as<int32_t>(), 2, 2, 2,
                                1.0f, true, out.as<float>(), -1.0f)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::kernels::cuda
