// What every rank reports about itself: memory by kind against the ZeRO memory equation, bytes
// sent against the ring's communication model, gradient buckets finishing during the backward
// pass, and a collective that times out instead of hanging when a peer stops taking part.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "tests/integration/rank_threads.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker {
namespace {

using parallel::CollectiveKind;

config::JobSpec Job(int zero, int layers = 2) {
  config::JobSpec spec;
  spec.name = "accounting";
  spec.model = *config::Preset("gpt2-debug");
  spec.model.layers = layers;
  spec.model.vocab = 64;
  spec.model.max_seq = 16;
  spec.data.markov.vocab = 64;
  spec.data.markov.train_tokens = 1 << 14;
  spec.data.markov.val_tokens = 1 << 10;
  spec.training.steps = 3;
  spec.training.batch = 8;
  spec.training.micro_batch = 2;  // two micro-batches per rank per step
  spec.training.seq_len = 16;
  spec.training.eval_every = 0;
  spec.parallelism.dp = 2;
  spec.parallelism.zero = zero;
  spec.resources.devices_per_node = 2;
  return spec;
}

double Within(double measured, double predicted) {
  return std::abs(measured - predicted) / predicted;
}

class ZeroStage : public ::testing::TestWithParam<int> {};

// Per-rank persistent bytes against the memory equation (fp32 parameters 4Ψ, gradients 4Ψ, AdamW
// moments 8Ψ; each divided by the dp degree once its stage shards it).
TEST_P(ZeroStage, MemoryMatchesTheEquation) {
  const int zero = GetParam();
  const config::JobSpec spec = Job(zero);
  testenv::RankRun run = testenv::RunRanks(spec);
  ASSERT_TRUE(run.results[0].ok()) << run.results[0].status();
  const double psi = ParameterLayout(spec.model).total(), n = spec.parallelism.dp;
  const auto& m = run.results[0]->memory;
  const double params = 4 * psi / (zero >= 3 ? n : 1);
  const double grads = 4 * psi / (zero >= 2 ? n : 1);
  const double optimizer = 8 * psi / (zero >= 1 ? n : 1);
  std::printf(
      "ZeRO-%d per rank: params %lld (equation %.0f), grads %lld (%.0f), optimizer %lld "
      "(%.0f), transient peak %lld, activations %lld bytes\n",
      zero, static_cast<long long>(m.params), params, static_cast<long long>(m.grads), grads,
      static_cast<long long>(m.optimizer), optimizer, static_cast<long long>(m.peak_transient),
      static_cast<long long>(m.activations));
  EXPECT_LE(Within(m.params, params), 0.10);
  EXPECT_LE(Within(m.grads, grads), 0.10);
  EXPECT_LE(Within(m.optimizer, optimizer), 0.10);
  EXPECT_GT(m.activations, 0);
}

// Bytes each rank sent, against the ring model: an all-reduce sends 2(n−1)/n of the buffer per
// rank, a reduce-scatter or an all-gather (n−1)/n. Stage 0/1 all-reduce once per step; stage 2/3
// reduce-scatter every micro-batch; stages 1/2 all-gather the parameters after each update;
// stage 3 gathers every group before its forward and each block again before its backward.
TEST_P(ZeroStage, BytesSentMatchTheRingModel) {
  const int zero = GetParam();
  const config::JobSpec spec = Job(zero);
  testenv::RankRun run = testenv::RunRanks(spec);
  ASSERT_TRUE(run.results[0].ok()) << run.results[0].status();
  const ParameterLayout layout(spec.model);
  const double n = spec.parallelism.dp, steps = spec.training.steps;
  const double micro = spec.training.batch / n / spec.training.micro_batch;
  const double bytes = 4.0 * layout.total();
  double blocks = 0;
  for (int l = 0; l < spec.model.layers; ++l) {
    blocks += layout.groups()[layout.block_group(l)].size();
  }
  // The tied LM head (in the embedding group) is gathered once more for the loss.
  const double head = layout.groups()[layout.head_group()].size();
  const double ring = (n - 1) / n;
  const auto& sent = run.results[0]->bytes_sent;
  auto got = [&](CollectiveKind k) { return static_cast<double>(sent[static_cast<int>(k)]); };
  if (zero <= 1) {
    const double predicted = steps * 2 * ring * bytes;
    std::printf("ZeRO-%d all-reduce: %.0f bytes sent, model %.0f\n", zero,
                got(CollectiveKind::kAllReduce), predicted);
    EXPECT_LE(Within(got(CollectiveKind::kAllReduce), predicted), 0.10);
  } else {
    const double predicted = steps * micro * ring * bytes;
    std::printf("ZeRO-%d reduce-scatter: %.0f bytes sent, model %.0f\n", zero,
                got(CollectiveKind::kReduceScatter), predicted);
    EXPECT_LE(Within(got(CollectiveKind::kReduceScatter), predicted), 0.10);
  }
  if (zero == 1 || zero == 2) {
    const double predicted = steps * ring * bytes;
    std::printf("ZeRO-%d all-gather: %.0f bytes sent, model %.0f\n", zero,
                got(CollectiveKind::kAllGather), predicted);
    EXPECT_LE(Within(got(CollectiveKind::kAllGather), predicted), 0.10);
  }
  if (zero == 3) {
    const double predicted = steps * micro * (bytes + 4 * blocks + 4 * head) * ring;
    std::printf("ZeRO-3 all-gather: %.0f bytes sent, model %.0f\n", got(CollectiveKind::kAllGather),
                predicted);
    EXPECT_LE(Within(got(CollectiveKind::kAllGather), predicted), 0.10);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroStage, ::testing::Values(0, 1, 2, 3));

// With buckets smaller than a block, the first buckets (the last layers' gradients) are
// all-reduced while the backward pass is still running through the earlier layers.
TEST(Overlap, FirstBucketsFinishBeforeTheBackwardPassEnds) {
  config::JobSpec spec = Job(/*zero=*/0, /*layers=*/8);
  spec.model.width = 256;
  spec.model.heads = 8;
  spec.model.kv_heads = 8;
  spec.model.ffn_hidden = 1024;
  spec.model.max_seq = 64;
  spec.training.seq_len = 64;
  spec.training.micro_batch = 4;  // 256 tokens per micro-batch: a block's backward takes ms
  spec.training.steps = 2;
  testenv::RankRun run = testenv::RunRanks(spec, {.bucket_bytes = 1 << 20});
  ASSERT_TRUE(run.results[0].ok()) << run.results[0].status();
  const parallel::OverlapTimeline& t = run.results[0]->overlap;
  ASSERT_GE(t.bucket_done_ns.size(), 3u);
  int before = 0;
  for (int64_t done : t.bucket_done_ns) before += done < t.backward_end_ns;
  std::printf("%zu buckets; %d finished before the backward pass ended (first %.3f ms before)\n",
              t.bucket_done_ns.size(), before, (t.backward_end_ns - t.bucket_done_ns[0]) / 1e6);
  EXPECT_LT(t.bucket_done_ns[0], t.backward_end_ns);
}

// A report: the pipeline's measured idle time per stage next to the 1F1B bubble model
// (p−1)/(m+p−1). That the schedule itself idles exactly the bubble is tested on a simulated clock
// (tests/unit/worker/pipeline_schedule_test.cc); measured here it also holds transfer time and
// the noise of ranks that are threads sharing this machine's cores, so only the runs are checked.
TEST(PipelineBubble, MeasuredIdleFractionReport) {
  auto run = [](int micro_batches) {
    config::JobSpec spec = Job(/*zero=*/0, /*layers=*/4);
    spec.model.width = 128;
    spec.model.ffn_hidden = 512;
    spec.model.max_seq = 32;
    spec.training.seq_len = 32;
    spec.training.steps = 5;
    spec.training.micro_batch = 2;
    spec.training.batch = 2 * micro_batches;
    spec.parallelism.dp = 1;
    spec.parallelism.pp = 2;
    testenv::RankRun r = testenv::RunRanks(spec);
    std::vector<double> idle;
    for (auto& result : r.results) {
      EXPECT_TRUE(result.ok()) << result.status();
      idle.push_back(result.ok() ? result->pipeline_wait_fraction : 1.0);
    }
    return idle;
  };
  const int p = 2;
  for (int m : {2, 4, 8}) {
    const std::vector<double> idle = run(m);
    const double model = static_cast<double>(p - 1) / (m + p - 1);
    std::printf("pp %d, %d micro-batches: idle fraction stage 0 %.3f, stage 1 %.3f; model %.3f\n",
                p, m, idle[0], idle[1], model);
  }
}

// Rank 1 stops taking part after its first step (for four times the collective timeout); rank 0
// must fail with a timeout error within the configured bound rather than wait for it.
TEST(NoSilentHang, AStalledPeerTimesOut) {
  const config::JobSpec spec = Job(/*zero=*/0);
  const auto timeout = std::chrono::milliseconds(1500);
  const auto stall = 4 * timeout;
  std::chrono::steady_clock::time_point stalled_at;
  testenv::RankRunOptions opts;
  opts.timeout = timeout;
  opts.customize = [&](int rank, TrainOptions& options) {
    if (rank != 1) return;
    options.on_step = [&](const StepReport& report) -> absl::Status {
      if (report.step != 1) return absl::OkStatus();
      stalled_at = std::chrono::steady_clock::now();
      std::this_thread::sleep_for(stall);
      return absl::CancelledError("the stalled rank gives up");
    };
  };
  testenv::RankRun run = testenv::RunRanks(spec, opts);
  ASSERT_FALSE(run.results[0].ok());
  EXPECT_EQ(run.results[0].status().code(), absl::StatusCode::kDeadlineExceeded)
      << run.results[0].status();
  const auto waited = run.finished[0] - stalled_at;
  std::printf("rank 0 failed %.2f s after its peer stalled (timeout %.1f s): %s\n",
              std::chrono::duration<double>(waited).count(), timeout.count() / 1e3,
              std::string(run.results[0].status().message()).c_str());
  EXPECT_LT(waited, timeout + std::chrono::seconds(2));
}

// Every step reports where its time went: forward and backward passes, the optimizer (with the
// gradient reduction) and drawing the batch, each measured and together within the step.
TEST(StepPhases, EveryStepReportsItsForwardBackwardOptimizerAndDataTime) {
  const config::JobSpec spec = Job(/*zero=*/0);
  std::mutex mu;
  std::vector<StepReport> reports;
  testenv::RankRunOptions opts;
  opts.customize = [&](int rank, TrainOptions& options) {
    if (rank != 0) return;
    options.on_step = [&](const StepReport& report) -> absl::Status {
      std::lock_guard<std::mutex> lock(mu);
      reports.push_back(report);
      return absl::OkStatus();
    };
  };
  testenv::RankRun run = testenv::RunRanks(spec, opts);
  for (const auto& result : run.results) ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_FALSE(reports.empty());
  for (const StepReport& r : reports) {
    EXPECT_GT(r.forward_seconds, 0) << "step " << r.step;
    EXPECT_GT(r.backward_seconds, 0) << "step " << r.step;
    EXPECT_GT(r.optimizer_seconds, 0) << "step " << r.step;
    EXPECT_GT(r.data_seconds, 0) << "step " << r.step;
    EXPECT_LE(r.forward_seconds + r.backward_seconds + r.optimizer_seconds + r.data_seconds,
              r.step_seconds * 1.0001)
        << "step " << r.step;
  }
  const StepReport& last = reports.back();
  std::printf(
      "step %lld: %.2f ms = forward %.2f + backward %.2f + optimizer %.2f + data %.3f ms "
      "(+ the rest)\n",
      static_cast<long long>(last.step), 1e3 * last.step_seconds, 1e3 * last.forward_seconds,
      1e3 * last.backward_seconds, 1e3 * last.optimizer_seconds, 1e3 * last.data_seconds);
}

}  // namespace
}  // namespace trainyard::worker
