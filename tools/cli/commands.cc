#include "tools/cli/commands.h"

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/flags.h"
#include "common/status.h"
#include "common/text_check.h"
#include "config/spec.h"
#include "planner/run_report_proto.h"
#include "tools/cli/checkpoint_format.h"
#include "tools/cli/format.h"
#include "tools/cli/job_client.h"
#include "tools/cli/plan_command.h"
#include "tools/cli/server_address.h"
#include "tools/cli/worker_command.h"

// The flags of every command (global) and of each (CommandFlags). Values are kept as written:
// each command checks its own, and `export`, `sample` and `tokenize` pass theirs on to
// trainyard-worker.
ABSL_FLAG(std::string, server, "", "the coordinator's address");
ABSL_FLAG(std::string, token_file, "", "the token to present");
ABSL_FLAG(std::string, tls_ca, "", "mutual TLS: the coordinator's CA");
ABSL_FLAG(std::string, tls_cert, "", "mutual TLS: this client's certificate");
ABSL_FLAG(std::string, tls_key, "", "mutual TLS: its key");
ABSL_FLAG(bool, json, false, "machine-readable output");
ABSL_FLAG(bool, watch, false, "submit: follow the job to the end");
ABSL_FLAG(trainyard::FlagList, state, {}, "list: jobs in this state (repeatable)");
ABSL_FLAG(std::string, limit, "", "list: at most this many jobs");
ABSL_FLAG(std::string, rank, "", "logs: this rank's log");
ABSL_FLAG(std::string, attempt, "", "logs: this attempt's");
ABSL_FLAG(std::string, tail, "", "logs: the last lines");
ABSL_FLAG(bool, follow, false, "logs: keep following");
ABSL_FLAG(std::string, reason, "", "cancel, drain: why");
ABSL_FLAG(std::string, format, "", "export: the format");
ABSL_FLAG(std::string, out, "", "export, tokenize: the directory");
ABSL_FLAG(std::string, dtype, "", "export: the tensors' type");
ABSL_FLAG(std::string, max_shard_size, "", "export: the largest file");
ABSL_FLAG(std::string, prompt, "", "sample: the prompt as bytes");
ABSL_FLAG(std::string, prompt_tokens, "", "sample: the prompt as token ids");
ABSL_FLAG(std::string, tokenizer, "", "sample, tokenize: a tokenizer.json");
ABSL_FLAG(std::string, tokens, "", "sample: new tokens");
ABSL_FLAG(std::string, temperature, "", "sample: 0 is greedy");
ABSL_FLAG(std::string, top_k, "", "sample: draw among the K most likely");
ABSL_FLAG(std::string, top_p, "", "sample: draw among the most likely, up to P");
ABSL_FLAG(std::string, eos, "", "sample: the ids that end the text");
ABSL_FLAG(std::string, seed, "", "sample: the draws' seed");
ABSL_FLAG(std::string, device, "", "sample: where the model runs");
ABSL_FLAG(std::string, threads, "", "sample, tokenize: CPU threads");
ABSL_FLAG(std::string, separator, "", "tokenize: text before each document");
ABSL_FLAG(std::string, shard_tokens, "", "tokenize: ids per shard");
ABSL_FLAG(std::string, field, "", "tokenize: JSON Lines' text field");

namespace trainyard::cli {
namespace {

constexpr std::string_view kGlobalFlags[] = {"server",   "token-file", "tls-ca",
                                             "tls-cert", "tls-key",    "json"};

constexpr char kUsage[] =
    R"(usage: trainyard [--server HOST:PORT] [--token-file FILE]
                 [--tls-ca FILE --tls-cert FILE --tls-key FILE] [--json] COMMAND [ARGS]

commands:
  submit SPEC.yaml [--watch]        queue a job and print its id; --watch follows it to the end
  list [--state STATE]... [--limit N]
  status JOB                        state, attempts, mesh, progress, ETA, checkpointing,
                                    newest checkpoint, failures
  watch JOB                         live progress until the job ends (exit 0/1/4/5: succeeded,
                                    failed, cancelled, drained)
  logs JOB [--rank R] [--attempt A] [--tail N] [--follow]
  checkpoints JOB                   every checkpoint save: step, time, size, write and blocked
                                    seconds, state, path
  report JOB                        at the end of a run, the planner's prediction beside what
                                    was measured: memory by kind, bytes per axis, step time and
                                    its phases, bubble, MFU, and the error of each
  cancel JOB [--reason TEXT]
  drain JOB [--reason TEXT]         the ranks checkpoint at a step they agree on and exit; the
                                    job ends DRAINED, and resubmitting its spec continues from
                                    that checkpoint
  nodes                             the agents, their slots, and nodes cordoned after failures
  nodes uncordon NODE               lift a node's quarantine now
  plan SPEC [--json] [...]          memory, step time and MFU of every mesh, and the best one
                                    (no coordinator; docs/planner.md)
  export CHECKPOINT_OR_JOB --format hf|llmc --out DIR|FILE [--dtype fp32|bf16]
         [--max-shard-size SIZE]    a checkpoint (a job's newest committed one) as a Hugging Face
                                    model directory that transformers loads, or an llm.c GPT-2
                                    model file (docs/weights.md)
  sample WEIGHTS_OR_JOB [--prompt TEXT | --prompt-tokens IDS] [--tokenizer PATH] [--tokens N]
         [--temperature T] [--top-k K] [--top-p P] [--seed S] [--eos IDS|none]
         [--device cpu|cuda] [--threads N]
                                    text generated from a checkpoint, a job's newest checkpoint,
                                    a Hugging Face directory or an llm.c file (greedy when T is 0,
                                    the default: --top-k, --top-p and --seed need T > 0;
                                    --threads is for --device cpu); --prompt's text is tokenized
                                    by a Hugging Face directory's tokenizer.json or --tokenizer's;
                                    it ends at a token of --eos (default: the directory's
                                    eos_token_id)
  tokenize FILE... --tokenizer PATH --out DIR [--field NAME] [--separator TEXT]
           [--shard-tokens N] [--threads N]
                                    text files (one document each; with --field, JSON Lines of
                                    one each; gzip or zstd read as they are) through a
                                    tokenizer.json into llm.c shards DIR/train_*.bin for
                                    data.source bin (docs/weights.md)

exit codes: 0 ok (watch: succeeded), 1 failed or unexpected error, 2 bad input (flags, spec,
unknown job, a job in the wrong state, a refused token or another user's job), 3 coordinator
unreachable, 4 cancelled, 5 drained.

--server defaults to $TRAINYARD_SERVER, else ./trainyard-state/server.addr.
--token-file defaults to $TRAINYARD_TOKEN_FILE, else ~/.config/trainyard/token, else
./trainyard-state/admin.token (the embedded server's admin token, readable by its user only).
--tls-ca, --tls-cert, --tls-key (default $TRAINYARD_TLS_CA, _CERT, _KEY): mutual TLS with a
coordinator that listens beyond loopback; the certificate must be signed by its client CA.
--json prints machine-readable JSON (one object per line) for every command but export, sample
and tokenize, which print plain text and refuse it. export and sample of a path on this machine,
and tokenize, reach no coordinator: there --server, --token-file and the TLS flags are refused.
)";

// How long watch keeps trying to reconnect when the coordinator goes away (it may restart).
constexpr absl::Duration kReconnectWindow = absl::Seconds(60);
constexpr absl::Duration kReconnectPause = absl::Milliseconds(500);
constexpr int kSubmitTries = 5;

// The parsed command line: global flags, the command, its positionals and flags.
struct CommandLine {
  std::string server;
  std::string token_file;
  rpc::TlsFiles tls;  // --tls-ca, --tls-cert, --tls-key
  bool json = false;
  bool help = false;
  std::set<std::string> connection_flags_given;  // of kConnectionFlags, those written
  std::string command;
  std::vector<std::string> positionals;
  std::map<std::string, std::vector<std::string>> flags;  // name -> values ("" for switches)

  bool Has(const std::string& name) const { return flags.count(name) > 0; }
  std::string Value(const std::string& name) const {
    auto it = flags.find(name);
    return it == flags.end() ? "" : it->second.back();
  }
};

// Flags each command takes (a boolean flag is a switch).
const std::map<std::string, std::vector<std::string_view>>& CommandFlags() {
  static const auto* flags = new std::map<std::string, std::vector<std::string_view>>{
      {"submit", {"watch"}},
      {"list", {"state", "limit"}},
      {"status", {}},
      {"watch", {}},
      {"logs", {"rank", "attempt", "tail", "follow"}},
      {"cancel", {"reason"}},
      {"drain", {"reason"}},
      {"checkpoints", {}},
      {"report", {}},
      {"nodes", {}},
      {"export", {"format", "out", "dtype", "max-shard-size"}},
      {"sample",
       {"prompt", "prompt-tokens", "tokenizer", "tokens", "temperature", "top-k", "top-p", "seed",
        "eos", "device", "threads"}},
      {"tokenize", {"tokenizer", "out", "field", "separator", "shard-tokens", "threads"}},
  };
  return *flags;
}

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args) {
  for (std::string& arg : args) {
    if (arg == "-f") arg = "--follow";
  }
  CommandLine line;
  line.command = CommandOf(args);
  std::vector<std::string_view> accepted(std::begin(kGlobalFlags), std::end(kGlobalFlags));
  auto known = CommandFlags().find(line.command);
  if (known != CommandFlags().end()) {
    accepted.insert(accepted.end(), known->second.begin(), known->second.end());
  }
  absl::StatusOr<trainyard::CommandLine> parsed =
      ParseCommandLine(args, accepted, absl::StrCat("'", line.command, "'"));
  const bool help = parsed.ok() ? parsed->help
                                : std::find(args.begin(), args.end(), "--help") != args.end() ||
                                      std::find(args.begin(), args.end(), "-h") != args.end();
  if (help || line.command.empty()) {
    line.help = help;
    if (parsed.ok() || help) return line;
  }
  if (known == CommandFlags().end() && !line.command.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown command '", line.command, "'"));
  }
  if (!parsed.ok()) return parsed.status();
  line.positionals.assign(parsed->positionals.begin() + 1, parsed->positionals.end());
  line.server = absl::GetFlag(FLAGS_server);
  line.token_file = absl::GetFlag(FLAGS_token_file);
  line.tls = {.ca = absl::GetFlag(FLAGS_tls_ca),
              .cert = absl::GetFlag(FLAGS_tls_cert),
              .key = absl::GetFlag(FLAGS_tls_key)};
  line.json = absl::GetFlag(FLAGS_json);
  for (std::string_view name : kConnectionFlags) {
    if (parsed->Has(std::string(name))) line.connection_flags_given.insert(std::string(name));
  }
  for (std::string_view name : known->second) {
    auto given = parsed->values.find(std::string(name));
    if (given == parsed->values.end()) continue;
    const bool is_switch = name == "watch" || name == "follow";
    for (const std::string& value : given->second) {
      if (is_switch && value == "false") continue;
      line.flags[std::string(name)].push_back(is_switch ? "" : value);
    }
  }
  return line;
}

// trainyard-worker's arguments for `export`, `sample` or `tokenize` of `sources`: the command's
// own flags, then "--" and the sources.
std::vector<std::string> WorkerArgs(const CommandLine& line,
                                    const std::vector<std::string>& sources) {
  std::vector<std::string> args = {line.command};
  for (const auto& [name, values] : line.flags) {
    for (const std::string& value : values) {
      args.push_back("--" + name);
      args.push_back(value);
    }
  }
  args.push_back("--");  // the sources after it, whatever they are named ("-h", "--x")
  args.insert(args.end(), sources.begin(), sources.end());
  return args;
}

// `export`, `sample` and `tokenize` run trainyard-worker, which prints plain text: --json is
// refused. Of a path on this machine (`local`; tokenize always), they reach no coordinator: the
// connection flags are refused.
absl::Status RefuseUnusedWorkerFlags(const CommandLine& line, bool local) {
  if (line.json) {
    return absl::InvalidArgumentError(
        absl::StrCat("--json is not available for ", line.command, ": it prints plain text"));
  }
  if (!local) return absl::OkStatus();
  for (std::string_view name : kConnectionFlags) {
    if (line.connection_flags_given.contains(std::string(name))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", std::string(name), " is not used: ", line.command, " reads ",
                       line.positionals.empty() ? "files" : "'" + line.positionals[0] + "'",
                       " on this machine, without a coordinator"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> NonNegative(const CommandLine& line, const std::string& name, int fallback) {
  if (!line.Has(name)) return fallback;
  int value = 0;
  if (!absl::SimpleAtoi(line.Value(name), &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be a non-negative integer, got '", line.Value(name), "'"));
  }
  return value;
}

absl::StatusOr<std::string> OneJobId(const CommandLine& line) {
  if (line.positionals.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("usage: trainyard ", line.command, " JOB"));
  }
  return line.positionals[0];
}

std::string RandomRequestId() {
  std::random_device device;
  return absl::StrFormat("cli-%08x%08x%08x", device(), device(), device());
}

int64_t NowMs(const CliIo& io) { return absl::ToUnixMillis(io.clock->Now()); }

class Cli {
 public:
  Cli(const CommandLine& line, const CliIo& io, JobClient& client)
      : line_(line), io_(io), out_(*io.out), client_(client) {}

  absl::StatusOr<int> Run() {
    const std::string& c = line_.command;
    if (c == "submit") return Submit();
    if (c == "list") return List();
    if (c == "status") return Status();
    if (c == "watch") {
      TY_ASSIGN_OR_RETURN(const std::string id, OneJobId(line_));
      return Watch(id);
    }
    if (c == "logs") return Logs();
    if (c == "cancel") return Cancel();
    if (c == "drain") return Drain();
    if (c == "checkpoints") return Checkpoints();
    if (c == "report") return Report();
    if (c == "export" || c == "sample") return OnNewestCheckpoint();
    return Nodes();
  }

 private:
  absl::StatusOr<int> Submit() {
    if (line_.positionals.size() != 1) {
      return absl::InvalidArgumentError("usage: trainyard submit SPEC.yaml [--watch]");
    }
    const std::string& path = line_.positionals[0];
    // The coordinator refuses a larger spec; say so before reading or sending it.
    if (absl::StatusOr<uint64_t> size = io_.fs->FileSize(path);
        size.ok() && *size > config::kMaxSpecBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": the spec is ", *size,
                                                     " bytes, over the limit of ",
                                                     config::kMaxSpecBytes, " bytes"));
    }
    absl::StatusOr<std::string> spec = io_.fs->ReadFile(path);
    if (!spec.ok()) return Annotate(spec.status(), "cannot read the spec");
    // The request carries the spec as a protobuf string, which must be UTF-8: say where it is
    // not rather than fail to send it.
    if (std::optional<TextProblem> bad = FindTextProblem(*spec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", bad->line, ":", bad->column, ": spec: ", bad->what));
    }
    v1::SubmitJobRequest request;
    request.set_spec_yaml(*spec);
    request.set_spec_source(path);
    request.set_user(io_.user);
    request.set_client_request_id(RandomRequestId());  // makes the retries below safe
    absl::StatusOr<v1::Job> job;
    for (int attempt = 1; attempt <= kSubmitTries; ++attempt) {
      job = client_.Submit(request);
      if (!absl::IsUnavailable(job.status()) || attempt == kSubmitTries) break;
      io_.clock->SleepFor(absl::Milliseconds(300));
    }
    if (!job.ok()) return job.status();
    if (line_.json) {
      out_ << ToJson(*job) << std::endl;
    } else {
      out_ << job->id() << std::endl;
    }
    if (!line_.Has("watch")) return 0;
    return Watch(job->id());
  }

  absl::StatusOr<int> List() {
    if (!line_.positionals.empty()) {
      return absl::InvalidArgumentError("usage: trainyard list [--state STATE]... [--limit N]");
    }
    std::vector<v1::JobState> states;
    if (line_.Has("state")) {
      for (const std::string& name : line_.flags.at("state")) {
        v1::JobState state;
        if (!v1::JobState_Parse(absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(name)), &state) ||
            state == v1::JOB_STATE_UNSPECIFIED) {
          return absl::InvalidArgumentError(absl::StrCat(
              "unknown state '", name,
              "' (queued, starting, running, restarting, succeeded, failed, cancelled, "
              "drained)"));
        }
        states.push_back(state);
      }
    }
    TY_ASSIGN_OR_RETURN(const int limit, NonNegative(line_, "limit", 0));
    TY_ASSIGN_OR_RETURN(const std::vector<v1::Job> jobs, client_.List(states, limit));
    if (line_.json) {
      v1::ListJobsReply reply;
      for (const v1::Job& job : jobs) *reply.add_jobs() = job;
      out_ << ToJson(reply) << std::endl;
    } else {
      out_ << JobTable(jobs, NowMs(io_));
    }
    return 0;
  }

  absl::StatusOr<int> Status() {
    TY_ASSIGN_OR_RETURN(const std::string id, OneJobId(line_));
    TY_ASSIGN_OR_RETURN(const v1::GetJobReply reply, client_.Get(id));
    if (line_.json) {
      out_ << ToJson(reply) << std::endl;
    } else {
      out_ << JobReport(reply, NowMs(io_));
    }
    return 0;
  }

  // FAILED_PRECONDITION until rank 0 has sent the report (at the end of its run).
  absl::StatusOr<int> Report() {
    TY_ASSIGN_OR_RETURN(const std::string id, OneJobId(line_));
    TY_ASSIGN_OR_RETURN(const v1::GetJobReply reply, client_.Get(id));
    const v1::Job& job = reply.job();
    if (!job.progress().has_run_report()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " (", StateName(job.state()),
                       ") has no run report yet: rank 0 sends it when its run ends"));
    }
    if (line_.json) {
      out_ << ToJson(job.progress().run_report()) << std::endl;
    } else {
      out_ << job.id() << " (" << job.name() << ", " << StateName(job.state()) << ")\n"
           << planner::ComparisonText(planner::FromProto(job.progress().run_report()));
    }
    return 0;
  }

  absl::StatusOr<int> Cancel() {
    TY_ASSIGN_OR_RETURN(const std::string id, OneJobId(line_));
    TY_ASSIGN_OR_RETURN(const v1::Job job, client_.Cancel(id, line_.Value("reason"), io_.user));
    if (line_.json) {
      out_ << ToJson(job) << std::endl;
    } else if (job.state() == v1::JOB_STATE_CANCELLED) {
      out_ << job.id() << " is cancelled" << std::endl;
    } else {
      out_ << "cancelling " << job.id() << " (" << StateName(job.state())
           << "); its workers are being stopped" << std::endl;
    }
    return 0;
  }

  absl::StatusOr<int> Drain() {
    TY_ASSIGN_OR_RETURN(const std::string id, OneJobId(line_));
    TY_ASSIGN_OR_RETURN(const v1::Job job, client_.Drain(id, line_.Value("reason"), io_.user));
    if (line_.json) {
      out_ << ToJson(job) << std::endl;
    } else if (job.state() == v1::JOB_STATE_DRAINED) {
      out_ << job.id() << " is DRAINED: " << job.message() << std::endl;
    } else {
      out_ << "draining " << job.id() << " (" << StateName(job.state()) << "): its ranks "
           << (job.checkpoint_policy().dir().empty()
                   ? "stop at a step they agree on (the spec has no checkpoint section)"
                   : "checkpoint at a step they agree on")
           << ", then exit; `trainyard watch " << job.id() << "` follows it" << std::endl;
    }
    return 0;
  }

  // `export` or `sample` of a job: its newest committed checkpoint, read on this machine.
  absl::StatusOr<int> OnNewestCheckpoint() {
    const std::string& id = line_.positionals[0];
    TY_ASSIGN_OR_RETURN(const std::vector<v1::Checkpoint> checkpoints, client_.ListCheckpoints(id));
    const v1::Checkpoint* newest = nullptr;
    for (const v1::Checkpoint& c : checkpoints) {
      if (c.state() == v1::CHECKPOINT_STATE_COMMITTED && (!newest || c.step() > newest->step())) {
        newest = &c;
      }
    }
    if (newest == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " has no committed checkpoint to ", line_.command));
    }
    return RunWorkerCommand(WorkerArgs(line_, {newest->path()}));
  }

  absl::StatusOr<int> Checkpoints() {
    TY_ASSIGN_OR_RETURN(const std::string id, OneJobId(line_));
    TY_ASSIGN_OR_RETURN(const std::vector<v1::Checkpoint> checkpoints, client_.ListCheckpoints(id));
    if (line_.json) {
      v1::ListCheckpointsReply reply;
      for (const v1::Checkpoint& checkpoint : checkpoints) *reply.add_checkpoints() = checkpoint;
      out_ << ToJson(reply) << std::endl;
    } else {
      out_ << CheckpointTable(checkpoints, io_.time_zone);
    }
    return 0;
  }

  absl::StatusOr<int> Nodes() {
    if (line_.positionals.size() == 2 && line_.positionals[0] == "uncordon") {
      TY_ASSIGN_OR_RETURN(const v1::Node node, client_.Uncordon(line_.positionals[1]));
      if (line_.json) {
        out_ << ToJson(node) << std::endl;
      } else {
        out_ << "node " << node.node_id()
             << " uncordoned: the scheduler places attempts there again" << std::endl;
      }
      return 0;
    }
    if (!line_.positionals.empty()) {
      return absl::InvalidArgumentError("usage: trainyard nodes [uncordon NODE]");
    }
    TY_ASSIGN_OR_RETURN(const std::vector<v1::Node> nodes, client_.Nodes());
    if (line_.json) {
      v1::ListNodesReply reply;
      for (const v1::Node& node : nodes) *reply.add_nodes() = node;
      out_ << ToJson(reply) << std::endl;
    } else {
      out_ << NodeTable(nodes);
    }
    return 0;
  }

  // Follows the job until it is final, reconnecting while the coordinator restarts.
  absl::StatusOr<int> Watch(const std::string& id) {
    std::vector<double> losses;
    int64_t last_step = -1;
    std::string last_line;
    std::optional<v1::Job> final_job;
    int64_t outage_started = -1;
    auto on_update = [&](const v1::JobUpdate& update) {
      outage_started = -1;
      const v1::Job& job = update.job();
      if (job.progress().step() > 0 && job.progress().step() != last_step) {
        last_step = job.progress().step();
        losses.push_back(job.progress().loss());
      }
      if (line_.json) {
        out_ << ToJson(update) << std::endl;
      } else {
        ShowUpdate(update, losses, &last_line);
      }
      if (OutcomeExitCode(job.state()) >= 0) final_job = job;
      return true;
    };
    while (!final_job) {
      const absl::Status status = client_.Watch(id, on_update);
      if (final_job) break;
      if (!status.ok() && !absl::IsUnavailable(status)) return status;
      // The stream ended early (the coordinator is shutting down or restarting): reconnect.
      const int64_t now = io_.clock->NowNanosMonotonic();
      if (outage_started < 0) outage_started = now;
      if (now - outage_started > absl::ToInt64Nanoseconds(kReconnectWindow)) {
        return status.ok() ? absl::UnavailableError(absl::StrCat("the coordinator at ",
                                                                 client_.address(), " went away"))
                           : status;
      }
      io_.clock->SleepFor(kReconnectPause);
    }
    if (!line_.json) {
      if (io_.out_is_tty && !last_line.empty()) out_ << "\n";
      out_ << OutcomeLine(*final_job) << std::endl;
    }
    return OutcomeExitCode(final_job->state());
  }

  void ShowUpdate(const v1::JobUpdate& update, const std::vector<double>& losses,
                  std::string* last_line) {
    const std::string line = WatchLine(update.job(), losses, NowMs(io_));
    std::string event;
    if (update.has_event() && !update.event().kind().empty()) {
      event = absl::StrCat("event: ", update.event().kind(),
                           update.event().cause().empty() ? "" : " - ", update.event().cause());
    }
    if (io_.out_is_tty) {
      out_ << "\r\033[K";
      if (!event.empty()) out_ << event << "\n";
      out_ << line << std::flush;
    } else {
      if (!event.empty()) out_ << event << "\n";
      if (line != *last_line) out_ << line << "\n";
      out_ << std::flush;
    }
    *last_line = line;
  }

  absl::StatusOr<int> Logs() {
    TY_ASSIGN_OR_RETURN(const std::string id, OneJobId(line_));
    v1::GetLogsRequest request;
    request.set_job_id(id);
    TY_ASSIGN_OR_RETURN(const int attempt, NonNegative(line_, "attempt", 0));
    TY_ASSIGN_OR_RETURN(const int rank, NonNegative(line_, "rank", 0));
    TY_ASSIGN_OR_RETURN(const int tail, NonNegative(line_, "tail", 0));
    request.set_attempt_id(attempt);
    request.set_all_ranks(!line_.Has("rank"));
    request.set_rank(rank);
    request.set_tail_lines(tail);
    request.set_follow(line_.Has("follow"));
    // With several ranks, lines are prefixed with their rank; partial lines wait for the rest.
    std::map<int, std::string> partial;
    const bool prefix = request.all_ranks() && !line_.json;
    TY_RETURN_IF_ERROR(client_.Logs(request, [&](const v1::LogChunk& chunk) {
      if (line_.json) {
        out_ << "{\"attempt_id\":" << chunk.attempt_id() << ",\"rank\":" << chunk.rank()
             << ",\"data\":" << JsonString(chunk.data()) << "}" << std::endl;
        return;
      }
      if (!prefix) {
        out_ << chunk.data() << std::flush;
        return;
      }
      std::string& pending = partial[chunk.rank()];
      pending += chunk.data();
      size_t newline;
      while ((newline = pending.find('\n')) != std::string::npos) {
        out_ << "[rank " << chunk.rank() << "] " << pending.substr(0, newline + 1);
        pending.erase(0, newline + 1);
      }
      out_ << std::flush;
    }));
    for (const auto& [r, rest] : partial) {
      if (!rest.empty()) out_ << "[rank " << r << "] " << rest << "\n";
    }
    return 0;
  }

  const CommandLine& line_;
  const CliIo& io_;
  std::ostream& out_;
  JobClient& client_;
};

}  // namespace

int RunCli(const std::vector<std::string>& args, const CliIo& io) {
  if (IsPlanCommand(args)) return RunPlan(args, PlanIoFromEnvironment(io.out, io.err, io.fs));
  // With --json an error is also one JSON object on stdout, for scripts:
  // {"error":{"code":"NOT_FOUND","message":"...","exit_code":2}}.
  const bool json = std::find(args.begin(), args.end(), "--json") != args.end();
  auto fail = [&](const absl::Status& status) {
    std::string message(status.message());
    for (char& c : message) {
      if (c == '\n') c = ' ';
    }
    *io.err << "trainyard: error: " << message << std::endl;
    const int code = ExitCodeForStatus(status);
    if (json) {
      *io.out << "{\"error\":{\"code\":" << JsonString(absl::StatusCodeToString(status.code()))
              << ",\"message\":" << JsonString(message) << ",\"exit_code\":" << code << "}}"
              << std::endl;
    }
    return code;
  };
  absl::StatusOr<CommandLine> line = Parse(args);
  if (!line.ok()) {
    *io.err << kUsage;
    return fail(line.status());
  }
  if (line->help) {
    *io.out << kUsage;
    return 0;
  }
  if (line->command.empty()) {
    *io.err << kUsage;
    return 2;
  }
  const bool weights_command = line->command == "export" || line->command == "sample";
  if (weights_command && line->positionals.size() != 1) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("usage: trainyard ", line->command, " ",
                     line->command == "export" ? "CHECKPOINT" : "WEIGHTS",
                     "_OR_JOB [flags] (see trainyard --help)")));
  }
  const bool tokenize = line->command == "tokenize";
  const bool local = tokenize || (weights_command && io.fs->Exists(line->positionals[0]));
  if (weights_command || tokenize) {
    if (absl::Status refused = RefuseUnusedWorkerFlags(*line, local); !refused.ok()) {
      return fail(refused);
    }
  }
  if (local) {
    absl::StatusOr<int> code = RunWorkerCommand(WorkerArgs(*line, line->positionals));
    return code.ok() ? *code : fail(code.status());
  }
  absl::StatusOr<std::string> address =
      ResolveServerAddress(line->server, io.server_env, *io.fs, io.state_dir);
  if (!address.ok()) return fail(address.status());
  // Each TLS file from its flag, else from the environment.
  const rpc::TlsFiles tls{.ca = line->tls.ca.empty() ? io.tls_env.ca : line->tls.ca,
                          .cert = line->tls.cert.empty() ? io.tls_env.cert : line->tls.cert,
                          .key = line->tls.key.empty() ? io.tls_env.key : line->tls.key};
  absl::StatusOr<std::string> token =
      ResolveToken(line->token_file, io.token_file_env, io.user_token_file, *io.fs, io.state_dir);
  if (!token.ok()) return fail(absl::InvalidArgumentError(token.status().message()));
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      rpc::MakeChannel(*address, tls, grpc::ChannelArguments(), *token);
  if (!channel.ok()) return fail(absl::InvalidArgumentError(channel.status().message()));
  JobClient client(*address, *std::move(channel));
  absl::StatusOr<int> code = Cli(*line, io, client).Run();
  if (!code.ok()) return fail(code.status());
  return *code;
}

}  // namespace trainyard::cli
