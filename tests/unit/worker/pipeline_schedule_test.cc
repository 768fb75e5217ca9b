// The schedules (worker/shape/schedule.h) run by the executor (worker/parallel/pipeline.h) on a
// simulated clock: p stages as threads, every pass one time unit, transfers instant. Each stage
// runs exactly its pass order, and its idle time over the step is exactly its schedule's bubble:
// (p − 1)/(m + p − 1) of it under 1F1B, (p − 1)/(3m + p − 1) under ZB-H1.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "worker/backend.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/pipeline.h"

namespace trainyard::worker {
namespace {

// Messages between the stages, stamped with the simulated time they were sent.
class Wire {
 public:
  void Post(int from, int to, uint32_t tag, int64_t time) {
    std::lock_guard<std::mutex> lock(mu_);
    sent_[{from, to, tag}] = time;
    cv_.notify_all();
  }
  int64_t Take(int from, int to, uint32_t tag) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return sent_.count({from, to, tag}) > 0; });
    const int64_t time = sent_[{from, to, tag}];
    sent_.erase({from, to, tag});
    return time;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, uint32_t>, int64_t> sent_;
};

// One stage's end of the pipeline group: a send is instant and never blocks; a receive waits
// for its message and moves this stage's clock to when it was sent, if that is later. With
// `starts`, transfers are started and waited for apart (the executor's path for such engines).
class SimulatedStage final : public parallel::Communicator {
 public:
  SimulatedStage(Wire* wire, int rank, int size, bool starts)
      : wire_(wire), rank_(rank), size_(size), starts_(starts) {}

  bool StartsTransfers() const override { return starts_; }
  absl::StatusOr<std::unique_ptr<parallel::PendingTransfer>> StartSend(const void*, int64_t, DType,
                                                                       int peer,
                                                                       uint32_t tag) override {
    wire_->Post(rank_, peer, tag, now_);
    return std::make_unique<Done>(nullptr);
  }
  absl::StatusOr<std::unique_ptr<parallel::PendingTransfer>> StartRecv(void*, int64_t, DType,
                                                                       int peer,
                                                                       uint32_t tag) override {
    return std::make_unique<Done>(
        [this, peer, tag] { now_ = std::max(now_, wire_->Take(peer, rank_, tag)); });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int64_t now() const { return now_; }
  void Work(int64_t units) { now_ += units; }

  absl::Status Send(const float*, int64_t, int peer, uint32_t tag) override {
    wire_->Post(rank_, peer, tag, now_);
    return absl::OkStatus();
  }
  absl::Status Recv(float*, int64_t, int peer, uint32_t tag) override {
    now_ = std::max(now_, wire_->Take(peer, rank_, tag));
    return absl::OkStatus();
  }
  absl::Status SendRecv(const float* send, int64_t send_count, int send_peer, uint32_t send_tag,
                        float* recv, int64_t recv_count, int recv_peer,
                        uint32_t recv_tag) override {
    TY_RETURN_IF_ERROR(Send(send, send_count, send_peer, send_tag));
    return Recv(recv, recv_count, recv_peer, recv_tag);
  }
  absl::Status AllReduce(float*, int64_t) override { return Unused(); }
  absl::Status ReduceScatter(const float*, float*, int64_t) override { return Unused(); }
  absl::Status AllGather(const float*, float*, int64_t) override { return Unused(); }
  absl::Status Broadcast(float*, int64_t, int) override { return Unused(); }
  absl::Status Barrier() override { return Unused(); }
  void Abort() override {}

  using Communicator::AllGather;
  using Communicator::AllReduce;
  using Communicator::Recv;
  using Communicator::ReduceScatter;
  using Communicator::Send;
  using Communicator::SendRecv;

 private:
  // A started transfer: a receive takes its message (and the clock) when waited for.
  class Done final : public parallel::PendingTransfer {
   public:
    explicit Done(std::function<void()> on_wait) : on_wait_(std::move(on_wait)) {}
    absl::Status Wait() override {
      if (on_wait_) on_wait_();
      return absl::OkStatus();
    }

   private:
    std::function<void()> on_wait_;
  };

  static absl::Status Unused() { return absl::UnimplementedError("not part of the schedule"); }

  Wire* wire_;
  const int rank_, size_;
  const bool starts_;
  int64_t now_ = 0;
};

// The idle fraction of every stage of a pipeline running `shape`, every pass one unit (the last
// stage's forward two, its backward none: it runs the micro-batch's backward in its forward pass).
// Each stage must run exactly the passes of its PassOrder, in that order.
std::vector<double> IdleFractions(const ScheduleShape& shape, bool starts) {
  const int p = shape.stages, m = shape.micro_batches;
  Wire wire;
  std::vector<std::unique_ptr<SimulatedStage>> stages;
  for (int s = 0; s < p; ++s)
    stages.push_back(std::make_unique<SimulatedStage>(&wire, s, p, starts));
  std::vector<int64_t> busy(p, 0);
  std::vector<std::vector<Pass>> ran(p);
  std::vector<absl::Status> results(p);
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s) {
    threads.emplace_back([&, s] {
      SimulatedStage& stage = *stages[s];
      const bool last = s == p - 1;
      auto backend = MakeCpuBackend(1);
      StageWork work;
      work.run = [&](const Pass& pass, int, const Act*, Act*) {
        ran[s].push_back(pass);
        const int units = pass.kind == PassKind::kForward    ? (last ? 2 : 1)
                          : pass.kind == PassKind::kBackward ? (last ? 0 : 1)
                                                             : 1;
        stage.Work(units);
        busy[s] += units;
        return absl::OkStatus();
      };
      ScheduleStats stats;
      results[s] = RunSchedule(stage, *backend, shape, /*count=*/4, work, &stats);
    });
  }
  for (std::thread& t : threads) t.join();
  int64_t step = 0;
  for (int s = 0; s < p; ++s) {
    EXPECT_TRUE(results[s].ok()) << results[s];
    step = std::max(step, stages[s]->now());
  }
  std::vector<double> idle;
  const int passes = SplitsBackward(shape.schedule) ? 3 : 2;
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(ran[s], PassOrder(shape, s)) << "stage " << s;
    EXPECT_EQ(busy[s], passes * m) << "stage " << s;
    idle.push_back(static_cast<double>(step - busy[s]) / static_cast<double>(step));
  }
  return idle;
}

TEST(PipelineSchedule, EveryStageIdlesExactlyTheOneForwardOneBackwardBubble) {
  for (int p : {2, 3, 4}) {
    for (int m : {1, 2, 4, 8}) {
      const double bubble = static_cast<double>(p - 1) / (m + p - 1);
      for (bool starts : {false, true}) {
        const std::vector<double> idle = IdleFractions({.stages = p, .micro_batches = m}, starts);
        for (int s = 0; s < p; ++s) {
          EXPECT_DOUBLE_EQ(idle[s], bubble)
              << "p " << p << ", m " << m << ", stage " << s << ", started " << starts;
        }
      }
    }
  }
}

// ZB-H1 with m ≥ p: each stage idles (p − 1)(F + B − W) = p − 1 units of a 3m + p − 1 step.
TEST(PipelineSchedule, EveryStageIdlesExactlyTheZeroBubbleBubble) {
  for (int p : {2, 3, 4}) {
    for (int m : {4, 5, 8}) {
      const double bubble = static_cast<double>(p - 1) / (3 * m + p - 1);
      for (bool starts : {false, true}) {
        const std::vector<double> idle = IdleFractions(
            {.schedule = PipelineSchedule::kZeroBubble, .stages = p, .micro_batches = m}, starts);
        for (int s = 0; s < p; ++s) {
          EXPECT_DOUBLE_EQ(idle[s], bubble)
              << "p " << p << ", m " << m << ", stage " << s << ", started " << starts;
        }
      }
    }
  }
}

}  // namespace
}  // namespace trainyard::worker
