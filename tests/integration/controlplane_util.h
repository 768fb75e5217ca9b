// A control plane for integration and chaos tests: trainyard-server and trainyard-agent as real
// processes on loopback in a scratch directory, and the trainyard CLI to drive them.
//
// Cleanup is total: the destructor SIGKILLs the servers and agents (their process groups) and
// then every trainyard-worker started for this control plane (found in /proc by its
// --coordinator argument), so a failing test leaves nothing running.
#ifndef TRAINYARD_TESTS_INTEGRATION_CONTROLPLANE_UTIL_H_
#define TRAINYARD_TESTS_INTEGRATION_CONTROLPLANE_UTIL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "proto/trainyard.pb.h"
#include "tests/integration/child_process.h"
#include "tests/integration/subprocess.h"

namespace trainyard::testenv {

namespace v1 = ::trainyard::v1;

struct ServerOptions {
  bool local_agent = false;  // run the embedded agent (node id "local")
  int local_slots = 2;
  int stop_grace_s = 2;
  bool metrics = false;
  std::vector<std::string> extra_args;  // more trainyard-server flags
  std::vector<std::string> env;         // "NAME=value" for the server (and its local agent)
  std::string listen;                   // --listen of the first start; empty: 127.0.0.1:0
};

struct TinyJob {
  std::string name = "tiny";
  int nodes = 1;
  int ranks_per_node = 1;
  int steps = 20;
  int max_restarts = 2;
  int priority = 0;
  std::string data;             // a `data:` mapping; empty: a small Markov chain
  std::string checkpoint;       // a `checkpoint:` mapping; empty: the job does not checkpoint
  std::string fault_tolerance;  // more `fault_tolerance:` entries ("hang_floor_s: 2, ...")
  int batch_per_rank = 4;
  std::string model = "{preset: gpt2-debug}";  // the `model:` mapping
  int eval_every = 0;                          // training.eval_every (2 batches each)
};

// A valid spec for the debug GPT-2 (or job.model): nodes x ranks_per_node data-parallel CPU
// ranks, one thread each, a batch of 4 sequences of 16 tokens per rank; a checkpoint section when
// job.checkpoint is given.
std::string TinySpec(const TinyJob& job);

// The exact final loss ("exact final loss 0x1.4p+0") of a rank-0 log; NaN when absent.
double ExactFinalLoss(const std::string& log);

// True when `pid` no longer runs (no /proc entry, or a zombie).
bool ProcessGone(int64_t pid);

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreeLoopbackPort();

class ControlPlane {
 public:
  explicit ControlPlane(const std::string& name);
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // Starts trainyard-server on the state directory and waits for its address. The first start
  // picks a free port; later starts (after KillServer) listen on the same one.
  void StartServer(const ServerOptions& options = ServerOptions());
  void KillServer();  // SIGKILL, no chance to clean up
  // Sends the server `signal` and waits up to `timeout_s` for it to exit: its wait status (as
  // waitpid gives it), or nullopt when it still ran (it is then killed). StartServer may follow.
  std::optional<int> StopServer(int signal, double timeout_s);
  bool ServerRunning();
  // `env`: "NAME=value" entries for the agent (and, for TRAINYARD_*, its workers).
  // `extra_args`: more trainyard-agent flags. Each agent's memory tier is <dir>/tier-<node>.
  // `wrapper`: a command the agent runs under (`ip netns exec NS`), which must exec it.
  void StartAgent(const std::string& node_id, int slots, const std::vector<std::string>& env = {},
                  const std::vector<std::string>& extra_args = {},
                  const std::vector<std::string>& wrapper = {});
  void KillAgent(const std::string& node_id);

  const std::string& address() const { return address_; }
  // The agents' and workers' listener (trainyard-server --cluster-listen).
  const std::string& cluster_address() const { return cluster_address_; }
  const std::string& dir() const { return dir_; }
  std::string state_dir() const { return dir_ + "/state"; }
  // The agents' token (role agent), made when the server first starts; the CLI presents the
  // admin token of the state directory.
  std::string agent_token_file() const { return dir_ + "/agent.token"; }
  std::string metrics_address() const;

  // Writes a spec file into the scratch directory; returns its path.
  std::string WriteSpec(const std::string& file_name, const std::string& yaml);
  // Global flags every later CLI run gets (such as --tls-ca, --tls-cert, --tls-key).
  void SetCliFlags(std::vector<std::string> flags) { cli_flags_ = std::move(flags); }
  // Runs the trainyard CLI with --server.
  ProcessResult Cli(std::vector<std::string> args, double timeout_s = 120);
  // Submits `spec_path` and returns the job id ("" after a test failure).
  std::string Submit(const std::string& spec_path);
  // `trainyard status JOB --json`, parsed.
  v1::GetJobReply Status(const std::string& job_id);
  // Polls Status until `done` holds (true) or `timeout_s` passes (false).
  bool WaitFor(const std::string& job_id, const std::function<bool(const v1::GetJobReply&)>& done,
               double timeout_s);
  // Waits until the job runs and has reported at least `step` steps.
  bool WaitForStep(const std::string& job_id, int64_t step, double timeout_s);

  // The pids of the live trainyard-worker processes of this control plane.
  std::vector<int64_t> WorkerPids() const;

 private:
  std::vector<std::string> ServerArgv(const ServerOptions& options) const;

  std::string dir_;
  std::string listen_ = "127.0.0.1:0";
  std::string address_;
  std::string cluster_address_;
  std::unique_ptr<ChildProcess> server_;
  std::map<std::string, std::unique_ptr<ChildProcess>> agents_;
  int server_starts_ = 0;
  std::vector<std::string> cli_flags_;
};

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_CONTROLPLANE_UTIL_H_
