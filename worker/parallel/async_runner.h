// AsyncRunner: one thread that runs submitted operations in submission order. Communication goes
// through it so that collectives overlap with compute on the training thread while every rank
// still issues them in the same order.
#ifndef TRAINYARD_WORKER_PARALLEL_ASYNC_RUNNER_H_
#define TRAINYARD_WORKER_PARALLEL_ASYNC_RUNNER_H_

#include <deque>
#include <functional>
#include <future>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace trainyard::worker::parallel {

class AsyncRunner {
 public:
  using Work = std::shared_future<absl::Status>;

  AsyncRunner();
  ~AsyncRunner();  // runs what is queued, then joins
  AsyncRunner(const AsyncRunner&) = delete;
  AsyncRunner& operator=(const AsyncRunner&) = delete;

  // Queues `op`; the returned future holds its status once it ran.
  Work Submit(std::function<absl::Status()> op);
  // Runs `op` after everything queued before it, and waits for it.
  [[nodiscard]] absl::Status Run(std::function<absl::Status()> op) {
    return Submit(std::move(op)).get();
  }

 private:
  void Loop();

  absl::Mutex mu_;
  absl::CondVar changed_;  // queued, or stopping
  std::deque<std::packaged_task<absl::Status()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainyard::worker::parallel

#endif  // TRAINYARD_WORKER_PARALLEL_ASYNC_RUNNER_H_
