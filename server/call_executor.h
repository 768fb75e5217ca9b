// CallExecutor: threads of the coordinator's own for RPC handlers that may wait.
//
// gRPC's callback API runs every handler on a few threads of its own (two on a two-core machine),
// and one of them blocked blocks every call it would have served. A handler that changes state
// waits until the change is stored (the commit queue's group commit, an fdatasync), so the
// handlers that may wait hand their work to this pool, and answer from it: on two callback
// threads, two waiting submissions used to stop the coordinator's whole traffic until their
// commit was stored, and submissions could not share a commit more than two at a time.
//
// Threading: Run may be called from any thread. The destructor runs what is queued, then joins.
#ifndef TRAINYARD_SERVER_CALL_EXECUTOR_H_
#define TRAINYARD_SERVER_CALL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc.h"
#include "grpcpp/grpcpp.h"

namespace trainyard::server {

class CallExecutor {
 public:
  // Enough threads that the calls waiting on one commit can all join it.
  static constexpr int kDefaultThreads = 32;

  explicit CallExecutor(int threads = kDefaultThreads);
  ~CallExecutor();
  CallExecutor(const CallExecutor&) = delete;
  CallExecutor& operator=(const CallExecutor&) = delete;

  void Run(std::function<void()> work);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// A unary call answered from `executor`: `work` fills the reply and returns the call's status.
template <typename Work>
grpc::ServerUnaryReactor* AnswerFrom(CallExecutor* executor, grpc::CallbackServerContext* context,
                                     Work work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  executor->Run(
      [reactor, work = std::move(work)]() mutable { reactor->Finish(rpc::ToGrpc(work())); });
  return reactor;
}

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_CALL_EXECUTOR_H_
