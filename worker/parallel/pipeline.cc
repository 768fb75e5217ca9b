#include "worker/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard::worker {
namespace {

// Received activations and gradients, held from the tick they arrive until the pass that reads
// them, in buffers reused across the step.
class Inbox {
 public:
  Inbox(Backend& backend, int64_t count) : backend_(backend), count_(count) {}

  Act* Receive(const Pass& consumer) {
    Buffer<Act> buffer;
    if (spare_.empty()) {
      buffer = backend_.AllocAct(count_);
    } else {
      buffer = std::move(spare_.back());
      spare_.pop_back();
    }
    Act* data = buffer.data();
    held_[Key(consumer)] = std::move(buffer);
    return data;
  }
  // The input received for `pass`; null when none was.
  const Act* For(const Pass& pass) const {
    auto it = held_.find(Key(pass));
    return it == held_.end() ? nullptr : it->second.data();
  }
  void Consumed(const Pass& pass) {
    auto it = held_.find(Key(pass));
    if (it == held_.end()) return;
    spare_.push_back(std::move(it->second));
    held_.erase(it);
  }

 private:
  static std::tuple<int, int, int> Key(const Pass& p) {
    return {static_cast<int>(p.kind), p.micro_batch, p.chunk};
  }
  Backend& backend_;
  int64_t count_;
  std::map<std::tuple<int, int, int>, Buffer<Act>> held_;
  std::vector<Buffer<Act>> spare_;
};

// Whether `pass` hands an output to another stage: every pass but the last virtual stage's
// forward passes, the first virtual stage's backward passes and the weight passes.
bool HasOutput(const ScheduleShape& shape, int stage, const Pass& pass) {
  if (pass.kind == PassKind::kWeight) return false;
  const int virtual_stage = pass.chunk * shape.stages + stage;
  return pass.kind == PassKind::kForward ? virtual_stage + 1 < shape.stages * shape.virtual_stages
                                         : virtual_stage > 0;
}

// A tick's transfers with one neighbour: at most one each way (PlanSchedule's rule), a send and a
// receive paired in one SendRecv.
absl::Status ExchangeWith(parallel::Communicator& pp, DType dtype, int64_t count, int peer,
                          const ScheduleStep& step, const Act* output, Inbox& inbox) {
  const Transfer* send = nullptr;
  const Transfer* recv = nullptr;
  for (const Transfer& t : step.transfers) {
    if (t.peer != peer) continue;
    const Transfer*& slot = t.send ? send : recv;
    if (slot != nullptr) {
      return absl::InternalError(absl::StrCat("pipeline tick ", step.tick, " has two ",
                                              t.send ? "sends to" : "receives from", " stage ",
                                              peer));
    }
    slot = &t;
  }
  if (send != nullptr && (!step.has_pass || !(send->pass == step.pass) || output == nullptr)) {
    return absl::InternalError(
        absl::StrCat("pipeline tick ", step.tick, " sends what its pass does not produce"));
  }
  if (send != nullptr && recv != nullptr) {
    return pp.SendRecv(output, count, peer, send->tag, inbox.Receive(recv->consumer), count, peer,
                       recv->tag, dtype);
  }
  if (send != nullptr) return pp.Send(output, count, dtype, peer, send->tag);
  return pp.Recv(inbox.Receive(recv->consumer), count, dtype, peer, recv->tag);
}

// A tick's transfers, neighbour by neighbour in ascending order of the pair (lower stage, higher
// stage). Every stage orders its pairs the same way, so the pair with the lowest order among
// those not yet done always has both its stages at it: the blocking exchanges cannot deadlock.
absl::Status Exchange(parallel::Communicator& pp, DType dtype, int64_t count,
                      const ScheduleStep& step, const Act* output, Inbox& inbox) {
  const int self = pp.rank();
  std::vector<std::pair<int, int>> pairs;  // (lower, higher) stage
  for (const Transfer& t : step.transfers) {
    const std::pair<int, int> pair{std::min(self, t.peer), std::max(self, t.peer)};
    if (std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) pairs.push_back(pair);
  }
  std::sort(pairs.begin(), pairs.end());
  for (const auto& [lower, higher] : pairs) {
    const int peer = lower == self ? higher : lower;
    TY_RETURN_IF_ERROR(ExchangeWith(pp, dtype, count, peer, step, output, inbox));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunSchedule(parallel::Communicator& pp, Backend& backend, const ScheduleShape& shape,
                         int64_t count, const StageWork& work, ScheduleStats* stats) {
  if (pp.size() != shape.stages) {
    return absl::InternalError(absl::StrCat("a schedule of ", shape.stages,
                                            " stages run by a pipeline group of ", pp.size()));
  }
  const std::vector<std::vector<ScheduleStep>> plan = PlanSchedule(shape);
  if (plan.empty()) {
    return absl::InternalError(absl::StrCat("the ", ScheduleName(shape.schedule), " schedule of ",
                                            shape.stages, " stages and ", shape.micro_batches,
                                            " micro-batches cannot run"));
  }
  const int stage = pp.rank();
  const DType dtype = backend.act_dtype();
  Inbox inbox(backend, count);
  Buffer<Act> output = backend.AllocAct(count);
  for (const ScheduleStep& step : plan[stage]) {
    const bool produces = step.has_pass && HasOutput(shape, stage, step.pass);
    if (step.has_pass) {
      TY_RETURN_IF_ERROR(
          work.run(step.pass, step.slot, inbox.For(step.pass), produces ? output.data() : nullptr));
      inbox.Consumed(step.pass);
    }
    if (step.transfers.empty()) continue;
    const auto start = std::chrono::steady_clock::now();
    TY_RETURN_IF_ERROR(Exchange(pp, dtype, count, step, produces ? output.data() : nullptr, inbox));
    stats->wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return absl::OkStatus();
}

}  // namespace trainyard::worker
