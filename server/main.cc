// trainyard-server: the coordinator. With no flags it is the embedded default: state in
// ./trainyard-state, gRPC and /metrics on loopback (free ports, printed and written to
// <state-dir>/server.addr and metrics.addr), and a local agent offering this machine's CPU slots
// and GPUs. SIGTERM or SIGINT shut it down gracefully; running jobs keep running and a restarted
// server on the same state directory adopts them (with --drain-on-stop, they drain first).
//
// Exit codes: 0 after a graceful shutdown; 2 bad flags or a state directory in use; 1 otherwise.
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/status.h"
#include "server/coordinator.h"
#include "server/token_command.h"
#if TRAINYARD_SERVER_WITH_AGENT
#include "server/agent/agent.h"
#endif

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC address of the CLI's service");
ABSL_FLAG(std::string, cluster_listen, "", "the agents' and workers' gRPC address");
ABSL_FLAG(std::string, state_dir, "trainyard-state", "jobs, events and node records");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0", "Prometheus /metrics (off: none)");
ABSL_FLAG(bool, local_agent, true, "run an agent in this process (--no-local-agent: none)");
ABSL_FLAG(int, agent_slots, 0, "CPU slots of the local agent");
ABSL_FLAG(std::string, agent_node_id, "", "node id of the local agent");
ABSL_FLAG(std::string, worker_binary, "", "trainyard-worker for the local agent");
ABSL_FLAG(trainyard::FlagList, agent_pass_env, {}, "a variable the local agent passes on");
ABSL_FLAG(std::string, agent_memory_tier_dir, "", "the local agent's memory tier");
ABSL_FLAG(int64_t, agent_memory_tier_mb, -1, "its budget in MiB (0: none)");
ABSL_FLAG(std::string, advertise_address, "", "address workers reach the coordinator at");
ABSL_FLAG(std::string, tls_cert, "", "serve TLS: the certificate (PEM)");
ABSL_FLAG(std::string, tls_key, "", "serve TLS: its key (PEM)");
ABSL_FLAG(std::string, tls_client_ca, "", "require client certificates this CA signed");
ABSL_FLAG(std::string, tokens, "", "the token file");
ABSL_FLAG(double, stop_grace, 10, "SIGTERM-to-SIGKILL grace, seconds");
ABSL_FLAG(double, drain_on_stop, 0, "on SIGTERM, drain the running jobs for up to, seconds");
ABSL_FLAG(double, heartbeat_timeout, 10, "close a silent agent's stream after, seconds");
ABSL_FLAG(double, node_mtbf_hours, 5000, "prior mean time between failures of one node");
ABSL_FLAG(int, quarantine_failures, 3, "cordon a node after this many failures (0: never)");
ABSL_FLAG(double, quarantine_window, 600, "the window of those failures, seconds");
ABSL_FLAG(double, quarantine_cooldown, 1800, "how long a cordon lasts, seconds");
ABSL_FLAG(int, max_streams_per_user, 64, "open watch and logs streams per user");
ABSL_FLAG(int, max_queued_jobs_per_user, 256, "queued jobs per user");
ABSL_FLAG(trainyard::FlagList, data_root, {}, "confine data paths beneath this directory");
ABSL_FLAG(trainyard::FlagList, checkpoint_root, {}, "confine checkpoint dirs beneath this one");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace trainyard::server {
namespace {

constexpr char kUsage[] = R"(usage: trainyard-server [flags]
  --listen HOST:PORT         gRPC address (default 127.0.0.1:0: a free loopback port); the CLI's
  --cluster-listen HOST:PORT the agents' and workers' gRPC address (default: --listen's host, a
                             free port; written to <state-dir>/cluster.addr): unlike --listen it
                             does not bound the memory requests hold, which thousands of agents
                             would exhaust
  --state-dir DIR            jobs, events and node records (default ./trainyard-state)
  --metrics-listen HOST:PORT Prometheus /metrics (default 127.0.0.1:0; "off" disables)
  --no-local-agent           do not run an agent in this process (the --agent-* flags and
                             --worker-binary are then refused)
  --agent-slots N            CPU slots of the local agent (default: the CPU cores)
  --agent-node-id ID         node id of the local agent (default: the hostname)
  --worker-binary PATH       trainyard-worker for the local agent (default: found beside this)
  --agent-memory-tier-dir DIR  the local agent's memory tier (default: under /dev/shm)
  --agent-memory-tier-mb N   its budget in MiB (default: a quarter of memory; 0: no tier)
  --agent-pass-env PATTERN   another variable (or PREFIX*) the local agent passes to workers
  --advertise-address H:P    address workers reach the coordinator at (default: the bound
                             --cluster-listen one)
  --tls-cert FILE --tls-key FILE [--tls-client-ca FILE]
                             serve TLS; with a client CA, clients must present certificates it
                             signed (all three are required for a non-loopback --listen)
  --stop-grace SECONDS       SIGTERM-to-SIGKILL grace when stopping workers (default 10)
  --drain-on-stop SECONDS    on SIGTERM or SIGINT, first drain every job that has workers (its
                             ranks checkpoint at a step they agree on and exit) and stop once
                             each has ended or SECONDS have passed, or at a second signal; for a
                             coordinator whose end ends the jobs too, as in a Slurm allocation
                             (default: stop at once; running jobs keep running and a restarted
                             coordinator adopts them)
  --heartbeat-timeout SECONDS  close a silent agent's stream after this long (default 10)
  --node-mtbf-hours H        prior mean time between failures of one node, for Young–Daly
                             checkpoint intervals (default 5000)
  --quarantine-failures N    cordon a node after N failures of attempts on it within the
                             window (default 3; 0 disables)
  --quarantine-window SECONDS  (default 600)
  --quarantine-cooldown SECONDS  how long a cordon lasts (default 1800)
  --tokens FILE              the token file (default <state-dir>/tokens; see
                             `trainyard-server token`); the admin token is <state-dir>/admin.token
  --max-streams-per-user N   open watch and logs streams per user (default 64)
  --max-queued-jobs-per-user N  queued jobs per user (default 256)
  --data-root DIR            confine data paths of submitted specs (repeatable)
  --checkpoint-root DIR      confine checkpoint dirs of submitted specs (repeatable)
  --log-level LEVEL          debug | info | warning | error (default info)

       trainyard-server token add|revoke|list ...   manage the token file (token --help))";

struct Flags {
  CoordinatorOptions coordinator;
  bool listen_given = false;
  bool local_agent = true;
  int agent_slots = 0;
  std::string agent_memory_tier_dir;
  std::vector<std::string> agent_pass_env;
  int64_t agent_memory_tier_mb = -1;
  std::string agent_node_id;
  std::string worker_binary;
  absl::Duration drain_on_stop = absl::ZeroDuration();
};

// Seconds in (0, 86400] of the flag `name`, when given.
absl::Status ReadSeconds(const CommandLine& line, const std::string& name,
                         const absl::Flag<double>& flag, absl::Duration* out) {
  if (!line.Has(name)) return absl::OkStatus();
  const double seconds = absl::GetFlag(flag);
  if (!(seconds > 0) || seconds > 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": expected seconds in (0, 86400], got ", seconds));
  }
  *out = absl::Seconds(seconds);
  return absl::OkStatus();
}

// A per-user limit: 1 to 1,000,000, when given.
absl::Status ReadLimit(const CommandLine& line, const std::string& name,
                       const absl::Flag<int>& flag, int* out) {
  if (!line.Has(name)) return absl::OkStatus();
  *out = absl::GetFlag(flag);
  if (*out < 1 || *out > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": expected 1 to 1000000, got ", *out));
  }
  return absl::OkStatus();
}

constexpr std::string_view kFlags[] = {"listen",
                                       "cluster-listen",
                                       "state-dir",
                                       "metrics-listen",
                                       "local-agent",
                                       "agent-slots",
                                       "agent-node-id",
                                       "worker-binary",
                                       "agent-pass-env",
                                       "agent-memory-tier-dir",
                                       "agent-memory-tier-mb",
                                       "advertise-address",
                                       "tls-cert",
                                       "tls-key",
                                       "tls-client-ca",
                                       "tokens",
                                       "stop-grace",
                                       "drain-on-stop",
                                       "heartbeat-timeout",
                                       "node-mtbf-hours",
                                       "quarantine-failures",
                                       "quarantine-window",
                                       "quarantine-cooldown",
                                       "max-streams-per-user",
                                       "max-queued-jobs-per-user",
                                       "data-root",
                                       "checkpoint-root",
                                       "log-level"};

// The coordinator's own options: where it listens and keeps state, TLS, authentication, limits
// and path confinement, and its failure policies.
absl::Status ReadCoordinatorFlags(const CommandLine& line, CoordinatorOptions& c) {
  if (line.Has("listen")) c.listen = absl::GetFlag(FLAGS_listen);
  c.cluster_listen = absl::GetFlag(FLAGS_cluster_listen);
  if (line.Has("state-dir")) c.state_dir = absl::GetFlag(FLAGS_state_dir);
  if (line.Has("metrics-listen")) {
    c.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
    if (c.metrics_listen == "off") c.metrics_listen.clear();
  }
  c.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  c.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  c.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  c.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  c.tokens_file = absl::GetFlag(FLAGS_tokens);
  c.allowed_data_roots = absl::GetFlag(FLAGS_data_root).values;
  c.allowed_checkpoint_roots = absl::GetFlag(FLAGS_checkpoint_root).values;
  TY_RETURN_IF_ERROR(
      ReadLimit(line, "max-streams-per-user", FLAGS_max_streams_per_user, &c.max_streams_per_user));
  TY_RETURN_IF_ERROR(ReadLimit(line, "max-queued-jobs-per-user", FLAGS_max_queued_jobs_per_user,
                               &c.max_queued_jobs_per_user));
  TY_RETURN_IF_ERROR(ReadSeconds(line, "stop-grace", FLAGS_stop_grace, &c.stop_grace));
  TY_RETURN_IF_ERROR(
      ReadSeconds(line, "heartbeat-timeout", FLAGS_heartbeat_timeout, &c.heartbeat_timeout));
  if (line.Has("node-mtbf-hours")) {
    const double hours = absl::GetFlag(FLAGS_node_mtbf_hours);
    if (!(hours > 0 && hours <= 1e7)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--node-mtbf-hours: expected hours in (0, 1e7], got ", hours));
    }
    c.node_mtbf = absl::Hours(hours);
  }
  if (line.Has("quarantine-failures")) {
    c.quarantine.failures = absl::GetFlag(FLAGS_quarantine_failures);
    if (c.quarantine.failures < 0 || c.quarantine.failures > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat("--quarantine-failures: expected 0 to 1000, got ", c.quarantine.failures));
    }
  }
  TY_RETURN_IF_ERROR(
      ReadSeconds(line, "quarantine-window", FLAGS_quarantine_window, &c.quarantine.window));
  return ReadSeconds(line, "quarantine-cooldown", FLAGS_quarantine_cooldown,
                     &c.quarantine.cooldown);
}

// The local agent's flags configure nothing without it: given with --no-local-agent, they are
// refused.
absl::Status RefuseAgentFlagsWithoutAgent(const CommandLine& line, bool local_agent) {
  if (local_agent) return absl::OkStatus();
  constexpr std::string_view kAgentFlags[] = {"agent-slots",           "agent-node-id",
                                              "worker-binary",         "agent-pass-env",
                                              "agent-memory-tier-dir", "agent-memory-tier-mb"};
  return RefuseGiven(line, kAgentFlags,
                     " configures the local agent: not used with --no-local-agent");
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  TY_ASSIGN_OR_RETURN(const CommandLine line, ParseCommandLine(argc, argv, 1, kFlags));
  if (line.help) {
    std::cout << kUsage << std::endl;
    std::exit(0);
  }
  TY_RETURN_IF_ERROR(RefusePositionals(line));
  Flags flags;
  TY_RETURN_IF_ERROR(ReadCoordinatorFlags(line, flags.coordinator));
  flags.listen_given = line.Has("listen");
  TY_RETURN_IF_ERROR(ReadSeconds(line, "drain-on-stop", FLAGS_drain_on_stop, &flags.drain_on_stop));
  flags.local_agent = absl::GetFlag(FLAGS_local_agent);
  TY_RETURN_IF_ERROR(RefuseAgentFlagsWithoutAgent(line, flags.local_agent));
  if (line.Has("agent-slots")) {
    flags.agent_slots = absl::GetFlag(FLAGS_agent_slots);
    if (flags.agent_slots < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--agent-slots: expected a positive integer, got ", flags.agent_slots));
    }
  }
  flags.agent_node_id = absl::GetFlag(FLAGS_agent_node_id);
  flags.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  flags.agent_pass_env = absl::GetFlag(FLAGS_agent_pass_env).values;
  flags.agent_memory_tier_dir = absl::GetFlag(FLAGS_agent_memory_tier_dir);
  if (line.Has("agent-memory-tier-mb")) {
    flags.agent_memory_tier_mb = absl::GetFlag(FLAGS_agent_memory_tier_mb);
    if (flags.agent_memory_tier_mb < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--agent-memory-tier-mb: expected a whole number of MiB (0: no tier), got ",
                       flags.agent_memory_tier_mb));
    }
    if (flags.agent_memory_tier_mb == 0) {
      constexpr std::string_view kTierFlags[] = {"agent-memory-tier-dir"};
      TY_RETURN_IF_ERROR(RefuseGiven(
          line, kTierFlags, " configures the memory tier: --agent-memory-tier-mb 0 has none"));
    }
  }
  if (line.Has("log-level")) {
    TY_ASSIGN_OR_RETURN(const LogLevel level, ParseLogLevel(absl::GetFlag(FLAGS_log_level)));
    SetMinLogLevel(level);
  }
  return flags;
}

// SIGTERM/SIGINT wake the main thread through a pipe; the handler does nothing else.
int signal_pipe[2] = {-1, -1};

void OnSignal(int signal_number) {
  const char byte = static_cast<char>(signal_number);
  [[maybe_unused]] ssize_t ignored = write(signal_pipe[1], &byte, 1);
}

absl::Status InstallSignalHandlers() {
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) {
    return ErrnoEnvironmentError(errno, "pipe");
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return absl::OkStatus();
}

int WaitForSignal() {
  char byte = 0;
  while (read(signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  return byte;
}

// True when a signal (or the local agent's end) came within `timeout`.
bool SignalWithin(absl::Duration timeout) {
  pollfd fd = {.fd = signal_pipe[0], .events = POLLIN, .revents = 0};
  const int ms =
      static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 0, 60000));
  if (poll(&fd, 1, ms) <= 0) return false;
  WaitForSignal();
  return true;
}

// --drain-on-stop: drains every job that has workers, and keeps serving (the ranks report, commit
// their checkpoints and exit through this coordinator) until each has ended, `grace` has passed or
// another signal came.
void DrainBeforeStop(Supervisor& supervisor, absl::Duration grace, const std::string& why) {
  supervisor.HoldQueue();
  std::vector<std::string> draining;
  for (const JobRecord& job : supervisor.ListJobs(
           {JobState::kStarting, JobState::kRunning, JobState::kRestarting}, /*limit=*/0)) {
    absl::StatusOr<JobRecord> drained = supervisor.Drain(job.id, why);
    if (!drained.ok()) {
      TY_LOG(WARNING) << "cannot drain " << job.id << ": " << drained.status().message();
    } else if (!IsFinal(drained->state)) {
      draining.push_back(job.id);
    }
  }
  if (draining.empty()) return;
  TY_LOG(INFO) << "draining " << draining.size() << " job(s) before stopping; waiting up to "
               << absl::FormatDuration(grace) << " for them to end";
  const absl::Time deadline = absl::Now() + grace;
  while (!draining.empty()) {
    if (absl::Now() >= deadline) {
      TY_LOG(WARNING) << draining.size() << " job(s) still draining after "
                      << absl::FormatDuration(grace) << "; stopping (they stay adoptable)";
      return;
    }
    if (SignalWithin(absl::Milliseconds(100))) {
      TY_LOG(WARNING) << "a second signal; stopping with " << draining.size()
                      << " job(s) still draining";
      return;
    }
    std::erase_if(draining, [&supervisor](const std::string& id) {
      absl::StatusOr<JobView> view = supervisor.GetJob(id, /*max_events=*/0);
      return !view.ok() || IsFinal(view->job.state);
    });
  }
  TY_LOG(INFO) << "every drained job has ended";
  // A moment more, so that the final states reach the watchers (a batch script's `trainyard
  // watch`) before the streams end.
  SignalWithin(std::min(absl::Seconds(1), deadline - absl::Now()));
}

std::map<std::string, std::string> ReadLastAddresses(const std::string& state_dir) {
  std::map<std::string, std::string> last;
  std::ifstream in(state_dir + "/" + kLastAddressesFile);
  std::string kind, address;
  while (in >> kind >> address) last[kind] = address;
  return last;
}

// `wanted` with port 0 (any free port) becomes `previous` when that is on the same host: a
// restarted coordinator keeps its ports, so agents, workers that survived it and a fixed
// Prometheus target reach it where they did.
std::string PreferPrevious(const std::string& wanted, const std::string& previous) {
  const size_t colon = wanted.rfind(':');
  if (colon == std::string::npos || wanted.substr(colon + 1) != "0") return wanted;
  const size_t previous_colon = previous.rfind(':');
  if (previous_colon == std::string::npos ||
      previous.substr(0, previous_colon) != wanted.substr(0, colon)) {
    return wanted;
  }
  return previous;
}

// Whether a listener could bind `address` (HOST:PORT) now, as gRPC's and the metrics server's do
// (SO_REUSEADDR): not when another socket has taken the port since.
bool CanBind(const std::string& address) {
  absl::StatusOr<std::pair<std::string, int>> split = SplitHostPort(address);
  if (!split.ok()) return false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(split->second);
  if (getaddrinfo(split->first.c_str(), port.c_str(), &hints, &found) != 0) return false;
  bool free = found != nullptr;
  for (addrinfo* a = found; a != nullptr && free; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    const int one = 1;
    free = fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
           bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (fd >= 0) close(fd);
  }
  freeaddrinfo(found);
  return free;
}

// Listens where the previous start did when the flags ask for any free port, address by address:
// one that another process has taken since becomes a new port, the others stay.
absl::StatusOr<std::unique_ptr<Coordinator>> StartCoordinator(const Flags& flags) {
  const std::map<std::string, std::string> last = ReadLastAddresses(flags.coordinator.state_dir);
  auto prefer = [&](const std::string& wanted, const std::string& kind) {
    auto it = last.find(kind);
    if (it == last.end()) return wanted;
    const std::string previous = PreferPrevious(wanted, it->second);
    if (previous == wanted || CanBind(previous)) return previous;
    TY_LOG(WARNING) << "the previous " << kind << " address " << previous
                    << " is taken; listening on a new port";
    return wanted;
  };
  CoordinatorOptions options = flags.coordinator;
  options.listen = prefer(options.listen, "grpc");
  // The cluster port too: agents, and workers that outlive this process, reconnect to it.
  if (last.count("cluster")) {
    options.cluster_listen = prefer(options.cluster_listen.empty()
                                        ? options.listen.substr(0, options.listen.rfind(':')) + ":0"
                                        : options.cluster_listen,
                                    "cluster");
  }
  if (!options.metrics_listen.empty()) {
    options.metrics_listen = prefer(options.metrics_listen, "metrics");
  }
  absl::StatusOr<std::unique_ptr<Coordinator>> started = Coordinator::Start(options);
  if (!started.ok() && (options.listen != flags.coordinator.listen ||
                        options.cluster_listen != flags.coordinator.cluster_listen ||
                        options.metrics_listen != flags.coordinator.metrics_listen)) {
    TY_LOG(WARNING) << "the previous addresses are unavailable (" << started.status().message()
                    << "); listening on new ports";
    started = Coordinator::Start(flags.coordinator);
  }
  return started;
}

// The host of the address workers are told to reach the coordinator at (--advertise-address, else
// the bound address); "" when that is an unspecified address (the agent then uses the hostname).
std::string AdvertisedHost(const CoordinatorOptions& options, const std::string& bound) {
  const std::string address = options.advertise_address.empty() ? bound : options.advertise_address;
  absl::StatusOr<std::pair<std::string, int>> split = SplitHostPort(address);
  if (!split.ok() || split->first == "0.0.0.0" || split->first == "::") return "";
  return split->first;
}

absl::Status Run(int argc, char** argv) {
  absl::StatusOr<Flags> parsed = ParseFlags(argc, argv);
  if (!parsed.ok()) return Annotate(parsed.status(), kUsage);
  const Flags& flags = *parsed;
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles (its debug default);
  // that bookkeeping cost about 6% of the coordinator's CPU under load (perf, 8,192 simulated
  // agents). Lock discipline is checked at build time instead (thread_safety_check).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  TY_RETURN_IF_ERROR(InstallSignalHandlers());
  TY_ASSIGN_OR_RETURN(std::unique_ptr<Coordinator> coordinator, StartCoordinator(flags));
  std::cout << "trainyard-server listening on " << coordinator->address();
  if (!coordinator->metrics_address().empty()) {
    std::cout << " (metrics http://" << coordinator->metrics_address() << "/metrics)";
  }
  std::cout << std::endl;

  std::atomic<bool> stop_agent{false};
  std::thread agent;
  absl::Status agent_status;
  if (flags.local_agent) {
#if TRAINYARD_SERVER_WITH_AGENT
    agent::AgentOptions options;
    options.coordinator_address = coordinator->cluster_address();
    options.node_id = flags.agent_node_id;
    options.slots = flags.agent_slots;
    options.work_dir = flags.coordinator.state_dir + "/agent";
    options.worker_binary = flags.worker_binary;
    options.memory_tier_dir = flags.agent_memory_tier_dir;
    options.memory_tier_mb = flags.agent_memory_tier_mb;
    options.pass_env = flags.agent_pass_env;
    // The local agent is part of this process: it presents the embedded admin token.
    TY_ASSIGN_OR_RETURN(options.token,
                        rpc::ReadTokenFile(flags.coordinator.state_dir + "/admin.token"));
    if (!flags.coordinator.tls_client_ca_file.empty()) {
      // Mutual TLS: the local agent (and its workers) present the coordinator's own certificate.
      options.tls = rpc::TlsFiles{.ca = flags.coordinator.tls_client_ca_file,
                                  .cert = flags.coordinator.tls_cert_file,
                                  .key = flags.coordinator.tls_key_file};
      // Its memory tier is reached at the host the certificate names: the advertised one.
      options.advertise_host = AdvertisedHost(flags.coordinator, coordinator->address());
    }
    agent = std::thread([options, &stop_agent, &agent_status] {
      agent_status = agent::RunAgent(options, &stop_agent);
      if (!agent_status.ok()) {
        const char byte = 0;  // wakes main: the embedded default is useless without its agent
        [[maybe_unused]] ssize_t ignored = write(signal_pipe[1], &byte, 1);
      }
    });
#else
    return absl::FailedPreconditionError(
        "this build has no agent library; start with --no-local-agent and run trainyard-agent");
#endif
  }

  const int signal_number = WaitForSignal();
  if (signal_number != 0) {
    TY_LOG(INFO) << "received " << strsignal(signal_number) << "; shutting down";
    if (flags.drain_on_stop > absl::ZeroDuration()) {
      DrainBeforeStop(*coordinator->supervisor(), flags.drain_on_stop,
                      absl::StrCat("the coordinator received ", strsignal(signal_number)));
    }
  }
  stop_agent = true;
  if (agent.joinable()) agent.join();
  coordinator->Stop();
  return Annotate(agent_status, "local agent");
}

}  // namespace
}  // namespace trainyard::server

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "token") {
    const absl::Status status = trainyard::server::RunTokenCommand(
        std::vector<std::string>(argv + 2, argv + argc), std::cout);
    if (!status.ok()) std::cerr << "trainyard-server token: " << status.message() << std::endl;
    return trainyard::ExitCodeForStatus(status);
  }
  absl::Status status = trainyard::server::Run(argc, argv);
  if (!status.ok()) {
    std::cerr << "trainyard-server: " << status.message() << std::endl;
    return trainyard::ExitCodeForStatus(status);
  }
  return 0;
}
