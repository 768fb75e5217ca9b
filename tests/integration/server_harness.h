// Helpers for integration tests that talk to a real trainyard-server over gRPC: start one (as a
// child process, on loopback, in a scratch state directory), and a FakeAgent that plays a node
// agent over AgentService.Connect so that the coordinator's behaviour can be checked message by
// message without real workers.
#ifndef TRAINYARD_TESTS_INTEGRATION_SERVER_HARNESS_H_
#define TRAINYARD_TESTS_INTEGRATION_SERVER_HARNESS_H_

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/trainyard.grpc.pb.h"
#include "tests/integration/child_process.h"
#include "tests/integration/test_env.h"

namespace trainyard::testenv {

namespace v1 = ::trainyard::v1;

// A trainyard-server child without a local agent. Its address is read from server.addr.
class ServerProcess {
 public:
  ServerProcess(const std::string& state_dir, const std::vector<std::string>& extra_flags = {});
  ~ServerProcess() = default;

  bool ok() const { return !address_.empty(); }
  const std::string& address() const { return address_; }
  // The agents' and workers' listener (--cluster-listen); workers are told this address.
  const std::string& cluster_address() const { return cluster_address_; }
  ChildProcess& process() { return *process_; }
  std::string log() const { return ReadWholeFile(stderr_path_); }

  std::unique_ptr<v1::JobService::Stub> JobStub() const;
  std::unique_ptr<v1::WorkerService::Stub> WorkerStub() const;
  // A channel presenting the admin token (admin_token()), which every service accepts.
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  const std::string& admin_token() const { return admin_token_; }
  // A new channel presenting `token` ("": no credentials).
  std::shared_ptr<grpc::Channel> Channel(const std::string& token) const;

 private:
  std::string stderr_path_;
  std::unique_ptr<ChildProcess> process_;
  std::string address_;
  std::string cluster_address_;
  std::string admin_token_;
  std::shared_ptr<grpc::Channel> channel_;
};

// A context with a deadline `seconds` from now.
std::unique_ptr<grpc::ClientContext> Deadline(double seconds);

// Plays a node agent: registers on construction, heartbeats every second with the workers set by
// SetRunning, and queues what the coordinator sends.
class FakeAgent {
 public:
  // `start_batches`: registers accepts_start_batches (start orders may come as StartWorkers).
  FakeAgent(std::shared_ptr<grpc::Channel> channel, const std::string& node_id, int slots,
            const std::vector<v1::RunningWorker>& running = {}, bool start_batches = false);
  ~FakeAgent();

  // The coordinator's next message, waiting up to `timeout`.
  std::optional<v1::CoordinatorMessage> Next(absl::Duration timeout = absl::Seconds(10));
  // Skips messages until one of `kind` arrives (or `timeout`).
  std::optional<v1::CoordinatorMessage> NextOf(v1::CoordinatorMessage::MsgCase kind,
                                               absl::Duration timeout = absl::Seconds(10));
  // No message arrives for `quiet`; returns what arrived otherwise.
  std::vector<v1::CoordinatorMessage> Drain(absl::Duration quiet);

  void Send(const v1::AgentMessage& message);
  void Started(const std::string& job_id, int attempt, int rank, int64_t pid);
  void Exited(const std::string& job_id, int attempt, int rank, int exit_code, int signal,
              const std::vector<std::string>& log = {});
  void SetRunning(const std::vector<v1::RunningWorker>& running);
  // Ends the stream from the agent's side.
  void Close();
  bool stream_ended();

 private:
  void ReadLoop();
  void HeartbeatLoop();

  std::string node_id_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>> stream_;
  absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RunningWorker> running_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex write_mu_;
  std::thread reader_;
  std::thread heartbeat_;
};

// The spec of a small CPU job of `world` data-parallel ranks on one node.
std::string SmallSpec(const std::string& name, int world = 2, int priority = 0);

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_SERVER_HARNESS_H_
