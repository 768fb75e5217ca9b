#include "server/job_store.h"

#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sqlite.h"
#include "tests/unit/server/server_test_util.h"

namespace trainyard::server {
namespace {

using testing::ScratchDir;

JobRecord MakeJob(int64_t seq) {
  JobRecord job;
  job.seq = seq;
  job.id = JobIdForSeq(seq);
  job.name = "job" + std::to_string(seq);
  job.spec_yaml = "name: x\n";
  job.state = JobState::kQueued;
  job.priority = 3;
  job.requirements.nodes = 2;
  job.requirements.ranks_per_node = 4;
  job.requirements.kind = DeviceKind::kGpu;
  job.requirements.mesh = Mesh{1, 4, 1, 1, "zero-bubble", 1, /*cp=*/2, /*ep=*/1};
  job.requirements.max_restarts = 5;
  job.requirements.heartbeat_timeout = absl::Seconds(7);
  job.user = "ada";
  job.labels = {{"team", "research"}, {"cost", "12"}};
  job.created = absl::FromUnixSeconds(1000);
  return job;
}

AttemptRecord MakeAttempt(const std::string& job_id) {
  AttemptRecord attempt;
  attempt.job_id = job_id;
  attempt.attempt_id = 1;
  attempt.state = AttemptState::kRunning;
  attempt.mesh = Mesh{1, 1, 1, 0, "interleaved", 3, /*cp=*/2, /*ep=*/1};
  attempt.created = absl::FromUnixSeconds(1001);
  attempt.running = absl::FromUnixSeconds(1002);
  for (int rank = 0; rank < 2; ++rank) {
    RankSlot slot;
    slot.rank = rank;
    slot.node_id = "node-a";
    slot.hostname = "host-a";
    slot.slot = rank;
    slot.local_rank = rank;
    slot.pid = 100 + rank;
    attempt.ranks.push_back(slot);
  }
  RankExit exit;
  exit.exit_code = 3;
  exit.pid = 101;
  exit.exited = absl::FromUnixSeconds(1003);
  exit.last_log_lines = {"loading", "boom: out of memory"};
  attempt.ranks[1].exit = exit;
  return attempt;
}

TEST(JobStoreTest, CommittedStateSurvivesReopen) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(7);
  AttemptRecord attempt = MakeAttempt(job.id);
  NodeRecord node{"node-a",
                  "host-a",
                  8,
                  {{0, "H100", int64_t{80} << 30}, {1, "H100", 5}},
                  /*memory_bytes=*/0,
                  absl::FromUnixSeconds(900),
                  absl::FromUnixSeconds(950)};
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    StoreBatch batch;
    batch.new_jobs.push_back(&job);
    batch.events.push_back(EventRecord{0, job.id, 0, absl::FromUnixSeconds(1000), JobState::kQueued,
                                       JobState::kQueued, "submitted", "hi"});
    ASSERT_TRUE((*store)->Commit(batch).ok());
    EXPECT_GT(batch.events[0].id, 0);

    job.state = JobState::kRunning;
    job.current_attempt = 1;
    job.attempts = 1;
    job.progress.step = 42;
    job.progress.loss = 2.5;
    job.progress.val_loss = 2.75;
    job.progress.logit_z_loss = 0.125;
    job.progress.grad_norm = 0.5;
    job.progress.eta = absl::Seconds(30);
    job.progress.step_times.forward_ms = 1.5;
    job.last_checkpoint = CheckpointInfo{40, "/ckpt/40", absl::FromUnixSeconds(1010)};
    StoreBatch update;
    update.updated_jobs.push_back(&job);
    update.attempts.push_back(&attempt);
    update.nodes.push_back(&node);
    update.events.push_back(EventRecord{0, job.id, 1, absl::FromUnixSeconds(1002),
                                        JobState::kStarting, JobState::kRunning, "running",
                                        "all joined"});
    ASSERT_TRUE((*store)->Commit(update).ok());
  }
  EXPECT_TRUE(std::filesystem::exists(path + "-wal") || std::filesystem::exists(path));

  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 1u);
  const JobRecord& loaded = state->jobs[0];
  EXPECT_EQ(state->max_job_seq, 7);
  EXPECT_EQ(loaded.id, "j-000007");
  EXPECT_EQ(loaded.state, JobState::kRunning);
  EXPECT_EQ(loaded.priority, 3);
  EXPECT_EQ(loaded.requirements.nodes, 2);
  EXPECT_EQ(loaded.requirements.ranks_per_node, 4);
  EXPECT_EQ(loaded.requirements.kind, DeviceKind::kGpu);
  EXPECT_EQ(loaded.requirements.mesh.tp, 4);
  EXPECT_EQ(loaded.requirements.mesh.zero_stage, 1);
  EXPECT_EQ(loaded.requirements.mesh.schedule, "zero-bubble");
  EXPECT_EQ(loaded.requirements.mesh.cp, 2);
  EXPECT_EQ(loaded.requirements.max_restarts, 5);
  EXPECT_EQ(loaded.requirements.heartbeat_timeout, absl::Seconds(7));
  EXPECT_EQ(loaded.labels, job.labels);
  EXPECT_EQ(loaded.user, "ada");
  EXPECT_EQ(loaded.created, absl::FromUnixSeconds(1000));
  EXPECT_EQ(loaded.started, absl::InfinitePast());
  EXPECT_EQ(loaded.progress.step, 42);
  EXPECT_EQ(loaded.progress.val_loss, 2.75);
  EXPECT_EQ(loaded.progress.logit_z_loss, 0.125);
  EXPECT_EQ(loaded.progress.grad_norm, 0.5);
  EXPECT_EQ(loaded.progress.eta, absl::Seconds(30));
  EXPECT_EQ(loaded.progress.step_times.forward_ms, 1.5);
  EXPECT_EQ(loaded.last_checkpoint.path, "/ckpt/40");
  EXPECT_EQ(loaded.last_checkpoint.written, absl::FromUnixSeconds(1010));

  ASSERT_EQ(state->attempts.size(), 1u);
  const AttemptRecord& a = state->attempts[0];
  EXPECT_EQ(a.mesh.schedule, "interleaved");
  EXPECT_EQ(a.mesh.virtual_stages, 3);
  EXPECT_EQ(a.mesh.cp, 2);
  EXPECT_EQ(a.state, AttemptState::kRunning);
  ASSERT_EQ(a.ranks.size(), 2u);
  EXPECT_EQ(a.ranks[0].pid, 100);
  EXPECT_FALSE(a.ranks[0].exit.has_value());
  ASSERT_TRUE(a.ranks[1].exit.has_value());
  EXPECT_EQ(a.ranks[1].exit->exit_code, 3);
  EXPECT_EQ(a.ranks[1].exit->last_log_lines,
            (std::vector<std::string>{"loading", "boom: out of memory"}));

  ASSERT_EQ(state->nodes.size(), 1u);
  EXPECT_EQ(state->nodes[0].cpu_slots, 8);
  ASSERT_EQ(state->nodes[0].gpus.size(), 2u);
  EXPECT_EQ(state->nodes[0].gpus[0].memory_bytes, int64_t{80} << 30);
  EXPECT_EQ(state->nodes[0].gpus[1].name, "H100");

  auto events = (*store)->ListEvents(job.id, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].kind, "submitted");
  EXPECT_EQ((*events)[1].kind, "running");
  EXPECT_EQ((*events)[1].from, JobState::kStarting);
  auto newest = (*store)->ListEvents(job.id, 1);
  ASSERT_TRUE(newest.ok());
  ASSERT_EQ(newest->size(), 1u);
  EXPECT_EQ((*newest)[0].kind, "running");
}

TEST(JobStoreTest, FailedBatchStoresNothing) {
  ScratchDir dir;
  auto store = JobStore::Open(dir.path() + "/state.db");
  ASSERT_TRUE(store.ok());
  JobRecord first = MakeJob(1);
  StoreBatch batch;
  batch.new_jobs.push_back(&first);
  ASSERT_TRUE((*store)->Commit(batch).ok());

  JobRecord second = MakeJob(2);
  JobRecord duplicate = MakeJob(1);  // same id and seq as `first`
  StoreBatch bad;
  bad.new_jobs = {&second, &duplicate};
  bad.events.push_back(EventRecord{0, second.id, 0, absl::Now(), JobState::kQueued,
                                   JobState::kQueued, "submitted", ""});
  absl::Status status = (*store)->Commit(bad);
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists) << status;

  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(state->jobs.size(), 1u);
  EXPECT_EQ(state->jobs[0].id, first.id);
  auto events = (*store)->ListEvents(second.id, 10);
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(events->empty());
}

TEST(JobStoreTest, ClientRequestIdIsUniqueAndFindable) {
  ScratchDir dir;
  auto store = JobStore::Open(dir.path() + "/state.db");
  ASSERT_TRUE(store.ok());
  JobRecord a = MakeJob(1);
  a.client_request_id = "req-1";
  JobRecord b = MakeJob(2);  // no key: many jobs may have none
  JobRecord c = MakeJob(3);
  StoreBatch batch;
  batch.new_jobs = {&a, &b, &c};
  ASSERT_TRUE((*store)->Commit(batch).ok());
  auto found = (*store)->FindJobByClientRequestId("req-1");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->value_or(""), a.id);
  auto missing = (*store)->FindJobByClientRequestId("req-2");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());

  JobRecord again = MakeJob(4);
  again.client_request_id = "req-1";
  StoreBatch dup;
  dup.new_jobs = {&again};
  EXPECT_EQ((*store)->Commit(dup).code(), absl::StatusCode::kAlreadyExists);
}

TEST(JobStoreTest, RefusesAnUnknownSchemaVersion) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  ASSERT_TRUE(JobStore::Open(path).ok());
  {
    auto db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("UPDATE meta SET value='99' WHERE key='schema_version'").ok());
  }
  auto store = JobStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  EXPECT_NE(store.status().message().find("99"), std::string_view::npos);
}

TEST(JobStoreTest, UsesWriteAheadLogging) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  ASSERT_TRUE(JobStore::Open(path).ok());
  auto db = SqliteDb::Open(path);
  ASSERT_TRUE(db.ok());
  auto pragma = (*db)->Prepare("PRAGMA journal_mode");
  ASSERT_TRUE(pragma.ok());
  auto row = (*pragma)->Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ((*pragma)->Text(0), "wal");
}

TEST(JobStoreTest, CheckpointRecordsDrainAndPolicySurviveReopen) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(3);
  job.requirements.checkpoint = CheckpointSettings{"ckpt/run", 100, true, 4, true};
  CheckpointInfo committed{200, "ckpt/run/step-200", absl::FromUnixSeconds(2000)};
  committed.bytes = int64_t{5} << 30;
  committed.write_seconds = 12.5;
  committed.blocked_seconds = 0.75;
  committed.attempt_id = 2;
  CheckpointInfo failed{300, "ckpt/run/step-300", absl::FromUnixSeconds(3000)};
  failed.state = CheckpointState::kFailed;
  failed.message = "No space left on device";
  failed.attempt_id = 2;
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    StoreBatch batch;
    batch.new_jobs.push_back(&job);
    ASSERT_TRUE((*store)->Commit(batch).ok());
    job.drain_requested = true;
    job.last_checkpoint = committed;
    StoreBatch update;
    update.updated_jobs.push_back(&job);
    update.checkpoints = {{job.id, failed}, {job.id, committed}};
    ASSERT_TRUE((*store)->Commit(update).ok());
    // The same path again replaces its row.
    failed.message = "disk quota exceeded";
    StoreBatch again;
    again.checkpoints = {{job.id, failed}};
    ASSERT_TRUE((*store)->Commit(again).ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 1u);
  const JobRecord& loaded = state->jobs[0];
  EXPECT_TRUE(loaded.drain_requested);
  EXPECT_EQ(loaded.requirements.checkpoint.dir, "ckpt/run");
  EXPECT_EQ(loaded.requirements.checkpoint.every_steps, 100);
  EXPECT_TRUE(loaded.requirements.checkpoint.interval_auto);
  EXPECT_EQ(loaded.requirements.checkpoint.keep, 4);
  EXPECT_TRUE(loaded.requirements.checkpoint.recorded);
  EXPECT_EQ(loaded.last_checkpoint.path, "ckpt/run/step-200");
  ASSERT_EQ(state->checkpoints.size(), 2u);  // oldest first
  const JobCheckpoint& first = state->checkpoints[0];
  EXPECT_EQ(first.job_id, job.id);
  EXPECT_EQ(first.record.path, "ckpt/run/step-200");
  EXPECT_EQ(first.record.step, 200);
  EXPECT_EQ(first.record.state, CheckpointState::kCommitted);
  EXPECT_EQ(first.record.bytes, int64_t{5} << 30);
  EXPECT_EQ(first.record.write_seconds, 12.5);
  EXPECT_EQ(first.record.blocked_seconds, 0.75);
  EXPECT_EQ(first.record.attempt_id, 2);
  EXPECT_EQ(first.record.written, absl::FromUnixSeconds(2000));
  EXPECT_EQ(state->checkpoints[1].record.state, CheckpointState::kFailed);
  EXPECT_EQ(state->checkpoints[1].record.message, "disk quota exceeded");
}

TEST(JobStoreTest, CheckpointRowsOfAFailedBatchAreNotStored) {
  ScratchDir dir;
  auto store = JobStore::Open(dir.path() + "/state.db");
  ASSERT_TRUE(store.ok());
  JobRecord first = MakeJob(1);
  StoreBatch batch;
  batch.new_jobs.push_back(&first);
  ASSERT_TRUE((*store)->Commit(batch).ok());
  JobRecord duplicate = MakeJob(1);
  StoreBatch bad;
  bad.new_jobs = {&duplicate};
  bad.checkpoints = {{first.id, CheckpointInfo{10, "ckpt/10", absl::FromUnixSeconds(1)}}};
  EXPECT_FALSE((*store)->Commit(bad).ok());
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok());
  EXPECT_TRUE(state->checkpoints.empty());
}

// The jobs table as schema 1 wrote it.
constexpr char kSchemaOneJobs[] = R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta(key, value) VALUES('schema_version', '1');
CREATE TABLE jobs(
  seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, name TEXT NOT NULL, spec_yaml TEXT NOT NULL,
  state INTEGER NOT NULL, priority INTEGER NOT NULL, nodes INTEGER NOT NULL,
  ranks_per_node INTEGER NOT NULL, device_kind INTEGER NOT NULL,
  dp INTEGER NOT NULL, tp INTEGER NOT NULL, pp INTEGER NOT NULL, zero_stage INTEGER NOT NULL,
  max_restarts INTEGER NOT NULL, heartbeat_timeout_ms INTEGER NOT NULL, user TEXT NOT NULL,
  client_request_id TEXT NOT NULL, created_us INTEGER, started_us INTEGER, finished_us INTEGER,
  attempts INTEGER NOT NULL, restarts INTEGER NOT NULL, current_attempt INTEGER NOT NULL,
  step INTEGER NOT NULL, total_steps INTEGER NOT NULL, loss REAL NOT NULL, lr REAL NOT NULL,
  grad_norm REAL NOT NULL, tokens_per_second REAL NOT NULL,
  step_total_ms REAL NOT NULL, step_forward_ms REAL NOT NULL, step_backward_ms REAL NOT NULL,
  step_optimizer_ms REAL NOT NULL, step_communication_ms REAL NOT NULL, step_data_ms REAL NOT NULL,
  val_loss REAL, eta_us INTEGER, progress_us INTEGER,
  checkpoint_step INTEGER NOT NULL, checkpoint_path TEXT NOT NULL, checkpoint_us INTEGER,
  cancel_requested INTEGER NOT NULL, message TEXT NOT NULL);
INSERT INTO jobs VALUES(5, 'j-000005', 'old', 'name: old', 3, 0, 1, 2, 0, 2, 1, 1, 0, 2, 10000,
  'ada', '', 1000000, 1000001, NULL, 1, 0, 1, 7, 10, 2.5, 0.001, 1, 100, 10, 3, 4, 1, 1, 1,
  NULL, NULL, NULL, 6, 'ckpt/old/step-6', 1000002, 0, '');
)sql";

TEST(JobStoreTest, SchemaOneDatabaseIsMigratedForCheckpointsAndDrains) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  {
    auto db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec(kSchemaOneJobs).ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 1u);
  JobRecord job = state->jobs[0];
  EXPECT_EQ(job.id, "j-000005");
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.last_checkpoint.path, "ckpt/old/step-6");
  EXPECT_FALSE(job.drain_requested);
  EXPECT_FALSE(job.requirements.checkpoint.recorded);  // derived from the spec by the supervisor
  job.drain_requested = true;
  StoreBatch batch;
  batch.updated_jobs.push_back(&job);
  batch.checkpoints = {{job.id, CheckpointInfo{8, "ckpt/old/step-8", absl::FromUnixSeconds(9)}}};
  ASSERT_TRUE((*store)->Commit(batch).ok());
  store->reset();

  auto reopened = JobStore::Open(path);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  state = (*reopened)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->jobs[0].drain_requested);
  ASSERT_EQ(state->checkpoints.size(), 1u);
  EXPECT_EQ(state->checkpoints[0].record.step, 8);
  auto db = SqliteDb::Open(path);
  ASSERT_TRUE(db.ok());
  auto version = (*db)->Prepare("SELECT value FROM meta WHERE key='schema_version'");
  ASSERT_TRUE(version.ok());
  auto row = (*version)->Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ((*version)->Text(0), absl::StrCat(JobStore::kSchemaVersion));
}

// Stores `job` and `attempt` at the current schema in a new store at `path`, then closes it.
void StoreJobAndAttempt(const std::string& path, JobRecord& job, AttemptRecord& attempt) {
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  StoreBatch batch;
  batch.new_jobs.push_back(&job);
  batch.attempts.push_back(&attempt);
  ASSERT_TRUE((*store)->Commit(batch).ok());
}

// Schema 11 kept an attempt's ranks in a table of their own, a row per rank: moves `attempt`'s
// ranks there, as schema 11 stored them.
void DowngradeToSchemaEleven(SqliteDb& db, const AttemptRecord& attempt) {
  ASSERT_TRUE(db.Exec(R"sql(
    CREATE TABLE attempt_ranks(
      job_id TEXT NOT NULL, attempt_id INTEGER NOT NULL, rank INTEGER NOT NULL,
      node_id TEXT NOT NULL, hostname TEXT NOT NULL, slot INTEGER NOT NULL,
      local_rank INTEGER NOT NULL, pid INTEGER NOT NULL,
      exited INTEGER NOT NULL, exit_code INTEGER NOT NULL, signal INTEGER NOT NULL,
      exit_pid INTEGER NOT NULL, exited_us INTEGER, last_log_lines TEXT NOT NULL,
      exit_message TEXT NOT NULL, exit_stopped INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY(job_id, attempt_id, rank));
    ALTER TABLE attempts DROP COLUMN ranks;
    UPDATE meta SET value='11' WHERE key='schema_version';
  )sql")
                  .ok());
  auto insert = db.Prepare(R"sql(
    INSERT INTO attempt_ranks VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
  )sql");
  ASSERT_TRUE(insert.ok()) << insert.status();
  for (const RankSlot& slot : attempt.ranks) {
    const RankExit exit = slot.exit.value_or(RankExit{});
    (*insert)->Reset();
    (*insert)
        ->Bind(1, attempt.job_id)
        .Bind(2, int64_t{attempt.attempt_id})
        .Bind(3, int64_t{slot.rank})
        .Bind(4, slot.node_id)
        .Bind(5, slot.hostname)
        .Bind(6, int64_t{slot.slot})
        .Bind(7, int64_t{slot.local_rank})
        .Bind(8, slot.pid)
        .Bind(9, int64_t{slot.exit.has_value() ? 1 : 0})
        .Bind(10, int64_t{exit.exit_code})
        .Bind(11, int64_t{exit.signal})
        .Bind(12, exit.pid)
        .Bind(13, absl::ToUnixMicros(exit.exited))
        .Bind(14, absl::StrJoin(exit.last_log_lines, "\n"))
        .Bind(15, exit.message)
        .Bind(16, int64_t{exit.stopped ? 1 : 0});
    ASSERT_TRUE((*insert)->Run().ok());
  }
}

// Stores `job` and `attempt` at the current schema, then brings the file back to schema 11 and
// runs `downgrade` on it (dropping what a later version added and setting the old version
// number).
void StoreThenDowngrade(const std::string& path, JobRecord& job, AttemptRecord& attempt,
                        const std::string& downgrade) {
  ASSERT_NO_FATAL_FAILURE(StoreJobAndAttempt(path, job, attempt));
  auto db = SqliteDb::Open(path);
  ASSERT_TRUE(db.ok());
  ASSERT_NO_FATAL_FAILURE(DowngradeToSchemaEleven(**db, attempt));
  ASSERT_TRUE((*db)->Exec(downgrade).ok());
}

void ExpectSameRanks(const std::vector<RankSlot>& got, const std::vector<RankSlot>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].rank, want[i].rank);
    EXPECT_EQ(got[i].node_id, want[i].node_id);
    EXPECT_EQ(got[i].hostname, want[i].hostname);
    EXPECT_EQ(got[i].slot, want[i].slot);
    EXPECT_EQ(got[i].local_rank, want[i].local_rank);
    EXPECT_EQ(got[i].pid, want[i].pid);
    ASSERT_EQ(got[i].exit.has_value(), want[i].exit.has_value()) << "rank " << i;
    if (!want[i].exit) continue;
    EXPECT_EQ(got[i].exit->exit_code, want[i].exit->exit_code);
    EXPECT_EQ(got[i].exit->signal, want[i].exit->signal);
    EXPECT_EQ(got[i].exit->pid, want[i].exit->pid);
    EXPECT_EQ(got[i].exit->exited, want[i].exit->exited);
    EXPECT_EQ(got[i].exit->last_log_lines, want[i].exit->last_log_lines);
    EXPECT_EQ(got[i].exit->message, want[i].exit->message);
    EXPECT_EQ(got[i].exit->stopped, want[i].exit->stopped);
  }
}

// Schema 11 stored a row per rank: the ranks move into their attempt's row unchanged, the old
// table goes, and the workers' pids (soft state) are written into the row afterwards.
TEST(JobStoreTest, SchemaElevenDatabaseIsMigratedForRanksInTheAttemptRow) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(9);
  AttemptRecord attempt = MakeAttempt(job.id);
  attempt.ranks[1].exit->message = "exec failed: no such file";
  attempt.ranks[1].exit->stopped = true;
  ASSERT_NO_FATAL_FAILURE(StoreThenDowngrade(path, job, attempt, ""));
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->attempts.size(), 1u);
  ExpectSameRanks(state->attempts[0].ranks, attempt.ranks);

  SoftStateBatch soft;
  soft.pids.push_back({job.id, 1, 0, 4242});
  soft.pids.push_back({job.id, 1, 1, 4343});
  soft.pids.push_back({job.id, 7, 0, 1});  // an attempt never stored: nothing to update
  ASSERT_TRUE((*store)->CommitSoftState(soft).ok());
  state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  attempt.ranks[0].pid = 4242;
  attempt.ranks[1].pid = 4343;
  ExpectSameRanks(state->attempts[0].ranks, attempt.ranks);

  auto db = SqliteDb::Open(path);
  ASSERT_TRUE(db.ok());
  auto tables = (*db)->Prepare("SELECT COUNT(*) FROM sqlite_master WHERE name='attempt_ranks'");
  ASSERT_TRUE(tables.ok());
  auto row = (*tables)->Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ((*tables)->Int(0), 0);
}

// An attempt's ranks that no longer parse are reported, naming the attempt, not loaded as none.
TEST(JobStoreTest, RanksThatDoNotParseFailTheLoadNamingTheAttempt) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(9);
  AttemptRecord attempt = MakeAttempt(job.id);
  ASSERT_NO_FATAL_FAILURE(StoreJobAndAttempt(path, job, attempt));
  {
    auto db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("UPDATE attempts SET ranks=x'ffff'").ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_FALSE(state.ok());
  EXPECT_THAT(std::string(state.status().message()), ::testing::HasSubstr(job.id));
}

// Schema 3 had no record of whether an exit followed a stop order: its exits load as failures,
// as before, and new ones keep the flag.
TEST(JobStoreTest, SchemaThreeDatabaseIsMigratedForStoppedExits) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(9);
  AttemptRecord attempt = MakeAttempt(job.id);
  ASSERT_NO_FATAL_FAILURE(
      StoreThenDowngrade(path, job, attempt,
                         "ALTER TABLE attempt_ranks DROP COLUMN exit_stopped; "
                         "UPDATE meta SET value='3' WHERE key='schema_version'"));
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(state->attempts[0].ranks[1].exit.has_value());
  EXPECT_FALSE(state->attempts[0].ranks[1].exit->stopped);
  attempt.ranks[1].exit->stopped = true;
  StoreBatch batch;
  batch.attempts.push_back(&attempt);
  ASSERT_TRUE((*store)->Commit(batch).ok());
  state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->attempts[0].ranks[1].exit->stopped);
}

// Schema 6 had no context-parallel degree: its jobs and attempts load with cp 1, and meshes
// stored after the migration keep theirs.
TEST(JobStoreTest, SchemaSixDatabaseIsMigratedForContextParallelism) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(9);
  AttemptRecord attempt = MakeAttempt(job.id);
  ASSERT_NO_FATAL_FAILURE(
      StoreThenDowngrade(path, job, attempt,
                         "ALTER TABLE jobs DROP COLUMN cp; ALTER TABLE attempts DROP COLUMN cp; "
                         "UPDATE meta SET value='6' WHERE key='schema_version'"));
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 1u);
  EXPECT_EQ(state->jobs[0].requirements.mesh.cp, 1);
  EXPECT_EQ(state->jobs[0].requirements.mesh.tp, 4);
  ASSERT_EQ(state->attempts.size(), 1u);
  EXPECT_EQ(state->attempts[0].mesh.cp, 1);
  EXPECT_EQ(state->attempts[0].mesh.virtual_stages, 3);

  JobRecord next = MakeJob(10);
  attempt.attempt_id = 2;
  StoreBatch batch;
  batch.new_jobs.push_back(&next);
  batch.attempts.push_back(&attempt);
  ASSERT_TRUE((*store)->Commit(batch).ok());
  state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 2u);
  EXPECT_EQ(state->jobs[1].requirements.mesh.cp, 2);
  ASSERT_EQ(state->attempts.size(), 2u);
  EXPECT_EQ(state->attempts[1].mesh.cp, 2);

  auto db = SqliteDb::Open(path);
  ASSERT_TRUE(db.ok());
  auto version = (*db)->Prepare("SELECT value FROM meta WHERE key='schema_version'");
  ASSERT_TRUE(version.ok());
  auto row = (*version)->Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ((*version)->Text(0), absl::StrCat(JobStore::kSchemaVersion));
}

std::vector<MoeLayerProgress> TwoMoeLayers() {
  MoeLayerProgress aux{1, 3, {15, 15, 18, 0}, 24, 5, 6, MoeBalance::kAuxLoss, 0.1 + 0.2, 0};
  MoeLayerProgress bias{3, 3,         {12, 12, 12, 12}, 24, 0, 0, MoeBalance::kBias,
                        0, 1.0 / 3.0, 2.0 / 3.0e3};  // with the router z-loss
  return {aux, bias};
}

// The MoE routing is progress: written with the soft state, read back exactly (the reals too).
TEST(JobStoreTest, MoeRoutingSurvivesReopen) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(11);
  JobRecord dense = MakeJob(12);
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    StoreBatch batch;
    batch.new_jobs = {&job, &dense};
    ASSERT_TRUE((*store)->Commit(batch).ok());
    job.progress.step = 9;
    job.progress.moe = TwoMoeLayers();
    SoftStateBatch soft;
    soft.progress.emplace_back(job.id, job.progress);
    ASSERT_TRUE((*store)->CommitSoftState(soft).ok());
  }
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 2u);
  EXPECT_EQ(state->jobs[0].progress.step, 9);
  EXPECT_EQ(state->jobs[0].progress.moe, TwoMoeLayers());
  EXPECT_TRUE(state->jobs[1].progress.moe.empty());

  // And with the job's other columns (a transition stores the whole progress).
  job.progress.moe.pop_back();
  StoreBatch update;
  update.updated_jobs.push_back(&job);
  ASSERT_TRUE((*store)->Commit(update).ok());
  state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs[0].progress.moe.size(), 1u);
  EXPECT_EQ(state->jobs[0].progress.moe[0], TwoMoeLayers()[0]);

  // A layer stored before the router z-loss was recorded (one field fewer) reads with none.
  store->reset();
  {
    auto db = SqliteDb::Open(path);
    ASSERT_TRUE(db.ok());
    // The jobs row's column, with no newer soft state in job_progress to take its place.
    ASSERT_TRUE((*db)
                    ->Exec("UPDATE jobs SET moe = '3\t3\t24\t0\t0\t2\t0\t0.5\t12,12,12,12'; "
                           "DELETE FROM job_progress")
                    .ok());
  }
  store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs[0].progress.moe.size(), 1u);
  EXPECT_EQ(state->jobs[0].progress.moe[0].bias_spread, 0.5);
  EXPECT_EQ(state->jobs[0].progress.moe[0].z_loss, 0.0);
  EXPECT_EQ(state->jobs[0].progress.moe[0].tokens_per_expert,
            (std::vector<int64_t>{12, 12, 12, 12}));
}

// Schema 10 had no expert-parallel degree: its jobs and attempts load with ep 0 (the spec's own),
// and meshes stored after the migration keep theirs.
TEST(JobStoreTest, SchemaTenDatabaseIsMigratedForExpertParallelism) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(9);
  AttemptRecord attempt = MakeAttempt(job.id);
  job.requirements.mesh.ep = 2;  // dropped by the downgrade below
  attempt.mesh.ep = 2;
  ASSERT_NO_FATAL_FAILURE(
      StoreThenDowngrade(path, job, attempt,
                         "ALTER TABLE jobs DROP COLUMN ep; ALTER TABLE attempts DROP COLUMN ep; "
                         "UPDATE meta SET value='10' WHERE key='schema_version'"));
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 1u);
  EXPECT_EQ(state->jobs[0].requirements.mesh.ep, 0);
  EXPECT_EQ(state->jobs[0].requirements.mesh.cp, 2);
  ASSERT_EQ(state->attempts.size(), 1u);
  EXPECT_EQ(state->attempts[0].mesh.ep, 0);

  JobRecord next = MakeJob(10);
  next.requirements.mesh.ep = 4;
  attempt.attempt_id = 2;
  StoreBatch batch;
  batch.new_jobs.push_back(&next);
  batch.attempts.push_back(&attempt);
  ASSERT_TRUE((*store)->Commit(batch).ok());
  state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 2u);
  EXPECT_EQ(state->jobs[1].requirements.mesh.ep, 4);
  ASSERT_EQ(state->attempts.size(), 2u);
  EXPECT_EQ(state->attempts[1].mesh.ep, 2);
}

// Schema 7 had no MoE routing: its jobs load without any, and progress stored after the migration
// keeps it.
TEST(JobStoreTest, SchemaSevenDatabaseIsMigratedForMoeRouting) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(9);
  AttemptRecord attempt = MakeAttempt(job.id);
  ASSERT_NO_FATAL_FAILURE(StoreThenDowngrade(
      path, job, attempt,
      "ALTER TABLE jobs DROP COLUMN moe; UPDATE meta SET value='7' WHERE key='schema_version'"));
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 1u);
  EXPECT_TRUE(state->jobs[0].progress.moe.empty());
  EXPECT_EQ(state->jobs[0].requirements.mesh.cp, 2);

  job.progress.moe = TwoMoeLayers();
  SoftStateBatch soft;
  soft.progress.emplace_back(job.id, job.progress);
  ASSERT_TRUE((*store)->CommitSoftState(soft).ok());
  state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->jobs[0].progress.moe, TwoMoeLayers());
}

// Schema 8 had no failure-handling accounts: its jobs load without any; accounts stored after the
// migration, with the job's row or with its progress, read back byte for byte.
TEST(JobStoreTest, SchemaEightDatabaseIsMigratedForTheJobsAccounts) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(9);
  AttemptRecord attempt = MakeAttempt(job.id);
  ASSERT_NO_FATAL_FAILURE(StoreThenDowngrade(path, job, attempt,
                                             "ALTER TABLE jobs DROP COLUMN accounts; UPDATE meta "
                                             "SET value='8' WHERE key='schema_version'"));
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 1u);
  EXPECT_TRUE(state->jobs[0].accounts.empty());

  job.accounts = std::string("\0binary\xff", 9);
  StoreBatch batch;
  batch.updated_jobs.push_back(&job);
  ASSERT_TRUE((*store)->Commit(batch).ok());
  state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->jobs[0].accounts, job.accounts);
  SoftStateBatch soft;
  soft.accounts.emplace_back(job.id, "newer");
  ASSERT_TRUE((*store)->CommitSoftState(soft).ok());
  state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->jobs[0].accounts, "newer");
}

// Schema 9 kept a job's progress and accounts in its jobs row: they load from there until the
// job's first write after the migration, which goes to the narrow job_progress table only (the
// once-a-second progress write no longer rewrites the jobs row).
TEST(JobStoreTest, SchemaNineDatabaseIsMigratedForTheProgressTable) {
  ScratchDir dir;
  const std::string path = dir.path() + "/state.db";
  JobRecord job = MakeJob(9);
  AttemptRecord attempt = MakeAttempt(job.id);
  ASSERT_NO_FATAL_FAILURE(StoreThenDowngrade(
      path, job, attempt,
      absl::StrCat("DROP TABLE job_progress; UPDATE jobs SET step=41, loss=2.5, val_loss=2.75, "
                   "accounts='",
                   absl::Base64Escape(std::string("\0old\xff", 5)),
                   "'; UPDATE meta SET value='9' WHERE key='schema_version'")));
  auto store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  auto state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs.size(), 1u);
  EXPECT_EQ(state->jobs[0].progress.step, 41);
  EXPECT_EQ(state->jobs[0].progress.loss, 2.5);
  EXPECT_EQ(state->jobs[0].progress.val_loss, 2.75);
  EXPECT_EQ(state->jobs[0].accounts, std::string("\0old\xff", 5));

  job.progress.step = 42;
  job.progress.loss = 2.25;
  job.progress.eta = absl::Seconds(90);
  job.progress.reported = absl::FromUnixSeconds(1800000000);
  job.progress.run_report = std::string("\0report", 7);
  SoftStateBatch soft;
  soft.progress.emplace_back(job.id, job.progress);
  soft.accounts.emplace_back(job.id, "newer");
  ASSERT_TRUE((*store)->CommitSoftState(soft).ok());
  state = (*store)->Load();
  ASSERT_TRUE(state.ok()) << state.status();
  const Progress& p = state->jobs[0].progress;
  EXPECT_EQ(p.step, 42);
  EXPECT_EQ(p.loss, 2.25);
  EXPECT_FALSE(p.val_loss.has_value());
  EXPECT_EQ(p.eta, absl::Seconds(90));
  EXPECT_EQ(p.reported, absl::FromUnixSeconds(1800000000));
  EXPECT_EQ(p.run_report, job.progress.run_report);
  EXPECT_EQ(state->jobs[0].accounts, "newer");

  auto db = SqliteDb::Open(path);
  ASSERT_TRUE(db.ok());
  auto legacy = (*db)->Prepare("SELECT step FROM jobs");
  ASSERT_TRUE(legacy.ok());
  auto row = (*legacy)->Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ((*legacy)->Int(0), 41) << "the progress write rewrote the jobs row";
}

}  // namespace
}  // namespace trainyard::server
