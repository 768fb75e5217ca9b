#include "worker/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard::worker {
namespace {

// Activation-sized buffers reused across the step.
class BufferPool {
 public:
  BufferPool(Backend& backend, int64_t count) : backend_(backend), count_(count) {}
  Buffer<Act> Take() {
    if (spare_.empty()) return backend_.AllocAct(count_);
    Buffer<Act> buffer = std::move(spare_.back());
    spare_.pop_back();
    return buffer;
  }
  void Give(Buffer<Act> buffer) {
    if (buffer.data() != nullptr) spare_.push_back(std::move(buffer));
  }

 private:
  Backend& backend_;
  int64_t count_;
  std::vector<Buffer<Act>> spare_;
};

// Received activations and gradients, held from the tick they arrive (or, with started
// transfers, the tick their receive is posted) until the pass that reads them.
class Inbox {
 public:
  explicit Inbox(BufferPool& pool) : pool_(pool) {}

  // A buffer for the input of `consumer`, held until it is consumed.
  Act* Receive(const Pass& consumer) {
    Held& held = held_[Key(consumer)];
    held.buffer = pool_.Take();
    return held.buffer.data();
  }
  // The receive into `consumer`'s buffer is in flight: For waits for it.
  void Started(const Pass& consumer, std::unique_ptr<parallel::PendingTransfer> pending) {
    held_[Key(consumer)].pending = std::move(pending);
  }
  // The input received for `pass`, after waiting for its transfer if it is still in flight (the
  // seconds blocked are added to *waited); null when none was received.
  absl::StatusOr<const Act*> For(const Pass& pass, double* waited) {
    auto it = held_.find(Key(pass));
    if (it == held_.end()) return nullptr;
    if (it->second.pending) {
      const auto start = std::chrono::steady_clock::now();
      TY_RETURN_IF_ERROR(it->second.pending->Wait());
      *waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      it->second.pending.reset();
    }
    return it->second.buffer.data();
  }
  void Consumed(const Pass& pass) {
    auto it = held_.find(Key(pass));
    if (it == held_.end()) return;
    pool_.Give(std::move(it->second.buffer));
    held_.erase(it);
  }

 private:
  struct Held {
    Buffer<Act> buffer;
    std::unique_ptr<parallel::PendingTransfer> pending;
  };
  static std::tuple<int, int, int> Key(const Pass& p) {
    return {static_cast<int>(p.kind), p.micro_batch, p.chunk};
  }
  BufferPool& pool_;
  std::map<std::tuple<int, int, int>, Held> held_;
};

// Sends in flight, each holding the output buffer it sends until it is waited for.
class Outbox {
 public:
  explicit Outbox(BufferPool& pool) : pool_(pool) {}
  void Started(Buffer<Act> buffer, std::unique_ptr<parallel::PendingTransfer> pending) {
    sending_.push_back({std::move(buffer), std::move(pending)});
  }
  // Waits for every send (the seconds blocked added to *waited) and returns their buffers.
  absl::Status Finish(double* waited) {
    const auto start = std::chrono::steady_clock::now();
    for (Sending& s : sending_) {
      TY_RETURN_IF_ERROR(s.pending->Wait());
      pool_.Give(std::move(s.buffer));
    }
    sending_.clear();
    *waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return absl::OkStatus();
  }

 private:
  struct Sending {
    Buffer<Act> buffer;
    std::unique_ptr<parallel::PendingTransfer> pending;
  };
  BufferPool& pool_;
  std::vector<Sending> sending_;
};

// Whether `pass` hands an output to another stage: every pass but the last virtual stage's
// forward passes, the first virtual stage's backward passes and the weight passes.
bool HasOutput(const ScheduleShape& shape, int stage, const Pass& pass) {
  return ConsumerOf(shape, stage, pass).has_value();
}

// PlanSchedule's rule: a tick sends only what its own pass produced.
absl::Status CheckSend(const ScheduleStep& step, const Transfer& send, const Act* output) {
  if (step.has_pass && send.pass == step.pass && output != nullptr) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("pipeline tick ", step.tick, " sends what its pass does not produce"));
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
  if (send != nullptr) TY_RETURN_IF_ERROR(CheckSend(step, *send, output));
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

// One stage's steps with blocking transfers: each tick's exchanged at its end (Exchange).
absl::Status RunLockstep(parallel::Communicator& pp, BufferPool& pool, const ScheduleShape& shape,
                         const std::vector<ScheduleStep>& steps, int64_t count, DType dtype,
                         const StageWork& work, ScheduleStats* stats) {
  const int stage = pp.rank();
  Inbox inbox(pool);
  Buffer<Act> output = pool.Take();
  for (const ScheduleStep& step : steps) {
    const bool produces = step.has_pass && HasOutput(shape, stage, step.pass);
    if (step.has_pass) {
      TY_ASSIGN_OR_RETURN(const Act* in, inbox.For(step.pass, &stats->wait_seconds));
      TY_RETURN_IF_ERROR(work.run(step.pass, step.slot, in, produces ? output.data() : nullptr));
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

// One stage's steps with started transfers: a tick's receives are posted at its end and waited
// for just before the pass that reads them; its send is started at once and waited for at the
// end of the step. A stage blocks only for an input it needs now, which the plan guarantees
// its sender produces without waiting on this stage's later passes.
absl::Status RunStarted(parallel::Communicator& pp, BufferPool& pool, const ScheduleShape& shape,
                        const std::vector<ScheduleStep>& steps, int64_t count, DType dtype,
                        const StageWork& work, ScheduleStats* stats) {
  const int stage = pp.rank();
  Inbox inbox(pool);
  Outbox outbox(pool);
  for (const ScheduleStep& step : steps) {
    Buffer<Act> output;
    if (step.has_pass) {
      if (HasOutput(shape, stage, step.pass)) output = pool.Take();
      TY_ASSIGN_OR_RETURN(const Act* in, inbox.For(step.pass, &stats->wait_seconds));
      TY_RETURN_IF_ERROR(work.run(step.pass, step.slot, in, output.data()));
      inbox.Consumed(step.pass);
    }
    for (const Transfer& t : step.transfers) {
      if (t.send) {
        TY_RETURN_IF_ERROR(CheckSend(step, t, output.data()));
        TY_ASSIGN_OR_RETURN(auto pending, pp.StartSend(output.data(), count, dtype, t.peer, t.tag));
        outbox.Started(std::move(output), std::move(pending));
      } else {
        Act* target = inbox.Receive(t.consumer);
        TY_ASSIGN_OR_RETURN(auto pending, pp.StartRecv(target, count, dtype, t.peer, t.tag));
        inbox.Started(t.consumer, std::move(pending));
      }
    }
    pool.Give(std::move(output));  // a pass whose output no transfer took
  }
  return outbox.Finish(&stats->wait_seconds);
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
  BufferPool pool(backend, count);
  const std::vector<ScheduleStep>& steps = plan[pp.rank()];
  if (pp.StartsTransfers()) {
    return RunStarted(pp, pool, shape, steps, count, backend.act_dtype(), work, stats);
  }
  return RunLockstep(pp, pool, shape, steps, count, backend.act_dtype(), work, stats);
}

}  // namespace trainyard::worker
