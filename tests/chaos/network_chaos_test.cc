// The control plane across a real network: every process speaking mutual TLS (the coordinator,
// agents, workers, the agents' memory tiers and the CLI), and a real partition made with network
// namespaces joined by veth pairs, after which the coordinator fences the partitioned node's
// workers: their attempt can neither commit a checkpoint nor report, and it ends once they hear
// from the coordinator again.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/certificates.h"
#include "tests/integration/controlplane_util.h"
#include "tests/integration/test_env.h"

namespace trainyard::testenv {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Certificates for a control plane: the CA, the coordinator's (for `server_names`), one per agent
// (for its advertised address) and a user's for the CLI.
struct Pki {
  std::string dir;

  std::vector<std::string> ServerFlags() const {
    return {"--tls-cert",        dir + "/server.crt", "--tls-key",
            dir + "/server.key", "--tls-client-ca",   dir + "/ca.crt"};
  }
  std::vector<std::string> Flags(const std::string& name) const {
    return {"--tls-ca",  dir + "/ca.crt",          "--tls-cert", dir + "/" + name + ".crt",
            "--tls-key", dir + "/" + name + ".key"};
  }
};

Pki MakePki(const std::string& dir, const std::string& server_names,
            const std::vector<std::pair<std::string, std::string>>& agents) {
  std::filesystem::create_directories(dir);
  IssueTestCa(dir);
  IssueTestCertificate(dir, "server", server_names);
  IssueTestCertificate(dir, "user", "DNS:user");
  for (const auto& [name, names] : agents) IssueTestCertificate(dir, name, names);
  return Pki{dir};
}

// The "resumed" event of `attempt`; empty when there is none (yet).
std::string ResumedCause(const v1::GetJobReply& reply, int attempt) {
  for (const v1::Event& event : reply.events()) {
    if (event.kind() == "resumed" && event.attempt_id() == attempt) return event.cause();
  }
  return "";
}

TEST(NetworkChaosTest, MutualTlsControlPlaneRecoversALostNodeFromThePeerCopy) {
  ControlPlane cp("chaos_tls");
  const Pki pki = MakePki(cp.dir() + "/pki", "IP:127.0.0.1",
                          {{"node-a", "IP:127.0.0.1"}, {"node-b", "IP:127.0.0.1"}});
  ASSERT_FALSE(HasFatalFailure());
  cp.StartServer({.local_agent = false, .extra_args = pki.ServerFlags()});
  cp.SetCliFlags(pki.Flags("user"));
  for (const std::string node : {"node-a", "node-b"}) {
    std::vector<std::string> flags = pki.Flags(node);
    flags.insert(flags.end(), {"--advertise-host", "127.0.0.1"});
    cp.StartAgent(node, 1, {}, flags);
  }
  // dp 2 over both nodes, a snapshot in memory every step and none on disk before step 1000: a
  // resume from memory after losing node-b needs the copy node-b's agent sent to node-a's.
  const std::string spec = absl::StrReplaceAll(
      TinySpec({.name = "tls",
                .nodes = 2,
                .steps = 1200,
                .checkpoint = absl::StrCat("{dir: ", cp.dir(), "/ckpt, every_steps: 1000}"),
                .fault_tolerance = "min_nodes: 1, backoff_initial_s: 0, resize_cooldown_s: 600, "
                                   "memory_every_steps: 1"}),
      {{"log_every: 10", "log_every: 1"}});
  const std::string job_id = cp.Submit(cp.WriteSpec("job.yaml", spec));
  ASSERT_FALSE(job_id.empty());
  ASSERT_TRUE(cp.WaitForStep(job_id, 300, 120)) << cp.Cli({"status", job_id}).out;
  const v1::GetJobReply running = cp.Status(job_id);
  int64_t node_b_worker = 0;
  for (const auto& p : running.attempts(0).placement()) {
    if (p.node_id() == "node-b") node_b_worker = p.pid();
  }
  ASSERT_GT(node_b_worker, 0) << running.DebugString();
  ASSERT_EQ(kill(static_cast<pid_t>(node_b_worker), SIGKILL), 0);
  cp.KillAgent("node-b");

  std::string cause;
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [&cause](const v1::GetJobReply& r) {
        cause = ResumedCause(r, 2);
        return !cause.empty();
      },
      30))
      << cp.Cli({"status", job_id}).out;
  EXPECT_THAT(cause, HasSubstr("memory tier"));
  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;

  // Without a certificate the CLI is refused (it cannot reach a coordinator that will talk).
  cp.SetCliFlags({});
  const ProcessResult anonymous = cp.Cli({"list"}, 30);
  EXPECT_EQ(anonymous.exit_code, 3) << anonymous.out << anonymous.err;
  // A certificate the CA did not sign is refused too.
  const Pki other = MakePki(cp.dir() + "/other-pki", "IP:127.0.0.1", {});
  ASSERT_FALSE(HasFatalFailure());
  cp.SetCliFlags({"--tls-ca", pki.dir + "/ca.crt", "--tls-cert", other.dir + "/user.crt",
                  "--tls-key", other.dir + "/user.key"});
  EXPECT_NE(cp.Cli({"list"}, 30).exit_code, 0);
  // Half a set of TLS files is bad input.
  cp.SetCliFlags({"--tls-ca", pki.dir + "/ca.crt"});
  const ProcessResult half = cp.Cli({"list"}, 30);
  EXPECT_EQ(half.exit_code, 2) << half.err;
  EXPECT_THAT(half.err, HasSubstr("--tls-cert"));
}

// iproute2's `ip` (the test skips where there is none).
std::string IpBinary() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (std::filesystem::exists(path)) return path;
  }
  return "ip";
}

// The embedded default with mutual TLS: its local agent presents the server's certificate, and
// its workers reach the coordinator and the agent's memory tier at the address that certificate
// names.
TEST(NetworkChaosTest, EmbeddedAgentSpeaksMutualTlsWithTheServersCertificate) {
  ControlPlane cp("chaos_tls_embedded");
  const Pki pki = MakePki(cp.dir() + "/pki", "IP:127.0.0.1", {});
  ASSERT_FALSE(HasFatalFailure());
  cp.StartServer({.local_agent = true, .extra_args = pki.ServerFlags()});
  cp.SetCliFlags(pki.Flags("user"));
  const std::string spec =
      TinySpec({.name = "embedded", .steps = 60, .fault_tolerance = "memory_every_steps: 1"});
  const std::string job_id = cp.Submit(cp.WriteSpec("job.yaml", spec));
  ASSERT_FALSE(job_id.empty());
  const ProcessResult watch = cp.Cli({"watch", job_id}, 120);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  const std::string log = cp.Cli({"logs", job_id, "--rank", "0"}).out;
  EXPECT_THAT(log, ::testing::HasSubstr("exact final loss"));
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("without the memory tier"))) << log;
  EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("its memory snapshots"))) << log;
}

// The coordinator tells workers to reach it at a name its certificate does not carry
// ("localhost", against a certificate for IP 127.0.0.1 only): every worker's TLS handshake fails.
// The worker gives up after 10 s saying why, instead of waiting out its 5-minute join timeout,
// and the job fails with that reason instead of burning its restarts on the same failure.
TEST(NetworkChaosTest, AWorkerThatCannotVerifyTheCoordinatorFailsFastSayingWhy) {
  ControlPlane cp("chaos_tls_mismatch");
  const Pki pki = MakePki(cp.dir() + "/pki", "IP:127.0.0.1", {});
  ASSERT_FALSE(HasFatalFailure());
  const int port = FreeLoopbackPort();
  std::vector<std::string> flags = pki.ServerFlags();
  flags.insert(flags.end(), {"--advertise-address", absl::StrCat("localhost:", port)});
  cp.StartServer(
      {.local_agent = true, .extra_args = flags, .listen = absl::StrCat("127.0.0.1:", port)});
  cp.SetCliFlags(pki.Flags("user"));
  const auto submitted = std::chrono::steady_clock::now();
  const std::string job_id = cp.Submit(cp.WriteSpec("job.yaml", TinySpec({.name = "mismatch"})));
  ASSERT_FALSE(job_id.empty());
  ASSERT_TRUE(cp.WaitFor(
      job_id, [](const v1::GetJobReply& r) { return r.job().state() == v1::JOB_STATE_FAILED; }, 90))
      << cp.Cli({"status", job_id}).out;
  EXPECT_LT(std::chrono::steady_clock::now() - submitted, std::chrono::seconds(60));
  const v1::GetJobReply failed = cp.Status(job_id);
  EXPECT_EQ(failed.job().restarts(), 0) << "a certificate problem is not worth a restart";
  EXPECT_THAT(cp.Cli({"status", job_id}).out, ::testing::HasSubstr("over TLS"));
}

// Runs `ip` with `args`; true on success.
bool Ip(const std::vector<std::string>& args, std::string* error = nullptr) {
  std::vector<std::string> argv = {IpBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  const ProcessResult result = RunProcess(argv, 30);
  if (error != nullptr) *error = result.err;
  return result.exit_code == 0;
}

// Two network namespaces, each joined to a bridge in this namespace by a veth pair, on a /24 of
// their own: the coordinator listens on the bridge's address, node n on 10.X.Y.(n + 2). Removed
// (namespaces, bridge, veths) on destruction.
class TwoHostNetwork {
 public:
  TwoHostNetwork() {
    const int id = static_cast<int>(getpid() % 100000);
    prefix_ = absl::StrCat("10.", 100 + id % 100, ".", id / 100 % 250, ".");
    bridge_ = absl::StrCat("tyb", id);
    std::string error;
    if (!Ip({"link", "add", bridge_, "type", "bridge"}, &error)) {
      skip_reason_ = "cannot create a bridge here: " + error;
      return;
    }
    bridge_made_ = true;
    if (!Ip({"addr", "add", gateway() + "/24", "dev", bridge_}, &error) ||
        !Ip({"link", "set", bridge_, "up"}, &error)) {
      skip_reason_ = "cannot configure the bridge: " + error;
      return;
    }
    for (int n = 0; n < 2; ++n) {
      const std::string ns = Namespace(n);
      const std::string veth = HostVeth(n);
      if (!Ip({"netns", "add", ns}, &error)) {
        skip_reason_ = "network namespaces are not allowed here: " + error;
        return;
      }
      namespaces_.push_back(ns);
      const bool ok =
          Ip({"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns}, &error) &&
          Ip({"link", "set", veth, "master", bridge_}, &error) &&
          Ip({"link", "set", veth, "up"}, &error) &&
          Ip({"netns", "exec", ns, "ip", "addr", "add", Address(n) + "/24", "dev", "eth0"},
             &error) &&
          Ip({"netns", "exec", ns, "ip", "link", "set", "eth0", "up"}, &error) &&
          Ip({"netns", "exec", ns, "ip", "link", "set", "lo", "up"}, &error);
      if (!ok) {
        skip_reason_ = "cannot wire namespace " + ns + ": " + error;
        return;
      }
    }
  }
  ~TwoHostNetwork() {
    for (const std::string& ns : namespaces_) Ip({"netns", "del", ns});
    if (bridge_made_) Ip({"link", "del", bridge_});
  }

  // Empty when the network is up; else why this machine cannot make it.
  const std::string& skip_reason() const { return skip_reason_; }
  std::string gateway() const { return prefix_ + "1"; }
  std::string Address(int n) const { return prefix_ + std::to_string(n + 2); }
  std::string Namespace(int n) const { return absl::StrCat(bridge_, "n", n); }
  std::vector<std::string> Exec(int n) const { return {IpBinary(), "netns", "exec", Namespace(n)}; }
  // Cuts (or restores) node n's only link.
  bool SetLink(int n, bool up) const {
    return Ip({"link", "set", HostVeth(n), up ? "up" : "down"});
  }

 private:
  std::string HostVeth(int n) const { return absl::StrCat(bridge_, "v", n); }

  std::string prefix_, bridge_, skip_reason_;
  bool bridge_made_ = false;
  std::vector<std::string> namespaces_;
};

// The committed checkpoint directories (those with a manifest) under `root`.
std::set<std::string> CommittedCheckpoints(const std::string& root) {
  std::set<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    if (std::filesystem::exists(entry.path() / "manifest.json")) {
      names.insert(entry.path().filename().string());
    }
  }
  return names;
}

// What every file under `dir` says, concatenated.
std::string ReadTree(const std::string& dir) {
  std::string text;
  std::error_code error;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, error)) {
    if (entry.is_regular_file()) text += ReadWholeFile(entry.path().string());
  }
  return text;
}

TEST(NetworkChaosTest, PartitionedNodeIsFencedAndItsJobGoesOnElsewhere) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  TwoHostNetwork net;
  if (!net.skip_reason().empty()) GTEST_SKIP() << net.skip_reason();
  ControlPlane cp("chaos_partition");
  const Pki pki = MakePki(cp.dir() + "/pki", "IP:" + net.gateway(),
                          {{"node-a", "IP:" + net.Address(0)}, {"node-b", "IP:" + net.Address(1)}});
  ASSERT_FALSE(HasFatalFailure());
  cp.StartServer(
      {.local_agent = false, .extra_args = pki.ServerFlags(), .listen = net.gateway() + ":0"});
  cp.SetCliFlags(pki.Flags("user"));
  auto start_agent = [&](int n, const std::string& node) {
    std::vector<std::string> flags = pki.Flags(node);
    flags.insert(flags.end(), {"--advertise-host", net.Address(n)});
    cp.StartAgent(node, 1, {}, flags, net.Exec(n));
  };
  // One rank, placed on node-b (the only node at first), checkpointing every 100 steps.
  start_agent(1, "node-b");
  const std::string ckpt = cp.dir() + "/ckpt";
  const std::string job_id = cp.Submit(cp.WriteSpec(
      "job.yaml", TinySpec({.name = "partition",
                            .steps = 6000,
                            .checkpoint = absl::StrCat("{dir: ", ckpt, ", every_steps: 100}"),
                            .fault_tolerance = "backoff_initial_s: 0, memory_every_steps: 0"})));
  ASSERT_FALSE(job_id.empty());
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [](const v1::GetJobReply& r) {
        return r.job().state() == v1::JOB_STATE_RUNNING && r.job().last_checkpoint().step() >= 200;
      },
      120))
      << cp.Cli({"status", job_id}).out;
  start_agent(0, "node-a");
  for (int i = 0; i < 100 && cp.Cli({"nodes"}, 30).out.find("node-a") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::vector<int64_t> stale = cp.WorkerPids();
  ASSERT_EQ(stale.size(), 1u);
  const std::set<std::string> before = CommittedCheckpoints(ckpt);

  // The partition: node-b (its agent and its worker) can reach nothing, and nothing reaches it.
  ASSERT_TRUE(net.SetLink(1, false));
  const Clock::time_point cut = Clock::now();
  ASSERT_TRUE(cp.WaitFor(
      job_id,
      [](const v1::GetJobReply& r) {
        return r.job().state() == v1::JOB_STATE_RUNNING && r.attempts_size() == 2 &&
               r.attempts(1).placement_size() == 1 &&
               r.attempts(1).placement(0).node_id() == "node-a";
      },
      30))
      << "no attempt on node-a within 30 s of the partition: " << cp.Cli({"status", job_id}).out;
  std::cout << "attempt 2 ran on node-a "
            << std::chrono::duration<double>(Clock::now() - cut).count()
            << " s after node-b was cut off" << std::endl;

  // The stale worker trains on, alone, and reaches checkpoint steps: each save is refused
  // because the coordinator cannot confirm its attempt.
  const std::string node_b_logs = cp.dir() + "/agent-node-b";
  bool fenced = false;
  for (int i = 0; i < 300 && !fenced; ++i) {
    fenced = ReadTree(node_b_logs).find("not committed") != std::string::npos;
    if (!fenced) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!fenced) {
    auto tail = [](const std::string& text) {
      return text.substr(text.size() - std::min<size_t>(text.size(), 3000));
    };
    ADD_FAILURE() << "the partitioned worker never tried to commit a checkpoint; its log ends: "
                  << tail(ReadWholeFile(node_b_logs + "/logs/" + job_id + "/attempt-1/rank-0.log"))
                  << "\nits agent's log ends: "
                  << tail(ReadWholeFile(cp.dir() + "/agent-node-b.err"));
  }
  EXPECT_FALSE(ProcessGone(stale[0])) << "the partitioned worker should still run, cut off";

  // The link returns: node-b's agent is told the attempt ended and stops the stale worker (or
  // the worker hears it first from its refused report, and stops itself).
  ASSERT_TRUE(net.SetLink(1, true));
  const Clock::time_point healed = Clock::now();
  bool gone = false;
  for (int i = 0; i < 300 && !gone; ++i) {
    gone = ProcessGone(stale[0]);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(gone) << "the stale worker still runs 30 s after the partition healed";
  std::cout << "the stale worker was gone "
            << std::chrono::duration<double>(Clock::now() - healed).count()
            << " s after the partition healed" << std::endl;

  const ProcessResult watch = cp.Cli({"watch", job_id}, 300);
  EXPECT_EQ(watch.exit_code, 0) << watch.out << watch.err;
  // Every checkpoint committed since the cut was written by attempt 2: the stale attempt's
  // directories carry its save token, and none of them committed after the cut.
  ASSERT_FALSE(before.empty());
  // "step-00000100-<token>"
  auto token = [](const std::string& name) { return name.substr(name.find('-', 5) + 1); };
  const std::string stale_token = token(*before.rbegin());
  for (const std::string& name : CommittedCheckpoints(ckpt)) {
    if (token(name) == stale_token) {
      EXPECT_TRUE(before.count(name)) << name << " was committed by the partitioned attempt";
    }
  }
  EXPECT_EQ(cp.Status(job_id).job().last_failure().failure_class(), "node_lost");
}

}  // namespace
}  // namespace trainyard::testenv
