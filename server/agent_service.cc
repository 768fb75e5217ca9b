#include "server/agent_service.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "google/protobuf/arena.h"
#include "server/convert.h"
#include "server/stream_writer.h"

namespace trainyard::server {
namespace {

using Reactor = grpc::ServerBidiReactor<v1::AgentMessage, v1::CoordinatorMessage>;
using Writer = QueuedWriter<Reactor, v1::CoordinatorMessage>;

google::protobuf::ArenaOptions ArenaOptions(char* first_block, size_t size) {
  google::protobuf::ArenaOptions options;
  options.initial_block = first_block;
  options.initial_block_size = size;
  return options;
}

std::vector<RunningWorker> Running(const v1::Heartbeat& heartbeat) {
  std::vector<RunningWorker> running;
  running.reserve(heartbeat.running_size());
  for (const v1::RunningWorker& w : heartbeat.running()) running.push_back(FromProto(w));
  return running;
}

// The registry's handle on one stream.
class StreamChannel : public AgentChannel {
 public:
  // `start_batches`: the agent takes StartWorkers.
  StreamChannel(std::shared_ptr<Writer> writer, bool start_batches)
      : writer_(std::move(writer)), start_batches_(start_batches) {}
  void Send(AgentOrder order) override {
    v1::CoordinatorMessage message;
    ToProto(order, &message);
    writer_->Push(std::move(message));
  }
  // Consecutive start orders go in one StartWorkers message.
  void SendAll(std::vector<AgentOrder> orders) override {
    for (size_t first = 0; first < orders.size();) {
      size_t end = first;
      while (end < orders.size() && std::holds_alternative<StartWorkerOrder>(orders[end])) ++end;
      if (!start_batches_ || end - first < 2) {
        Send(std::move(orders[first]));
        ++first;
        continue;
      }
      v1::CoordinatorMessage batch;
      for (; first < end; ++first) {
        v1::CoordinatorMessage one;
        ToProto(orders[first], &one);
        batch.mutable_start_batch()->add_workers()->Swap(one.mutable_start());
      }
      writer_->Push(std::move(batch));
    }
  }
  void Close(const absl::Status& status) override { writer_->FinishWhenDrained(ToGrpc(status)); }

 private:
  std::shared_ptr<Writer> writer_;
  const bool start_batches_;
};

class AgentStream : public Reactor {
 public:
  // `caller`: the caller's authentication; a refused stream ends at once with it.
  AgentStream(Supervisor* supervisor, LogRouter* logs, CallExecutor* executor,
              absl::StatusOr<Identity> caller)
      : supervisor_(supervisor),
        logs_(logs),
        executor_(executor),
        writer_(std::make_shared<Writer>(this)) {
    if (!caller.ok()) {
      TY_LOG(WARNING) << "refused an agent: " << caller.status();
      writer_->FinishWhenDrained(ToGrpc(caller.status()));
      return;
    }
    caller_ = *std::move(caller);
    NextRead();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the agent closed its side or the connection broke
      writer_->FinishWhenDrained(grpc::Status::OK);
      return;
    }
    // A message whose handling waits for the store (a registration, an exit: each is stored
    // before it is answered) is handled on the coordinator's threads, so that gRPC's few callback
    // threads never wait for a commit; the stream is held open until it is handled and the next
    // read started. The next message is read only then, so a stream's messages keep their order.
    if (MayWaitForStore(*in_) && writer_->Hold()) {
      executor_->Run([this] {
        Handled(Handle(*in_));
        writer_->Release();
      });
      return;
    }
    Handled(Handle(*in_));
  }

  void OnWriteDone(bool ok) override { writer_->OnWriteDone(ok); }

  void OnCancel() override {
    writer_->Abandon(grpc::Status(grpc::StatusCode::CANCELLED, "the agent went away"));
  }

  void OnDone() override {
    writer_->Detach();
    if (session_ != 0) {
      supervisor_->AgentDisconnected(node_id_, session_);
      logs_->OnAgentGone(node_id_);
    }
    delete this;
  }

 private:
  // Every message is read into the arena, emptied once the message was handled: reading a
  // heartbeat or a batch of reports then allocates nothing while it fits the first block.
  void NextRead() {
    arena_.Reset();
    in_ = google::protobuf::Arena::CreateMessage<v1::AgentMessage>(&arena_);
    StartRead(in_);
  }

  static bool MayWaitForStore(const v1::AgentMessage& message) {
    return message.has_registration() || message.has_exited() || message.has_tier_notice();
  }

  // Reads the next message, or ends the stream when `status` (the last one's) is an error.
  void Handled(const absl::Status& status) {
    if (!status.ok()) {
      TY_LOG(WARNING) << "agent stream " << (node_id_.empty() ? "(unregistered)" : node_id_)
                      << " ended: " << status;
      writer_->FinishWhenDrained(ToGrpc(status));
      return;
    }
    NextRead();
  }

  absl::Status Handle(const v1::AgentMessage& message) {
    if (session_ == 0) {
      if (!message.has_registration()) {
        return absl::InvalidArgumentError("the first message of a Connect stream must register");
      }
      return Register(message.registration());
    }
    switch (message.msg_case()) {
      case v1::AgentMessage::kRegistration:
        return absl::InvalidArgumentError("registered twice on one stream");
      case v1::AgentMessage::kHeartbeat:
        return supervisor_->Heartbeat(node_id_, session_, Running(message.heartbeat()));
      case v1::AgentMessage::kStarted: {
        const v1::WorkerStarted& started = message.started();
        return supervisor_->WorkerStarted(
            node_id_, session_,
            RunningWorker{started.job_id(), started.attempt_id(), started.rank(), started.pid()});
      }
      case v1::AgentMessage::kExited:
        return supervisor_->WorkerExited(node_id_, session_, FromProto(message.exited()));
      case v1::AgentMessage::kTierNotice:
        return supervisor_->TierNotice(node_id_, session_, message.tier_notice().job_id(),
                                       message.tier_notice().message());
      case v1::AgentMessage::kProgress:
        return AnswerProgress(message.progress());
      case v1::AgentMessage::kLog: {
        const v1::LogData& log = message.log();
        logs_->OnLogData(node_id_, log.request_id(), log.rank(), log.data(), log.done(),
                         log.error());
        return absl::OkStatus();
      }
      case v1::AgentMessage::MSG_NOT_SET:
        return absl::InvalidArgumentError("empty agent message");
    }
    return absl::InvalidArgumentError("unknown agent message");
  }

  absl::Status AnswerProgress(const v1::ProgressBatch& batch) {
    std::vector<ProgressUpdate> updates;
    updates.reserve(batch.reports_size());
    for (const v1::ProgressReport& report : batch.reports()) updates.push_back(FromProto(report));
    std::optional<std::vector<RunningWorker>> running;
    if (batch.has_heartbeat()) {
      running = Running(batch.heartbeat());
      if (batch.heartbeat().omits_reported()) {
        for (const ProgressUpdate& u : updates) {
          running->push_back(RunningWorker{u.job_id, u.attempt_id, u.rank, /*pid=*/0});
        }
      }
    }
    TY_ASSIGN_OR_RETURN(std::vector<absl::StatusOr<OrderReply>> orders,
                        supervisor_->ReportNodeProgress(node_id_, session_, updates,
                                                        running ? &*running : nullptr));
    v1::CoordinatorMessage message;
    v1::ProgressAnswers* answers = message.mutable_progress_answers();
    answers->set_batch_id(batch.batch_id());
    for (int i = 0; i < batch.reports_size(); ++i) {
      if (batch.omit_plain_answers() && orders[i].ok() &&
          orders[i]->order == WorkerOrder::kContinue && orders[i]->checkpoint_step == 0) {
        continue;
      }
      v1::ProgressAnswer* answer = answers->add_answers();
      answer->set_job_id(batch.reports(i).job_id());
      answer->set_attempt_id(batch.reports(i).attempt_id());
      answer->set_rank(batch.reports(i).rank());
      if (orders[i].ok()) {
        ToProto(*orders[i], answer->mutable_reply());
      } else {
        answer->set_code(static_cast<int>(orders[i].status().code()));
        answer->set_message(std::string(orders[i].status().message()));
      }
    }
    writer_->Push(std::move(message));
    return absl::OkStatus();
  }

  absl::Status Register(const v1::RegisterAgent& registration) {
    TY_RETURN_IF_ERROR(MayRegisterNode(caller_, registration.node_id()));
    std::vector<RunningWorker> running;
    for (const v1::RunningWorker& w : registration.running()) running.push_back(FromProto(w));
    std::vector<WorkerExit> exited;
    for (const v1::WorkerExited& e : registration.exited_while_disconnected()) {
      exited.push_back(FromProto(e));
    }
    auto channel = std::make_shared<StreamChannel>(writer_, registration.accepts_start_batches());
    absl::StatusOr<uint64_t> session = supervisor_->AgentConnected(
        FromProto(registration), running, exited, channel, [this](const RegisteredOrder& order) {
          v1::CoordinatorMessage message;
          ToProto(order, &message);
          writer_->Push(std::move(message));
        });
    if (!session.ok()) return session.status();
    node_id_ = registration.node_id();
    session_ = *session;
    return absl::OkStatus();
  }

  Supervisor* const supervisor_;
  LogRouter* const logs_;
  CallExecutor* const executor_;
  std::shared_ptr<Writer> writer_;
  Identity caller_;
  alignas(8) char first_block_[16 << 10];
  google::protobuf::Arena arena_{ArenaOptions(first_block_, sizeof(first_block_))};
  v1::AgentMessage* in_ = nullptr;  // on arena_
  std::string node_id_;
  uint64_t session_ = 0;
};

}  // namespace

grpc::ServerBidiReactor<v1::AgentMessage, v1::CoordinatorMessage>* AgentServiceImpl::Connect(
    grpc::CallbackServerContext* context) {
  return new AgentStream(supervisor_, logs_, executor_, auth_->Agent(*context));
}

}  // namespace trainyard::server
