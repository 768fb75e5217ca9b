// trainyard-agent: the node agent. One per node; it registers the node's CPU slots and GPUs with
// the coordinator and starts, stops and watches the workers the coordinator places here.
//
//   trainyard-agent --coordinator HOST:PORT [--node-id NAME] [--slots N] [--no-gpus]
//                   [--work-dir DIR] [--worker-binary PATH] [--threads-per-worker N]
//                   [--memory-tier-dir DIR] [--memory-tier-mb N] [--memory-tier-port PORT]
//                   [--pass-env PATTERN]... [--advertise-host HOST]
//                   [--tls-ca FILE --tls-cert FILE --tls-key FILE] [--token-file FILE]
//                   [--log-level LEVEL]
//
// The memory tier (memory_tier.h) keeps the workers' in-memory snapshots: in DIR (default: a
// directory of /dev/shm named after the node), at most N MiB (default: a quarter of the
// machine's memory; 0: no tier), served on PORT (default: a free one).
//
// SIGTERM or SIGINT stops the agent; its workers keep running and a restarted agent with the
// same --work-dir adopts them. Exit codes: 0 stopped; 2 bad flags, no worker binary or a refused
// credential; 1 other.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "server/agent/agent.h"

namespace trainyard::server::agent {
namespace {

constexpr char kUsage[] =
    "usage: trainyard-agent --coordinator HOST:PORT [--node-id NAME] [--slots N] [--no-gpus] "
    "[--work-dir DIR] [--worker-binary PATH] [--threads-per-worker N] [--memory-tier-dir DIR] "
    "[--memory-tier-mb N] [--memory-tier-port PORT] [--pass-env PATTERN]... "
    "[--advertise-host HOST] [--tls-ca FILE --tls-cert FILE --tls-key FILE] [--token-file FILE] "
    "[--log-level LEVEL]";

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
    "  --log-level LEVEL         debug, info, warning or error (default: info)\n"
    "\n"
    "SIGTERM or SIGINT stops the agent; its workers keep running, and a restarted agent with the\n"
    "same --work-dir adopts them. While another live agent has the same --node-id, the\n"
    "coordinator refuses this one, which says so and asks again every 5 s. Exit codes: 0\n"
    "stopped; 2 bad flags, no worker binary, or a credential the coordinator refuses; 1 other\n"
    "errors.\n";

std::atomic<bool> g_stop{false};

void OnStopSignal(int) { g_stop = true; }

absl::StatusOr<int> PositiveInt(const std::string& flag, const std::string& value) {
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " must be a positive integer, got '", value, "'"));
  }
  return parsed;
}

absl::StatusOr<AgentOptions> ParseFlags(int argc, char** argv) {
  AgentOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      return std::string(argv[++i]);
    };
    if (arg == "--coordinator") {
      TY_ASSIGN_OR_RETURN(options.coordinator_address, value());
    } else if (arg == "--node-id") {
      TY_ASSIGN_OR_RETURN(options.node_id, value());
    } else if (arg == "--slots") {
      TY_ASSIGN_OR_RETURN(const std::string v, value());
      TY_ASSIGN_OR_RETURN(options.slots, PositiveInt(arg, v));
    } else if (arg == "--no-gpus") {
      options.probe_gpus = false;
    } else if (arg == "--work-dir") {
      TY_ASSIGN_OR_RETURN(options.work_dir, value());
    } else if (arg == "--worker-binary") {
      TY_ASSIGN_OR_RETURN(options.worker_binary, value());
    } else if (arg == "--threads-per-worker") {
      TY_ASSIGN_OR_RETURN(const std::string v, value());
      TY_ASSIGN_OR_RETURN(options.threads_per_cpu_worker, PositiveInt(arg, v));
    } else if (arg == "--pass-env") {
      TY_ASSIGN_OR_RETURN(std::string v, value());
      options.pass_env.push_back(std::move(v));
    } else if (arg == "--advertise-host") {
      TY_ASSIGN_OR_RETURN(options.advertise_host, value());
    } else if (arg == "--tls-ca") {
      TY_ASSIGN_OR_RETURN(options.tls.ca, value());
    } else if (arg == "--tls-cert") {
      TY_ASSIGN_OR_RETURN(options.tls.cert, value());
    } else if (arg == "--tls-key") {
      TY_ASSIGN_OR_RETURN(options.tls.key, value());
    } else if (arg == "--token-file") {
      TY_ASSIGN_OR_RETURN(const std::string path, value());
      TY_ASSIGN_OR_RETURN(options.token, rpc::ReadTokenFile(path));
    } else if (arg == "--memory-tier-dir") {
      TY_ASSIGN_OR_RETURN(options.memory_tier_dir, value());
    } else if (arg == "--memory-tier-mb") {
      TY_ASSIGN_OR_RETURN(const std::string v, value());
      if (!absl::SimpleAtoi(v, &options.memory_tier_mb) || options.memory_tier_mb < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--memory-tier-mb must be a whole number of MiB (0: no tier), got '", v, "'"));
      }
    } else if (arg == "--memory-tier-port") {
      TY_ASSIGN_OR_RETURN(const std::string v, value());
      if (!absl::SimpleAtoi(v, &options.memory_tier_port) || options.memory_tier_port < 0 ||
          options.memory_tier_port > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat("--memory-tier-port must be a port number, got '", v, "'"));
      }
    } else if (arg == "--log-level") {
      TY_ASSIGN_OR_RETURN(const std::string v, value());
      TY_ASSIGN_OR_RETURN(const LogLevel level, ParseLogLevel(v));
      SetMinLogLevel(level);
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage << "\n\n" << kHelp;
      std::exit(0);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", arg, "'"));
    }
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
