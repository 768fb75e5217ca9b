#include "tests/integration/controlplane_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <google/protobuf/util/json_util.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "tests/integration/test_env.h"

namespace trainyard::testenv {
namespace {

std::string Binary(const std::string& relative) { return BinaryDir() + "/" + relative; }

// The NUL-separated arguments of process `pid` ("" when it is gone).
std::vector<std::string> CommandLine(int64_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"), std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::vector<std::string> args;
  std::string arg;
  for (char c : buffer.str()) {
    if (c == '\0') {
      args.push_back(arg);
      arg.clear();
    } else {
      arg += c;
    }
  }
  return args;
}

}  // namespace

std::string TinySpec(const TinyJob& job) {
  const int world = job.nodes * job.ranks_per_node;
  const std::string data =
      job.data.empty()
          ? "{source: markov, markov: {vocab: 32, train_tokens: 50000, val_tokens: 2000}}"
          : job.data;
  std::string spec = absl::StrCat(
      "name: ", job.name, "\nmodel: ", job.model, "\ndata: ", data,
      "\ntraining: {steps: ", job.steps, ", batch: ", job.batch_per_rank * world,
      ", seq_len: 16, eval_every: ", job.eval_every, job.eval_every > 0 ? ", eval_batches: 2" : "",
      ", log_every: 10, threads: 1}\nparallelism: {dp: ", world,
      "}\nresources: {nodes: ", job.nodes, ", devices_per_node: ", job.ranks_per_node,
      "}\nfault_tolerance: {max_restarts: ", job.max_restarts, ", heartbeat_timeout_s: 5",
      job.fault_tolerance.empty() ? "" : ", ", job.fault_tolerance, "}\npriority: ", job.priority,
      "\n");
  if (!job.checkpoint.empty()) absl::StrAppend(&spec, "checkpoint: ", job.checkpoint, "\n");
  return spec;
}

// The exact final loss ("exact final loss 0x1.4p+0") of a rank-0 log; NaN when absent.
double ExactFinalLoss(const std::string& log) {
  std::smatch m;
  if (!std::regex_search(log, m, std::regex("exact final loss (\\S+)"))) return std::nan("");
  return std::strtod(m[1].str().c_str(), nullptr);
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

bool ProcessGone(int64_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!in || !std::getline(in, line)) return true;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() &&
         (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

ControlPlane::ControlPlane(const std::string& name)
    : dir_(MakeScratchDir("trainyard_" + name).string()) {}

ControlPlane::~ControlPlane() {
  server_.reset();
  agents_.clear();
  for (int64_t pid : WorkerPids()) kill(-static_cast<pid_t>(pid), SIGKILL);
  for (int64_t pid : WorkerPids()) kill(static_cast<pid_t>(pid), SIGKILL);
  for (int i = 0; i < 100 && !WorkerPids().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::vector<std::string> ControlPlane::ServerArgv(const ServerOptions& options) const {
  std::vector<std::string> argv = {Binary("server/trainyard-server"),
                                   "--listen",
                                   listen_,
                                   "--state-dir",
                                   state_dir(),
                                   "--stop-grace",
                                   absl::StrCat(options.stop_grace_s),
                                   "--heartbeat-timeout",
                                   "5",
                                   "--metrics-listen",
                                   options.metrics ? "127.0.0.1:0" : "off"};
  if (options.local_agent) {
    argv.insert(argv.end(), {"--worker-binary", Binary("worker/trainyard-worker"), "--agent-slots",
                             absl::StrCat(options.local_slots), "--agent-node-id", "local",
                             "--agent-memory-tier-dir", dir_ + "/tier-local"});
  } else {
    argv.push_back("--no-local-agent");
  }
  argv.insert(argv.end(), options.extra_args.begin(), options.extra_args.end());
  return argv;
}

void ControlPlane::StartServer(const ServerOptions& options) {
  ++server_starts_;
  if (server_starts_ == 1 && !options.listen.empty()) listen_ = options.listen;
  std::filesystem::remove(state_dir() + "/server.addr");
  server_ = std::make_unique<ChildProcess>(
      ServerArgv(options), absl::StrCat(dir_, "/server-", server_starts_, ".out"),
      absl::StrCat(dir_, "/server-", server_starts_, ".err"), options.env);
  const std::string address =
      WaitForFileLine(state_dir() + "/server.addr", std::chrono::seconds(30));
  ASSERT_FALSE(address.empty()) << "the server did not start: "
                                << ReadWholeFile(
                                       absl::StrCat(dir_, "/server-", server_starts_, ".err"));
  address_ = address;
  listen_ = address;  // a restart listens where agents and workers expect it
  // Agents and workers use the cluster listener (a restart takes it again).
  cluster_address_ = WaitForFileLine(state_dir() + "/cluster.addr", std::chrono::seconds(10));
  if (!std::filesystem::exists(agent_token_file())) {
    // The agents' own credential, as an operator makes one.
    const ProcessResult added =
        RunProcess({Binary("server/trainyard-server"), "token", "add", "agents", "--role", "agent",
                    "--nodes", "*", "--state-dir", state_dir()},
                   30);
    ASSERT_EQ(added.exit_code, 0) << added.err;
    std::ofstream(agent_token_file()) << added.out;
  }
}

void ControlPlane::KillServer() {
  if (server_) server_->KillGroup();
  server_.reset();
}

std::optional<int> ControlPlane::StopServer(int signal, double timeout_s) {
  if (!server_) return std::nullopt;
  server_->Signal(signal);
  const std::optional<int> code =
      server_->Wait(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  KillServer();
  return code;
}

bool ControlPlane::ServerRunning() { return server_ != nullptr && server_->running(); }

void ControlPlane::StartAgent(const std::string& node_id, int slots,
                              const std::vector<std::string>& env,
                              const std::vector<std::string>& extra_args,
                              const std::vector<std::string>& wrapper) {
  std::vector<std::string> argv = wrapper;
  argv.insert(argv.end(),
              {Binary("server/agent/trainyard-agent"), "--coordinator", cluster_address_,
               "--node-id", node_id, "--slots", absl::StrCat(slots), "--no-gpus", "--work-dir",
               dir_ + "/agent-" + node_id, "--worker-binary", Binary("worker/trainyard-worker"),
               "--threads-per-worker", "1", "--memory-tier-dir", dir_ + "/tier-" + node_id,
               "--token-file", agent_token_file()});
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  agents_[node_id] = std::make_unique<ChildProcess>(argv, dir_ + "/agent-" + node_id + ".out",
                                                    dir_ + "/agent-" + node_id + ".err", env);
  ASSERT_TRUE(agents_[node_id]->running());
}

void ControlPlane::KillAgent(const std::string& node_id) { agents_.erase(node_id); }

std::string ControlPlane::metrics_address() const {
  return WaitForFileLine(state_dir() + "/metrics.addr", std::chrono::seconds(10));
}

std::string ControlPlane::WriteSpec(const std::string& file_name, const std::string& yaml) {
  const std::string path = dir_ + "/" + file_name;
  std::ofstream(path) << yaml;
  return path;
}

ProcessResult ControlPlane::Cli(std::vector<std::string> args, double timeout_s) {
  // `plan` runs on this machine and refuses the flags that reach the coordinator.
  if (args.empty() || args[0] != "plan") {
    args.insert(args.begin(), cli_flags_.begin(), cli_flags_.end());
    args.insert(args.begin(), {"--server", address_, "--token-file", state_dir() + "/admin.token"});
  }
  args.insert(args.begin(), Binary("tools/cli/trainyard"));
  return RunProcess(args, timeout_s);
}

std::string ControlPlane::Submit(const std::string& spec_path) {
  const ProcessResult submitted = Cli({"submit", spec_path});
  EXPECT_EQ(submitted.exit_code, 0) << submitted.err;
  return std::string(absl::StripAsciiWhitespace(submitted.out));
}

v1::GetJobReply ControlPlane::Status(const std::string& job_id) {
  const ProcessResult result = Cli({"status", job_id, "--json"}, 30);
  v1::GetJobReply reply;
  if (result.exit_code != 0) {
    ADD_FAILURE() << "status " << job_id << " exited " << result.exit_code << ": " << result.err;
    return reply;
  }
  const auto parsed = google::protobuf::util::JsonStringToMessage(result.out, &reply);
  EXPECT_TRUE(parsed.ok()) << parsed.ToString() << ": " << result.out;
  return reply;
}

bool ControlPlane::WaitFor(const std::string& job_id,
                           const std::function<bool(const v1::GetJobReply&)>& done,
                           double timeout_s) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    const ProcessResult result = Cli({"status", job_id, "--json"}, 30);
    v1::GetJobReply reply;
    if (result.exit_code == 0 &&
        google::protobuf::util::JsonStringToMessage(result.out, &reply).ok() && done(reply)) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

bool ControlPlane::WaitForStep(const std::string& job_id, int64_t step, double timeout_s) {
  return WaitFor(
      job_id,
      [step](const v1::GetJobReply& r) {
        return r.job().state() == v1::JOB_STATE_RUNNING && r.job().progress().step() >= step;
      },
      timeout_s);
}

std::vector<int64_t> ControlPlane::WorkerPids() const {
  std::vector<int64_t> pids;
  if (address_.empty()) return pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    int64_t pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid) || ProcessGone(pid)) continue;
    const std::vector<std::string> args = CommandLine(pid);
    if (args.empty() || !absl::EndsWith(args[0], "trainyard-worker")) continue;
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--coordinator" && args[i + 1] == cluster_address_) {
        pids.push_back(pid);
        break;
      }
    }
  }
  closedir(proc);
  return pids;
}

}  // namespace trainyard::testenv
