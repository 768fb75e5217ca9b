#include "server/agent/progress_relay_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "proto/trainyard.grpc.pb.h"

namespace trainyard::server::agent {
namespace {

class Service final : public v1::ProgressRelay::CallbackService {
 public:
  explicit Service(ProgressRelay* relay) : relay_(relay) {}

  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* context,
                                           const v1::ProgressReport* request,
                                           v1::ProgressReply* reply) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    // The call (and `reply`) lives until Finish, also when the worker gave up waiting.
    relay_->Report(*request, rpc::BearerToken(*context).value_or(""),
                   [reactor, reply](absl::StatusOr<v1::ProgressReply> answer) {
                     if (answer.ok()) *reply = *std::move(answer);
                     reactor->Finish(rpc::ToGrpc(answer.status()));
                   });
    return reactor;
  }

 private:
  ProgressRelay* const relay_;
};

class ServerImpl final : public ProgressRelayServer {
 public:
  explicit ServerImpl(ProgressRelay* relay) : service_(relay) {}
  ~ServerImpl() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  absl::Status Listen(int port) {
    grpc::ServerBuilder builder;
    int bound = 0;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &bound);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || bound == 0) {
      return absl::UnavailableError(
          absl::StrCat("progress relay: cannot listen on 127.0.0.1:", port));
    }
    address_ = absl::StrCat("127.0.0.1:", bound);
    return absl::OkStatus();
  }

  std::string address() const override { return address_; }

 private:
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ProgressRelayServer>> ProgressRelayServer::Start(
    ProgressRelay* relay, int port) {
  auto server = std::make_unique<ServerImpl>(relay);
  if (absl::Status status = server->Listen(port); !status.ok()) return status;
  return server;
}

}  // namespace trainyard::server::agent
