#include "worker/coordinated.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/exit_codes.h"
#include "common/filesystem.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/status.h"
#include "config/hang_limit.h"
#include "config/mesh.h"
#include "config/spec.h"
#include "planner/run_report_proto.h"
#include "proto/trainyard.grpc.pb.h"
#include "worker/backend.h"
#include "worker/checkpoint/reader.h"
#include "worker/checkpoint/writer.h"
#include "worker/convert/init_from.h"
#include "worker/flags.h"
#include "worker/grpc_kv_store.h"
#include "worker/grpc_memory_tier.h"
#include "worker/hang_watchdog.h"
#include "worker/parallel/placement.h"
#include "worker/parallel/wait_registry.h"
#include "worker/progress_reporter.h"
#include "worker/run_report.h"
#include "worker/termination.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

// Names this rank in a request or report to the coordinator.
template <typename Message>
void IdentifyRank(const CoordinatedOptions& options, Message& message) {
  message.set_job_id(options.job_id);
  message.set_attempt_id(options.attempt_id);
  message.set_rank(options.rank);
}

namespace v1 = ::trainyard::v1;

constexpr char kUsage[] =
    "usage: trainyard-worker --coordinator HOST:PORT --job JOB --attempt N --rank R "
    "[--threads N] [--join-timeout-s S] [--collective-timeout-s S]";

std::string LocalHostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

bool IsLoopback(const std::string& address) {
  return absl::StartsWith(address, "127.") || absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]") || absl::StartsWith(address, "ipv4:127.");
}

// Joins the rendezvous, retrying while the coordinator is unreachable (it may be restarting)
// until `timeout` has passed.
// How long TLS failures reaching the coordinator may last before the worker gives up: no
// coordinator restart mends a certificate that does not verify.
constexpr absl::Duration kTlsFailureWait = absl::Seconds(10);

// gRPC's message for a connection whose TLS handshake failed (a certificate that does not verify,
// or does not name the host dialled).
bool IsTlsFailure(absl::string_view message) {
  return absl::StrContains(message, "andshake") || absl::StrContains(message, "ertificate") ||
         absl::StrContains(message, "server name") || absl::StrContains(message, "SSL_ERROR");
}

absl::StatusOr<v1::JoinReply> Join(v1::WorkerService::StubInterface& stub,
                                   const CoordinatedOptions& options) {
  v1::JoinRequest request;
  IdentifyRank(options, request);
  request.set_pid(getpid());
  request.set_hostname(LocalHostname());
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(options.join_timeout));
  // An unreachable coordinator is waited for (it may be restarting), but each failed connection
  // is seen, so that a TLS failure, which no restart mends, ends the wait early and says why.
  std::optional<absl::Time> tls_failing_since;
  bool said_why = false;
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    v1::JoinReply reply;
    const absl::Status status = rpc::FromGrpc(stub.Join(&context, request, &reply));
    if (status.ok()) return reply;
    const bool time_left = std::chrono::system_clock::now() < deadline;
    if (!absl::IsUnavailable(status) || !time_left) {
      return absl::Status(status.code(),
                          absl::StrCat("join job ", options.job_id, " attempt ", options.attempt_id,
                                       " as rank ", options.rank, ": ", status.message()));
    }
    const absl::Time now = RealClock()->Now();
    if (!IsTlsFailure(status.message())) {
      tls_failing_since.reset();
    } else if (!tls_failing_since) {
      tls_failing_since = now;
    } else if (now - *tls_failing_since >= kTlsFailureWait) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot reach the coordinator at ", options.coordinator, " over TLS for ",
          absl::FormatDuration(kTlsFailureWait),
          " (its certificate must name that host and be "
          "signed by the CA in TRAINYARD_TLS_CA; the coordinator's --advertise-address sets the "
          "host): ",
          status.message()));
    }
    if (!said_why) {
      std::cerr << "waiting for the coordinator at " << options.coordinator << ": "
                << status.message() << std::endl;
      said_why = true;
    }
    RealClock()->SleepFor(absl::Milliseconds(200));
  }
}

// The mesh the coordinator chose for this attempt, over `base` (the spec's); none when the reply
// names none.
std::optional<config::ParallelismSpec> MeshOfReply(const v1::JoinReply& reply,
                                                   config::ParallelismSpec base) {
  if (reply.mesh().dp() <= 0) return std::nullopt;
  base.dp = reply.mesh().dp();
  base.tp = std::max(1, reply.mesh().tp());
  base.pp = std::max(1, reply.mesh().pp());
  base.cp = std::max(1, reply.mesh().cp());
  // The expert-parallel degree (for `auto`, the planner's; 0: the spec's own).
  if (reply.mesh().ep() > 0) base.ep = reply.mesh().ep();
  base.zero = reply.mesh().zero_stage();
  // The schedule the coordinator admitted (for `schedule: auto`, the planner's choice).
  if (const auto schedule = config::ScheduleFromName(reply.mesh().schedule())) {
    base.schedule = *schedule;
    base.virtual_stages = std::max(1, reply.mesh().virtual_stages());
  }
  return base;
}

// The spec as the coordinator sent it, with the mesh it chose for this attempt.
absl::StatusOr<config::JobSpec> SpecOfAttempt(const v1::JoinReply& reply,
                                              const CoordinatedOptions& options) {
  TY_ASSIGN_OR_RETURN(
      config::JobSpec spec,
      config::ParseStoredJobSpec(reply.spec_yaml(), absl::StrCat("job ", options.job_id)));
  std::optional<config::ParallelismSpec> told = MeshOfReply(reply, spec.parallelism);
  const int per_node = spec.resources.devices_per_node;
  if (reply.world_size() != spec.world_size() && per_node > 0 &&
      reply.world_size() % per_node == 0) {
    // An elastic attempt on fewer (or more) nodes: the coordinator's mesh for that size (the
    // planner's, for `auto`), with the micro-batch fitted to it as the coordinator did.
    std::optional<config::JobSpec> resized = config::ResizedSpec(
        spec, reply.world_size() / per_node, told.has_value() ? &*told : nullptr);
    if (!resized) {
      return absl::InternalError(absl::StrCat("the coordinator placed ", reply.world_size(),
                                              " ranks, for which the spec has no valid mesh"));
    }
    spec = *std::move(resized);
  }
  if (told.has_value()) spec.parallelism = *told;
  if (reply.micro_batch() > 0) spec.training.micro_batch = reply.micro_batch();
  if (reply.world_size() != spec.world_size() || reply.rank() != options.rank) {
    return absl::InternalError(absl::StrCat("the coordinator's join reply does not fit: world ",
                                            reply.world_size(), " rank ", reply.rank(),
                                            ", but the mesh has ", spec.world_size(),
                                            " ranks and this is rank ", options.rank));
  }
  return spec;
}

int ThreadsFor(const CoordinatedOptions& options, const config::JobSpec& spec) {
  if (options.threads > 0) return options.threads;
  if (spec.training.threads > 0) return spec.training.threads;
  int from_env = 0;
  if (const char* omp = std::getenv("OMP_NUM_THREADS");
      omp != nullptr && absl::SimpleAtoi(omp, &from_env) && from_env > 0) {
    return from_env;
  }
  return 0;
}

void PrintSummary(const TrainResult& result) { std::cout << SummaryLine(result) << std::endl; }

// Rank 0 at the end: the planner's prediction for the mesh it ran beside what it measured,
// printed above the done line and sent to the coordinator (`trainyard report`).
void ReportRun(const config::JobSpec& spec, const TrainResult& result, ProgressReporter& reporter) {
  absl::StatusOr<planner::DeviceProfile> device = LocalDeviceProfile(spec);
  if (!device.ok()) {
    TY_LOG(WARNING) << "no run report: " << device.status();
    return;
  }
  const planner::RunComparison comparison =
      CompareRun(spec, *device, LoopOptionsFor(/*coordinated=*/true), result, 0);
  std::cout << planner::ComparisonText(comparison) << std::flush;
  if (absl::Status sent = reporter.SendRunReport(planner::ToProto(comparison)); !sent.ok()) {
    TY_LOG(WARNING) << "the run report did not reach the coordinator: " << sent;
  }
}

v1::Checkpoint CheckpointRecord(const checkpoint::SaveOutcome& outcome, int attempt_id) {
  v1::Checkpoint c;
  c.set_step(outcome.step);
  c.set_path(outcome.path);
  c.set_written_unix_ms(absl::ToUnixMillis(outcome.finished));
  c.set_state(outcome.committed ? v1::CHECKPOINT_STATE_COMMITTED : v1::CHECKPOINT_STATE_FAILED);
  c.set_bytes(outcome.bytes);
  c.set_write_seconds(outcome.write_seconds);
  c.set_blocked_seconds(outcome.blocked_seconds);
  c.set_message(outcome.message);
  c.set_attempt_id(attempt_id);
  return c;
}

}  // namespace

bool IsCoordinatedInvocation(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--coordinator" || arg.rfind("--coordinator=", 0) == 0) return true;
  }
  return false;
}

absl::StatusOr<CoordinatedOptions> ParseCoordinatedFlags(int argc, char** argv) {
  constexpr std::string_view kFlags[] = {
      "coordinator", "job", "attempt", "rank", "threads", "join-timeout-s", "collective-timeout-s"};
  CoordinatedOptions options;
  auto parse = [&]() -> absl::Status {
    TY_ASSIGN_OR_RETURN(const CommandLine line, ParseCommandLine(argc, argv, 1, kFlags));
    TY_RETURN_IF_ERROR(RefusePositionals(line));
    options.coordinator = absl::GetFlag(FLAGS_coordinator);
    options.job_id = absl::GetFlag(FLAGS_job);
    options.attempt_id = absl::GetFlag(FLAGS_attempt);
    options.rank = absl::GetFlag(FLAGS_rank);
    if (options.coordinator.empty() || options.job_id.empty() || !line.Has("attempt") ||
        !line.Has("rank")) {
      return absl::InvalidArgumentError("--coordinator, --job, --attempt and --rank are required");
    }
    if (options.attempt_id < 1 || options.rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--attempt must be at least 1 and --rank at least 0, got ",
                       options.attempt_id, " and ", options.rank));
    }
    if (line.Has("threads")) {
      options.threads = absl::GetFlag(FLAGS_threads);
      if (options.threads < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("--threads must be at least 1, got ", options.threads));
      }
    }
    TY_ASSIGN_OR_RETURN(options.join_timeout,
                        PositiveSeconds("join-timeout-s", absl::GetFlag(FLAGS_join_timeout_s)));
    TY_ASSIGN_OR_RETURN(
        options.collective_timeout,
        PositiveSeconds("collective-timeout-s", absl::GetFlag(FLAGS_collective_timeout_s)));
    return absl::OkStatus();
  };
  if (absl::Status status = parse(); !status.ok()) return Annotate(status, kUsage);
  return options;
}

// The hang watchdog fired: tell the coordinator what this rank waits for and end the process
// with kExitHang. The coordinator gathers the attempt's reports for a moment, blames the rank
// the others wait for and kills every worker of the attempt; a rank not killed within
// kHangExitGrace (the coordinator is unreachable, or slow) exits on its own.
constexpr absl::Duration kHangExitGrace = absl::Seconds(10);

[[noreturn]] void ReportHangAndExit(v1::WorkerService::StubInterface& stub,
                                    const CoordinatedOptions& options,
                                    const HangDiagnosis& diagnosis) {
  std::cerr << "trainyard-worker: hang: " << diagnosis.Describe() << std::endl;
  v1::HangReport report;
  IdentifyRank(options, report);
  report.set_step(diagnosis.step);
  report.set_elapsed_s(diagnosis.elapsed_s);
  report.set_limit_s(diagnosis.limit_s);
  if (diagnosis.wait) {
    report.set_operation(diagnosis.wait->operation);
    report.set_group(diagnosis.wait->group);
    for (int peer : diagnosis.wait->waiting_for) report.add_waiting_for(peer);
    report.set_waiting_s(diagnosis.waiting_s);
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::HangReply reply;
  const absl::Status sent = rpc::FromGrpc(stub.ReportHang(&context, report, &reply));
  if (sent.ok()) {
    RealClock()->SleepFor(kHangExitGrace);
  } else {
    std::cerr << "trainyard-worker: could not report the hang: " << sent.message() << std::endl;
  }
  RecordExitStatus(kExitHang);
  std::_Exit(kExitHang);
}

// TRAINYARD_INJECT_SPIN=RANK:STEP makes step STEP+1 of rank RANK spin forever (tests of hang
// detection).
namespace {

// What a worker reads data and reads and writes checkpoints through: where the coordinator
// confines those paths, a filesystem confined to the same roots, so a symbolic link made after
// the coordinator checked a path cannot lead out.
struct WorkerFileSystems {
  std::unique_ptr<FileSystem> confined_data, confined_checkpoints;
  FileSystem* data = RealFileSystem();
  FileSystem* checkpoints = RealFileSystem();
};

WorkerFileSystems FileSystemsFor(const v1::JoinReply& joined) {
  auto confined = [](const google::protobuf::RepeatedPtrField<std::string>& roots) {
    return roots.empty()
               ? nullptr
               : NewConfinedFileSystem(std::vector<std::string>(roots.begin(), roots.end()));
  };
  WorkerFileSystems files;
  files.confined_data = confined(joined.data_roots());
  files.confined_checkpoints = confined(joined.checkpoint_roots());
  if (files.confined_data) files.data = files.confined_data.get();
  if (files.confined_checkpoints) files.checkpoints = files.confined_checkpoints.get();
  return files;
}

}  // namespace

void ReadSpinInjection(TrainOptions& train) {
  const char* value = std::getenv("TRAINYARD_INJECT_SPIN");
  if (value == nullptr || *value == '\0') return;
  std::pair<std::string, std::string> parts = absl::StrSplit(value, absl::MaxSplits(':', 1));
  if (!absl::SimpleAtoi(parts.first, &train.spin_rank) ||
      !absl::SimpleAtoi(parts.second, &train.spin_at_step)) {
    TY_LOG(WARNING) << "TRAINYARD_INJECT_SPIN=" << value << " ignored: expected RANK:STEP";
    train.spin_at_step = 0;
  }
}

// TRAINYARD_INJECT_SLOW_PHASE=PHASE:SECONDS[,PHASE:SECONDS] (PHASE: evaluation, sampling or
// checkpoint) makes every such phase of this worker sleep that long first (tests of the phases'
// hang limits).
void ReadSlowPhaseInjection(TrainOptions& train) {
  const char* value = std::getenv("TRAINYARD_INJECT_SLOW_PHASE");
  if (value == nullptr || *value == '\0') return;
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    std::pair<std::string, std::string> parts = absl::StrSplit(item, absl::MaxSplits(':', 1));
    double seconds = 0;
    int phase = 0;
    for (int p = 1; p < config::kHangPhases; ++p) {
      const std::string name = config::HangPhaseName(static_cast<config::HangPhase>(p));
      if (absl::StartsWith(name, parts.first)) phase = p;
    }
    if (phase == 0 || !absl::SimpleAtod(parts.second, &seconds) || seconds < 0) {
      TY_LOG(WARNING) << "TRAINYARD_INJECT_SLOW_PHASE item " << item
                      << " ignored: expected evaluation, sampling or checkpoint:SECONDS";
      continue;
    }
    train.slow_phase_s[phase] = seconds;
  }
}

namespace {

// This rank in its groups: rendezvous through `store`, waits recorded in `waits` (for the
// watchdog), and the Gloo address TRAINYARD_GLOO_HOSTNAME names, else this host's name unless
// the coordinator is on loopback.
RankContext RankContextFor(const CoordinatedOptions& options, RankContext::Collectives collectives,
                           parallel::KeyValueStore* store, parallel::WaitRegistry* waits) {
  RankContext rank;
  rank.rank = options.rank;
  rank.collectives = collectives;
  rank.store = store;
  rank.gloo.timeout =
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options.collective_timeout));
  rank.gloo.waits = waits;
  if (const char* host = std::getenv("TRAINYARD_GLOO_HOSTNAME"); host != nullptr && *host) {
    rank.gloo.hostname = host;
  } else if (!IsLoopback(options.coordinator)) {
    rank.gloo.hostname = LocalHostname();
  }
  return rank;
}

// OK when the coordinator confirms `options`' attempt is still the job's current one.
absl::Status ConfirmAttempt(v1::WorkerService::StubInterface& stub,
                            const CoordinatedOptions& options) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ConfirmAttemptRequest request;
  IdentifyRank(options, request);
  v1::ConfirmAttemptReply reply;
  const grpc::Status s = stub.ConfirmAttempt(&context, request, &reply);
  if (s.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the coordinator did not confirm attempt ", options.attempt_id, " as the job's current one (",
      s.error_message(), "); a newer attempt may own the job"));
}

// The report that asks the coordinator what a SIGTERM means for this rank (a termination
// notice, ProgressReport.terminated).
v1::ProgressReport TerminationNotice(const CoordinatedOptions& options) {
  v1::ProgressReport report;
  IdentifyRank(options, report);
  report.set_terminated(true);
  return report;
}

}  // namespace

namespace {

// The channel to the coordinator's WorkerService.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CoordinatorChannel(const std::string& address) {
  // Reconnect quickly after a coordinator restart (gRPC's default backoff grows to two minutes,
  // during which progress reports would not get through).
  // Mutual TLS with the agent's files when the cluster uses it (the agent sets TRAINYARD_TLS_*).
  const rpc::TlsFiles tls = rpc::TlsFilesFromEnvironment();
  // The attempt's secret, from the agent that started this worker: every call presents it.
  return rpc::MakeChannel(address, tls, rpc::QuickReconnect(), rpc::AttemptSecretFromEnvironment());
}

// Where progress goes: the node agent's relay when the agent gave one (plaintext on loopback),
// falling back to the coordinator when the relay cannot answer; else the coordinator.
absl::StatusOr<std::unique_ptr<ProgressChannel>> ProgressChannelFor(
    std::shared_ptr<v1::WorkerService::StubInterface> coordinator) {
  const char* relay = std::getenv(rpc::kProgressRelayVariable);
  if (relay == nullptr || *relay == '\0') return MakeGrpcProgressChannel(std::move(coordinator));
  TY_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                      rpc::MakeChannel(relay, rpc::TlsFiles{}, grpc::ChannelArguments(),
                                       rpc::AttemptSecretFromEnvironment()));
  return MakeFallbackProgressChannel(
      MakeGrpcProgressChannel(
          std::shared_ptr<v1::ProgressRelay::StubInterface>(v1::ProgressRelay::NewStub(channel))),
      MakeGrpcProgressChannel(std::move(coordinator)));
}

// The log's first line: who this rank is, on which mesh, and what it will train.
void PrintRankBanner(const CoordinatedOptions& options, const config::JobSpec& spec,
                     const v1::JoinReply& joined, const Backend& backend) {
  const std::string cp_text = spec.parallelism.cp > 1
                                  ? absl::StrFormat(" cp %d", spec.parallelism.cp)
                                  : std::string();  // shown only where there is a ring
  std::cout << absl::StrFormat(
                   "job %s (%s) attempt %d: rank %d of %d on node %s | mesh dp %d%s tp %d pp %d "
                   "ZeRO-%d | %d steps of %d x %d tokens on %s\n",
                   options.job_id, spec.name, options.attempt_id, options.rank, joined.world_size(),
                   joined.node_id(), spec.parallelism.dp, cp_text, spec.parallelism.tp,
                   spec.parallelism.pp, spec.parallelism.zero, spec.training.steps,
                   spec.training.batch, spec.training.seq_len, backend.name())
            << std::flush;
}

}  // namespace

absl::Status RunCoordinated(const CoordinatedOptions& options) {
  SetLogContext(options.job_id, options.rank);
  const int64_t started = RealClock()->NowNanosMonotonic();
  TY_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> coordinator_channel,
                      CoordinatorChannel(options.coordinator));
  std::shared_ptr<v1::WorkerService::StubInterface> stub =
      v1::WorkerService::NewStub(std::move(coordinator_channel));
  std::atomic<bool> drain{false};  // the coordinator's drain order, or a SIGTERM it answered so
  // Asked directly, not through the agent's relay, which forwards reports in batches: a stop
  // should not wait for one.
  TerminationWatcher termination(
      [direct = MakeGrpcProgressChannel(stub),
       notice = TerminationNotice(options)](absl::Duration timeout) -> absl::StatusOr<v1::Order> {
        TY_ASSIGN_OR_RETURN(const v1::ProgressReply reply, direct->Report(notice, timeout));
        return reply.order();
      },
      &drain);
  TY_ASSIGN_OR_RETURN(const v1::JoinReply joined, Join(*stub, options));
  TY_ASSIGN_OR_RETURN(const config::JobSpec spec, SpecOfAttempt(joined, options));
  // From here the start-up limit runs: placement, connecting the groups, the restore and the
  // first step must finish within fault_tolerance.hang_startup_s.
  parallel::WaitRegistry waits(RealClock());
  HangWatchdog watchdog(spec.fault_tolerance, RealClock(), &waits,
                        [&stub, &options](const HangDiagnosis& diagnosis) {
                          ReportHangAndExit(*stub, options, diagnosis);
                        });
  watchdog.Start();
  const WorkerFileSystems files = FileSystemsFor(joined);
  TY_RETURN_IF_ERROR(checkpoint::CheckResumeFrom(*files.checkpoints, spec));
  TY_RETURN_IF_ERROR(convert::CheckInitFrom(*files.data, spec));
  const int threads = ThreadsFor(options, spec);
  // The agent gives a GPU rank exactly one visible device (CUDA_VISIBLE_DEVICES), so each rank
  // has its own: NCCL between them.
  TY_ASSIGN_OR_RETURN(Placement placement, PlaceRank(spec, /*local_rank=*/0, /*ranks_on_node=*/1,
                                                     threads, SystemDeviceProbe()));
  std::unique_ptr<Backend> backend = std::move(placement.backend);
  PrintRankBanner(options, spec, joined, *backend);

  GrpcKeyValueStore store(stub, joined.kv_prefix());
  RankContext rank = RankContextFor(options, placement.collectives, &store, &waits);
  TY_ASSIGN_OR_RETURN(std::unique_ptr<ProgressChannel> channel, ProgressChannelFor(stub));
  std::atomic<int64_t> checkpoint_order{0};
  ProgressReporter reporter(
      channel.get(), WorkerIdentity{options.job_id, options.attempt_id, options.rank}, RealClock(),
      absl::Milliseconds(500), absl::Minutes(10), &drain, &checkpoint_order);
  if (const config::MoeConfig& moe = spec.model.moe; moe.enabled()) {
    reporter.SetMoe(moe.has_bias() ? v1::MOE_BALANCE_BIAS : v1::MOE_BALANCE_AUX_LOSS, moe.top_k);
  }
  TrainOptions train;
  train.fs = files.checkpoints;
  train.data_fs = files.data;
  train.progress = &std::cout;
  train.on_step = [&reporter](const StepReport& step) { return reporter.OnStep(step); };
  train.stop_requested = &drain;
  train.watchdog = &watchdog;
  train.checkpoint_order = &checkpoint_order;
  ReadSpinInjection(train);
  ReadSlowPhaseInjection(train);
  train.on_phase = [&reporter](config::HangPhase phase, double limit_s, int64_t step) {
    reporter.OnPhase(phase, limit_s, step);
  };
  train.recorded_checkpoint = joined.resume_from().path();
  train.on_checkpoint = [&reporter, &options](const checkpoint::SaveOutcome& outcome) {
    reporter.AddCheckpoint(CheckpointRecord(outcome, options.attempt_id));
  };
  std::unique_ptr<MemoryTierClient> tier;
  if (const char* address = std::getenv("TRAINYARD_MEMORY_TIER");
      address != nullptr && *address && spec.fault_tolerance.memory_tier_enabled()) {
    TY_ASSIGN_OR_RETURN(
        tier, MakeGrpcMemoryTierClient(address, rpc::TlsFilesFromEnvironment(), options.job_id,
                                       options.attempt_id, options.rank, spec.world_size(),
                                       options.collective_timeout / 2));
    train.memory_tier = tier.get();
  }
  train.attempt = options.attempt_id;
  // Fencing: a checkpoint commits only while the coordinator confirms this attempt is current.
  train.may_commit = [&stub, &options] { return ConfirmAttempt(*stub, options); };
  train.on_resumed = [&reporter, started](const ResumeInfo& info) {
    v1::Resumed resumed;
    resumed.set_step(info.step);
    resumed.set_from(info.from);
    resumed.set_from_memory(info.from_memory);
    resumed.set_restore_ms(1e3 * info.restore_seconds);
    resumed.set_started_ms((RealClock()->NowNanosMonotonic() - started) / 1e6);
    reporter.SetResumed(resumed);
  };
  TY_ASSIGN_OR_RETURN(const TrainResult result, TrainRank(spec, rank, *backend, train));
  if (options.rank == 0) {
    ReportRun(spec, result, reporter);  // first: the done line stays the log's last
    PrintSummary(result);
  }
  return absl::OkStatus();
}

absl::Status RunCoordinatedFromFlags(int argc, char** argv) {
  TY_ASSIGN_OR_RETURN(const CoordinatedOptions options, ParseCoordinatedFlags(argc, argv));
  return RunCoordinated(options);
}

void RecordExitStatus(int exit_code) {
  const char* path = std::getenv("TRAINYARD_EXIT_STATUS_FILE");
  if (path == nullptr || *path == '\0') return;
  (void)RealFileSystem()->WriteFileAtomic(path, absl::StrCat(exit_code, "\n"));
}

}  // namespace trainyard::worker
