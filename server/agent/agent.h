// The node agent as a whole: its gRPC transport around AgentCore. trainyard-agent runs it as a
// process; the embedded trainyard-server runs it on a thread of its own process.
//
// Threading: RunAgent blocks its calling thread and starts one more (the stream reader) per
// connection; it returns once *stop becomes true (checked every 50 ms).
#ifndef TRAINYARD_SERVER_AGENT_AGENT_H_
#define TRAINYARD_SERVER_AGENT_AGENT_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc.h"

namespace trainyard::server::agent {

struct AgentOptions {
  std::string coordinator_address;  // host:port of the coordinator's AgentService; required
  std::string node_id;              // stable node name; empty: the hostname
  int slots = 0;                    // CPU slots offered; 0: the CPU cores this process may use
  bool probe_gpus = true;           // report this machine's CUDA devices (CUDA builds only)
  std::string work_dir = "trainyard-agent";  // per-rank logs and the worker records
  std::string worker_binary;                 // empty: FindWorkerBinary("") (node_info.h)
  // OMP_NUM_THREADS for CPU workers; 0: max(1, cores / slots).
  int threads_per_cpu_worker = 0;
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
  // The memory tier (memory_tier.h): its directory (empty: DefaultMemoryTierRoot), its budget in
  // MiB (-1: a quarter of the machine's memory; 0: no tier), and the port of its service (0: a
  // free one).
  std::string memory_tier_dir;
  // More variables of the agent's environment that pass to workers (names, or prefixes ending
  // in '*'), beyond agent_core.h's kDefaultWorkerVariables.
  std::vector<std::string> pass_env;
  int64_t memory_tier_mb = -1;
  int memory_tier_port = 0;
  // Mutual TLS (all three files or none): the agent presents its certificate to the coordinator
  // and to peer agents, its memory tier admits only certificates the CA signed, and its workers
  // use the same files (TRAINYARD_TLS_*).
  rpc::TlsFiles tls;
  // The agent's bearer token for the coordinator (a token of role agent, or an admin's).
  std::string token;
  // The host or address other nodes reach this one at: its memory tier, and its workers'
  // collectives (TRAINYARD_GLOO_HOSTNAME). Empty: the hostname.
  std::string advertise_host;
  // How a stop treats the workers. Zero: the agent stops at once and its workers keep running,
  // for a restarted agent to adopt. Above zero (where the agent's end ends its workers too: a
  // Slurm job step, a container): the agent sends each running worker SIGTERM, on which a worker
  // asks the coordinator to drain its job (its ranks checkpoint at a step they agree on and exit;
  // worker/termination.h), and goes on relaying their progress and reporting their exits until
  // none runs or this long has passed.
  absl::Duration stop_grace = absl::ZeroDuration();
};

// Runs the agent until *stop is true: connects to the coordinator, registers (reporting the
// workers it still runs after a restart), heartbeats, carries out start/stop/log orders, and
// reconnects with backoff (100 ms doubling up to max_reconnect_backoff) whenever the stream
// breaks. Workers keep running when the agent stops (after their drain, with a stop_grace); a
// restarted agent with the same work_dir adopts them. Returns OK after stop. Errors, before
// connecting: INVALID_ARGUMENT for bad options, NOT_FOUND when there is no worker binary, and the
// filesystem's error when work_dir cannot be created.
[[nodiscard]] absl::Status RunAgent(const AgentOptions& options, std::atomic<bool>* stop);

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_AGENT_H_
