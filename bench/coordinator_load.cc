// Coordinator load benchmark: one process simulates a cluster against a real trainyard-server
// (started here as a child on loopback) and measures how the coordinator copes.
//
//   - N agents (default 1,000) on AgentService.Connect streams, each offering S CPU slots
//     (default 10), heartbeating at 1 Hz with the list of workers they run, and answering
//     StartWorker orders with WorkerStarted;
//   - N*S/R jobs of R ranks each (default 1,000 jobs of 10 ranks), so every slot is busy;
//   - every rank (default 10,000) joins the rendezvous, then reports its progress at 1 Hz: with
//     --progress relay (the default) as the agents' progress relays send them, each agent one
//     ProgressBatch of its ranks' reports per second on its Connect stream, the agents staggered
//     evenly over the second; with --progress direct each rank calls WorkerService.ReportProgress
//     itself, the ranks staggered;
//   - a probe calls GetJob at 10 Hz, as a user's CLI would.
//
// After the set-up, it measures for --seconds (default 30): the latency of every report (client-
// side, from sending the call or batch to its answer) and GetJob call, the coordinator's CPU time
// from /proc/<pid>/stat and its resident memory from /proc/<pid>/status. It prints a Markdown
// table.
//
// Usage: trainyard-bench-coordinator [--server-binary PATH] [--agents N] [--slots S]
//          [--ranks-per-job R] [--seconds T] [--channels C] [--submitters N]
//          [--progress relay|direct]
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "proto/trainyard.grpc.pb.h"

namespace trainyard::bench {
namespace {

namespace v1 = ::trainyard::v1;

struct Options {
  std::string server_binary;
  int agents = 1000;
  int slots = 10;
  int ranks_per_job = 10;
  double seconds = 30;
  int channels = 32;    // connections the simulated agents and ranks share
  int submitters = 16;  // client threads submitting the jobs concurrently
  std::string dump;     // CSV of every measured report: send time (ms into the window), ms
  bool relay = true;    // --progress relay (batches on the agents' streams) or direct
};

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
    const std::string value = argv[++i];
    bool ok = true;
    if (arg == "--server-binary") {
      options.server_binary = value;
    } else if (arg == "--agents") {
      ok = absl::SimpleAtoi(value, &options.agents) && options.agents > 0;
    } else if (arg == "--slots") {
      ok = absl::SimpleAtoi(value, &options.slots) && options.slots > 0;
    } else if (arg == "--ranks-per-job") {
      ok = absl::SimpleAtoi(value, &options.ranks_per_job) && options.ranks_per_job > 0;
    } else if (arg == "--seconds") {
      ok = absl::SimpleAtod(value, &options.seconds) && options.seconds > 0;
    } else if (arg == "--progress") {
      ok = value == "relay" || value == "direct";
      options.relay = value == "relay";
    } else if (arg == "--dump") {
      options.dump = value;
    } else if (arg == "--submitters") {
      ok = absl::SimpleAtoi(value, &options.submitters) && options.submitters > 0;
    } else if (arg == "--channels") {
      ok = absl::SimpleAtoi(value, &options.channels) && options.channels > 0;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("bad value for ", arg, ": ", value));
  }
  if (options.slots % options.ranks_per_job != 0) {
    return absl::InvalidArgumentError("--ranks-per-job must divide --slots");
  }
  if (options.server_binary.empty()) {
    // Beside this binary's build folder: <build>/bench/.. -> <build>/server/trainyard-server.
    options.server_binary =
        (std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "server" /
         "trainyard-server")
            .string();
  }
  return options;
}

// --- The coordinator process ---------------------------------------------------------------

struct ProcessSample {
  double cpu_seconds = 0;  // user + system
  double rss_mb = 0;
  double peak_rss_mb = 0;
};

ProcessSample Sample(pid_t pid) {
  ProcessSample sample;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the command (which may hold spaces) start after the last ')'.
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::vector<std::string> values;
  for (std::string field; fields >> field;) values.push_back(field);
  if (values.size() > 13) {
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    sample.cpu_seconds = (std::stod(values[11]) + std::stod(values[12])) / ticks;  // utime, stime
  }
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    double kb = 0;
    if (line.rfind("VmRSS:", 0) == 0 && absl::SimpleAtod(line.substr(6, line.size() - 9), &kb)) {
      sample.rss_mb = kb / 1024;
    }
    if (line.rfind("VmHWM:", 0) == 0 && absl::SimpleAtod(line.substr(6, line.size() - 9), &kb)) {
      sample.peak_rss_mb = kb / 1024;
    }
  }
  return sample;
}

class ServerChild {
 public:
  absl::Status Start(const std::string& binary, const std::string& state_dir) {
    state_dir_ = state_dir;
    const std::vector<std::string> argv = {binary,
                                           "--no-local-agent",
                                           "--state-dir",
                                           state_dir,
                                           "--listen",
                                           "127.0.0.1:0",
                                           "--metrics-listen",
                                           "off",
                                           "--heartbeat-timeout",
                                           "60",
                                           "--log-level",
                                           "warning"};
    // Its banner stays out of the table.
    TY_ASSIGN_OR_RETURN(pid_, Spawn({.argv = argv, .stdout_path = "/dev/null"}));
    for (int i = 0; i < 500; ++i) {
      std::ifstream in(state_dir + "/server.addr");
      if (std::getline(in, address_) && !address_.empty()) {
        // Written before server.addr: the agents' and workers' listener.
        std::getline(std::ifstream(state_dir + "/cluster.addr"), cluster_address_);
        return absl::OkStatus();
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::UnavailableError(absl::StrCat(binary, " exited at start"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return absl::DeadlineExceededError("the coordinator did not write server.addr");
  }
  ~ServerChild() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 500 && waitpid(pid_, &status, WNOHANG) != pid_; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      kill(-pid_, SIGKILL);
      waitpid(pid_, &status, WNOHANG);
    }
  }
  pid_t pid() const { return pid_; }
  const std::string& address() const { return address_; }
  const std::string& cluster_address() const { return cluster_address_; }

 private:
  pid_t pid_ = -1;
  std::string address_;
  std::string cluster_address_;
  std::string state_dir_;
};

// --- Latency recording ---------------------------------------------------------------------

class Latencies {
 public:
  void Add(absl::Time sent, double ms) {
    absl::MutexLock lock(&mu_);
    if (!recording_) return;
    samples_.push_back(static_cast<float>(ms));
    sent_.push_back(static_cast<float>(absl::ToDoubleMilliseconds(sent - start_)));
  }
  void Error() { errors_.fetch_add(1); }
  void SetRecording(bool on) {
    absl::MutexLock lock(&mu_);
    recording_ = on;
    if (on) start_ = absl::Now();
  }
  void Dump(const std::string& path) {
    absl::MutexLock lock(&mu_);
    std::ofstream out(path);
    out << "sent_ms,latency_ms\n";
    for (size_t i = 0; i < samples_.size(); ++i) out << sent_[i] << "," << samples_[i] << "\n";
  }
  // The 99th percentile of each whole second of the recording, in order.
  std::vector<double> PerSecondP99() {
    absl::MutexLock lock(&mu_);
    std::vector<std::vector<float>> seconds;
    for (size_t i = 0; i < samples_.size(); ++i) {
      if (sent_[i] < 0) continue;
      const size_t second = static_cast<size_t>(sent_[i] / 1000);
      if (second >= seconds.size()) seconds.resize(second + 1);
      seconds[second].push_back(samples_[i]);
    }
    std::vector<double> out;
    for (std::vector<float>& s : seconds) {
      if (s.empty()) continue;
      std::sort(s.begin(), s.end());
      out.push_back(s[std::min(s.size() - 1, static_cast<size_t>(0.99 * s.size()))]);
    }
    return out;
  }
  std::vector<float> Sorted() {
    absl::MutexLock lock(&mu_);
    std::vector<float> copy = samples_;
    std::sort(copy.begin(), copy.end());
    return copy;
  }
  int64_t errors() const { return errors_.load(); }

 private:
  absl::Mutex mu_;
  bool recording_ = false;
  std::vector<float> samples_;
  std::vector<float> sent_;
  absl::Time start_;
  std::atomic<int64_t> errors_{0};
};

double Percentile(const std::vector<float>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t index = std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()));
  return sorted[index];
}

// Every call presents a credential (rpc::AddBearer): the coordinator's admin token (its state
// directory's admin.token) for agents and clients, each attempt's secret for its ranks.
// The attempt secret of each job's first attempt, from the agents' StartWorker orders.
struct Secrets {
  absl::Mutex mu;
  std::map<std::string, std::string> by_job ABSL_GUARDED_BY(mu);
};

// --- Simulated agents ----------------------------------------------------------------------

class SimAgent : public grpc::ClientBidiReactor<v1::AgentMessage, v1::CoordinatorMessage> {
 public:
  SimAgent(v1::AgentService::Stub* stub, const std::string& node_id, int slots,
           const std::string& token, Secrets* secrets, std::atomic<int>* registered,
           std::atomic<int>* started, Latencies* progress)
      : secrets_(secrets), registered_(registered), started_(started), progress_(progress) {
    rpc::AddBearer(context_, token);
    stub->async()->Connect(&context_, this);
    v1::AgentMessage hello;
    hello.mutable_registration()->set_node_id(node_id);
    hello.mutable_registration()->set_hostname(node_id);
    hello.mutable_registration()->set_cpu_slots(slots);
    hello.mutable_registration()->set_agent_version("bench");
    StartRead(&in_);
    Enqueue(std::move(hello));
    StartCall();
  }

  void Heartbeat() {
    v1::AgentMessage beat;
    beat.mutable_heartbeat()->set_sent_unix_ms(absl::ToUnixMillis(absl::Now()));
    {
      absl::MutexLock lock(&mu_);
      for (const v1::RunningWorker& w : running_) *beat.mutable_heartbeat()->add_running() = w;
    }
    Enqueue(std::move(beat));
    heartbeats_.fetch_add(1);
  }

  // What the agent's progress relay sends: one report per rank it runs, in one batch.
  void ReportBatch() {
    v1::AgentMessage message;
    v1::ProgressBatch* batch = message.mutable_progress();
    {
      absl::MutexLock lock(&mu_);
      batch->set_batch_id(++batch_id_);
      sent_[batch_id_] = absl::Now();
      ++step_;
      for (const v1::RunningWorker& w : running_) {
        v1::ProgressReport* report = batch->add_reports();
        report->set_job_id(w.job_id());
        report->set_attempt_id(w.attempt_id());
        report->set_rank(w.rank());
        report->set_step(step_);
        report->set_total_steps(1000000);
        report->set_loss(5.0 / (1.0 + 0.01 * static_cast<double>(step_)));
        report->set_tokens_per_second(20000);
        report->mutable_step_times()->set_total_ms(1000);
      }
    }
    batches_.fetch_add(1);
    Enqueue(std::move(message));
  }

  void Cancel() { context_.TryCancel(); }
  void WaitDone() { done_.WaitForNotification(); }
  int64_t heartbeats() const { return heartbeats_.load(); }
  int64_t batches() const { return batches_.load(); }
  bool ended_early() const { return ended_early_.load(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (in_.has_registered()) registered_->fetch_add(1);
    if (in_.has_progress_answers()) Answered(in_.progress_answers());
    if (in_.has_start()) {
      const v1::StartWorker& start = in_.start();
      {
        absl::MutexLock lock(&secrets_->mu);
        secrets_->by_job[start.job_id()] = start.attempt_secret();
      }
      v1::RunningWorker worker;
      worker.set_job_id(start.job_id());
      worker.set_attempt_id(start.attempt_id());
      worker.set_rank(start.rank());
      worker.set_pid(100000 + start.rank());
      {
        absl::MutexLock lock(&mu_);
        running_.push_back(worker);
      }
      v1::AgentMessage message;
      v1::WorkerStarted* started = message.mutable_started();
      started->set_job_id(start.job_id());
      started->set_attempt_id(start.attempt_id());
      started->set_rank(start.rank());
      started->set_pid(worker.pid());
      Enqueue(std::move(message));
      started_->fetch_add(1);
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) return;
    PumpLocked();
  }

  void OnDone(const grpc::Status& status) override {
    if (status.error_code() != grpc::StatusCode::CANCELLED) ended_early_ = true;
    done_.Notify();
  }

 private:
  void Answered(const v1::ProgressAnswers& answers) {
    absl::Time sent;
    {
      absl::MutexLock lock(&mu_);
      auto it = sent_.find(answers.batch_id());
      if (it == sent_.end()) return;
      sent = it->second;
      sent_.erase(it);
    }
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - sent);
    for (const v1::ProgressAnswer& answer : answers.answers()) {
      if (answer.code() == 0) {
        progress_->Add(sent, ms);
      } else {
        progress_->Error();
      }
    }
  }

  void Enqueue(v1::AgentMessage message) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(message));
    PumpLocked();
  }
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || queue_.empty()) return;
    current_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    StartWrite(&current_);
  }

  grpc::ClientContext context_;
  v1::CoordinatorMessage in_;
  absl::Mutex mu_;
  std::deque<v1::AgentMessage> queue_ ABSL_GUARDED_BY(mu_);
  v1::AgentMessage current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::RunningWorker> running_ ABSL_GUARDED_BY(mu_);
  Secrets* secrets_;
  std::atomic<int>* registered_;
  std::atomic<int>* started_;
  Latencies* progress_;
  int64_t batch_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, absl::Time> sent_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> batches_{0};
  std::atomic<int64_t> heartbeats_{0};
  std::atomic<bool> ended_early_{false};
  absl::Notification done_;
};

// --- Simulated ranks -----------------------------------------------------------------------

struct Rank {
  std::string job_id;
  int rank = 0;
  int64_t step = 0;
  std::string secret;  // its attempt's
};

void ReportProgress(v1::WorkerService::Stub* stub, Rank& rank, Latencies* latencies,
                    std::atomic<int64_t>* in_flight) {
  struct Call {
    grpc::ClientContext context;
    v1::ProgressReport request;
    v1::ProgressReply reply;
    absl::Time sent;
  };
  auto* call = new Call();
  call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  rpc::AddBearer(call->context, rank.secret);
  call->request.set_job_id(rank.job_id);
  call->request.set_attempt_id(1);
  call->request.set_rank(rank.rank);
  call->request.set_step(++rank.step);
  call->request.set_total_steps(1000000);
  call->request.set_loss(5.0 / (1.0 + 0.01 * rank.step));
  call->request.set_tokens_per_second(20000);
  call->request.mutable_step_times()->set_total_ms(1000);
  call->sent = absl::Now();
  in_flight->fetch_add(1);
  stub->async()->ReportProgress(
      &call->context, &call->request, &call->reply,
      [call, latencies, in_flight](grpc::Status status) {
        if (status.ok()) {
          latencies->Add(call->sent, absl::ToDoubleMilliseconds(absl::Now() - call->sent));
        } else {
          latencies->Error();
        }
        in_flight->fetch_sub(1);
        delete call;
      });
}

std::string JobSpec(int index, int ranks) {
  return absl::StrFormat(
      "name: load-%d\nmodel: {preset: gpt2-debug}\ndata: {source: markov}\n"
      "training: {steps: 1000000, warmup_steps: 1, batch: %d, seq_len: 16}\n"
      "parallelism: {dp: %d}\nresources: {nodes: 1, devices_per_node: %d}\n"
      "fault_tolerance: {heartbeat_timeout_s: 120}\nlabels: {bench: coordinator-load}\n",
      index, 2 * ranks, ranks, ranks);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int index) {
  grpc::ChannelArguments args;
  args.SetInt("trainyard.bench.channel", index);  // distinct args: distinct connections
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// Calls fn(i) for i in [0, count) once per second each, spread evenly over the second, until
// `stop`. Wakes every 2 ms and sends what has come due, rather than sleeping per call.
template <typename Fn>
void PacedLoop(int64_t count, const std::atomic<bool>& stop, Fn fn) {
  const absl::Time start = absl::Now();
  int64_t sent = 0;
  while (!stop.load()) {
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
    const int64_t due = static_cast<int64_t>(elapsed * static_cast<double>(count));
    for (; sent < due && !stop.load(); ++sent) fn(sent % count);
    absl::SleepFor(absl::Milliseconds(2));
  }
}

template <typename Predicate>
bool WaitFor(Predicate done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

absl::Status Run(const Options& options) {
  const std::string state_dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainyard-load-", getpid())).string();
  std::filesystem::remove_all(state_dir);
  ServerChild server;
  absl::Status started = server.Start(options.server_binary, state_dir);
  if (!started.ok()) return started;
  std::string admin_token;
  std::getline(std::ifstream(state_dir + "/admin.token"), admin_token);
  if (admin_token.empty()) return absl::FailedPreconditionError("the server wrote no admin token");
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  // Agents and ranks on the cluster listener, as deployments run them; the probe and the
  // submissions on the clients' one.
  for (int i = 0; i < options.channels; ++i) {
    channels.push_back(MakeChannel(server.cluster_address(), i));
  }
  std::vector<std::unique_ptr<v1::AgentService::Stub>> agent_stubs;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> worker_stubs;
  for (const auto& channel : channels) {
    agent_stubs.push_back(v1::AgentService::NewStub(channel));
    worker_stubs.push_back(v1::WorkerService::NewStub(channel));
  }
  auto job_stub = v1::JobService::NewStub(MakeChannel(server.address(), options.channels));

  const int jobs = options.agents * options.slots / options.ranks_per_job;
  const int ranks_total = jobs * options.ranks_per_job;
  std::cerr << "coordinator pid " << server.pid() << " at " << server.address() << "; "
            << options.agents << " agents, " << jobs << " jobs, " << ranks_total << " ranks\n";

  Latencies progress;
  Latencies probe;

  // 1. Agents register.
  const absl::Time t0 = absl::Now();
  std::atomic<int> registered{0};
  std::atomic<int> workers_started{0};
  Secrets secrets;
  std::vector<std::unique_ptr<SimAgent>> agents;
  for (int i = 0; i < options.agents; ++i) {
    agents.push_back(std::make_unique<SimAgent>(
        agent_stubs[i % agent_stubs.size()].get(), absl::StrFormat("node-%04d", i), options.slots,
        admin_token, &secrets, &registered, &workers_started, &progress));
  }
  if (!WaitFor([&] { return registered.load() == options.agents; }, absl::Seconds(120))) {
    return absl::DeadlineExceededError(
        absl::StrCat("only ", registered.load(), " agents registered"));
  }
  const absl::Duration register_time = absl::Now() - t0;

  // Heartbeats start now and run until the end, staggered over each second.
  std::atomic<bool> stop{false};
  std::thread heartbeats(
      [&] { PacedLoop(options.agents, stop, [&](int64_t i) { agents[i]->Heartbeat(); }); });

  // 2. Jobs are submitted (--submitters client threads) and placed; agents answer every
  // StartWorker.
  const absl::Time t1 = absl::Now();
  std::vector<std::string> job_ids(jobs);
  std::atomic<int> submit_errors{0};
  {
    std::vector<std::thread> submitters;
    for (int t = 0; t < options.submitters; ++t) {
      submitters.emplace_back([&, t] {
        for (int j = t; j < jobs; j += options.submitters) {
          v1::SubmitJobRequest request;
          request.set_spec_yaml(JobSpec(j, options.ranks_per_job));
          request.set_user("bench");
          v1::SubmitJobReply reply;
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
          rpc::AddBearer(context, admin_token);
          if (job_stub->SubmitJob(&context, request, &reply).ok()) {
            job_ids[j] = reply.job().id();
          } else {
            submit_errors.fetch_add(1);
          }
        }
      });
    }
    for (std::thread& t : submitters) t.join();
  }
  if (submit_errors.load() > 0) {
    return absl::InternalError(absl::StrCat(submit_errors.load(), " submissions failed"));
  }
  const absl::Duration submit_time = absl::Now() - t1;
  if (!WaitFor([&] { return workers_started.load() == ranks_total; }, absl::Seconds(120))) {
    return absl::DeadlineExceededError(
        absl::StrCat("only ", workers_started.load(), " workers were started"));
  }
  const absl::Duration place_time = absl::Now() - t1;

  // 3. Every rank joins its rendezvous.
  const absl::Time t2 = absl::Now();
  std::vector<Rank> ranks;
  for (const std::string& id : job_ids) {
    absl::MutexLock lock(&secrets.mu);
    for (int r = 0; r < options.ranks_per_job; ++r) {
      ranks.push_back(Rank{id, r, 0, secrets.by_job[id]});
    }
  }
  std::atomic<int> joined{0};
  std::atomic<int> join_errors{0};
  for (size_t i = 0; i < ranks.size(); ++i) {
    struct Call {
      grpc::ClientContext context;
      v1::JoinRequest request;
      v1::JoinReply reply;
    };
    auto* call = new Call();
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    rpc::AddBearer(call->context, ranks[i].secret);
    call->request.set_job_id(ranks[i].job_id);
    call->request.set_attempt_id(1);
    call->request.set_rank(ranks[i].rank);
    worker_stubs[i % worker_stubs.size()]->async()->Join(
        &call->context, &call->request, &call->reply,
        [call, &joined, &join_errors](grpc::Status s) {
          (s.ok() ? joined : join_errors).fetch_add(1);
          delete call;
        });
  }
  if (!WaitFor([&] { return joined.load() + join_errors.load() == ranks_total; },
               absl::Seconds(180))) {
    return absl::DeadlineExceededError(absl::StrCat("only ", joined.load(), " ranks joined"));
  }
  if (join_errors.load() > 0) {
    return absl::InternalError(absl::StrCat(join_errors.load(), " joins failed"));
  }
  const absl::Duration join_time = absl::Now() - t2;

  // 4. Steady state: every rank reports at 1 Hz (staggered, or its agent's batches staggered),
  // a probe reads a job at 10 Hz.
  std::atomic<int64_t> in_flight{0};
  std::thread reporters([&] {
    if (options.relay) {
      PacedLoop(options.agents, stop, [&](int64_t i) { agents[i]->ReportBatch(); });
      return;
    }
    PacedLoop(static_cast<int64_t>(ranks.size()), stop, [&](int64_t i) {
      ReportProgress(worker_stubs[i % worker_stubs.size()].get(), ranks[i], &progress, &in_flight);
    });
  });
  std::thread prober([&] {
    for (int64_t n = 0; !stop.load(); ++n) {
      v1::GetJobRequest request;
      request.set_job_id(job_ids[n % job_ids.size()]);
      request.set_max_events(10);
      v1::GetJobReply reply;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      rpc::AddBearer(context, admin_token);
      const absl::Time sent = absl::Now();
      if (job_stub->GetJob(&context, request, &reply).ok()) {
        probe.Add(sent, absl::ToDoubleMilliseconds(absl::Now() - sent));
      } else {
        probe.Error();
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  });

  absl::SleepFor(absl::Seconds(3));  // let the report rhythm settle
  progress.SetRecording(true);
  probe.SetRecording(true);
  const ProcessSample before = Sample(server.pid());
  const ProcessSample self_before = Sample(getpid());
  const absl::Time window_start = absl::Now();
  const int64_t heartbeats_before = [&] {
    int64_t n = 0;
    for (const auto& a : agents) n += a->heartbeats();
    return n;
  }();
  const int64_t batches_before = [&] {
    int64_t n = 0;
    for (const auto& a : agents) n += a->batches();
    return n;
  }();
  absl::SleepFor(absl::Seconds(options.seconds));
  const ProcessSample after = Sample(server.pid());
  const ProcessSample self_after = Sample(getpid());
  const absl::Duration window = absl::Now() - window_start;
  progress.SetRecording(false);
  probe.SetRecording(false);
  int64_t heartbeats_after = 0, batches_after = 0;
  for (const auto& a : agents) heartbeats_after += a->heartbeats();
  for (const auto& a : agents) batches_after += a->batches();
  stop = true;
  reporters.join();
  prober.join();
  heartbeats.join();
  WaitFor([&] { return in_flight.load() == 0; }, absl::Seconds(10));
  int agents_lost = 0;
  for (auto& agent : agents) agents_lost += agent->ended_early();
  for (auto& agent : agents) agent->Cancel();
  for (auto& agent : agents) agent->WaitDone();

  if (!options.dump.empty()) progress.Dump(options.dump);
  const std::vector<float> p = progress.Sorted();
  const std::vector<float> g = probe.Sorted();
  const double seconds = absl::ToDoubleSeconds(window);
  const double cpu = 100.0 * (after.cpu_seconds - before.cpu_seconds) / seconds;
  const double load_cpu = 100.0 * (self_after.cpu_seconds - self_before.cpu_seconds) / seconds;
  const std::vector<double> per_second = progress.PerSecondP99();
  const int quiet_seconds = static_cast<int>(
      std::count_if(per_second.begin(), per_second.end(), [](double p) { return p < 50; }));
  std::vector<double> sorted_seconds = per_second;
  std::sort(sorted_seconds.begin(), sorted_seconds.end());
  const double median_second_p99 =
      sorted_seconds.empty() ? 0 : sorted_seconds[sorted_seconds.size() / 2];
  std::cout << absl::StrFormat(
      "| metric | value |\n|---|---:|\n"
      "| simulated agents (1 Hz heartbeats, %d workers each) | %d |\n"
      "| simulated ranks (1 Hz progress reports) / jobs | %d / %d |\n"
      "| reports sent as | %s |\n"
      "| set-up: agents registered / jobs submitted / all ranks started / all joined | "
      "%.1f s / %.1f s / %.1f s / %.1f s |\n"
      "| submissions accepted per second (%d client threads) | %.0f |\n"
      "| measured window | %.1f s |\n"
      "| heartbeats received per second | %.0f |\n"
      "| reports answered per second (errors); messages per second carrying them | %.0f (%d); %.0f "
      "|\n"
      "| report latency p50 / p99 / max | %.2f / %.2f / %.2f ms |\n"
      "| seconds whose report p99 < 50 ms; median per-second p99 | %d of %d; %.2f ms |\n"
      "| GetJob probe at 10 Hz: p50 / p99 / max (errors) | %.2f / %.2f / %.2f ms (%d) |\n"
      "| coordinator CPU (user+sys over the window) | %.1f%% of one core |\n"
      "| load generator CPU (same window, same machine) | %.1f%% of one core |\n"
      "| coordinator RSS at the end / peak | %.0f MiB / %.0f MiB |\n"
      "| agent streams ended by the coordinator | %d |\n",
      options.slots, options.agents, ranks_total, jobs,
      options.relay ? "one ProgressBatch per agent per second (relay)"
                    : "one WorkerService.ReportProgress call per rank (direct)",
      absl::ToDoubleSeconds(register_time), absl::ToDoubleSeconds(submit_time),
      absl::ToDoubleSeconds(place_time), absl::ToDoubleSeconds(join_time), options.submitters,
      jobs / std::max(absl::ToDoubleSeconds(submit_time), 1e-9), seconds,
      (heartbeats_after - heartbeats_before) / seconds, p.size() / seconds,
      static_cast<int>(progress.errors()),
      options.relay ? (batches_after - batches_before) / seconds : p.size() / seconds,
      Percentile(p, 0.5), Percentile(p, 0.99), p.empty() ? 0.0 : p.back(), quiet_seconds,
      static_cast<int>(per_second.size()), median_second_p99, Percentile(g, 0.5),
      Percentile(g, 0.99), g.empty() ? 0.0 : g.back(), static_cast<int>(probe.errors()), cpu,
      load_cpu, after.rss_mb, after.peak_rss_mb, agents_lost);
  std::cout.flush();
  agents.clear();
  std::filesystem::remove_all(state_dir);
  return absl::OkStatus();
}

}  // namespace
}  // namespace trainyard::bench

int main(int argc, char** argv) {
  absl::StatusOr<trainyard::bench::Options> options = trainyard::bench::ParseOptions(argc, argv);
  if (!options.ok()) {
    std::cerr << "trainyard-bench-coordinator: " << options.status().message() << "\n";
    return 2;
  }
  absl::Status status = trainyard::bench::Run(*options);
  if (!status.ok()) {
    std::cerr << "trainyard-bench-coordinator: " << status << "\n";
    return 1;
  }
  return 0;
}
