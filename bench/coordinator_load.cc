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
//          [--progress relay|direct] [--heartbeat-in-batch yes|no]
//
// With --progress relay, each batch carries its agent's heartbeat once the reports start (as an
// agent's batches do when its ranks report about once a heartbeat interval); with
// --heartbeat-in-batch no the heartbeats stay separate messages.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/coordinator_sim.h"
#include "grpcpp/grpcpp.h"
#include "proto/trainyard.grpc.pb.h"

namespace trainyard::bench {
namespace {

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
  // --heartbeat-in-batch yes|no: with the relay, whether each batch carries its agent's heartbeat
  // (one message per agent-second, as the agent sends them) or heartbeats go on their own
  bool heartbeat_in_batch = true;
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
    } else if (arg == "--heartbeat-in-batch") {
      ok = value == "yes" || value == "no";
      options.heartbeat_in_batch = value == "yes";
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
  if (options.server_binary.empty()) options.server_binary = DefaultServerBinary();
  return options;
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
  TY_ASSIGN_OR_RETURN(
      const std::vector<std::string> job_ids,
      SubmitJobs(job_stub.get(), admin_token, jobs, options.ranks_per_job, options.submitters));
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
  TY_RETURN_IF_ERROR(JoinRanks(worker_stubs, ranks, absl::Seconds(180)));
  const absl::Duration join_time = absl::Now() - t2;

  // 4. Steady state: every rank reports at 1 Hz (staggered, or its agent's batches staggered),
  // a probe reads a job at 10 Hz.
  std::atomic<int64_t> in_flight{0};
  std::thread reporters([&] {
    if (options.relay) {
      if (options.heartbeat_in_batch) {
        for (auto& agent : agents) agent->HeartbeatInBatches();
      }
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
      "| reports sent as | %s%s |\n"
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
      options.relay && options.heartbeat_in_batch ? ", carrying the agent's heartbeat" : "",
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
  // As in trainyard-server: Abseil's run-time deadlock detection keeps a graph of every mutex
  // (8,192 agents have one each) and took a ninth of the load generator's time.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
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
