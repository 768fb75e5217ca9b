#include "server/log_router.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainyard::server {

uint64_t LogRouter::Start(const std::string& job_id, const LogTargets& targets, int tail_lines,
                          bool follow, std::shared_ptr<LogSink> sink) {
  absl::MutexLock lock(&mu_);
  const uint64_t stream_id = next_stream_++;
  Stream& stream = streams_[stream_id];
  stream.attempt_id = targets.attempt_id;
  stream.sink = std::move(sink);
  for (const LogTarget& target : targets.ranks) {
    const int64_t request_id = next_request_++;
    ReadLogsOrder order;
    order.request_id = request_id;
    order.job_id = job_id;
    order.attempt_id = targets.attempt_id;
    order.rank = target.rank;
    order.tail_lines = tail_lines;
    order.follow = follow && !target.exited;
    if (!registry_->Send(target.node_id, order)) {
      EndStreamLocked(stream_id, absl::UnavailableError(absl::StrCat(
                                     "node ", target.node_id, " holding the log of rank ",
                                     target.rank, " is not connected")));
      return stream_id;
    }
    stream.pending.insert(request_id);
    requests_[request_id] = Request{stream_id, target.node_id};
  }
  if (stream.pending.empty()) EndStreamLocked(stream_id, absl::OkStatus());
  return stream_id;
}

void LogRouter::EndStreamLocked(uint64_t stream_id, const absl::Status& status) {
  auto it = streams_.find(stream_id);
  if (it == streams_.end()) return;
  for (int64_t request_id : it->second.pending) {
    auto request = requests_.find(request_id);
    if (request == requests_.end()) continue;
    if (!status.ok()) registry_->Send(request->second.node_id, CancelReadLogsOrder{request_id});
    requests_.erase(request);
  }
  std::shared_ptr<LogSink> sink = std::move(it->second.sink);
  streams_.erase(it);
  if (sink != nullptr) sink->OnDone(status);
}

void LogRouter::Cancel(uint64_t stream_id) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream_id);
  if (it == streams_.end()) return;
  it->second.sink = nullptr;  // the client is gone: no OnDone
  EndStreamLocked(stream_id, absl::CancelledError("the client cancelled"));
}

void LogRouter::OnLogData(const std::string& node_id, int64_t request_id, int rank,
                          std::string data, bool done, const std::string& error) {
  absl::MutexLock lock(&mu_);
  auto request = requests_.find(request_id);
  if (request == requests_.end() || request->second.node_id != node_id) return;
  const uint64_t stream_id = request->second.stream_id;
  Stream& stream = streams_.at(stream_id);
  if (!data.empty()) stream.sink->OnData(stream.attempt_id, rank, std::move(data));
  if (!error.empty()) {
    EndStreamLocked(stream_id, absl::NotFoundError(absl::StrCat("rank ", rank, ": ", error)));
    return;
  }
  if (!done) return;
  stream.pending.erase(request_id);
  requests_.erase(request);
  if (stream.pending.empty()) EndStreamLocked(stream_id, absl::OkStatus());
}

void LogRouter::OnAgentGone(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  std::set<uint64_t> affected;
  for (const auto& [request_id, request] : requests_) {
    if (request.node_id == node_id) affected.insert(request.stream_id);
  }
  for (uint64_t stream_id : affected) {
    EndStreamLocked(stream_id, absl::UnavailableError(absl::StrCat(
                                   "node ", node_id, " disconnected while sending a log")));
  }
}

void LogRouter::CloseAll(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, stream] : streams_) ids.push_back(id);
  for (uint64_t id : ids) EndStreamLocked(id, status);
}

}  // namespace trainyard::server
