// JobStore: the coordinator's durable state in one SQLite database (WAL journal, synchronous
// FULL, so a committed change survives the coordinator being killed at any moment): jobs with
// their labels, attempts with their per-rank placement and exits, the event log, nodes, and the
// checkpoint saves workers reported (one row per job and checkpoint path).
//
// Every mutation goes through Commit(), which applies a whole StoreBatch in one transaction:
// either all of it is stored or none. The schema carries a version (meta.schema_version); a
// database of an older version is migrated when opened, one written by a newer version is
// refused with FAILED_PRECONDITION rather than misread.
//
// Threading: thread-safe (one internal mutex); calls are serialized.
#ifndef TRAINYARD_SERVER_JOB_STORE_H_
#define TRAINYARD_SERVER_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/node_quarantine.h"
#include "server/sqlite.h"
#include "server/types.h"

namespace trainyard::server {

// A checkpoint record of a job.
struct JobCheckpoint {
  std::string job_id;
  CheckpointInfo record;
};

// One transaction's worth of changes. Pointers must stay valid during Commit().
struct StoreBatch {
  std::vector<const JobRecord*> new_jobs;      // inserted with labels and spec
  std::vector<const JobRecord*> updated_jobs;  // mutable columns only (state, progress, ...)
  std::vector<const AttemptRecord*> attempts;  // inserted or replaced, with their ranks
  std::vector<EventRecord> events;             // appended; Commit() fills in their ids
  std::vector<const NodeRecord*> nodes;        // inserted or replaced
  std::vector<JobCheckpoint> checkpoints;      // inserted or replaced, by (job id, path)
  // Cordons put in place (stored, replacing the node's) or lifted (deleted), in order.
  struct CordonChange {
    std::string node_id;
    std::optional<Cordon> cordon;  // nullopt: lifted
  };
  std::vector<CordonChange> cordons;

  bool empty() const {
    return new_jobs.empty() && updated_jobs.empty() && attempts.empty() && events.empty() &&
           nodes.empty() && checkpoints.empty() && cordons.empty();
  }
};

// Soft state, written often and cheaply (see CommitSoftState): progress columns of jobs and
// worker pids of attempt ranks.
struct SoftStateBatch {
  struct Pid {
    std::string job_id;
    int attempt_id = 0;
    int rank = 0;
    int64_t pid = 0;
  };
  std::vector<std::pair<std::string, Progress>> progress;  // by job id
  // By job id: its failure-handling accounts (JobRecord::accounts).
  std::vector<std::pair<std::string, std::string>> accounts;
  std::vector<Pid> pids;
  bool empty() const { return progress.empty() && accounts.empty() && pids.empty(); }
};

// Everything Load() reads back.
struct StoredState {
  std::vector<JobRecord> jobs;          // in submission order
  std::vector<AttemptRecord> attempts;  // by job, then attempt id
  std::vector<NodeRecord> nodes;
  std::vector<JobCheckpoint> checkpoints;  // by job, then oldest first (written time, step)
  std::vector<Cordon> cordons;             // by node id; some may have expired
  int64_t max_job_seq = 0;
};

// What the supervisor needs of durable storage: JobStore, or a fake that injects failures.
class StateStore {
 public:
  virtual ~StateStore() = default;
  // Applies `batch` atomically: all of it is stored or none. Pointers must stay valid during
  // the call; events get their ids.
  [[nodiscard]] virtual absl::Status Commit(StoreBatch& batch) = 0;
  [[nodiscard]] virtual absl::Status CommitSoftState(const SoftStateBatch& batch) = 0;
  [[nodiscard]] virtual absl::StatusOr<StoredState> Load() = 0;
  [[nodiscard]] virtual absl::StatusOr<std::vector<EventRecord>> ListEvents(
      const std::string& job_id, int limit) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::optional<std::string>> FindJobByClientRequestId(
      const std::string& key) = 0;
};

class JobStore final : public StateStore {
 public:
  static constexpr int kSchemaVersion = 12;

  // Opens or creates the database at `path` (its directory must exist), migrating one of an
  // older schema version (1: before checkpoints and drains). INTERNAL for SQLite errors;
  // FAILED_PRECONDITION for a schema version this build does not know.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);

  // Applies `batch` atomically. A duplicate job id or client_request_id is ALREADY_EXISTS (and
  // nothing of the batch is stored); other failures INTERNAL.
  [[nodiscard]] absl::Status Commit(StoreBatch& batch) override;

  // Updates only progress columns and pids, in one transaction that survives the process being
  // killed (synchronous NORMAL: it is not flushed to disk, so a power loss may drop the last
  // second of progress — state that workers report again anyway). Never changes a job's state.
  [[nodiscard]] absl::Status CommitSoftState(const SoftStateBatch& batch) override;

  [[nodiscard]] absl::StatusOr<StoredState> Load() override;

  // The newest `limit` events of a job, oldest first.
  [[nodiscard]] absl::StatusOr<std::vector<EventRecord>> ListEvents(const std::string& job_id,
                                                                    int limit) override;

  // The job created with this idempotency key, if any.
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> FindJobByClientRequestId(
      const std::string& key) override;

 private:
  explicit JobStore(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}
  [[nodiscard]] absl::Status Migrate();
  [[nodiscard]] absl::StatusOr<bool> HasColumn(const char* table, const char* column)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The body of Commit and CommitSoftState: one transaction.
  [[nodiscard]] absl::Status StoreBatchLocked(StoreBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status StoreSoftStateLocked(const SoftStateBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status InsertJob(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status UpdateJob(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's job_progress row: its progress, its accounts, or both (null: left as stored).
  [[nodiscard]] absl::Status PutProgress(const std::string& job_id, const Progress* progress,
                                         const std::string* accounts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status PutAttempt(const AttemptRecord& attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker pids of one stored attempt's ranks (its other fields as stored).
  [[nodiscard]] absl::Status PutPidsLocked(const std::string& job_id, int attempt_id,
                                           absl::Span<const SoftStateBatch::Pid> pids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Schema 11 -> 12: attempt_ranks' rows into the attempts' ranks column.
  [[nodiscard]] absl::Status MoveRanksIntoAttempts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status AppendEvent(EventRecord& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status PutNode(const NodeRecord& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status PutCordons(const StoreBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status PutCheckpoint(const JobCheckpoint& checkpoint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status LoadJobs(StoredState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status LoadAttempts(StoredState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status LoadNodes(StoredState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status LoadCordons(StoredState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status LoadCheckpoints(StoredState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A prepared statement for `sql`, kept for reuse; reset and unbound.
  [[nodiscard]] absl::StatusOr<SqliteStatement*> Cached(const char* sql)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::unique_ptr<SqliteDb> db_ ABSL_GUARDED_BY(mu_);
  // Keyed by the SQL text's address: callers pass string literals.
  std::map<const char*, std::unique_ptr<SqliteStatement>> statements_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_JOB_STORE_H_
