// The simulated cluster the coordinator benchmarks drive: a trainyard-server child on loopback,
// agents on AgentService.Connect streams that answer StartWorker orders, heartbeat and relay
// their ranks' progress in batches, ranks that join and report directly, and the latency
// recording. Used by trainyard-bench-coordinator (latency under load) and
// trainyard-bench-coordinator-cost (instructions per request).
#ifndef TRAINYARD_BENCH_COORDINATOR_SIM_H_
#define TRAINYARD_BENCH_COORDINATOR_SIM_H_

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

namespace v1 = ::trainyard::v1;

// trainyard-server beside the calling benchmark's build folder:
// <build>/bench/<benchmark> -> <build>/server/trainyard-server.
inline std::string DefaultServerBinary() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "server" /
          "trainyard-server")
      .string();
}

// --- The coordinator process ---------------------------------------------------------------

struct ProcessSample {
  double cpu_seconds = 0;  // user + system
  double rss_mb = 0;
  double peak_rss_mb = 0;
};

inline ProcessSample Sample(pid_t pid) {
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
  // `wrapper` runs the server (e.g. under Valgrind: the wrapper's argv, the server's after it);
  // `start_timeout` bounds the wait for its address file.
  absl::Status Start(const std::string& binary, const std::string& state_dir,
                     const std::vector<std::string>& wrapper = {},
                     absl::Duration start_timeout = absl::Seconds(10)) {
    state_dir_ = state_dir;
    std::vector<std::string> argv = wrapper;
    argv.insert(argv.end(),
                {binary, "--no-local-agent", "--state-dir", state_dir, "--listen", "127.0.0.1:0",
                 "--metrics-listen", "off", "--heartbeat-timeout", "60", "--log-level", "warning"});
    // Its banner stays out of the table.
    TY_ASSIGN_OR_RETURN(pid_, Spawn({.argv = argv, .stdout_path = "/dev/null"}));
    const absl::Time deadline = absl::Now() + start_timeout;
    while (absl::Now() < deadline) {
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
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
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

inline double Percentile(const std::vector<float>& sorted, double p) {
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
    hello.mutable_registration()->set_accepts_start_batches(true);  // as the real agent does
    StartRead(&in_);
    Enqueue(std::move(hello));
    StartCall();
  }

  // A Heartbeat message; none once the heartbeat rides on the batches (HeartbeatInBatches).
  void Heartbeat() {
    if (heartbeat_in_batches_.load()) return;
    v1::AgentMessage beat;
    {
      absl::MutexLock lock(&mu_);
      FillHeartbeatLocked(beat.mutable_heartbeat());
    }
    Enqueue(std::move(beat));
    heartbeats_.fetch_add(1);
  }
  // From now on each batch carries the heartbeat, as a real agent's do when its ranks report
  // about once a heartbeat interval.
  void HeartbeatInBatches() { heartbeat_in_batches_ = true; }

  // What the agent's progress relay sends: one report per rank it runs, in one batch.
  void ReportBatch() {
    v1::AgentMessage message;
    v1::ProgressBatch* batch = message.mutable_progress();
    {
      absl::MutexLock lock(&mu_);
      if (heartbeat_in_batches_.load()) {
        // Every worker reports in the batch: the heartbeat need not list them again.
        batch->mutable_heartbeat()->set_sent_unix_ms(absl::ToUnixMillis(absl::Now()));
        batch->mutable_heartbeat()->set_omits_reported(true);
        heartbeats_.fetch_add(1);
      }
      batch->set_batch_id(++batch_id_);
      batch->set_omit_plain_answers(true);
      sent_[batch_id_] = Sent{absl::Now(), static_cast<int>(running_.size())};
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
  int64_t answered() const { return answered_.load(); }  // batches whose answers came back
  bool ended_early() const { return ended_early_.load(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (in_.has_registered()) registered_->fetch_add(1);
    if (in_.has_progress_answers()) Answered(in_.progress_answers());
    if (in_.has_start()) Start(in_.start());
    for (const v1::StartWorker& start : in_.start_batch().workers()) Start(start);
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
  // What the agent does with a start order: runs the worker (here: records it) and says so.
  void Start(const v1::StartWorker& start) {
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

  void Answered(const v1::ProgressAnswers& answers) {
    Sent sent;
    {
      absl::MutexLock lock(&mu_);
      auto it = sent_.find(answers.batch_id());
      if (it == sent_.end()) return;
      sent = it->second;
      sent_.erase(it);
    }
    answered_.fetch_add(1);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - sent.at);
    // The answers left out (the batch asked for omit_plain_answers) were OK.
    int errors = 0;
    for (const v1::ProgressAnswer& answer : answers.answers()) errors += answer.code() != 0;
    for (int i = 0; i < sent.reports - errors; ++i) progress_->Add(sent.at, ms);
    for (int i = 0; i < errors; ++i) progress_->Error();
  }

  void FillHeartbeatLocked(v1::Heartbeat* heartbeat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    heartbeat->set_sent_unix_ms(absl::ToUnixMillis(absl::Now()));
    for (const v1::RunningWorker& w : running_) *heartbeat->add_running() = w;
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
  struct Sent {
    absl::Time at;
    int reports = 0;
  };
  std::map<int64_t, Sent> sent_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> batches_{0};
  std::atomic<int64_t> answered_{0};
  std::atomic<int64_t> heartbeats_{0};
  std::atomic<bool> ended_early_{false};
  std::atomic<bool> heartbeat_in_batches_{false};
  absl::Notification done_;
};

// --- Simulated ranks -----------------------------------------------------------------------

struct Rank {
  std::string job_id;
  int rank = 0;
  int64_t step = 0;
  std::string secret;  // its attempt's
};

inline void ReportProgress(v1::WorkerService::Stub* stub, Rank& rank, Latencies* latencies,
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

inline std::string JobSpec(int index, int ranks) {
  return absl::StrFormat(
      "name: load-%d\nmodel: {preset: gpt2-debug}\ndata: {source: markov}\n"
      "training: {steps: 1000000, warmup_steps: 1, batch: %d, seq_len: 16}\n"
      "parallelism: {dp: %d}\nresources: {nodes: 1, devices_per_node: %d}\n"
      "fault_tolerance: {heartbeat_timeout_s: 120}\nlabels: {bench: coordinator-load}\n",
      index, 2 * ranks, ranks, ranks);
}

inline std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, int index) {
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

// Submits `jobs` jobs of `ranks_per_job` ranks each from `submitters` client threads; returns
// their ids in submission order.
inline absl::StatusOr<std::vector<std::string>> SubmitJobs(v1::JobService::Stub* stub,
                                                           const std::string& token, int jobs,
                                                           int ranks_per_job, int submitters) {
  std::vector<std::string> job_ids(jobs);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < submitters; ++t) {
    threads.emplace_back([&, t] {
      for (int j = t; j < jobs; j += submitters) {
        v1::SubmitJobRequest request;
        request.set_spec_yaml(JobSpec(j, ranks_per_job));
        request.set_user("bench");
        v1::SubmitJobReply reply;
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        rpc::AddBearer(context, token);
        if (stub->SubmitJob(&context, request, &reply).ok()) {
          job_ids[j] = reply.job().id();
        } else {
          errors.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (errors.load() > 0) {
    return absl::InternalError(absl::StrCat(errors.load(), " submissions failed"));
  }
  return job_ids;
}

// Every rank joins its job's rendezvous (attempt 1), the calls spread over `stubs`.
inline absl::Status JoinRanks(const std::vector<std::unique_ptr<v1::WorkerService::Stub>>& stubs,
                              const std::vector<Rank>& ranks, absl::Duration timeout) {
  struct Counts {
    std::atomic<int> joined{0};
    std::atomic<int> errors{0};
  };
  auto counts = std::make_shared<Counts>();  // outlives a timed-out wait
  for (size_t i = 0; i < ranks.size(); ++i) {
    struct Call {
      grpc::ClientContext context;
      v1::JoinRequest request;
      v1::JoinReply reply;
    };
    auto* call = new Call();
    call->context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(timeout));
    rpc::AddBearer(call->context, ranks[i].secret);
    call->request.set_job_id(ranks[i].job_id);
    call->request.set_attempt_id(1);
    call->request.set_rank(ranks[i].rank);
    stubs[i % stubs.size()]->async()->Join(
        &call->context, &call->request, &call->reply, [call, counts](grpc::Status s) {
          (s.ok() ? counts->joined : counts->errors).fetch_add(1);
          delete call;
        });
  }
  const int total = static_cast<int>(ranks.size());
  if (!WaitFor([&] { return counts->joined.load() + counts->errors.load() == total; }, timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("only ", counts->joined.load(), " ranks joined"));
  }
  if (counts->errors.load() > 0) {
    return absl::InternalError(absl::StrCat(counts->errors.load(), " joins failed"));
  }
  return absl::OkStatus();
}

}  // namespace trainyard::bench

#endif  // TRAINYARD_BENCH_COORDINATOR_SIM_H_
