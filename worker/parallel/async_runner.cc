#include "worker/parallel/async_runner.h"

namespace trainyard::worker::parallel {

AsyncRunner::AsyncRunner() : thread_([this] { Loop(); }) {}

AsyncRunner::~AsyncRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

AsyncRunner::Work AsyncRunner::Submit(std::function<absl::Status()> op) {
  std::packaged_task<absl::Status()> task(std::move(op));
  Work work = task.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return work;
}

void AsyncRunner::Loop() {
  while (true) {
    std::packaged_task<absl::Status()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace trainyard::worker::parallel
