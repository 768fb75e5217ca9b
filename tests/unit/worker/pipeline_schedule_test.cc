// The schedules (worker/shape/schedule.h) run by the executor (worker/parallel/pipeline.h) on a
// simulated clock: p stages as threads, every pass one time unit, transfers instant. Each stage
// runs exactly its pass order, every pass reads the output of the pass it depends on (the same
// micro-batch on the neighbouring virtual stage, around the ring under interleaving), and its idle
// time over the step is exactly its schedule's bubble: (p − 1)/(m + p − 1) of it under 1F1B,
// (p − 1)/(3m + p − 1) under ZB-H1, (p − 1)/(V·m + p − 1) under interleaved 1F1B over V chunks.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
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

// Messages between the stages: their data, stamped with the simulated time they were sent.
class Wire {
 public:
  struct Message {
    int64_t time = 0;
    std::vector<float> data;
  };
  void Post(int from, int to, uint32_t tag, int64_t time, const float* data, int64_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    sent_[{from, to, tag}] = Message{time, std::vector<float>(data, data + count)};
    cv_.notify_all();
  }
  Message Take(int from, int to, uint32_t tag) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return sent_.count({from, to, tag}) > 0; });
    Message message = std::move(sent_[{from, to, tag}]);
    sent_.erase({from, to, tag});
    return message;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, uint32_t>, Message> sent_;
};

// One stage's end of the pipeline group: a send is instant and never blocks; a receive waits
// for its message, copies its data and moves this stage's clock to when it was sent, if that is
// later. With `starts`, transfers are started and waited for apart (the executor's path for such
// engines): a started send takes its data at once and checks at its wait that the buffer was left
// untouched meanwhile; a started receive fills its buffer only when waited for.
class SimulatedStage final : public parallel::Communicator {
 public:
  SimulatedStage(Wire* wire, int rank, int size, bool starts)
      : wire_(wire), rank_(rank), size_(size), starts_(starts) {}

  bool StartsTransfers() const override { return starts_; }
  absl::StatusOr<std::unique_ptr<parallel::PendingTransfer>> StartSend(const void* data,
                                                                       int64_t count, DType,
                                                                       int peer,
                                                                       uint32_t tag) override {
    const float* sent = static_cast<const float*>(data);
    wire_->Post(rank_, peer, tag, now_, sent, count);
    return std::make_unique<Done>([sent, copy = std::vector<float>(sent, sent + count), tag] {
      if (std::equal(copy.begin(), copy.end(), sent)) return absl::OkStatus();
      return absl::InternalError(absl::StrCat("the buffer of send ", tag, " changed in flight"));
    });
  }
  absl::StatusOr<std::unique_ptr<parallel::PendingTransfer>> StartRecv(void* data, int64_t count,
                                                                       DType, int peer,
                                                                       uint32_t tag) override {
    return std::make_unique<Done>([this, data, count, peer, tag] {
      return Recv(static_cast<float*>(data), count, peer, tag);
    });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int64_t now() const { return now_; }
  void Work(int64_t units) { now_ += units; }

  absl::Status Send(const float* data, int64_t count, int peer, uint32_t tag) override {
    wire_->Post(rank_, peer, tag, now_, data, count);
    return absl::OkStatus();
  }
  absl::Status Recv(float* data, int64_t count, int peer, uint32_t tag) override {
    Wire::Message message = wire_->Take(peer, rank_, tag);
    if (static_cast<int64_t>(message.data.size()) != count) {
      return absl::InternalError(
          absl::StrCat("receive ", tag, " of ", count, " elements got ", message.data.size()));
    }
    std::copy(message.data.begin(), message.data.end(), data);
    now_ = std::max(now_, message.time);
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
  // A started transfer, finished by `on_wait`.
  class Done final : public parallel::PendingTransfer {
   public:
    explicit Done(std::function<absl::Status()> on_wait) : on_wait_(std::move(on_wait)) {}
    absl::Status Wait() override { return on_wait_(); }

   private:
    std::function<absl::Status()> on_wait_;
  };

  static absl::Status Unused() { return absl::UnimplementedError("not part of the schedule"); }

  Wire* wire_;
  const int rank_, size_;
  const bool starts_;
  int64_t now_ = 0;
};

// What a pass hands on, as the elements of its transfer: the kind of pass and the virtual stage
// that produced it, and its micro-batch.
constexpr int64_t kTransferCount = 3;

std::vector<float> Stamp(PassKind kind, int virtual_stage, int micro_batch) {
  return {static_cast<float>(kind), static_cast<float>(virtual_stage),
          static_cast<float>(micro_batch)};
}

std::string Describe(const std::vector<float>& stamp) {
  return absl::StrCat(
      stamp[0] == static_cast<float>(PassKind::kForward) ? "activation" : "gradient",
      " of virtual stage ", stamp[1], ", micro-batch ", stamp[2]);
}

// One stage's work: checks that `pass` reads the output of the pass it depends on (a forward
// pass the activation of virtual stage v − 1, a backward pass the gradient of v + 1, both of its
// micro-batch; nothing on the first and last virtual stages and in a weight pass) and has an
// output exactly where its executor must send one, and stamps that output. Returns what was
// wrong, empty when nothing.
std::string CheckAndStamp(Backend& backend, const ScheduleShape& shape, int stage, const Pass& pass,
                          const Act* in, Act* out) {
  const int v = pass.chunk * shape.stages + stage;
  const int last = shape.stages * shape.virtual_stages - 1;
  const bool forward = pass.kind == PassKind::kForward;
  const bool backward = pass.kind == PassKind::kBackward;
  const int from = forward ? v - 1 : v + 1;
  const bool wants_in = (forward && v > 0) || (backward && v < last);
  const bool wants_out = (forward && v < last) || (backward && v > 0);
  const std::string where = absl::StrCat(PassName(pass), " on stage ", stage);
  if ((in != nullptr) != wants_in) {
    return absl::StrCat(where, (in != nullptr) ? " got an input" : " got no input");
  }
  if ((out != nullptr) != wants_out) {
    return absl::StrCat(where, (out != nullptr) ? " got an output" : " got no output");
  }
  if (in != nullptr) {
    std::vector<float> got(kTransferCount);
    backend.CopyActToHost(got.data(), in, kTransferCount);
    const std::vector<float> want = Stamp(pass.kind, from, pass.micro_batch);
    if (got != want) {
      return absl::StrCat(where, " read the ", Describe(got), ", not the ", Describe(want));
    }
  }
  if (out != nullptr) {
    backend.CopyActFromHost(out, Stamp(pass.kind, v, pass.micro_batch).data(), kTransferCount);
  }
  return "";
}

// What each pass costs on the simulated clock. kLossInForward: one unit, but the last virtual
// stage's forward two and its backward none (it runs the micro-batch's backward in its forward
// pass, as the trainer does). kUniform: every pass one unit (the schedules' unit clock).
enum class Costs { kLossInForward, kUniform };

int Units(Costs costs, bool last_virtual_stage, PassKind kind) {
  if (costs == Costs::kUniform || !last_virtual_stage || kind == PassKind::kWeight) return 1;
  return kind == PassKind::kForward ? 2 : 0;
}

// The idle fraction of every stage of a pipeline running `shape` at `costs`. Each stage must run
// exactly the passes of its PassOrder, in that order, each with the input CheckAndStamp expects.
std::vector<double> IdleFractions(const ScheduleShape& shape, bool starts,
                                  Costs costs = Costs::kLossInForward) {
  const int p = shape.stages, m = shape.micro_batches, v = shape.virtual_stages;
  Wire wire;
  std::vector<std::unique_ptr<SimulatedStage>> stages;
  for (int s = 0; s < p; ++s)
    stages.push_back(std::make_unique<SimulatedStage>(&wire, s, p, starts));
  std::vector<int64_t> busy(p, 0);
  std::vector<std::vector<Pass>> ran(p);
  std::vector<std::vector<std::string>> wrong(p);
  std::vector<absl::Status> results(p);
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s) {
    threads.emplace_back([&, s] {
      SimulatedStage& stage = *stages[s];
      auto backend = MakeCpuBackend(1);
      StageWork work;
      work.run = [&](const Pass& pass, int, const Act* in, Act* out) {
        ran[s].push_back(pass);
        const std::string problem = CheckAndStamp(*backend, shape, s, pass, in, out);
        if (!problem.empty()) wrong[s].push_back(problem);
        const int units = Units(costs, pass.chunk * p + s == p * v - 1, pass.kind);
        stage.Work(units);
        busy[s] += units;
        return absl::OkStatus();
      };
      ScheduleStats stats;
      results[s] = RunSchedule(stage, *backend, shape, kTransferCount, work, &stats);
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
    std::set<std::tuple<PassKind, int, int>> distinct;  // (kind, chunk, micro-batch)
    for (const Pass& pass : ran[s]) distinct.insert({pass.kind, pass.chunk, pass.micro_batch});
    EXPECT_EQ(distinct.size(), ran[s].size()) << "stage " << s << " ran a pass twice";
    EXPECT_EQ(static_cast<int>(distinct.size()), passes * m * v) << "stage " << s;
    EXPECT_EQ(busy[s], passes * m * v) << "stage " << s;
    EXPECT_TRUE(wrong[s].empty()) << wrong[s].size() << " wrong inputs, the first: " << wrong[s][0];
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

ScheduleShape Interleaved(int p, int v, int m) {
  return {.schedule = PipelineSchedule::kInterleaved,
          .stages = p,
          .micro_batches = m,
          .virtual_stages = v};
}

void ExpectInterleavedBubble(int p, int v, int m, Costs costs) {
  const double bubble = static_cast<double>(p - 1) / (v * m + p - 1);
  for (bool starts : {false, true}) {
    const std::vector<double> idle = IdleFractions(Interleaved(p, v, m), starts, costs);
    for (int s = 0; s < p; ++s) {
      EXPECT_DOUBLE_EQ(idle[s], bubble)
          << "p " << p << ", V " << v << ", m " << m << ", stage " << s << ", started " << starts
          << ", uniform " << (costs == Costs::kUniform);
    }
  }
}

// Interleaved 1F1B with m a multiple of p: each chunk pass 1/V of a stage's, the fill and drain
// shrink V-fold to a (p − 1)/(V·m + p − 1) bubble. The last stage hands its chunks' activations on
// to stage 0's next chunk, and stage 0 its gradients back to the last stage's previous chunk.
TEST(PipelineSchedule, EveryStageIdlesExactlyTheInterleavedBubble) {
  const struct {
    int p, v, m;
  } shapes[] = {{2, 2, 4}, {2, 3, 6}, {3, 2, 6}, {4, 2, 8}, {2, 2, 2}, {2, 3, 2}, {4, 2, 4}};
  for (const auto& [p, v, m] : shapes) {
    ExpectInterleavedBubble(p, v, m, Costs::kUniform);
    ExpectInterleavedBubble(p, v, m, Costs::kLossInForward);
  }
}

}  // namespace
}  // namespace trainyard::worker
