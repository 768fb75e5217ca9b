#include "server/worker_service.h"

#include <algorithm>
#include <optional>
#include <string>

#include "common/status.h"
#include "server/convert.h"

namespace trainyard::server {

absl::Status WorkerServiceImpl::MayUseKey(const grpc::ServerContextBase& context,
                                          const std::string& key) const {
  TY_ASSIGN_OR_RETURN(const auto attempt, KvSpace::AttemptOf(key));
  return auth_->Worker(context, attempt.first, attempt.second);
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Join(grpc::CallbackServerContext* context,
                                                  const v1::JoinRequest* request,
                                                  v1::JoinReply* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status allowed = auth_->Worker(*context, request->job_id(), request->attempt_id());
      !allowed.ok()) {
    reactor->Finish(ToGrpc(allowed));
    return reactor;
  }
  // The last rank's Join stores the attempt's start: it may wait for the store.
  executor_->Run([this, context, request, reply, reactor] {
    supervisor_->Join(request->job_id(), request->attempt_id(), request->rank(),
                      FromDeadline(context->deadline()),
                      [reactor, reply](absl::StatusOr<JoinInfo> info) {
                        if (info.ok()) ToProto(*info, reply);
                        reactor->Finish(ToGrpc(info.status()));
                      });
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvSet(grpc::CallbackServerContext* context,
                                                   const v1::KvSetRequest* request,
                                                   v1::KvSetReply* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status allowed = MayUseKey(*context, request->key()); !allowed.ok()) {
    reactor->Finish(ToGrpc(allowed));
    return reactor;
  }
  reactor->Finish(ToGrpc(kv_->Set(request->key(), request->value())));
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvGet(grpc::CallbackServerContext* context,
                                                   const v1::KvGetRequest* request,
                                                   v1::KvGetReply* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status allowed = MayUseKey(*context, request->key()); !allowed.ok()) {
    reactor->Finish(ToGrpc(allowed));
    return reactor;
  }
  if (request->wait_ms() < 0) {
    reactor->Finish(ToGrpc(absl::InvalidArgumentError("wait_ms must not be negative")));
    return reactor;
  }
  const absl::Duration wait = std::min(absl::Milliseconds(request->wait_ms()), kMaxKvWait);
  const absl::Time deadline = std::min(clock_->Now() + wait, FromDeadline(context->deadline()));
  kv_->Get(request->key(), deadline,
           [reactor, reply](absl::StatusOr<std::optional<std::string>> value) {
             if (value.ok() && value->has_value()) {
               reply->set_found(true);
               reply->set_value(std::move(**value));
             }
             reactor->Finish(ToGrpc(value.status()));
           });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportProgress(grpc::CallbackServerContext* context,
                                                            const v1::ProgressReport* request,
                                                            v1::ProgressReply* reply) {
  return AnswerFrom(executor_, context, [this, context, request, reply]() -> absl::Status {
    TY_RETURN_IF_ERROR(auth_->Worker(*context, request->job_id(), request->attempt_id()));
    TY_ASSIGN_OR_RETURN(const OrderReply order, supervisor_->ReportProgress(FromProto(*request)));
    ToProto(order, reply);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportHang(grpc::CallbackServerContext* context,
                                                        const v1::HangReport* request,
                                                        v1::HangReply* /*reply*/) {
  return AnswerFrom(executor_, context, [this, context, request]() -> absl::Status {
    TY_RETURN_IF_ERROR(auth_->Worker(*context, request->job_id(), request->attempt_id()));
    return supervisor_->ReportHang(FromProto(*request));
  });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ConfirmAttempt(
    grpc::CallbackServerContext* context, const v1::ConfirmAttemptRequest* request,
    v1::ConfirmAttemptReply* /*reply*/) {
  return AnswerFrom(executor_, context, [this, context, request]() -> absl::Status {
    TY_RETURN_IF_ERROR(auth_->Worker(*context, request->job_id(), request->attempt_id()));
    return supervisor_->ConfirmAttempt(request->job_id(), request->attempt_id(), request->rank());
  });
}

}  // namespace trainyard::server
