// trainyard-agent: the node agent. One per node; it registers the node's CPU slots and GPUs with
// the coordinator and starts, stops and watches the workers the coordinator places here.
//
//   trainyard-agent --coordinator HOST:PORT [--node-id NAME] [--slots N] [--no-gpus]
//                   [--work-dir DIR] [--worker-binary PATH] [--threads-per-worker N]
//                   [--memory-tier-dir DIR] [--memory-tier-mb N] [--memory-tier-port PORT]
//                   [--pass-env PATTERN]... [--advertise-host HOST]
//                   [--tls-ca FILE --tls-cert FILE --tls-key FILE] [--token-file FILE]
//                   [--stop-grace-s SECONDS] [--log-level LEVEL]
//
// The memory tier (memory_tier.h) keeps the workers' in-memory snapshots: in DIR (default: a
// directory of /dev/shm named after the node), at most N MiB (default: a quarter of the
// machine's memory; 0: no tier), served on PORT (default: a free one).
//
// SIGTERM or SIGINT stops the agent; its workers keep running and a restarted agent with the
// same --work-dir adopts them. With --stop-grace-s (where the agent's end ends its workers too,
// as a Slurm job step's does), it first sends them SIGTERM, on which their coordinator drains
// their jobs, and stops once they have exited or SECONDS have passed. Exit codes: 0 stopped; 2 bad
// flags, no worker binary or a refused credential; 1 other.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/agent/agent.h"

ABSL_FLAG(std::string, coordinator, "", "the coordinator's gRPC address (HOST:PORT)");
ABSL_FLAG(std::string, node_id, "", "this node's stable name (default: the hostname)");
ABSL_FLAG(int, slots, 0, "CPU ranks this node runs at once (default: its CPU cores)");
ABSL_FLAG(bool, gpus, true, "offer this machine's GPUs (--no-gpus: none)");
ABSL_FLAG(std::string, work_dir, "trainyard-agent", "per-rank logs and the worker records");
ABSL_FLAG(std::string, worker_binary, "", "trainyard-worker (default: found beside this binary)");
ABSL_FLAG(int, threads_per_worker, 0, "OMP_NUM_THREADS of CPU workers (default: cores / slots)");
ABSL_FLAG(trainyard::FlagList, pass_env, {}, "another variable (or PREFIX*) workers inherit");
ABSL_FLAG(std::string, advertise_host, "", "where other nodes reach this one");
ABSL_FLAG(std::string, tls_ca, "", "mutual TLS: the CA (PEM)");
ABSL_FLAG(std::string, tls_cert, "", "mutual TLS: this node's certificate (PEM)");
ABSL_FLAG(std::string, tls_key, "", "mutual TLS: its key (PEM)");
ABSL_FLAG(std::string, token_file, "", "the agent's token");
ABSL_FLAG(std::string, memory_tier_dir, "", "the workers' in-memory snapshots");
ABSL_FLAG(int64_t, memory_tier_mb, -1, "their budget in MiB (0: none)");
ABSL_FLAG(int, memory_tier_port, 0, "where peer agents send copies (0: a free port)");
ABSL_FLAG(double, stop_grace_s, 0, "on a stop, how long draining workers may take to exit");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace trainyard::server::agent {
namespace {

constexpr char kUsage[] =
    "usage: trainyard-agent --coordinator HOST:PORT [--node-id NAME] [--slots N] [--no-gpus] "
    "[--work-dir DIR] [--worker-binary PATH] [--threads-per-worker N] [--memory-tier-dir DIR] "
    "[--memory-tier-mb N] [--memory-tier-port PORT] [--pass-env PATTERN]... "
    "[--advertise-host HOST] [--tls-ca FILE --tls-cert FILE --tls-key FILE] [--token-file FILE] "
    "[--stop-grace-s SECONDS] [--log-level LEVEL]";

constexpr char kHelp[] =
    "The node agent: registers this node's CPU slots and GPUs with the coordinator, and starts,\n"
    "stops and watches the workers it places here.\n"
    "\n"
    "  --coordinator HOST:PORT   the coordinator's gRPC address (required)\n"
    "  --node-id NAME            this node's stable name (default: the hostname); one per agent\n"
    "  --slots N                 CPU ranks this node runs at once (default: its CPU cores)\n"
    "  --no-gpus                 offer no GPUs even where CUDA devices exist\n"
    "  --work-dir DIR            per-rank logs and the worker records (default: trainyard-agent)\n"
    "  --worker-binary PATH      trainyard-worker (default: found beside this binary)\n"
    "  --threads-per-worker N    OMP_NUM_THREADS of CPU workers (default: cores / slots)\n"
    "  --memory-tier-dir DIR     the workers' in-memory snapshots (default: under /dev/shm)\n"
    "  --memory-tier-mb N        their budget in MiB (default: a quarter of memory; 0: none)\n"
    "  --memory-tier-port PORT   where peer agents send copies (default: a free port)\n"
    "  --pass-env PATTERN        another variable (or PREFIX*) workers inherit; repeatable\n"
    "  --advertise-host HOST     where other nodes reach this one: its memory tier and its\n"
    "                            workers' collectives (default: the hostname)\n"
    "  --tls-ca FILE --tls-cert FILE --tls-key FILE\n"
    "                            mutual TLS (PEM): this node's certificate, signed by the CA\n"
    "                            the coordinator trusts and naming --advertise-host; presented\n"
    "                            to the coordinator and peer agents, and used by its workers\n"
    "  --token-file FILE         the agent's token (trainyard-server token add --role agent);\n"
    "                            without one, only a client certificate the coordinator's token\n"
    "                            file maps to an agent identifies it\n"
    "  --stop-grace-s SECONDS    on SIGTERM or SIGINT, first send the workers SIGTERM (their\n"
    "                            coordinator then drains their jobs: the ranks checkpoint at a\n"
    "                            step they agree on and exit), and stop once they have exited or\n"
    "                            SECONDS have passed; for agents whose end ends their workers\n"
    "                            (a Slurm job step, a container) (default: 0, stop at once)\n"
    "  --log-level LEVEL         debug, info, warning or error (default: info)\n"
    "\n"
    "SIGTERM or SIGINT stops the agent; its workers keep running (unless --stop-grace-s drained\n"
    "them), and a restarted agent with the same --work-dir adopts them. While another live\n"
    "agent has the same --node-id, the coordinator refuses this one, which says so and asks\n"
    "again every 5 s. Exit codes: 0 stopped; 2 bad flags, no worker binary, or a credential the\n"
    "coordinator refuses; 1 other errors.\n";

std::atomic<bool> g_stop{false};

void OnStopSignal(int) { g_stop = true; }

absl::StatusOr<int> PositiveInt(const std::string& flag, int value) {
  if (value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be a positive integer, got ", value));
  }
  return value;
}

constexpr std::string_view kFlags[] = {"coordinator",
                                       "node-id",
                                       "slots",
                                       "gpus",
                                       "work-dir",
                                       "worker-binary",
                                       "threads-per-worker",
                                       "pass-env",
                                       "advertise-host",
                                       "tls-ca",
                                       "tls-cert",
                                       "tls-key",
                                       "token-file",
                                       "memory-tier-dir",
                                       "memory-tier-mb",
                                       "memory-tier-port",
                                       "stop-grace-s",
                                       "log-level"};

absl::StatusOr<AgentOptions> ParseFlags(int argc, char** argv) {
  TY_ASSIGN_OR_RETURN(const CommandLine line, ParseCommandLine(argc, argv, 1, kFlags));
  if (line.help) {
    std::cout << kUsage << "\n\n" << kHelp;
    std::exit(0);
  }
  TY_RETURN_IF_ERROR(RefusePositionals(line));
  AgentOptions options;
  options.coordinator_address = absl::GetFlag(FLAGS_coordinator);
  options.node_id = absl::GetFlag(FLAGS_node_id);
  if (line.Has("slots")) {
    TY_ASSIGN_OR_RETURN(options.slots, PositiveInt("slots", absl::GetFlag(FLAGS_slots)));
  }
  options.probe_gpus = absl::GetFlag(FLAGS_gpus);
  if (line.Has("work-dir")) options.work_dir = absl::GetFlag(FLAGS_work_dir);
  options.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  if (line.Has("threads-per-worker")) {
    TY_ASSIGN_OR_RETURN(options.threads_per_cpu_worker,
                        PositiveInt("threads-per-worker", absl::GetFlag(FLAGS_threads_per_worker)));
  }
  options.pass_env = absl::GetFlag(FLAGS_pass_env).values;
  options.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  options.tls = {.ca = absl::GetFlag(FLAGS_tls_ca),
                 .cert = absl::GetFlag(FLAGS_tls_cert),
                 .key = absl::GetFlag(FLAGS_tls_key)};
  if (line.Has("token-file")) {
    TY_ASSIGN_OR_RETURN(options.token, rpc::ReadTokenFile(absl::GetFlag(FLAGS_token_file)));
  }
  options.memory_tier_dir = absl::GetFlag(FLAGS_memory_tier_dir);
  if (line.Has("memory-tier-mb")) {
    options.memory_tier_mb = absl::GetFlag(FLAGS_memory_tier_mb);
    if (options.memory_tier_mb < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--memory-tier-mb must be a whole number of MiB (0: no tier), got ",
                       options.memory_tier_mb));
    }
  }
  if (options.memory_tier_mb == 0) {
    constexpr std::string_view kTierFlags[] = {"memory-tier-dir", "memory-tier-port"};
    TY_RETURN_IF_ERROR(
        RefuseGiven(line, kTierFlags, " configures the memory tier: --memory-tier-mb 0 has none"));
  }
  options.memory_tier_port = absl::GetFlag(FLAGS_memory_tier_port);
  if (options.memory_tier_port < 0 || options.memory_tier_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory-tier-port must be a port number, got ", options.memory_tier_port));
  }
  if (line.Has("stop-grace-s")) {
    const double grace = absl::GetFlag(FLAGS_stop_grace_s);
    if (!(grace >= 0 && grace <= 86400)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stop-grace-s must be a number of seconds from 0 to 86400, got ", grace));
    }
    options.stop_grace = absl::Seconds(grace);
  }
  if (line.Has("log-level")) {
    TY_ASSIGN_OR_RETURN(const LogLevel level, ParseLogLevel(absl::GetFlag(FLAGS_log_level)));
    SetMinLogLevel(level);
  }
  if (options.coordinator_address.empty()) {
    return absl::InvalidArgumentError("--coordinator HOST:PORT is required");
  }
  TY_RETURN_IF_ERROR(rpc::ValidateTlsFiles(options.tls));
  return options;
}

absl::Status Run(int argc, char** argv) {
  absl::StatusOr<AgentOptions> options = ParseFlags(argc, argv);
  if (!options.ok()) return Annotate(options.status(), kUsage);
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  return RunAgent(*options, &g_stop);
}

}  // namespace
}  // namespace trainyard::server::agent

int main(int argc, char** argv) {
  const absl::Status status = trainyard::server::agent::Run(argc, argv);
  if (!status.ok()) std::cerr << "trainyard-agent: error: " << status.message() << "\n";
  return trainyard::ExitCodeForStatus(status);
}
