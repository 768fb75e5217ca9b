#include "server/job_store.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "proto/stored.pb.h"

namespace trainyard::server {
namespace {

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs(
  seq INTEGER PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  name TEXT NOT NULL,
  spec_yaml TEXT NOT NULL,
  state INTEGER NOT NULL,
  priority INTEGER NOT NULL,
  nodes INTEGER NOT NULL,
  ranks_per_node INTEGER NOT NULL,
  device_kind INTEGER NOT NULL,
  dp INTEGER NOT NULL, tp INTEGER NOT NULL, pp INTEGER NOT NULL, zero_stage INTEGER NOT NULL,
  max_restarts INTEGER NOT NULL,
  heartbeat_timeout_ms INTEGER NOT NULL,
  user TEXT NOT NULL,
  client_request_id TEXT NOT NULL,
  created_us INTEGER, started_us INTEGER, finished_us INTEGER,
  attempts INTEGER NOT NULL, restarts INTEGER NOT NULL, current_attempt INTEGER NOT NULL,
  step INTEGER NOT NULL, total_steps INTEGER NOT NULL, loss REAL NOT NULL, lr REAL NOT NULL,
  grad_norm REAL NOT NULL, tokens_per_second REAL NOT NULL,
  step_total_ms REAL NOT NULL, step_forward_ms REAL NOT NULL, step_backward_ms REAL NOT NULL,
  step_optimizer_ms REAL NOT NULL, step_communication_ms REAL NOT NULL, step_data_ms REAL NOT NULL,
  val_loss REAL, eta_us INTEGER, progress_us INTEGER,
  checkpoint_step INTEGER NOT NULL, checkpoint_path TEXT NOT NULL, checkpoint_us INTEGER,
  cancel_requested INTEGER NOT NULL,
  message TEXT NOT NULL,
  drain_requested INTEGER NOT NULL DEFAULT 0,
  checkpoint_dir TEXT NOT NULL DEFAULT '',
  checkpoint_every_steps INTEGER NOT NULL DEFAULT 0,
  checkpoint_interval_auto INTEGER NOT NULL DEFAULT 0,
  checkpoint_keep INTEGER NOT NULL DEFAULT -1,
  run_report TEXT NOT NULL DEFAULT '',
  schedule TEXT NOT NULL DEFAULT '', virtual_stages INTEGER NOT NULL DEFAULT 1,
  cp INTEGER NOT NULL DEFAULT 1,
  moe TEXT NOT NULL DEFAULT '',
  accounts TEXT NOT NULL DEFAULT '',
  ep INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_client_request ON jobs(client_request_id)
  WHERE client_request_id <> '';
CREATE TABLE IF NOT EXISTS job_progress(
  job_id TEXT PRIMARY KEY,
  progress BLOB NOT NULL DEFAULT x'',
  accounts BLOB NOT NULL DEFAULT x'');
CREATE TABLE IF NOT EXISTS job_labels(
  job_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY(job_id, key));
CREATE TABLE IF NOT EXISTS attempts(
  job_id TEXT NOT NULL, attempt_id INTEGER NOT NULL, state INTEGER NOT NULL,
  dp INTEGER NOT NULL, tp INTEGER NOT NULL, pp INTEGER NOT NULL, zero_stage INTEGER NOT NULL,
  device_kind INTEGER NOT NULL,
  created_us INTEGER, running_us INTEGER, finished_us INTEGER, cause TEXT NOT NULL,
  failure_class TEXT NOT NULL DEFAULT '', blamed_rank INTEGER NOT NULL DEFAULT -1,
  schedule TEXT NOT NULL DEFAULT '', virtual_stages INTEGER NOT NULL DEFAULT 1,
  cp INTEGER NOT NULL DEFAULT 1,
  ep INTEGER NOT NULL DEFAULT 0,
  ranks BLOB NOT NULL DEFAULT x'',
  PRIMARY KEY(job_id, attempt_id));
CREATE TABLE IF NOT EXISTS events(
  id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, attempt_id INTEGER NOT NULL,
  time_us INTEGER, from_state INTEGER NOT NULL, to_state INTEGER NOT NULL,
  kind TEXT NOT NULL, cause TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_job ON events(job_id, id);
CREATE TABLE IF NOT EXISTS checkpoints(
  job_id TEXT NOT NULL, path TEXT NOT NULL, attempt_id INTEGER NOT NULL, step INTEGER NOT NULL,
  state INTEGER NOT NULL, bytes INTEGER NOT NULL, write_seconds REAL NOT NULL,
  blocked_seconds REAL NOT NULL, written_us INTEGER, message TEXT NOT NULL,
  PRIMARY KEY(job_id, path));
CREATE TABLE IF NOT EXISTS nodes(
  node_id TEXT PRIMARY KEY, hostname TEXT NOT NULL, cpu_slots INTEGER NOT NULL,
  gpus TEXT NOT NULL, registered_us INTEGER, last_seen_us INTEGER);
CREATE TABLE IF NOT EXISTS cordons(
  node_id TEXT PRIMARY KEY, reason TEXT NOT NULL, since_us INTEGER NOT NULL, until_us INTEGER);
)sql";

// Schema 1 -> 2: the checkpoint policy and the drain request of jobs (the checkpoints table is
// created by kSchema). Jobs stored before keep checkpoint_keep -1: "policy not recorded".
constexpr char kMigrateFrom1[] = R"sql(
ALTER TABLE jobs ADD COLUMN drain_requested INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN checkpoint_dir TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN checkpoint_every_steps INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN checkpoint_interval_auto INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN checkpoint_keep INTEGER NOT NULL DEFAULT -1;
)sql";

// Schema 2 -> 3: how each failed attempt was classified and whom it blamed (restart budgets are
// per class). Attempts stored before have no class and count against no class's budget.
constexpr char kMigrateFrom2[] = R"sql(
ALTER TABLE attempts ADD COLUMN failure_class TEXT NOT NULL DEFAULT '';
ALTER TABLE attempts ADD COLUMN blamed_rank INTEGER NOT NULL DEFAULT -1;
)sql";

// Schema 3 -> 4: whether a rank's exit followed a stop order (a cancel, a drain, the end of its
// attempt) rather than being a failure. Exits stored before count as failures, as they did.
constexpr char kMigrateFrom3[] = R"sql(
ALTER TABLE attempt_ranks ADD COLUMN exit_stopped INTEGER NOT NULL DEFAULT 0;
)sql";

// Schema 4 -> 5: the run report rank 0 sends at the end of a run (a serialized v1::RunReport,
// base64). Jobs stored before have none.
constexpr char kMigrateFrom4[] = R"sql(
ALTER TABLE jobs ADD COLUMN run_report TEXT NOT NULL DEFAULT '';
)sql";

// Schema 5 -> 6: the pipeline schedule of a job's mesh and of each attempt's (its name and
// virtual stages; '' for meshes stored before, which run the spec's own schedule). Each table
// separately: one kSchema made just now has them already.
constexpr char kMigrateJobsFrom5[] = R"sql(
ALTER TABLE jobs ADD COLUMN schedule TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN virtual_stages INTEGER NOT NULL DEFAULT 1;
)sql";
constexpr char kMigrateAttemptsFrom5[] = R"sql(
ALTER TABLE attempts ADD COLUMN schedule TEXT NOT NULL DEFAULT '';
ALTER TABLE attempts ADD COLUMN virtual_stages INTEGER NOT NULL DEFAULT 1;
)sql";

// Schema 6 -> 7: the context-parallel degree of a job's mesh and of each attempt's (1 for meshes
// stored before, which had none). Each table separately, as for schema 6.
constexpr char kMigrateJobsFrom6[] = R"sql(
ALTER TABLE jobs ADD COLUMN cp INTEGER NOT NULL DEFAULT 1;
)sql";
constexpr char kMigrateAttemptsFrom6[] = R"sql(
ALTER TABLE attempts ADD COLUMN cp INTEGER NOT NULL DEFAULT 1;
)sql";

// Schema 7 -> 8: the MoE layers' routing of a job's newest progress (EncodeMoe). Jobs stored
// before have none.
constexpr char kMigrateFrom7[] = R"sql(
ALTER TABLE jobs ADD COLUMN moe TEXT NOT NULL DEFAULT '';
)sql";

// Schema 8 -> 9: the job's failure-handling accounts (goodput, Young–Daly: stored.proto's
// JobAccounts, base64). Jobs stored before have none and start them afresh.
constexpr char kMigrateFrom8[] = R"sql(
ALTER TABLE jobs ADD COLUMN accounts TEXT NOT NULL DEFAULT '';
)sql";

// Schema 10 -> 11: the expert-parallel degree of a job's mesh and of each attempt's (an MoE job's
// `parallelism: auto` may now choose it); 0 for meshes stored before, which run the spec's own.
// Each table separately, as for schema 6.
constexpr char kMigrateJobsFrom10[] = R"sql(
ALTER TABLE jobs ADD COLUMN ep INTEGER NOT NULL DEFAULT 0;
)sql";
constexpr char kMigrateAttemptsFrom10[] = R"sql(
ALTER TABLE attempts ADD COLUMN ep INTEGER NOT NULL DEFAULT 0;
)sql";

// Schema 11 -> 12: an attempt's ranks move from the attempt_ranks table (a row per rank) into
// the attempts row (stored.proto's AttemptRanks): MoveRanksIntoAttempts copies them, then drops
// attempt_ranks.
constexpr char kMigrateAttemptsFrom11[] = R"sql(
ALTER TABLE attempts ADD COLUMN ranks BLOB NOT NULL DEFAULT x'';
)sql";

// Schema 9 -> 10: a job's progress and accounts move to the narrow job_progress table
// (progress: stored.proto's Progress; accounts: JobAccounts), which kSchema creates: the
// once-a-second write of every running job's progress no longer rewrites the jobs row. A job
// with no job_progress row (stored before, or never updated since) keeps the jobs columns'.

std::optional<int64_t> TimeToMicros(absl::Time time) {
  if (time == absl::InfinitePast()) return std::nullopt;
  return absl::ToUnixMicros(time);
}

absl::Time MicrosToTime(std::optional<int64_t> micros) {
  if (!micros.has_value()) return absl::InfinitePast();
  return absl::FromUnixMicros(*micros);
}

std::optional<int64_t> DurationToMicros(std::optional<absl::Duration> duration) {
  if (!duration.has_value()) return std::nullopt;
  return absl::ToInt64Microseconds(*duration);
}

// GPUs as one line each: index, memory bytes, name (tab-separated; the name goes last so that it
// may contain anything but a newline).
std::string EncodeGpus(const std::vector<GpuInfo>& gpus) {
  std::vector<std::string> lines;
  for (const GpuInfo& gpu : gpus) {
    std::string name = gpu.name;
    for (char& c : name) {
      if (c == '\n') c = ' ';
    }
    lines.push_back(absl::StrCat(gpu.index, "\t", gpu.memory_bytes, "\t", name));
  }
  return absl::StrJoin(lines, "\n");
}

absl::StatusOr<std::vector<GpuInfo>> DecodeGpus(const std::string& text) {
  std::vector<GpuInfo> gpus;
  if (text.empty()) return gpus;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits('\t', 2));
    GpuInfo gpu;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &gpu.index) ||
        !absl::SimpleAtoi(parts[1], &gpu.memory_bytes)) {
      return absl::InternalError(absl::StrCat("bad gpu record '", line, "'"));
    }
    gpu.name = std::string(parts[2]);
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

// MoE layers as one line each: layer, steps, tokens, dropped, dropped_total, balance, aux_loss,
// bias_spread, z_loss (tab-separated; the reals as "%.17g", which reads back exactly), then the
// picks per expert, comma-separated. A line written before z_loss was recorded lacks it (0).
std::string EncodeMoe(const std::vector<MoeLayerProgress>& layers) {
  std::vector<std::string> lines;
  for (const MoeLayerProgress& l : layers) {
    lines.push_back(absl::StrFormat("%d\t%d\t%d\t%d\t%d\t%d\t%.17g\t%.17g\t%.17g\t%s", l.layer,
                                    l.steps, l.tokens, l.dropped, l.dropped_total,
                                    static_cast<int>(l.balance), l.aux_loss, l.bias_spread,
                                    l.z_loss, absl::StrJoin(l.tokens_per_expert, ",")));
  }
  return absl::StrJoin(lines, "\n");
}

// Soft state that workers report again: a record that does not read back is dropped (nullopt),
// not a reason to refuse the database.
std::optional<std::vector<MoeLayerProgress>> DecodeMoe(const std::string& text) {
  std::vector<MoeLayerProgress> layers;
  if (text.empty()) return layers;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
    MoeLayerProgress l;
    int balance = 0;
    const bool with_z = f.size() == 10;
    if ((f.size() != 9 && !with_z) || !absl::SimpleAtoi(f[0], &l.layer) ||
        !absl::SimpleAtoi(f[1], &l.steps) || !absl::SimpleAtoi(f[2], &l.tokens) ||
        !absl::SimpleAtoi(f[3], &l.dropped) || !absl::SimpleAtoi(f[4], &l.dropped_total) ||
        !absl::SimpleAtoi(f[5], &balance) || balance < 0 ||
        balance > static_cast<int>(MoeBalance::kBias) || !absl::SimpleAtod(f[6], &l.aux_loss) ||
        !absl::SimpleAtod(f[7], &l.bias_spread) || (with_z && !absl::SimpleAtod(f[8], &l.z_loss))) {
      return std::nullopt;
    }
    l.balance = static_cast<MoeBalance>(balance);
    for (absl::string_view picks : absl::StrSplit(f.back(), ',', absl::SkipEmpty())) {
      if (!absl::SimpleAtoi(picks, &l.tokens_per_expert.emplace_back())) return std::nullopt;
    }
    layers.push_back(std::move(l));
  }
  return layers;
}

std::string EncodeProgress(const Progress& p) {
  stored::Progress out;
  out.set_step(p.step);
  out.set_total_steps(p.total_steps);
  out.set_loss(p.loss);
  out.set_logit_z_loss(p.logit_z_loss);
  out.set_learning_rate(p.learning_rate);
  out.set_grad_norm(p.grad_norm);
  out.set_tokens_per_second(p.tokens_per_second);
  stored::Progress::StepTimes* t = out.mutable_step_times();
  t->set_total_ms(p.step_times.total_ms);
  t->set_forward_ms(p.step_times.forward_ms);
  t->set_backward_ms(p.step_times.backward_ms);
  t->set_optimizer_ms(p.step_times.optimizer_ms);
  t->set_communication_ms(p.step_times.communication_ms);
  t->set_data_ms(p.step_times.data_ms);
  if (p.val_loss.has_value()) out.set_val_loss(*p.val_loss);
  if (std::optional<int64_t> eta = DurationToMicros(p.eta)) out.set_eta_us(*eta);
  if (std::optional<int64_t> reported = TimeToMicros(p.reported)) out.set_reported_us(*reported);
  out.set_run_report(p.run_report);
  out.set_moe(EncodeMoe(p.moe));
  return out.SerializeAsString();
}

// Soft state again: a record that does not parse leaves the progress as it was.
void DecodeProgress(const std::string& bytes, Progress& p) {
  stored::Progress in;
  if (!in.ParseFromString(bytes)) return;
  p.step = in.step();
  p.total_steps = in.total_steps();
  p.loss = in.loss();
  p.logit_z_loss = in.logit_z_loss();
  p.learning_rate = in.learning_rate();
  p.grad_norm = in.grad_norm();
  p.tokens_per_second = in.tokens_per_second();
  const stored::Progress::StepTimes& t = in.step_times();
  p.step_times = StepTimes{t.total_ms(),     t.forward_ms(),       t.backward_ms(),
                           t.optimizer_ms(), t.communication_ms(), t.data_ms()};
  p.val_loss.reset();
  if (in.has_val_loss()) p.val_loss = in.val_loss();
  p.eta.reset();
  if (in.has_eta_us()) p.eta = absl::Microseconds(in.eta_us());
  p.reported =
      MicrosToTime(in.has_reported_us() ? std::optional<int64_t>(in.reported_us()) : std::nullopt);
  p.run_report = in.run_report();
  p.moe = DecodeMoe(in.moe()).value_or(std::vector<MoeLayerProgress>{});
}

// Schema 11's attempt_ranks.last_log_lines: the lines joined by newlines.
std::vector<std::string> DecodeLines(const std::string& text, bool any) {
  if (!any) return {};
  return absl::StrSplit(text, '\n');
}

std::string EncodeRanks(const std::vector<RankSlot>& ranks) {
  stored::AttemptRanks out;
  for (const RankSlot& slot : ranks) {
    stored::AttemptRanks::Rank* rank = out.add_ranks();
    rank->set_node_id(slot.node_id);
    rank->set_hostname(slot.hostname);
    rank->set_slot(slot.slot);
    rank->set_local_rank(slot.local_rank);
    rank->set_pid(slot.pid);
    if (!slot.exit.has_value()) continue;
    const RankExit& exit = *slot.exit;
    stored::AttemptRanks::Exit* e = rank->mutable_exit();
    e->set_exit_code(exit.exit_code);
    e->set_signal(exit.signal);
    e->set_pid(exit.pid);
    if (exit.exited != absl::InfinitePast()) e->set_exited_ns(absl::ToUnixNanos(exit.exited));
    for (const std::string& line : exit.last_log_lines) e->add_last_log_lines(line);
    e->set_message(exit.message);
    e->set_stopped(exit.stopped);
  }
  return out.SerializeAsString();
}

absl::StatusOr<std::vector<RankSlot>> DecodeRanks(const std::string& bytes) {
  stored::AttemptRanks in;
  if (!in.ParseFromString(bytes)) return absl::DataLossError("its ranks do not parse");
  std::vector<RankSlot> ranks;
  ranks.reserve(in.ranks_size());
  for (const stored::AttemptRanks::Rank& rank : in.ranks()) {
    RankSlot& slot = ranks.emplace_back();
    slot.rank = static_cast<int>(ranks.size()) - 1;
    slot.node_id = rank.node_id();
    slot.hostname = rank.hostname();
    slot.slot = rank.slot();
    slot.local_rank = rank.local_rank();
    slot.pid = rank.pid();
    if (!rank.has_exit()) continue;
    const stored::AttemptRanks::Exit& e = rank.exit();
    RankExit& exit = slot.exit.emplace();
    exit.exit_code = e.exit_code();
    exit.signal = e.signal();
    exit.pid = e.pid();
    exit.exited = e.has_exited_ns() ? absl::FromUnixNanos(e.exited_ns()) : absl::InfinitePast();
    exit.last_log_lines.assign(e.last_log_lines().begin(), e.last_log_lines().end());
    exit.message = e.message();
    exit.stopped = e.stopped();
  }
  return ranks;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  TY_ASSIGN_OR_RETURN(std::unique_ptr<SqliteDb> db, SqliteDb::Open(path));
  TY_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL"));
  TY_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=FULL"));
  TY_RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON"));
  std::unique_ptr<JobStore> store(new JobStore(std::move(db)));
  TY_RETURN_IF_ERROR_WITH(store->Migrate(), absl::StrCat("job store ", path));
  return store;
}

absl::Status JobStore::Migrate() {
  absl::MutexLock lock(&mu_);
  TY_ASSIGN_OR_RETURN(auto txn, SqliteTransaction::Begin(*db_));
  TY_RETURN_IF_ERROR(db_->Exec(kSchema));
  TY_ASSIGN_OR_RETURN(auto select,
                      db_->Prepare("SELECT value FROM meta WHERE key='schema_version'"));
  TY_ASSIGN_OR_RETURN(bool has_version, select->Step());
  int version = kSchemaVersion;
  if (has_version && !absl::SimpleAtoi(select->Text(0), &version)) {
    return absl::FailedPreconditionError(
        absl::StrCat("unreadable schema_version '", select->Text(0), "'"));
  }
  select.reset();  // a statement left running would keep schema 12 from dropping a table
  if (version == 1) {
    TY_RETURN_IF_ERROR_WITH(db_->Exec(kMigrateFrom1), "migrating schema 1 to 2");
    version = 2;
  }
  // A table kSchema made just now (the database had none) is whole already.
  if (version == 2) {
    TY_ASSIGN_OR_RETURN(const bool has, HasColumn("attempts", "failure_class"));
    if (!has) TY_RETURN_IF_ERROR_WITH(db_->Exec(kMigrateFrom2), "migrating schema 2 to 3");
    version = 3;
  }
  if (version == 3) {
    // (A database without attempt_ranks has no ranks to migrate: schema 12 has no such table.)
    TY_ASSIGN_OR_RETURN(const bool table, HasColumn("attempt_ranks", "rank"));
    TY_ASSIGN_OR_RETURN(const bool has, HasColumn("attempt_ranks", "exit_stopped"));
    if (table && !has) TY_RETURN_IF_ERROR_WITH(db_->Exec(kMigrateFrom3), "migrating schema 3 to 4");
    version = 4;
  }
  if (version == 4) {
    TY_ASSIGN_OR_RETURN(const bool has, HasColumn("jobs", "run_report"));
    if (!has) TY_RETURN_IF_ERROR_WITH(db_->Exec(kMigrateFrom4), "migrating schema 4 to 5");
    version = 5;
  }
  if (version == 5) {
    for (const auto& [table, migration] :
         {std::pair{"jobs", kMigrateJobsFrom5}, std::pair{"attempts", kMigrateAttemptsFrom5}}) {
      TY_ASSIGN_OR_RETURN(const bool has, HasColumn(table, "schedule"));
      if (!has) TY_RETURN_IF_ERROR_WITH(db_->Exec(migration), "migrating schema 5 to 6");
    }
    version = 6;
  }
  if (version == 6) {
    for (const auto& [table, migration] :
         {std::pair{"jobs", kMigrateJobsFrom6}, std::pair{"attempts", kMigrateAttemptsFrom6}}) {
      TY_ASSIGN_OR_RETURN(const bool has, HasColumn(table, "cp"));
      if (!has) TY_RETURN_IF_ERROR_WITH(db_->Exec(migration), "migrating schema 6 to 7");
    }
    version = 7;
  }
  if (version == 7) {
    TY_ASSIGN_OR_RETURN(const bool has, HasColumn("jobs", "moe"));
    if (!has) TY_RETURN_IF_ERROR_WITH(db_->Exec(kMigrateFrom7), "migrating schema 7 to 8");
    version = 8;
  }
  if (version == 8) {
    TY_ASSIGN_OR_RETURN(const bool has, HasColumn("jobs", "accounts"));
    if (!has) TY_RETURN_IF_ERROR_WITH(db_->Exec(kMigrateFrom8), "migrating schema 8 to 9");
    version = 9;
  }
  if (version == 9) version = 10;  // kSchema made job_progress
  if (version == 10) {
    for (const auto& [table, migration] :
         {std::pair{"jobs", kMigrateJobsFrom10}, std::pair{"attempts", kMigrateAttemptsFrom10}}) {
      TY_ASSIGN_OR_RETURN(const bool has, HasColumn(table, "ep"));
      if (!has) TY_RETURN_IF_ERROR_WITH(db_->Exec(migration), "migrating schema 10 to 11");
    }
    version = 11;
  }
  if (version == 11) {
    TY_ASSIGN_OR_RETURN(const bool has, HasColumn("attempts", "ranks"));
    if (!has)
      TY_RETURN_IF_ERROR_WITH(db_->Exec(kMigrateAttemptsFrom11), "migrating schema 11 to 12");
    TY_ASSIGN_OR_RETURN(const bool old, HasColumn("attempt_ranks", "rank"));
    if (old) TY_RETURN_IF_ERROR_WITH(MoveRanksIntoAttempts(), "migrating schema 11 to 12");
    version = 12;
  }
  if (version != kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat("schema version ", version,
                                                      " is not a version this build knows (1 to ",
                                                      kSchemaVersion, ")"));
  }
  TY_ASSIGN_OR_RETURN(
      auto put,
      db_->Prepare("INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', ?)"));
  put->Bind(1, absl::StrCat(kSchemaVersion));
  TY_RETURN_IF_ERROR(put->Run());
  return txn->Commit();
}

absl::StatusOr<bool> JobStore::HasColumn(const char* table, const char* column) {
  TY_ASSIGN_OR_RETURN(auto has,
                      db_->Prepare(absl::StrCat("SELECT COUNT(*) FROM pragma_table_info('", table,
                                                "') WHERE name = '", column, "'")));
  TY_ASSIGN_OR_RETURN(const bool row, has->Step());
  return row && has->Int(0) > 0;
}

absl::Status JobStore::Commit(StoreBatch& batch) {
  if (batch.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  absl::Status status = StoreBatchLocked(batch);
  if (!status.ok()) {
    for (EventRecord& event : batch.events) event.id = 0;  // rolled back: they do not exist
  }
  return status;
}

absl::Status JobStore::StoreBatchLocked(StoreBatch& batch) {
  TY_ASSIGN_OR_RETURN(auto txn, SqliteTransaction::Begin(*db_));
  for (const JobRecord* job : batch.new_jobs) {
    TY_RETURN_IF_ERROR_WITH(InsertJob(*job), absl::StrCat("insert job ", job->id));
  }
  for (const JobRecord* job : batch.updated_jobs) {
    TY_RETURN_IF_ERROR_WITH(UpdateJob(*job), absl::StrCat("update job ", job->id));
  }
  for (const AttemptRecord* attempt : batch.attempts) {
    TY_RETURN_IF_ERROR_WITH(PutAttempt(*attempt), absl::StrCat("store attempt ", attempt->job_id,
                                                               "/", attempt->attempt_id));
  }
  for (const NodeRecord* node : batch.nodes) {
    TY_RETURN_IF_ERROR_WITH(PutNode(*node), absl::StrCat("store node ", node->node_id));
  }
  TY_RETURN_IF_ERROR_WITH(PutCordons(batch), "store cordons");
  for (const JobCheckpoint& checkpoint : batch.checkpoints) {
    TY_RETURN_IF_ERROR_WITH(
        PutCheckpoint(checkpoint),
        absl::StrCat("store checkpoint ", checkpoint.record.path, " of ", checkpoint.job_id));
  }
  for (EventRecord& event : batch.events) {
    TY_RETURN_IF_ERROR_WITH(AppendEvent(event), absl::StrCat("append event of ", event.job_id));
  }
  return txn->Commit();
}

absl::StatusOr<SqliteStatement*> JobStore::Cached(const char* sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    TY_ASSIGN_OR_RETURN(std::unique_ptr<SqliteStatement> statement, db_->Prepare(sql));
    it = statements_.emplace(sql, std::move(statement)).first;
  }
  it->second->Reset();
  return it->second.get();
}

absl::Status JobStore::CommitSoftState(const SoftStateBatch& batch) {
  if (batch.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  TY_RETURN_IF_ERROR(db_->Exec("PRAGMA synchronous=NORMAL"));
  absl::Status status = StoreSoftStateLocked(batch);
  absl::Status restored = db_->Exec("PRAGMA synchronous=FULL");
  return status.ok() ? restored : status;
}

absl::Status JobStore::StoreSoftStateLocked(const SoftStateBatch& batch) {
  TY_ASSIGN_OR_RETURN(auto txn, SqliteTransaction::Begin(*db_));
  // A job's progress and accounts go in one statement.
  absl::flat_hash_map<absl::string_view, const std::string*> accounts;
  for (const auto& [job_id, encoded] : batch.accounts) accounts[job_id] = &encoded;
  for (const auto& [job_id, p] : batch.progress) {
    auto with = accounts.find(job_id);
    TY_RETURN_IF_ERROR(PutProgress(job_id, &p, with == accounts.end() ? nullptr : with->second));
    if (with != accounts.end()) accounts.erase(with);
  }
  for (const auto& [job_id, encoded] : batch.accounts) {
    if (accounts.contains(job_id)) TY_RETURN_IF_ERROR(PutProgress(job_id, nullptr, &encoded));
  }
  // The pids of one attempt come together: its ranks are read, changed and written once.
  for (size_t first = 0; first < batch.pids.size();) {
    const SoftStateBatch::Pid& head = batch.pids[first];
    size_t end = first;
    while (end < batch.pids.size() && batch.pids[end].job_id == head.job_id &&
           batch.pids[end].attempt_id == head.attempt_id) {
      ++end;
    }
    TY_RETURN_IF_ERROR(PutPidsLocked(head.job_id, head.attempt_id,
                                     absl::MakeConstSpan(batch.pids).subspan(first, end - first)));
    first = end;
  }
  return txn->Commit();
}

absl::Status JobStore::PutPidsLocked(const std::string& job_id, int attempt_id,
                                     absl::Span<const SoftStateBatch::Pid> pids) {
  TY_ASSIGN_OR_RETURN(SqliteStatement * select, Cached(R"sql(
    SELECT ranks FROM attempts WHERE job_id=? AND attempt_id=?
  )sql"));
  select->Bind(1, job_id).Bind(2, int64_t{attempt_id});
  TY_ASSIGN_OR_RETURN(const bool found, select->Step());
  if (!found) return absl::OkStatus();  // soft state: an attempt not stored yet has no pids
  TY_ASSIGN_OR_RETURN(std::vector<RankSlot> ranks, DecodeRanks(select->Blob(0)));
  for (const SoftStateBatch::Pid& pid : pids) {
    if (pid.rank >= 0 && pid.rank < static_cast<int>(ranks.size())) ranks[pid.rank].pid = pid.pid;
  }
  TY_ASSIGN_OR_RETURN(SqliteStatement * update, Cached(R"sql(
    UPDATE attempts SET ranks=? WHERE job_id=? AND attempt_id=?
  )sql"));
  update->BindBlob(1, EncodeRanks(ranks)).Bind(2, job_id).Bind(3, int64_t{attempt_id});
  return update->Run();
}

absl::Status JobStore::MoveRanksIntoAttempts() {
  TY_ASSIGN_OR_RETURN(auto select, db_->Prepare(R"sql(
    SELECT job_id, attempt_id, rank, node_id, hostname, slot, local_rank, pid, exited, exit_code,
      signal, exit_pid, exited_us, last_log_lines, exit_message, exit_stopped
    FROM attempt_ranks ORDER BY job_id, attempt_id, rank
  )sql"));
  std::map<std::pair<std::string, int>, std::vector<RankSlot>> by_attempt;
  while (true) {
    TY_ASSIGN_OR_RETURN(bool row, select->Step());
    if (!row) break;
    std::vector<RankSlot>& ranks = by_attempt[{select->Text(0), static_cast<int>(select->Int(1))}];
    RankSlot slot;
    slot.rank = static_cast<int>(select->Int(2));
    if (slot.rank != static_cast<int>(ranks.size())) {
      return absl::InternalError(absl::StrCat("attempt ", select->Text(0), "/", select->Int(1),
                                              " has a gap before rank ", slot.rank));
    }
    slot.node_id = select->Text(3);
    slot.hostname = select->Text(4);
    slot.slot = static_cast<int>(select->Int(5));
    slot.local_rank = static_cast<int>(select->Int(6));
    slot.pid = select->Int(7);
    if (select->Int(8) != 0) {
      RankExit& exit = slot.exit.emplace();
      exit.exit_code = static_cast<int>(select->Int(9));
      exit.signal = static_cast<int>(select->Int(10));
      exit.pid = select->Int(11);
      exit.exited = MicrosToTime(select->OptionalInt(12));
      const std::string lines = select->Text(13);
      exit.last_log_lines = DecodeLines(lines, !lines.empty());
      exit.message = select->Text(14);
      exit.stopped = select->Int(15) != 0;
    }
    ranks.push_back(std::move(slot));
  }
  select.reset();  // an open statement on attempt_ranks would keep it from being dropped
  TY_ASSIGN_OR_RETURN(auto update, db_->Prepare(R"sql(
    UPDATE attempts SET ranks=? WHERE job_id=? AND attempt_id=?
  )sql"));
  for (const auto& [attempt, ranks] : by_attempt) {
    update->Reset();
    update->BindBlob(1, EncodeRanks(ranks)).Bind(2, attempt.first).Bind(3, int64_t{attempt.second});
    TY_RETURN_IF_ERROR(update->Run());
  }
  update.reset();
  return db_->Exec("DROP TABLE attempt_ranks");
}

absl::Status JobStore::PutProgress(const std::string& job_id, const Progress* progress,
                                   const std::string* accounts) {
  TY_ASSIGN_OR_RETURN(SqliteStatement * put, Cached(progress == nullptr   ? R"sql(
    INSERT INTO job_progress(job_id, accounts) VALUES(?, ?)
    ON CONFLICT(job_id) DO UPDATE SET accounts=excluded.accounts
  )sql"
                                                    : accounts == nullptr ? R"sql(
    INSERT INTO job_progress(job_id, progress) VALUES(?, ?)
    ON CONFLICT(job_id) DO UPDATE SET progress=excluded.progress
  )sql"
                                                                          : R"sql(
    INSERT INTO job_progress(job_id, progress, accounts) VALUES(?, ?, ?)
    ON CONFLICT(job_id) DO UPDATE SET progress=excluded.progress, accounts=excluded.accounts
  )sql"));
  put->Bind(1, job_id);
  int next = 2;
  if (progress != nullptr) put->BindBlob(next++, EncodeProgress(*progress));
  if (accounts != nullptr) put->BindBlob(next, *accounts);
  return put->Run();
}

namespace {

// A job's state as UpdateJob writes it (state and the 11 columns after it), from `first` on.
void BindJobState(SqliteStatement& statement, int first, const JobRecord& job) {
  statement.Bind(first, int64_t{static_cast<int>(job.state)})
      .Bind(first + 1, TimeToMicros(job.started))
      .Bind(first + 2, TimeToMicros(job.finished))
      .Bind(first + 3, int64_t{job.attempts})
      .Bind(first + 4, int64_t{job.restarts})
      .Bind(first + 5, int64_t{job.current_attempt})
      .Bind(first + 6, job.last_checkpoint.step)
      .Bind(first + 7, job.last_checkpoint.path)
      .Bind(first + 8, TimeToMicros(job.last_checkpoint.written))
      .Bind(first + 9, int64_t{job.cancel_requested ? 1 : 0})
      .Bind(first + 10, job.message)
      .Bind(first + 11, int64_t{job.drain_requested ? 1 : 0});
}

}  // namespace

absl::Status JobStore::InsertJob(const JobRecord& job) {
  // The whole row in one statement; the columns of progress before schema 10 stay 0.
  TY_ASSIGN_OR_RETURN(SqliteStatement * insert, Cached(R"sql(
    INSERT INTO jobs(seq, id, name, spec_yaml, priority, nodes, ranks_per_node, device_kind,
      dp, tp, pp, zero_stage, max_restarts, heartbeat_timeout_ms, user, client_request_id,
      created_us, checkpoint_dir, checkpoint_every_steps, checkpoint_interval_auto,
      checkpoint_keep, schedule, virtual_stages, cp, ep,
      state, started_us, finished_us, attempts, restarts, current_attempt, checkpoint_step,
      checkpoint_path, checkpoint_us, cancel_requested, message, drain_requested,
      step, total_steps, loss, lr, grad_norm, tokens_per_second, step_total_ms, step_forward_ms,
      step_backward_ms, step_optimizer_ms, step_communication_ms, step_data_ms)
    VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,
           ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,
           0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
  )sql"));
  const JobRequirements& req = job.requirements;
  insert->Bind(1, job.seq)
      .Bind(2, job.id)
      .Bind(3, job.name)
      .Bind(4, job.spec_yaml)
      .Bind(5, int64_t{job.priority})
      .Bind(6, int64_t{req.nodes})
      .Bind(7, int64_t{req.ranks_per_node})
      .Bind(8, int64_t{static_cast<int>(req.kind)})
      .Bind(9, int64_t{req.mesh.dp})
      .Bind(10, int64_t{req.mesh.tp})
      .Bind(11, int64_t{req.mesh.pp})
      .Bind(12, int64_t{req.mesh.zero_stage})
      .Bind(13, int64_t{req.max_restarts})
      .Bind(14, absl::ToInt64Milliseconds(req.heartbeat_timeout))
      .Bind(15, job.user)
      .Bind(16, job.client_request_id)
      .Bind(17, TimeToMicros(job.created))
      .Bind(18, req.checkpoint.dir)
      .Bind(19, req.checkpoint.every_steps)
      .Bind(20, int64_t{req.checkpoint.interval_auto ? 1 : 0})
      .Bind(21, int64_t{req.checkpoint.recorded ? req.checkpoint.keep : -1})
      .Bind(22, req.mesh.schedule)
      .Bind(23, int64_t{req.mesh.virtual_stages})
      .Bind(24, int64_t{req.mesh.cp})
      .Bind(25, int64_t{req.mesh.ep});
  BindJobState(*insert, 26, job);
  TY_RETURN_IF_ERROR(insert->Run());
  TY_ASSIGN_OR_RETURN(SqliteStatement * label,
                      Cached("INSERT INTO job_labels(job_id, key, value) VALUES(?, ?, ?)"));
  for (const auto& [key, value] : job.labels) {
    label->Reset();
    label->Bind(1, job.id).Bind(2, key).Bind(3, value);
    TY_RETURN_IF_ERROR(label->Run());
  }
  return PutProgress(job.id, &job.progress, &job.accounts);
}

absl::Status JobStore::UpdateJob(const JobRecord& job) {
  TY_ASSIGN_OR_RETURN(SqliteStatement * update, Cached(R"sql(
    UPDATE jobs SET state=?, started_us=?, finished_us=?, attempts=?, restarts=?,
      current_attempt=?, checkpoint_step=?, checkpoint_path=?, checkpoint_us=?,
      cancel_requested=?, message=?, drain_requested=?
    WHERE id=?
  )sql"));
  BindJobState(*update, 1, job);
  update->Bind(13, job.id);
  TY_RETURN_IF_ERROR(update->Run());
  return PutProgress(job.id, &job.progress, &job.accounts);
}

absl::Status JobStore::PutAttempt(const AttemptRecord& attempt) {
  TY_ASSIGN_OR_RETURN(SqliteStatement * put, Cached(R"sql(
    INSERT OR REPLACE INTO attempts(job_id, attempt_id, state, dp, tp, pp, zero_stage, device_kind,
      created_us, running_us, finished_us, cause, failure_class, blamed_rank, schedule,
      virtual_stages, cp, ep, ranks)
    VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
  )sql"));
  put->Bind(1, attempt.job_id)
      .Bind(2, int64_t{attempt.attempt_id})
      .Bind(3, int64_t{static_cast<int>(attempt.state)})
      .Bind(4, int64_t{attempt.mesh.dp})
      .Bind(5, int64_t{attempt.mesh.tp})
      .Bind(6, int64_t{attempt.mesh.pp})
      .Bind(7, int64_t{attempt.mesh.zero_stage})
      .Bind(8, int64_t{static_cast<int>(attempt.kind)})
      .Bind(9, TimeToMicros(attempt.created))
      .Bind(10, TimeToMicros(attempt.running))
      .Bind(11, TimeToMicros(attempt.finished))
      .Bind(12, attempt.cause)
      .Bind(13, attempt.failure_class)
      .Bind(14, int64_t{attempt.blamed_rank})
      .Bind(15, attempt.mesh.schedule)
      .Bind(16, int64_t{attempt.mesh.virtual_stages})
      .Bind(17, int64_t{attempt.mesh.cp})
      .Bind(18, int64_t{attempt.mesh.ep})
      .BindBlob(19, EncodeRanks(attempt.ranks));
  return put->Run();
}

absl::Status JobStore::AppendEvent(EventRecord& event) {
  TY_ASSIGN_OR_RETURN(SqliteStatement * insert, Cached(R"sql(
    INSERT INTO events(job_id, attempt_id, time_us, from_state, to_state, kind, cause)
    VALUES(?, ?, ?, ?, ?, ?, ?)
  )sql"));
  insert->Bind(1, event.job_id)
      .Bind(2, int64_t{event.attempt_id})
      .Bind(3, TimeToMicros(event.time))
      .Bind(4, int64_t{static_cast<int>(event.from)})
      .Bind(5, int64_t{static_cast<int>(event.to)})
      .Bind(6, event.kind)
      .Bind(7, event.cause);
  TY_RETURN_IF_ERROR(insert->Run());
  event.id = db_->LastInsertRowId();
  return absl::OkStatus();
}

absl::Status JobStore::PutCheckpoint(const JobCheckpoint& checkpoint) {
  TY_ASSIGN_OR_RETURN(SqliteStatement * put, Cached(R"sql(
    INSERT OR REPLACE INTO checkpoints(job_id, path, attempt_id, step, state, bytes, write_seconds,
      blocked_seconds, written_us, message)
    VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
  )sql"));
  const CheckpointInfo& r = checkpoint.record;
  put->Bind(1, checkpoint.job_id)
      .Bind(2, r.path)
      .Bind(3, int64_t{r.attempt_id})
      .Bind(4, r.step)
      .Bind(5, int64_t{static_cast<int>(r.state)})
      .Bind(6, r.bytes)
      .Bind(7, r.write_seconds)
      .Bind(8, r.blocked_seconds)
      .Bind(9, TimeToMicros(r.written))
      .Bind(10, r.message);
  return put->Run();
}

absl::Status JobStore::PutNode(const NodeRecord& node) {
  TY_ASSIGN_OR_RETURN(SqliteStatement * put, Cached(R"sql(
    INSERT OR REPLACE INTO nodes(node_id, hostname, cpu_slots, gpus, registered_us, last_seen_us)
    VALUES(?, ?, ?, ?, ?, ?)
  )sql"));
  put->Bind(1, node.node_id)
      .Bind(2, node.hostname)
      .Bind(3, int64_t{node.cpu_slots})
      .Bind(4, EncodeGpus(node.gpus))
      .Bind(5, TimeToMicros(node.registered))
      .Bind(6, TimeToMicros(node.last_seen));
  return put->Run();
}

absl::Status JobStore::PutCordons(const StoreBatch& batch) {
  for (const StoreBatch::CordonChange& change : batch.cordons) {
    if (!change.cordon.has_value()) {
      TY_ASSIGN_OR_RETURN(SqliteStatement * remove,
                          Cached("DELETE FROM cordons WHERE node_id = ?"));
      remove->Bind(1, change.node_id);
      TY_RETURN_IF_ERROR(remove->Run());
      continue;
    }
    const Cordon& cordon = *change.cordon;
    TY_ASSIGN_OR_RETURN(SqliteStatement * put, Cached(R"sql(
      INSERT OR REPLACE INTO cordons(node_id, reason, since_us, until_us) VALUES(?, ?, ?, ?)
    )sql"));
    // A cordon until uncordoned (an infinite cooldown) has no end time.
    const std::optional<int64_t> until =
        cordon.until == absl::InfiniteFuture() ? std::nullopt : TimeToMicros(cordon.until);
    put->Bind(1, cordon.node_id)
        .Bind(2, cordon.reason)
        .Bind(3, TimeToMicros(cordon.since))
        .Bind(4, until);
    TY_RETURN_IF_ERROR(put->Run());
  }
  return absl::OkStatus();
}

absl::Status JobStore::LoadCordons(StoredState& state) {
  TY_ASSIGN_OR_RETURN(auto select, db_->Prepare(R"sql(
    SELECT node_id, reason, since_us, until_us FROM cordons ORDER BY node_id
  )sql"));
  while (true) {
    TY_ASSIGN_OR_RETURN(bool row, select->Step());
    if (!row) break;
    Cordon cordon;
    cordon.node_id = select->Text(0);
    cordon.reason = select->Text(1);
    cordon.since = MicrosToTime(select->OptionalInt(2));
    const std::optional<int64_t> until = select->OptionalInt(3);
    cordon.until = until.has_value() ? MicrosToTime(until) : absl::InfiniteFuture();
    state.cordons.push_back(std::move(cordon));
  }
  return absl::OkStatus();
}

absl::StatusOr<StoredState> JobStore::Load() {
  absl::MutexLock lock(&mu_);
  StoredState state;
  TY_RETURN_IF_ERROR(LoadJobs(state));
  TY_RETURN_IF_ERROR(LoadAttempts(state));
  TY_RETURN_IF_ERROR(LoadNodes(state));
  TY_RETURN_IF_ERROR(LoadCordons(state));
  TY_RETURN_IF_ERROR(LoadCheckpoints(state));
  return state;
}

absl::Status JobStore::LoadJobs(StoredState& state) {
  TY_ASSIGN_OR_RETURN(auto select, db_->Prepare(R"sql(
    SELECT seq, id, name, spec_yaml, state, priority, nodes, ranks_per_node, device_kind,
      dp, tp, pp, zero_stage, max_restarts, user, client_request_id, created_us, started_us,
      finished_us, attempts, restarts, current_attempt, step, total_steps, loss, lr, grad_norm,
      tokens_per_second, step_total_ms, step_forward_ms, step_backward_ms, step_optimizer_ms,
      step_communication_ms, step_data_ms, val_loss, eta_us, progress_us, checkpoint_step,
      checkpoint_path, checkpoint_us, cancel_requested, message, heartbeat_timeout_ms,
      drain_requested, checkpoint_dir, checkpoint_every_steps, checkpoint_interval_auto,
      checkpoint_keep, run_report, schedule, virtual_stages, cp, moe, jobs.accounts,
      job_progress.job_id IS NOT NULL, job_progress.progress, job_progress.accounts, jobs.ep
    FROM jobs LEFT JOIN job_progress ON job_progress.job_id = jobs.id ORDER BY seq
  )sql"));
  while (true) {
    TY_ASSIGN_OR_RETURN(bool row, select->Step());
    if (!row) break;
    JobRecord job;
    job.seq = select->Int(0);
    job.id = select->Text(1);
    job.name = select->Text(2);
    job.spec_yaml = select->Text(3);
    TY_ASSIGN_OR_RETURN(job.state, JobStateFromInt(select->Int(4)));
    job.priority = static_cast<int>(select->Int(5));
    JobRequirements& req = job.requirements;
    req.nodes = static_cast<int>(select->Int(6));
    req.ranks_per_node = static_cast<int>(select->Int(7));
    req.kind = select->Int(8) == 1 ? DeviceKind::kGpu : DeviceKind::kCpu;
    req.mesh.dp = static_cast<int>(select->Int(9));
    req.mesh.tp = static_cast<int>(select->Int(10));
    req.mesh.pp = static_cast<int>(select->Int(11));
    req.mesh.zero_stage = static_cast<int>(select->Int(12));
    req.max_restarts = static_cast<int>(select->Int(13));
    job.user = select->Text(14);
    job.client_request_id = select->Text(15);
    job.created = MicrosToTime(select->OptionalInt(16));
    job.started = MicrosToTime(select->OptionalInt(17));
    job.finished = MicrosToTime(select->OptionalInt(18));
    job.attempts = static_cast<int>(select->Int(19));
    job.restarts = static_cast<int>(select->Int(20));
    job.current_attempt = static_cast<int>(select->Int(21));
    Progress& p = job.progress;
    p.step = select->Int(22);
    p.total_steps = select->Int(23);
    p.loss = select->Double(24);
    p.learning_rate = select->Double(25);
    p.grad_norm = select->Double(26);
    p.tokens_per_second = select->Double(27);
    p.step_times.total_ms = select->Double(28);
    p.step_times.forward_ms = select->Double(29);
    p.step_times.backward_ms = select->Double(30);
    p.step_times.optimizer_ms = select->Double(31);
    p.step_times.communication_ms = select->Double(32);
    p.step_times.data_ms = select->Double(33);
    if (!select->IsNull(34)) p.val_loss = select->Double(34);
    if (std::optional<int64_t> eta = select->OptionalInt(35)) p.eta = absl::Microseconds(*eta);
    p.reported = MicrosToTime(select->OptionalInt(36));
    job.last_checkpoint.step = select->Int(37);
    job.last_checkpoint.path = select->Text(38);
    job.last_checkpoint.written = MicrosToTime(select->OptionalInt(39));
    job.cancel_requested = select->Int(40) != 0;
    job.message = select->Text(41);
    req.heartbeat_timeout = absl::Milliseconds(select->Int(42));
    job.drain_requested = select->Int(43) != 0;
    req.checkpoint.dir = select->Text(44);
    req.checkpoint.every_steps = select->Int(45);
    req.checkpoint.interval_auto = select->Int(46) != 0;
    req.checkpoint.keep = static_cast<int>(std::max<int64_t>(select->Int(47), 0));
    req.checkpoint.recorded = select->Int(47) >= 0;
    if (!absl::Base64Unescape(select->Text(48), &p.run_report)) p.run_report.clear();
    req.mesh.schedule = select->Text(49);
    req.mesh.virtual_stages = static_cast<int>(select->Int(50));
    req.mesh.cp = static_cast<int>(select->Int(51));
    p.moe = DecodeMoe(select->Text(52)).value_or(std::vector<MoeLayerProgress>{});
    if (!absl::Base64Unescape(select->Text(53), &job.accounts)) job.accounts.clear();
    if (select->Int(54) != 0) {  // newer than the jobs columns (schema 10)
      DecodeProgress(select->Blob(55), p);
      job.accounts = select->Blob(56);
    }
    req.mesh.ep = static_cast<int>(select->Int(57));
    state.max_job_seq = std::max(state.max_job_seq, job.seq);
    state.jobs.push_back(std::move(job));
  }
  TY_ASSIGN_OR_RETURN(auto labels, db_->Prepare("SELECT job_id, key, value FROM job_labels"));
  std::map<std::string, JobRecord*> by_id;
  for (JobRecord& job : state.jobs) by_id[job.id] = &job;
  while (true) {
    TY_ASSIGN_OR_RETURN(bool row, labels->Step());
    if (!row) break;
    auto it = by_id.find(labels->Text(0));
    if (it != by_id.end()) it->second->labels[labels->Text(1)] = labels->Text(2);
  }
  return absl::OkStatus();
}

absl::Status JobStore::LoadAttempts(StoredState& state) {
  TY_ASSIGN_OR_RETURN(auto select, db_->Prepare(R"sql(
    SELECT job_id, attempt_id, state, dp, tp, pp, zero_stage, device_kind, created_us,
      running_us, finished_us, cause, failure_class, blamed_rank, schedule, virtual_stages, cp,
      ep, ranks
    FROM attempts ORDER BY job_id, attempt_id
  )sql"));
  while (true) {
    TY_ASSIGN_OR_RETURN(bool row, select->Step());
    if (!row) break;
    AttemptRecord attempt;
    attempt.job_id = select->Text(0);
    attempt.attempt_id = static_cast<int>(select->Int(1));
    TY_ASSIGN_OR_RETURN(attempt.state, AttemptStateFromInt(select->Int(2)));
    attempt.mesh.dp = static_cast<int>(select->Int(3));
    attempt.mesh.tp = static_cast<int>(select->Int(4));
    attempt.mesh.pp = static_cast<int>(select->Int(5));
    attempt.mesh.zero_stage = static_cast<int>(select->Int(6));
    attempt.mesh.schedule = select->Text(14);
    attempt.mesh.virtual_stages = static_cast<int>(select->Int(15));
    attempt.mesh.cp = static_cast<int>(select->Int(16));
    attempt.mesh.ep = static_cast<int>(select->Int(17));
    attempt.kind = select->Int(7) == 1 ? DeviceKind::kGpu : DeviceKind::kCpu;
    attempt.created = MicrosToTime(select->OptionalInt(8));
    attempt.running = MicrosToTime(select->OptionalInt(9));
    attempt.finished = MicrosToTime(select->OptionalInt(10));
    attempt.cause = select->Text(11);
    attempt.failure_class = select->Text(12);
    attempt.blamed_rank = static_cast<int>(select->Int(13));
    TY_ASSIGN_OR_RETURN_WITH(
        attempt.ranks, DecodeRanks(select->Blob(18)),
        absl::StrCat("attempt ", attempt.attempt_id, " of job ", attempt.job_id));
    state.attempts.push_back(std::move(attempt));
  }
  return absl::OkStatus();
}

absl::Status JobStore::LoadNodes(StoredState& state) {
  TY_ASSIGN_OR_RETURN(auto select, db_->Prepare(R"sql(
    SELECT node_id, hostname, cpu_slots, gpus, registered_us, last_seen_us FROM nodes
    ORDER BY node_id
  )sql"));
  while (true) {
    TY_ASSIGN_OR_RETURN(bool row, select->Step());
    if (!row) break;
    NodeRecord node;
    node.node_id = select->Text(0);
    node.hostname = select->Text(1);
    node.cpu_slots = static_cast<int>(select->Int(2));
    TY_ASSIGN_OR_RETURN(node.gpus, DecodeGpus(select->Text(3)));
    node.registered = MicrosToTime(select->OptionalInt(4));
    node.last_seen = MicrosToTime(select->OptionalInt(5));
    state.nodes.push_back(std::move(node));
  }
  return absl::OkStatus();
}

absl::Status JobStore::LoadCheckpoints(StoredState& state) {
  TY_ASSIGN_OR_RETURN(auto select, db_->Prepare(R"sql(
    SELECT job_id, path, attempt_id, step, state, bytes, write_seconds, blocked_seconds,
      written_us, message
    FROM checkpoints ORDER BY job_id, written_us, step, path
  )sql"));
  while (true) {
    TY_ASSIGN_OR_RETURN(bool row, select->Step());
    if (!row) break;
    JobCheckpoint checkpoint;
    checkpoint.job_id = select->Text(0);
    CheckpointInfo& r = checkpoint.record;
    r.path = select->Text(1);
    r.attempt_id = static_cast<int>(select->Int(2));
    r.step = select->Int(3);
    TY_ASSIGN_OR_RETURN(r.state, CheckpointStateFromInt(select->Int(4)));
    r.bytes = select->Int(5);
    r.write_seconds = select->Double(6);
    r.blocked_seconds = select->Double(7);
    r.written = MicrosToTime(select->OptionalInt(8));
    r.message = select->Text(9);
    state.checkpoints.push_back(std::move(checkpoint));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<EventRecord>> JobStore::ListEvents(const std::string& job_id,
                                                              int limit) {
  absl::MutexLock lock(&mu_);
  TY_ASSIGN_OR_RETURN(SqliteStatement * select, Cached(R"sql(
    SELECT id, job_id, attempt_id, time_us, from_state, to_state, kind, cause FROM events
    WHERE job_id=? ORDER BY id DESC LIMIT ?
  )sql"));
  select->Bind(1, job_id).Bind(2, int64_t{limit});
  std::vector<EventRecord> events;
  while (true) {
    TY_ASSIGN_OR_RETURN(bool row, select->Step());
    if (!row) break;
    EventRecord event;
    event.id = select->Int(0);
    event.job_id = select->Text(1);
    event.attempt_id = static_cast<int>(select->Int(2));
    event.time = MicrosToTime(select->OptionalInt(3));
    TY_ASSIGN_OR_RETURN(event.from, JobStateFromInt(select->Int(4)));
    TY_ASSIGN_OR_RETURN(event.to, JobStateFromInt(select->Int(5)));
    event.kind = select->Text(6);
    event.cause = select->Text(7);
    events.push_back(std::move(event));
  }
  std::reverse(events.begin(), events.end());
  return events;
}

absl::StatusOr<std::optional<std::string>> JobStore::FindJobByClientRequestId(
    const std::string& key) {
  absl::MutexLock lock(&mu_);
  TY_ASSIGN_OR_RETURN(auto select, db_->Prepare("SELECT id FROM jobs WHERE client_request_id=?"));
  select->Bind(1, key);
  TY_ASSIGN_OR_RETURN(bool row, select->Step());
  if (!row) return std::optional<std::string>();
  return std::optional<std::string>(select->Text(0));
}

}  // namespace trainyard::server
