#include "server/worker_service.h"

#include <algorithm>
#include <optional>
#include <string>

#include "server/convert.h"

namespace trainyard::server {
namespace {

v1::Order ToProto(WorkerOrder order) {
  switch (order) {
    case WorkerOrder::kContinue:
      return v1::ORDER_CONTINUE;
    case WorkerOrder::kCheckpoint:
      return v1::ORDER_CHECKPOINT;
    case WorkerOrder::kDrain:
      return v1::ORDER_DRAIN;
    case WorkerOrder::kStop:
      return v1::ORDER_STOP;
  }
  return v1::ORDER_CONTINUE;
}

}  // namespace

grpc::ServerUnaryReactor* WorkerServiceImpl::Join(grpc::CallbackServerContext* context,
                                                  const v1::JoinRequest* request,
                                                  v1::JoinReply* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  supervisor_->Join(request->job_id(), request->attempt_id(), request->rank(),
                    FromDeadline(context->deadline()),
                    [reactor, reply](absl::StatusOr<JoinInfo> info) {
                      if (info.ok()) ToProto(*info, reply);
                      reactor->Finish(ToGrpc(info.status()));
                    });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvSet(grpc::CallbackServerContext* context,
                                                   const v1::KvSetRequest* request,
                                                   v1::KvSetReply* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(kv_->Set(request->key(), request->value())));
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvGet(grpc::CallbackServerContext* context,
                                                   const v1::KvGetRequest* request,
                                                   v1::KvGetReply* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
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
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<OrderReply> order = supervisor_->ReportProgress(FromProto(*request));
  if (order.ok()) {
    reply->set_order(ToProto(order->order));
    reply->set_checkpoint_step(order->checkpoint_step);
  }
  reactor->Finish(ToGrpc(order.status()));
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportHang(grpc::CallbackServerContext* context,
                                                        const v1::HangReport* request,
                                                        v1::HangReply* /*reply*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(supervisor_->ReportHang(FromProto(*request))));
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ConfirmAttempt(
    grpc::CallbackServerContext* context, const v1::ConfirmAttemptRequest* request,
    v1::ConfirmAttemptReply* /*reply*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(
      supervisor_->ConfirmAttempt(request->job_id(), request->attempt_id(), request->rank())));
  return reactor;
}

}  // namespace trainyard::server
