#include "tests/integration/server_harness.h"

#include "absl/strings/str_cat.h"
#include "common/rpc.h"

namespace trainyard::testenv {

ServerProcess::ServerProcess(const std::string& state_dir,
                             const std::vector<std::string>& extra_flags) {
  const std::string binary = BinaryDir() + "/server/trainyard-server";
  std::vector<std::string> argv = {
      binary,     "--state-dir", state_dir,          "--no-local-agent",
      "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  stderr_path_ = state_dir + ".server.log";
  std::filesystem::create_directories(state_dir);
  std::filesystem::remove(state_dir + "/server.addr");
  process_ = std::make_unique<ChildProcess>(argv, state_dir + ".server.out", stderr_path_);
  address_ = WaitForFileLine(state_dir + "/server.addr", std::chrono::seconds(20));
  if (!address_.empty()) {
    // The tests act as the admin, who may also play agents and workers.
    cluster_address_ = WaitForFileLine(state_dir + "/cluster.addr", std::chrono::seconds(5));
    admin_token_ = rpc::ReadTokenFile(state_dir + "/admin.token").value_or("");
    channel_ = Channel(admin_token_);
  }
}

std::shared_ptr<grpc::Channel> ServerProcess::Channel(const std::string& token) const {
  return *rpc::MakeChannel(address_, rpc::TlsFiles(), grpc::ChannelArguments(), token);
}

std::unique_ptr<v1::JobService::Stub> ServerProcess::JobStub() const {
  return v1::JobService::NewStub(channel_);
}

std::unique_ptr<v1::WorkerService::Stub> ServerProcess::WorkerStub() const {
  return v1::WorkerService::NewStub(channel_);
}

std::unique_ptr<grpc::ClientContext> Deadline(double seconds) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  return context;
}

FakeAgent::FakeAgent(std::shared_ptr<grpc::Channel> channel, const std::string& node_id, int slots,
                     const std::vector<v1::RunningWorker>& running, bool start_batches)
    : node_id_(node_id), stub_(v1::AgentService::NewStub(channel)) {
  stream_ = stub_->Connect(&context_);
  {
    absl::MutexLock lock(&mu_);
    running_ = running;
  }
  v1::AgentMessage hello;
  v1::RegisterAgent* registration = hello.mutable_registration();
  registration->set_node_id(node_id);
  registration->set_hostname(node_id + ".test");
  registration->set_cpu_slots(slots);
  registration->set_agent_version("fake");
  registration->set_accepts_start_batches(start_batches);
  for (const v1::RunningWorker& w : running) *registration->add_running() = w;
  Send(hello);
  reader_ = std::thread([this] { ReadLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

FakeAgent::~FakeAgent() {
  Close();
  context_.TryCancel();
  if (reader_.joinable()) reader_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  stream_->Finish().ok();  // CANCELLED; the status only matters to tests that check it
}

void FakeAgent::Send(const v1::AgentMessage& message) {
  absl::MutexLock lock(&write_mu_);
  stream_->Write(message);
}

void FakeAgent::ReadLoop() {
  v1::CoordinatorMessage message;
  while (stream_->Read(&message)) {
    absl::MutexLock lock(&mu_);
    inbox_.push_back(message);
  }
  absl::MutexLock lock(&mu_);
  ended_ = true;
}

void FakeAgent::HeartbeatLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_ || ended_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(1))) return;
    }
    v1::AgentMessage beat;
    {
      absl::MutexLock lock(&mu_);
      for (const v1::RunningWorker& w : running_) *beat.mutable_heartbeat()->add_running() = w;
    }
    beat.mutable_heartbeat()->set_sent_unix_ms(absl::ToUnixMillis(absl::Now()));
    Send(beat);
  }
}

std::optional<v1::CoordinatorMessage> FakeAgent::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !inbox_.empty() || ended_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (inbox_.empty()) return std::nullopt;
  v1::CoordinatorMessage message = std::move(inbox_.front());
  inbox_.pop_front();
  return message;
}

std::optional<v1::CoordinatorMessage> FakeAgent::NextOf(v1::CoordinatorMessage::MsgCase kind,
                                                        absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::optional<v1::CoordinatorMessage> message = Next(deadline - absl::Now());
    if (!message.has_value()) return std::nullopt;
    if (message->msg_case() == kind) return message;
  }
  return std::nullopt;
}

std::vector<v1::CoordinatorMessage> FakeAgent::Drain(absl::Duration quiet) {
  std::vector<v1::CoordinatorMessage> out;
  while (std::optional<v1::CoordinatorMessage> message = Next(quiet)) out.push_back(*message);
  return out;
}

void FakeAgent::Started(const std::string& job_id, int attempt, int rank, int64_t pid) {
  v1::AgentMessage message;
  v1::WorkerStarted* started = message.mutable_started();
  started->set_job_id(job_id);
  started->set_attempt_id(attempt);
  started->set_rank(rank);
  started->set_pid(pid);
  {
    absl::MutexLock lock(&mu_);
    v1::RunningWorker worker;
    worker.set_job_id(job_id);
    worker.set_attempt_id(attempt);
    worker.set_rank(rank);
    worker.set_pid(pid);
    running_.push_back(worker);
  }
  Send(message);
}

void FakeAgent::Exited(const std::string& job_id, int attempt, int rank, int exit_code, int signal,
                       const std::vector<std::string>& log) {
  int64_t pid = 0;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = running_.begin(); it != running_.end(); ++it) {
      if (it->job_id() == job_id && it->attempt_id() == attempt && it->rank() == rank) {
        pid = it->pid();
        running_.erase(it);
        break;
      }
    }
  }
  v1::AgentMessage message;
  v1::WorkerExited* exited = message.mutable_exited();
  exited->set_job_id(job_id);
  exited->set_attempt_id(attempt);
  v1::RankExit* exit = exited->mutable_exit();
  exit->set_rank(rank);
  exit->set_node_id(node_id_);
  exit->set_exit_code(exit_code);
  exit->set_signal(signal);
  exit->set_pid(pid);
  for (const std::string& line : log) exit->add_last_log_lines(line);
  Send(message);
}

void FakeAgent::SetRunning(const std::vector<v1::RunningWorker>& running) {
  absl::MutexLock lock(&mu_);
  running_ = running;
}

void FakeAgent::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    closing_ = true;
  }
  absl::MutexLock lock(&write_mu_);
  stream_->WritesDone();
}

bool FakeAgent::stream_ended() {
  absl::MutexLock lock(&mu_);
  return ended_;
}

std::string SmallSpec(const std::string& name, int world, int priority) {
  return absl::StrCat("name: ", name, R"(
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 5, warmup_steps: 1, batch: )",
                      2 * world, R"(, seq_len: 16}
parallelism: {dp: )",
                      world, R"(}
resources: {nodes: 1, devices_per_node: )",
                      world, R"(}
fault_tolerance: {max_restarts: 1, heartbeat_timeout_s: 60}
priority: )",
                      priority, "\n");
}

}  // namespace trainyard::testenv
