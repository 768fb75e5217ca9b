#include "worker/parallel/async_runner.h"

namespace trainyard::worker::parallel {

AsyncRunner::AsyncRunner() : thread_([this] { Loop(); }) {}

AsyncRunner::~AsyncRunner() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.Signal();
  }
  thread_.join();
}

AsyncRunner::Work AsyncRunner::Submit(std::function<absl::Status()> op) {
  std::packaged_task<absl::Status()> task(std::move(op));
  Work work = task.get_future().share();
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(task));
    changed_.Signal();
  }
  return work;
}

void AsyncRunner::Loop() {
  while (true) {
    std::packaged_task<absl::Status()> task;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) changed_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace trainyard::worker::parallel
