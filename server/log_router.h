// LogRouter: serves GetLogs by asking the agents that hold rank logs to read them (ReadLogs over
// their Connect streams) and routing the LogData they send back to the waiting stream.
//
// A stream ends OK when every rank's read is done; with the first error otherwise (UNAVAILABLE
// when a node holding a log is not connected or disconnects, NOT_FOUND when an agent cannot read
// a log).
//
// Threading: thread-safe. LogSink methods run with the router's mutex held (so chunks keep their
// order) and must not block nor call back into the router.
#ifndef TRAINYARD_SERVER_LOG_ROUTER_H_
#define TRAINYARD_SERVER_LOG_ROUTER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/agent_registry.h"
#include "server/supervisor.h"

namespace trainyard::server {

class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void OnData(int attempt_id, int rank, std::string data) = 0;
  // Called once; no OnData after it.
  virtual void OnDone(const absl::Status& status) = 0;
};

class LogRouter {
 public:
  explicit LogRouter(AgentRegistry* registry) : registry_(registry) {}

  // Starts one read per target rank; returns an id for Cancel. The sink may be done before this
  // returns (e.g. a node not connected).
  uint64_t Start(const std::string& job_id, const LogTargets& targets, int tail_lines, bool follow,
                 std::shared_ptr<LogSink> sink);
  // The client went away: tells the agents to stop sending; the sink gets no more calls.
  void Cancel(uint64_t stream_id);

  // From the agent service: a LogData message of `node_id`.
  void OnLogData(const std::string& node_id, int64_t request_id, int rank, std::string data,
                 bool done, const std::string& error);
  // `node_id`'s connection ended: its reads fail with UNAVAILABLE.
  void OnAgentGone(const std::string& node_id);
  // Ends every stream with `status` (shutdown).
  void CloseAll(const absl::Status& status);

 private:
  struct Request {
    uint64_t stream_id;
    std::string node_id;
  };
  struct Stream {
    int attempt_id = 0;
    std::shared_ptr<LogSink> sink;
    std::set<int64_t> pending;  // request ids not done yet
  };
  void EndStreamLocked(uint64_t stream_id, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  AgentRegistry* const registry_;
  absl::Mutex mu_;
  uint64_t next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_request_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Stream> streams_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Request> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_LOG_ROUTER_H_
