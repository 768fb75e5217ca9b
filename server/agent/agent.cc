#include "server/agent/agent.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "common/logging.h"
#include "common/status.h"
#include "proto/trainyard.grpc.pb.h"
#include "server/agent/agent_core.h"
#include "server/agent/memory_tier.h"
#include "server/agent/memory_tier_service.h"
#include "server/agent/node_info.h"
#include "server/agent/process_launcher.h"
#include "server/agent/progress_relay.h"
#include "server/agent/progress_relay_service.h"

namespace trainyard::server::agent {
namespace {

constexpr absl::Duration kLoopPeriod = absl::Milliseconds(50);
// How long a stopping agent with a grace waits for the coordinator to end the stream.
constexpr absl::Duration kGracefulClose = absl::Seconds(3);
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(100);
// While the coordinator stays unreachable, the agent says so once per this long, not at every try.
constexpr absl::Duration kMaxQuietLog = absl::Minutes(1);
// How long an agent refused for its node id waits before it asks again.
constexpr absl::Duration kRefusedBackoff = absl::Seconds(5);

using Stream = grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>;

// Wakes the connection loop early when an order arrives or the stream ends.
class Wakeup {
 public:
  void Notify() {
    absl::MutexLock lock(&mu_);
    pending_ = true;
  }
  void WaitFor(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&pending_), timeout);
    pending_ = false;
  }

 private:
  absl::Mutex mu_;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<AgentConfig> MakeConfig(const AgentOptions& options) {
  if (options.coordinator_address.empty()) {
    return absl::InvalidArgumentError("the coordinator address is required");
  }
  if (options.slots < 0) {
    return absl::InvalidArgumentError(absl::StrCat("slots must be positive, got ", options.slots));
  }
  AgentConfig config;
  config.hostname = LocalHostname();
  config.node_id = options.node_id.empty() ? config.hostname : options.node_id;
  const int cores = LocalCpuCount();
  config.cpu_slots = options.slots > 0 ? options.slots : cores;
  config.memory_bytes = LocalMemoryBytes();
  if (options.probe_gpus) config.gpus = LocalGpus(SystemDeviceProbe());
  TY_ASSIGN_OR_RETURN(config.worker_binary, FindWorkerBinary(options.worker_binary));
  std::error_code error;
  const std::filesystem::path work_dir = std::filesystem::absolute(options.work_dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("work dir ", options.work_dir, ": ", error.message()));
  }
  config.work_dir = work_dir.lexically_normal().string();
  config.environment = CurrentEnvironment();
  std::random_device random;
  config.instance_id = absl::StrFormat("%08x%08x", random(), random());
  for (const std::string& pattern : options.pass_env) {
    if (!IsValidVariablePattern(pattern)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pass-env '", pattern, "': expected a variable name, or a prefix ending in '*'"));
    }
  }
  config.pass_env = options.pass_env;
  TY_RETURN_IF_ERROR(rpc::ValidateTlsFiles(options.tls));
  if (!options.advertise_host.empty() && !options.tls.enabled()) {
    return absl::InvalidArgumentError(
        "--advertise-host needs mutual TLS (--tls-ca, --tls-cert, --tls-key): other machines "
        "reach this node only over it");
  }
  config.tls = options.tls;
  config.gloo_hostname = options.advertise_host;
  config.threads_per_cpu_worker = options.threads_per_cpu_worker > 0
                                      ? options.threads_per_cpu_worker
                                      : std::max(1, cores / config.cpu_slots);
  return config;
}

// Starts a server on the port it had before this agent restarted, kept in `port_file`, when it
// can (the workers the agent adopts know only that address), else on a free one; records the
// port it got. `start(port)` starts it (0: a free port).
template <typename Server>
absl::StatusOr<std::unique_ptr<Server>> StartOnSavedPort(
    const std::string& port_file, std::string_view what,
    const std::function<absl::StatusOr<std::unique_ptr<Server>>(int)>& start) {
  FileSystem* fs = RealFileSystem();
  int port = 0;
  if (absl::StatusOr<std::string> saved = fs->ReadFile(port_file); saved.ok()) {
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*saved), &port)) port = 0;
  }
  absl::StatusOr<std::unique_ptr<Server>> server = start(port);
  if (!server.ok() && port != 0) {
    TY_LOG(WARNING) << what << " cannot have its previous port " << port << " ("
                    << server.status().message() << "); adopted workers cannot reach it until "
                    << "their next attempt";
    server = start(0);
  }
  if (!server.ok()) return server.status();
  const std::string at = (*server)->address();  // HOST:PORT
  TY_RETURN_IF_ERROR(fs->WriteFileAtomic(port_file, at.substr(at.rfind(':') + 1) + "\n"));
  return server;
}

absl::StatusOr<std::unique_ptr<ProgressRelayServer>> StartRelayServer(ProgressRelay* relay,
                                                                      const std::string& work_dir) {
  TY_RETURN_IF_ERROR(RealFileSystem()->CreateDirs(work_dir));
  return StartOnSavedPort<ProgressRelayServer>(
      work_dir + "/progress-relay.port", "the progress relay",
      [relay](int port) { return ProgressRelayServer::Start(relay, port); });
}

// The node's memory tier and its server, when it has a budget (config->memory_tier and its
// addresses set); nothing without one.
absl::Status StartMemoryTier(const AgentOptions& options, AgentConfig* config,
                             std::unique_ptr<MemoryTier>* tier,
                             std::unique_ptr<MemoryTierServer>* server) {
  const int64_t tier_mb = options.memory_tier_mb >= 0 ? options.memory_tier_mb
                                                      : LocalMemoryBytes() / 4 / (int64_t{1} << 20);
  if (tier_mb <= 0) return absl::OkStatus();
  const std::string root = options.memory_tier_dir.empty()
                               ? DefaultMemoryTierRoot(config->node_id, config->work_dir)
                               : options.memory_tier_dir;
  *tier = std::make_unique<MemoryTier>(RealFileSystem(), root, tier_mb << 20, config->node_id);
  TY_RETURN_IF_ERROR((*tier)->Start());
  // Plaintext keeps the tier on loopback: without mutual TLS the coordinator is on loopback
  // too, so every agent of the cluster is on this machine.
  const bool tls = options.tls.enabled();
  const std::string advertised = !tls                             ? "127.0.0.1"
                                 : options.advertise_host.empty() ? config->hostname
                                                                  : options.advertise_host;
  const auto start = [&](int port) {
    return MemoryTierServer::Start(tier->get(), RealFileSystem(),
                                   absl::StrCat(tls ? "0.0.0.0:" : "127.0.0.1:", port), advertised,
                                   config->node_id, options.tls);
  };
  if (options.memory_tier_port != 0) {
    TY_ASSIGN_OR_RETURN(*server, start(options.memory_tier_port));
  } else {
    TY_RETURN_IF_ERROR(RealFileSystem()->CreateDirs(config->work_dir));
    TY_ASSIGN_OR_RETURN(*server,
                        StartOnSavedPort<MemoryTierServer>(config->work_dir + "/memory-tier.port",
                                                           "the memory tier", start));
  }
  config->memory_tier = tier->get();
  config->memory_tier_address = (*server)->address();
  config->memory_tier_local_address = (*server)->local_address();
  TY_LOG(INFO) << "memory tier " << root << ": " << tier_mb << " MiB, peers reach it at "
               << config->memory_tier_address;
  return absl::OkStatus();
}

// When the agent stops: at once when the stop flag is set, or with a stop grace
// (AgentOptions::stop_grace) once the workers, sent SIGTERM at the stop (and any started since,
// when they are first seen), have exited or the grace has passed.
class StopCondition {
 public:
  StopCondition(std::atomic<bool>* stop, absl::Duration grace, AgentCore* core)
      : stop_(stop), grace_(grace), core_(core) {}

  bool requested() const { return *stop_; }
  // A stop with a grace ends the coordinator's stream only after it has what the workers' ends
  // produced.
  bool graceful() const { return *stop_ && grace_ > absl::ZeroDuration(); }

  // Whether the agent should stop now. Not a pure test: during a graceful stop each call also
  // sends SIGTERM to the workers not yet told (those started since the last call).
  bool Poll() {
    if (!*stop_) return false;
    if (grace_ <= absl::ZeroDuration()) return true;
    const int64_t now = RealClock()->NowNanosMonotonic();
    const int signalled = core_->TerminateWorkers();
    if (!deadline_) {
      deadline_ = now + absl::ToInt64Nanoseconds(grace_);
      TY_LOG(INFO) << "stopping: sent SIGTERM to " << signalled
                   << " workers, whose jobs drain; waiting up to " << absl::FormatDuration(grace_)
                   << " for them to exit";
    } else if (signalled > 0) {
      TY_LOG(INFO) << "stopping: sent SIGTERM to " << signalled << " workers started since";
    }
    return core_->running_workers().empty() || now >= *deadline_;
  }

 private:
  std::atomic<bool>* stop_;
  absl::Duration grace_;
  AgentCore* core_;
  std::optional<int64_t> deadline_;  // monotonic; set at the stop when there is a grace
};

// One Connect stream, from registration until it breaks or `stopping`. True when the coordinator
// accepted the registration. *refused: set when the coordinator refused this agent because its
// node id belongs to another live agent (ALREADY_EXISTS) or its credential (UNAUTHENTICATED,
// PERMISSION_DENIED).
// `quiet`: the coordinator has been unreachable for a while and that was said already.
// `wakeup`: notified when the loop has something to send before its next tick.
bool RunSession(v1::AgentService::Stub& stub, AgentCore& core, StopCondition& stopping,
                absl::Status* refused, bool quiet, Wakeup& wakeup) {
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = stub.Connect(&context);
  std::atomic<bool> reader_done{false}, registered{false};
  std::atomic<bool> read_ended{false};  // the coordinator ended the stream (Read returned false)
  if (!stream->Write(core.Registration())) {
    reader_done = true;
  }
  std::thread reader([&] {
    v1::CoordinatorMessage message;
    while (!reader_done && stream->Read(&message)) {
      if (message.has_registered()) {
        if (!registered) TY_LOG(INFO) << "registered with the coordinator";
        registered = true;
      }
      core.Handle(message);
      wakeup.Notify();
    }
    read_ended = !reader_done.load();
    reader_done = true;
    wakeup.Notify();
  });
  Clock* clock = RealClock();
  int64_t next_heartbeat = clock->NowNanosMonotonic();
  while (!stopping.Poll() && !reader_done) {
    core.Tick();
    std::vector<v1::AgentMessage> outgoing = core.TakeOutgoing();
    // A heartbeat due within half an interval rides on a progress batch that goes last (so it
    // lists no worker whose exit is still to come): ranks that report about once an interval
    // then cost the coordinator one message an interval, not two.
    const int64_t interval = absl::ToInt64Nanoseconds(core.heartbeat_interval());
    if (registered && !outgoing.empty() && outgoing.back().has_progress() &&
        clock->NowNanosMonotonic() >= next_heartbeat - interval / 2) {
      v1::ProgressBatch* batch = outgoing.back().mutable_progress();
      *batch->mutable_heartbeat() = std::move(*core.Heartbeat(batch).mutable_heartbeat());
      next_heartbeat = clock->NowNanosMonotonic() + interval;
    }
    for (size_t i = 0; i < outgoing.size(); ++i) {
      if (!stream->Write(outgoing[i])) {
        core.ReturnUnsent(std::vector<v1::AgentMessage>(outgoing.begin() + i, outgoing.end()));
        reader_done = true;
        break;
      }
    }
    if (reader_done) break;
    if (registered && clock->NowNanosMonotonic() >= next_heartbeat) {
      if (!stream->Write(core.Heartbeat())) break;
      next_heartbeat = clock->NowNanosMonotonic() + interval;
    }
    wakeup.WaitFor(kLoopPeriod);
  }
  if (stopping.graceful() && !reader_done) {
    // The workers' last reports and exits went out just now: half-close, so that the coordinator
    // handles them before it ends the stream, and cancel only if it does not end it soon.
    stream->WritesDone();
    const int64_t until = clock->NowNanosMonotonic() + absl::ToInt64Nanoseconds(kGracefulClose);
    while (!reader_done && clock->NowNanosMonotonic() < until) wakeup.WaitFor(kLoopPeriod);
  }
  // A stream the coordinator ended carries its status (a refusal says why): cancel only one
  // this side gives up on.
  if (!read_ended) context.TryCancel();
  reader.join();
  const grpc::Status status = stream->Finish();
  if (status.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
      status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
      status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    *refused = rpc::FromGrpc(status);
    return registered;
  }
  if (!stopping.requested() && (registered || !quiet)) {
    TY_LOG(WARNING) << (registered ? "connection to the coordinator ended: "
                                   : "cannot connect to the coordinator: ")
                    << (status.ok() ? "OK" : status.error_message()) << " (code "
                    << status.error_code() << "); retrying (while it lasts, this is said at "
                    << "most once every " << absl::FormatDuration(kMaxQuietLog) << ")";
  }
  return registered;
}

}  // namespace

absl::Status RunAgent(const AgentOptions& options, std::atomic<bool>* stop) {
  TY_ASSIGN_OR_RETURN(AgentConfig config, MakeConfig(options));
  TY_LOG(INFO) << "agent " << config.node_id << " (" << config.hostname << "): " << config.cpu_slots
               << " CPU slots, " << config.gpus.size() << " GPUs, worker " << config.worker_binary
               << ", work dir " << config.work_dir << ", coordinator "
               << options.coordinator_address;
  std::unique_ptr<ProcessLauncher> launcher = MakeRealProcessLauncher();
  std::unique_ptr<MemoryTier> tier;
  std::unique_ptr<MemoryTierServer> tier_server;
  TY_RETURN_IF_ERROR(StartMemoryTier(options, &config, &tier, &tier_server));
  // A report that makes a batch due wakes the connection loop.
  Wakeup wakeup;
  ProgressRelay relay(RealClock(), [&wakeup] { wakeup.Notify(); });
  TY_ASSIGN_OR_RETURN(std::unique_ptr<ProgressRelayServer> relay_server,
                      StartRelayServer(&relay, config.work_dir));
  config.progress_relay = &relay;
  config.progress_relay_address = relay_server->address();
  AgentCore core(std::move(config), launcher.get(), RealFileSystem(), RealClock());
  TY_RETURN_IF_ERROR(core.Recover());

  TY_ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::Channel> channel,
      rpc::MakeChannel(options.coordinator_address, options.tls,
                       rpc::QuickReconnect(static_cast<int>(
                           absl::ToInt64Milliseconds(options.max_reconnect_backoff))),
                       options.token));
  std::unique_ptr<v1::AgentService::Stub> stub = v1::AgentService::NewStub(channel);

  absl::Duration backoff = kFirstBackoff;
  int failures = 0;       // connection attempts in a row that did not register
  int64_t last_said = 0;  // monotonic: when the last such failure was logged
  StopCondition stopping(stop, options.stop_grace, &core);
  while (!stopping.Poll()) {
    absl::Status refused;
    const int64_t now = RealClock()->NowNanosMonotonic();
    const bool quiet = failures > 0 && now - last_said < absl::ToInt64Nanoseconds(kMaxQuietLog);
    if (!quiet) last_said = now;
    if (RunSession(*stub, core, stopping, &refused, quiet, wakeup)) {
      if (failures > 1) TY_LOG(INFO) << "connected again after " << failures << " attempts";
      backoff = kFirstBackoff;
      failures = 0;
    } else {
      ++failures;
    }
    if (absl::IsUnauthenticated(refused) || absl::IsPermissionDenied(refused)) {
      // Retrying cannot help: the credential must be fixed. Workers keep running; their waiting
      // progress reports are answered (the relay's server cannot stop with calls unanswered).
      core.OnDisconnected();
      return absl::Status(refused.code(), absl::StrCat("the coordinator refused this agent's "
                                                       "credential: ",
                                                       refused.message()));
    }
    if (!refused.ok()) {
      // Another live agent has this node id: it keeps it. This one tries again slowly (the other
      // may be a ghost the coordinator has not declared lost yet), saying why.
      if (!quiet) TY_LOG(ERROR) << "the coordinator refused this agent: " << refused.message();
      backoff = std::max(backoff, kRefusedBackoff);
    }
    core.OnDisconnected();
    // Keep watching the workers while disconnected; their exits wait for the next registration.
    const int64_t until = RealClock()->NowNanosMonotonic() + absl::ToInt64Nanoseconds(backoff);
    while (!stopping.Poll() && RealClock()->NowNanosMonotonic() < until) {
      core.Tick();
      RealClock()->SleepFor(std::min(kLoopPeriod, backoff));
    }
    backoff = std::min(backoff * 2, options.max_reconnect_backoff);
  }
  TY_LOG(INFO) << "agent stopping; " << core.running_workers().size() << " workers keep running";
  if (tier != nullptr) {
    tier_server.reset();
    (void)RemoveRecursively(*RealFileSystem(), tier->root());  // a restarted agent starts empty
  }
  return absl::OkStatus();
}

}  // namespace trainyard::server::agent
