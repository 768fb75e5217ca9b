// What the coordinator spends per request, in instructions: a fixed workload against a real
// trainyard-server run under Valgrind's Callgrind, counted phase by phase. Instruction counts do
// not depend on how busy the machine is, so they show a change in the coordinator's cost where
// wall-clock latency (trainyard-bench-coordinator) cannot.
//
//   1. N agents register (not counted);
//   2. "submission": N*S/R jobs of R ranks are submitted and placed, and every StartWorker order
//      is answered (counted from the first submission to the last WorkerStarted);
//   3. every rank joins (not counted);
//   4. "agent-second": --rounds times, every agent sends what it sends each second, one
//      ProgressBatch of its ranks' reports carrying its heartbeat (as an agent whose ranks report
//      about once a heartbeat interval sends them), and the round ends when every batch is
//      answered (counted over all rounds).
//
// The coordinator's 100 ms tick runs during the phases as it always does; its instructions are
// taken out of each phase's figure (Callgrind's inclusive cost of Supervisor::Tick) and reported
// on their own, per tick and live job, since how many ticks fall into a phase depends on how
// long the phase takes under Valgrind.
//
// Usage: trainyard-bench-coordinator-cost [--server-binary PATH] [--agents N] [--slots S]
//          [--ranks-per-job R] [--rounds K] [--limits FILE] [--keep DIR]
// --keep DIR: Callgrind's dumps are kept there (callgrind.out.1: the submissions,
// callgrind.out.2: the agent-seconds), to read with callgrind_annotate.
// --limits FILE: lines "<metric> <instructions> <allowed increase in %>"; the program fails
// (exit 1) when a metric exceeds its instructions by more than the allowance.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/coordinator_sim.h"
#include "common/process.h"
#include "grpcpp/grpcpp.h"
#include "proto/trainyard.grpc.pb.h"

namespace trainyard::bench {
namespace {

// Client threads submitting the jobs: enough that submissions overlap and share commits.
constexpr int kSubmitters = 4;

struct Options {
  std::string server_binary;
  int agents = 32;
  int slots = 8;
  int ranks_per_job = 8;
  int rounds = 20;
  std::string limits;
  std::string keep;  // a folder to keep Callgrind's dumps in (for callgrind_annotate)
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
    } else if (arg == "--limits") {
      options.limits = value;
    } else if (arg == "--keep") {
      options.keep = value;
    } else if (arg == "--agents") {
      ok = absl::SimpleAtoi(value, &options.agents) && options.agents > 0;
    } else if (arg == "--slots") {
      ok = absl::SimpleAtoi(value, &options.slots) && options.slots > 0;
    } else if (arg == "--ranks-per-job") {
      ok = absl::SimpleAtoi(value, &options.ranks_per_job) && options.ranks_per_job > 0;
    } else if (arg == "--rounds") {
      ok = absl::SimpleAtoi(value, &options.rounds) && options.rounds > 0;
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

// --- Callgrind -----------------------------------------------------------------------------

// Runs a command to its end; its standard output, or an error naming it.
absl::StatusOr<std::string> Output(const std::vector<std::string>& argv) {
  const std::string path =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainyard-cost-", getpid(), ".out"))
          .string();
  std::filesystem::remove(path);
  TY_ASSIGN_OR_RETURN(const pid_t pid,
                      Spawn({.argv = argv, .stdout_path = path, .stderr_path = "/dev/null"}));
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  if (DecodeWaitStatus(status).exit_code != 0) {
    return absl::InternalError(absl::StrCat(argv[0], " ", argv[1], " failed"));
  }
  return text;
}

// The coordinator under Callgrind, counting only while a phase runs.
class Counter {
 public:
  Counter(pid_t pid, std::string dir) : pid_(pid), dir_(std::move(dir)) {}

  // Instrumentation is off outside the phases (the server runs faster); a phase starts from
  // zeroed counters.
  absl::Status Start() {
    TY_RETURN_IF_ERROR(Control("--instr=on"));
    return Control("--zero");
  }
  absl::Status Stop() { return Control("--instr=off"); }
  // Dumps the counts since the last dump (which resets them) and reads the dump back.
  struct Counts {
    int64_t total = 0;       // every thread's instructions
    int64_t tick = 0;        // of which under Supervisor::Tick
    int64_t tick_calls = 0;  // how many ticks ran
  };
  absl::StatusOr<Counts> Dump() {
    std::set<std::string> before = Files();
    TY_RETURN_IF_ERROR(Control("--dump"));
    for (const std::string& file : Files()) {
      if (before.count(file) == 0) return Read(file);
    }
    return absl::InternalError("callgrind wrote no dump");
  }

 private:
  absl::Status Control(const char* action) {
    return Output({"/usr/bin/callgrind_control", action, absl::StrCat(pid_)}).status();
  }
  std::set<std::string> Files() const {
    std::set<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      if (e.path().filename().string().rfind("callgrind.out", 0) == 0) files.insert(e.path());
    }
    return files;
  }
  // Totals from the "summary:"/"totals:" line; the tick from the calls into Supervisor::Tick.
  // Callgrind names a function in full once ("cfn=(id) name") and by its id after that.
  static absl::StatusOr<Counts> Read(const std::string& file) {
    std::ifstream in(file);
    Counts counts;
    std::string tick_id;
    bool next_is_tick_call = false;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("summary: ", 0) == 0 || line.rfind("totals: ", 0) == 0) {
        absl::SimpleAtoi(line.substr(line.find(' ') + 1), &counts.total);
      } else if (line.rfind("fn=", 0) == 0 || line.rfind("cfn=", 0) == 0) {
        const std::string rest = line.substr(line.find('=') + 1);
        const std::string id = rest.substr(0, rest.find(')') + 1);
        if (tick_id.empty() && rest.find("Supervisor::Tick()") != std::string::npos) tick_id = id;
        next_is_tick_call = line[0] == 'c' && !tick_id.empty() && id == tick_id;
      } else if (next_is_tick_call && line.rfind("calls=", 0) == 0) {
        std::vector<std::string> calls = absl::StrSplit(line.substr(6), ' ');
        int64_t n = 0;
        absl::SimpleAtoi(calls[0], &n);
        counts.tick_calls += n;
        // The line after "calls=" is the call's inclusive cost: "<position> <Ir>".
        std::string cost;
        std::getline(in, cost);
        std::vector<std::string> fields = absl::StrSplit(cost, ' ', absl::SkipEmpty());
        int64_t ir = 0;
        if (fields.size() >= 2) absl::SimpleAtoi(fields[1], &ir);
        counts.tick += ir;
        next_is_tick_call = false;
      }
    }
    if (counts.total == 0) return absl::InternalError(absl::StrCat(file, ": no totals line"));
    return counts;
  }

  pid_t pid_;
  std::string dir_;
};

// --- The workload --------------------------------------------------------------------------

struct Result {
  std::string metric;
  std::string unit;
  double instructions = 0;
};

// Lines "<metric> <instructions> <allowed increase in %>".
absl::Status CheckLimits(const std::string& path, const std::vector<Result>& results) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string failures;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double limit = 0, allowance = 0;
    if (f.size() != 3 || !absl::SimpleAtod(f[1], &limit) || !absl::SimpleAtod(f[2], &allowance)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": bad line '", line, "'"));
    }
    auto it = std::find_if(results.begin(), results.end(),
                           [&](const Result& r) { return r.metric == f[0]; });
    if (it == results.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no metric '", f[0], "'"));
    }
    const double allowed = limit * (1 + allowance / 100);
    std::cout << absl::StrFormat("%s: %.0f instructions, limit %.0f (%.0f + %.0f%%): %s\n",
                                 it->metric, it->instructions, allowed, limit, allowance,
                                 it->instructions <= allowed ? "ok" : "OVER");
    if (it->instructions > allowed) {
      absl::StrAppend(&failures, failures.empty() ? "" : "; ", it->metric, " costs ",
                      absl::StrFormat("%.0f", it->instructions), " instructions, more than ",
                      absl::StrFormat("%.0f", allowed));
    }
  }
  if (!failures.empty()) return absl::FailedPreconditionError(failures);
  return absl::OkStatus();
}

absl::Status Run(const Options& options) {
  const std::string state_dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("trainyard-cost-", getpid())).string();
  std::filesystem::remove_all(state_dir);
  std::filesystem::create_directories(state_dir + "/callgrind");
  const std::string dumps = state_dir + "/callgrind";
  ServerChild server;
  TY_RETURN_IF_ERROR(server.Start(
      options.server_binary, state_dir,
      {"/usr/bin/valgrind", "--tool=callgrind", "--instr-atstart=no",
       absl::StrCat("--callgrind-out-file=", dumps, "/callgrind.out"), "--log-file=/dev/null"},
      absl::Seconds(120)));
  Counter counter(server.pid(), dumps);
  std::string admin_token;
  std::getline(std::ifstream(state_dir + "/admin.token"), admin_token);
  // A fixed workload needs no spread: the agents and ranks share one connection to the cluster
  // listener, the submissions one to the clients' (MakeChannel's index keeps them distinct).
  auto cluster = MakeChannel(server.cluster_address(), /*index=*/0);
  auto agent_stub = v1::AgentService::NewStub(cluster);
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> worker_stubs;
  worker_stubs.push_back(v1::WorkerService::NewStub(cluster));
  auto job_stub = v1::JobService::NewStub(MakeChannel(server.address(), /*index=*/1));
  const int jobs = options.agents * options.slots / options.ranks_per_job;
  const int ranks_total = jobs * options.ranks_per_job;

  // 1. Agents register.
  std::atomic<int> registered{0}, started{0};
  Secrets secrets;
  Latencies progress;
  std::vector<std::unique_ptr<SimAgent>> agents;
  for (int i = 0; i < options.agents; ++i) {
    agents.push_back(std::make_unique<SimAgent>(agent_stub.get(), absl::StrFormat("node-%04d", i),
                                                options.slots, admin_token, &secrets, &registered,
                                                &started, &progress));
  }
  // Their streams end before they go, on every path out.
  absl::Cleanup end_streams = [&agents] {
    for (auto& agent : agents) agent->Cancel();
    for (auto& agent : agents) agent->WaitDone();
  };
  // Outside the counted phases the agents heartbeat every 2 s, so that no node is lost while
  // the set-up runs slowly under Valgrind; in the steady phase the heartbeats are the counted ones.
  std::atomic<bool> beating{true}, done{false};
  std::thread beats([&] {
    while (!done.load()) {
      if (beating.load() && registered.load() == options.agents) {
        for (auto& agent : agents) agent->Heartbeat();
      }
      absl::SleepFor(absl::Seconds(2));
    }
  });
  absl::Cleanup stop_beats = [&] {
    done = true;
    beats.join();
  };
  if (!WaitFor([&] { return registered.load() == options.agents; }, absl::Seconds(300))) {
    return absl::DeadlineExceededError("the agents did not register");
  }
  // 2. Submissions, counted until every worker started.
  TY_RETURN_IF_ERROR(counter.Start());
  TY_ASSIGN_OR_RETURN(
      const std::vector<std::string> job_ids,
      SubmitJobs(job_stub.get(), admin_token, jobs, options.ranks_per_job, kSubmitters));
  if (!WaitFor([&] { return started.load() == ranks_total; }, absl::Seconds(600))) {
    return absl::DeadlineExceededError("not every worker was started");
  }
  TY_ASSIGN_OR_RETURN(const Counter::Counts submit, counter.Dump());
  TY_RETURN_IF_ERROR(counter.Stop());
  // 3. Every rank joins.
  std::vector<Rank> ranks;
  for (const std::string& id : job_ids) {
    absl::MutexLock lock(&secrets.mu);
    for (int r = 0; r < options.ranks_per_job; ++r) ranks.push_back({id, r, 0, secrets.by_job[id]});
  }
  TY_RETURN_IF_ERROR(JoinRanks(worker_stubs, ranks, absl::Seconds(600)));
  // 4. Agent-seconds: a batch of reports with the heartbeat from every agent, round by round.
  beating = false;
  for (auto& agent : agents) agent->HeartbeatInBatches();
  absl::SleepFor(absl::Milliseconds(100));  // a heartbeat round under way ends
  TY_RETURN_IF_ERROR(counter.Start());
  for (int round = 1; round <= options.rounds; ++round) {
    for (auto& agent : agents) {
      agent->Heartbeat();
      agent->ReportBatch();
    }
    if (!WaitFor(
            [&] {
              for (auto& agent : agents) {
                if (agent->answered() < round) return false;
              }
              return true;
            },
            absl::Seconds(600))) {
      return absl::DeadlineExceededError("progress batches went unanswered");
    }
  }
  // The rounds take about a second under Valgrind: ten ticks, one or two of which write every
  // job's progress. Two more seconds of ticks (with one more write) keep the tick's figure from
  // swinging by a third with that count.
  absl::SleepFor(absl::Seconds(2));
  TY_ASSIGN_OR_RETURN(const Counter::Counts steady, counter.Dump());
  TY_RETURN_IF_ERROR(counter.Stop());
  if (progress.errors() > 0) {
    return absl::InternalError(absl::StrCat(progress.errors(), " reports were refused"));
  }

  const double agent_seconds = static_cast<double>(options.agents) * options.rounds;
  const std::vector<Result> results = {
      {"submission", "per job submitted and started, ticks aside",
       static_cast<double>(submit.total - submit.tick) / jobs},
      {"agent-second", "per batch of reports with the heartbeat, ticks aside",
       static_cast<double>(steady.total - steady.tick) / agent_seconds},
      {"report", "the same per report",
       static_cast<double>(steady.total - steady.tick) / (agent_seconds * options.slots)},
      {"tick-job", "per tick and live job",
       steady.tick_calls == 0 ? 0.0 : static_cast<double>(steady.tick) / steady.tick_calls / jobs},
  };
  std::cout << absl::StrFormat(
      "| workload | %d agents of %d slots, %d jobs of %d ranks, %d rounds |\n"
      "|---|---:|\n",
      options.agents, options.slots, jobs, options.ranks_per_job, options.rounds);
  std::cout << absl::StrFormat(
      "| submission phase: instructions (of which %d ticks) | %d (%d) |\n"
      "| agent-second phase: instructions (of which %d ticks) | %d (%d) |\n",
      submit.tick_calls, submit.total, submit.tick, steady.tick_calls, steady.total, steady.tick);
  for (const Result& r : results) {
    std::cout << absl::StrFormat("| %s: instructions %s | %.0f |\n", r.metric, r.unit,
                                 r.instructions);
  }
  std::cout.flush();
  if (!options.keep.empty()) {
    std::filesystem::create_directories(options.keep);
    std::filesystem::copy(dumps, options.keep,
                          std::filesystem::copy_options::recursive |
                              std::filesystem::copy_options::overwrite_existing);
  }
  std::filesystem::remove_all(state_dir);
  if (!options.limits.empty()) return CheckLimits(options.limits, results);
  return absl::OkStatus();
}

}  // namespace
}  // namespace trainyard::bench

int main(int argc, char** argv) {
  absl::StatusOr<trainyard::bench::Options> options = trainyard::bench::ParseOptions(argc, argv);
  if (!options.ok()) {
    std::cerr << "trainyard-bench-coordinator-cost: " << options.status().message() << "\n";
    return 2;
  }
  for (const char* tool : {"/usr/bin/valgrind", "/usr/bin/callgrind_control"}) {
    if (access(tool, X_OK) != 0) {
      std::cerr << "trainyard-bench-coordinator-cost: skipped: " << tool
                << " is not installed (Debian's valgrind package; tools/setup.sh installs it)\n";
      return 77;
    }
  }
  if (absl::Status status = trainyard::bench::Run(*options); !status.ok()) {
    std::cerr << "trainyard-bench-coordinator-cost: " << status << "\n";
    return 1;
  }
  return 0;
}
