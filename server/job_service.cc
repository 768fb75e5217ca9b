#include "server/job_service.h"

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "config/spec.h"
#include "server/convert.h"
#include "server/stream_writer.h"

namespace trainyard::server {
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(status));
  return reactor;
}

// WatchJob: a JobWatcher registered with the Supervisor feeds the stream until the job is final.
class WatchReactor : public grpc::ServerWriteReactor<v1::JobUpdate> {
 public:
  // `ticket`: the caller's stream slot, or why the call is refused.
  WatchReactor(Supervisor* supervisor, std::string job_id, absl::StatusOr<StreamTicket> ticket)
      : supervisor_(supervisor),
        job_id_(std::move(job_id)),
        writer_(std::make_shared<Writer>(this)),
        watcher_(std::make_shared<Watcher>(writer_)) {
    if (!ticket.ok()) {
      writer_->FinishWhenDrained(ToGrpc(ticket.status()));
      return;
    }
    ticket_ = *std::move(ticket);
    absl::StatusOr<uint64_t> id = supervisor_->Watch(job_id_, watcher_);
    if (!id.ok()) {
      writer_->FinishWhenDrained(ToGrpc(id.status()));
      return;
    }
    watch_id_ = *id;
  }

  void OnWriteDone(bool ok) override { writer_->OnWriteDone(ok); }
  void OnCancel() override {
    writer_->Abandon(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled"));
  }
  void OnDone() override {
    writer_->Detach();
    if (watch_id_ != 0) supervisor_->Unwatch(job_id_, watch_id_);
    delete this;
  }

 private:
  using Writer = QueuedWriter<grpc::ServerWriteReactor<v1::JobUpdate>, v1::JobUpdate>;

  class Watcher : public JobWatcher {
   public:
    explicit Watcher(std::shared_ptr<Writer> writer) : writer_(std::move(writer)) {}
    void OnUpdate(const JobRecord& job, const EventRecord* event) override {
      v1::JobUpdate update;
      ToProto(job, update.mutable_job());
      update.mutable_job()->clear_spec_yaml();
      if (event != nullptr) ToProto(*event, update.mutable_event());
      writer_->Push(std::move(update), /*replaceable=*/event == nullptr && !IsFinal(job.state));
      if (IsFinal(job.state)) writer_->FinishWhenDrained(grpc::Status::OK);
    }
    void OnClose(const absl::Status& status) override {
      writer_->FinishWhenDrained(ToGrpc(status));
    }

   private:
    std::shared_ptr<Writer> writer_;
  };

  Supervisor* const supervisor_;
  const std::string job_id_;
  std::shared_ptr<Writer> writer_;
  std::shared_ptr<Watcher> watcher_;
  uint64_t watch_id_ = 0;
  StreamTicket ticket_;
};

// GetLogs: a LogSink registered with the LogRouter feeds the stream.
class LogsReactor : public grpc::ServerWriteReactor<v1::LogChunk> {
 public:
  LogsReactor(Supervisor* supervisor, LogRouter* logs, const v1::GetLogsRequest& request,
              absl::StatusOr<StreamTicket> ticket)
      : logs_(logs), writer_(std::make_shared<Writer>(this)) {
    if (!ticket.ok()) {
      writer_->FinishWhenDrained(ToGrpc(ticket.status()));
      return;
    }
    ticket_ = *std::move(ticket);
    if (request.job_id().empty()) {
      writer_->FinishWhenDrained(ToGrpc(absl::InvalidArgumentError("empty job_id")));
      return;
    }
    if (request.tail_lines() < 0 || request.attempt_id() < 0) {
      writer_->FinishWhenDrained(
          ToGrpc(absl::InvalidArgumentError("tail_lines and attempt_id must not be negative")));
      return;
    }
    absl::StatusOr<LogTargets> targets = supervisor->LocateLogs(
        request.job_id(), request.attempt_id(),
        request.all_ranks() ? std::nullopt : std::optional<int>(request.rank()));
    if (!targets.ok()) {
      writer_->FinishWhenDrained(ToGrpc(targets.status()));
      return;
    }
    stream_id_ = logs_->Start(request.job_id(), *targets, request.tail_lines(), request.follow(),
                              std::make_shared<Sink>(writer_));
  }

  void OnWriteDone(bool ok) override { writer_->OnWriteDone(ok); }
  void OnCancel() override {
    if (stream_id_ != 0) logs_->Cancel(stream_id_);
    writer_->Abandon(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled"));
  }
  void OnDone() override {
    writer_->Detach();
    if (stream_id_ != 0) logs_->Cancel(stream_id_);
    delete this;
  }

 private:
  using Writer = QueuedWriter<grpc::ServerWriteReactor<v1::LogChunk>, v1::LogChunk>;

  class Sink : public LogSink {
   public:
    explicit Sink(std::shared_ptr<Writer> writer) : writer_(std::move(writer)) {}
    void OnData(int attempt_id, int rank, std::string data) override {
      v1::LogChunk chunk;
      chunk.set_attempt_id(attempt_id);
      chunk.set_rank(rank);
      chunk.set_data(std::move(data));
      writer_->Push(std::move(chunk));
    }
    void OnDone(const absl::Status& status) override { writer_->FinishWhenDrained(ToGrpc(status)); }

   private:
    std::shared_ptr<Writer> writer_;
  };

  LogRouter* const logs_;
  std::shared_ptr<Writer> writer_;
  uint64_t stream_id_ = 0;
  StreamTicket ticket_;
};

}  // namespace

absl::StatusOr<Identity> JobServiceImpl::JobCaller(const grpc::ServerContextBase& context,
                                                   const std::string& job_id) const {
  TY_ASSIGN_OR_RETURN(Identity caller, auth_->User(context));
  TY_ASSIGN_OR_RETURN(const std::string owner, supervisor_->JobOwner(job_id));
  TY_RETURN_IF_ERROR(ServiceAuth::MayUseJob(caller, job_id, owner));
  return caller;
}

absl::Status JobServiceImpl::MayUseJob(const grpc::ServerContextBase& context,
                                       const std::string& job_id) const {
  return JobCaller(context, job_id).status();
}

absl::StatusOr<StreamTicket> JobServiceImpl::OpenStream(const grpc::ServerContextBase& context,
                                                        const std::string& job_id) const {
  if (job_id.empty()) return absl::InvalidArgumentError("empty job_id");
  TY_ASSIGN_OR_RETURN(const Identity caller, JobCaller(context, job_id));
  TY_RETURN_IF_ERROR(streams_->Acquire(caller.user));
  return StreamTicket(streams_, caller.user);
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::SubmitJobReply* reply) {
  if (request->spec_yaml().size() > config::kMaxSpecBytes) {
    return Answer(context, absl::ResourceExhaustedError(absl::StrCat(
                               "spec of ", request->spec_yaml().size(),
                               " bytes is over the limit of ", config::kMaxSpecBytes, " bytes")));
  }
  return AnswerFrom(executor_, context, [this, context, request, reply]() -> absl::Status {
    TY_ASSIGN_OR_RETURN(const Identity caller, auth_->User(*context));
    SubmitRequest submit;
    submit.spec_yaml = request->spec_yaml();
    if (!request->spec_source().empty()) submit.spec_source = request->spec_source();
    submit.user = caller.user;  // who the credential proves, never who the request says
    submit.client_request_id = request->client_request_id();
    TY_ASSIGN_OR_RETURN(const JobRecord job, supervisor_->Submit(submit));
    ToProto(job, reply->mutable_job());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest* request,
                                                 v1::GetJobReply* reply) {
  if (request->job_id().empty()) return Answer(context, absl::InvalidArgumentError("empty job_id"));
  if (request->max_events() < 0) {
    return Answer(context, absl::InvalidArgumentError("max_events must not be negative"));
  }
  if (absl::Status allowed = MayUseJob(*context, request->job_id()); !allowed.ok()) {
    return Answer(context, allowed);
  }
  absl::StatusOr<JobView> view = supervisor_->GetJob(request->job_id(), request->max_events());
  if (view.ok()) {
    ToProto(view->job, reply->mutable_job());
    for (const AttemptRecord& attempt : view->attempts) ToProto(attempt, reply->add_attempts());
    for (const EventRecord& event : view->events) ToProto(event, reply->add_events());
  }
  return Answer(context, view.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsReply* reply) {
  if (request->limit() < 0 || request->limit() > 1000) {
    return Answer(context, absl::InvalidArgumentError(
                               absl::StrCat("limit ", request->limit(), " is outside 0..1000")));
  }
  absl::StatusOr<Identity> caller = auth_->User(*context);
  if (!caller.ok()) return Answer(context, caller.status());
  std::set<JobState> states;
  for (int state : request->states()) {
    absl::StatusOr<JobState> parsed = FromProto(static_cast<v1::JobState>(state));
    if (!parsed.ok()) return Answer(context, parsed.status());
    states.insert(*parsed);
  }
  const std::optional<std::string> owner =
      caller->admin() ? std::nullopt : std::optional<std::string>(caller->user);
  for (const JobRecord& job :
       supervisor_->ListJobs(states, request->limit() == 0 ? 100 : request->limit(), owner)) {
    ToProto(job, reply->add_jobs());
  }
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::CancelJobReply* reply) {
  return StopJob(context, request->job_id(), request->reason(), reply->mutable_job(),
                 &Supervisor::Cancel);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListCheckpoints(grpc::CallbackServerContext* context,
                                                          const v1::ListCheckpointsRequest* request,
                                                          v1::ListCheckpointsReply* reply) {
  if (request->job_id().empty()) return Answer(context, absl::InvalidArgumentError("empty job_id"));
  if (absl::Status allowed = MayUseJob(*context, request->job_id()); !allowed.ok()) {
    return Answer(context, allowed);
  }
  absl::StatusOr<std::vector<CheckpointInfo>> checkpoints =
      supervisor_->ListCheckpoints(request->job_id());
  if (checkpoints.ok()) {
    for (const CheckpointInfo& checkpoint : *checkpoints) {
      ToProto(checkpoint, reply->add_checkpoints());
    }
  }
  return Answer(context, checkpoints.status());
}

grpc::ServerUnaryReactor* JobServiceImpl::DrainJob(grpc::CallbackServerContext* context,
                                                   const v1::DrainJobRequest* request,
                                                   v1::DrainJobReply* reply) {
  return StopJob(context, request->job_id(), request->reason(), reply->mutable_job(),
                 &Supervisor::Drain);
}

grpc::ServerUnaryReactor* JobServiceImpl::StopJob(grpc::CallbackServerContext* context,
                                                  const std::string& job_id,
                                                  const std::string& reason, v1::Job* reply,
                                                  StopFn stop) {
  if (job_id.empty()) return Answer(context, absl::InvalidArgumentError("empty job_id"));
  return AnswerFrom(executor_, context, [=, this]() -> absl::Status {
    TY_ASSIGN_OR_RETURN(const Identity caller, JobCaller(*context, job_id));
    // std::invoke rather than ->*: GCC 12's -fsanitize=vptr checks a ->* call made in a lambda
    // against the wrong address and aborts a sanitized server on every cancel and drain.
    TY_ASSIGN_OR_RETURN(const JobRecord job,
                        std::invoke(stop, supervisor_, job_id, reason, caller.user));
    ToProto(job, reply);
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::JobUpdate>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  return new WatchReactor(supervisor_, request->job_id(), OpenStream(*context, request->job_id()));
}

grpc::ServerWriteReactor<v1::LogChunk>* JobServiceImpl::GetLogs(
    grpc::CallbackServerContext* context, const v1::GetLogsRequest* request) {
  return new LogsReactor(supervisor_, logs_, *request, OpenStream(*context, request->job_id()));
}

grpc::ServerUnaryReactor* JobServiceImpl::ListNodes(grpc::CallbackServerContext* context,
                                                    const v1::ListNodesRequest* request,
                                                    v1::ListNodesReply* reply) {
  if (absl::StatusOr<Identity> caller = auth_->User(*context); !caller.ok()) {
    return Answer(context, caller.status());
  }
  for (const NodeStatus& node : supervisor_->Nodes()) ToProto(node, reply->add_nodes());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* JobServiceImpl::UncordonNode(grpc::CallbackServerContext* context,
                                                       const v1::UncordonNodeRequest* request,
                                                       v1::UncordonNodeReply* reply) {
  if (request->node_id().empty()) {
    return Answer(context, absl::InvalidArgumentError("node_id is empty"));
  }
  return AnswerFrom(executor_, context, [this, context, request, reply]() -> absl::Status {
    TY_ASSIGN_OR_RETURN(const Identity caller, auth_->User(*context));
    if (!caller.admin()) {
      return absl::PermissionDeniedError(
          absl::StrCat(caller.user, " is not an admin: only admins manage nodes"));
    }
    TY_ASSIGN_OR_RETURN(const NodeStatus node, supervisor_->Uncordon(request->node_id()));
    ToProto(node, reply->mutable_node());
    return absl::OkStatus();
  });
}

}  // namespace trainyard::server
