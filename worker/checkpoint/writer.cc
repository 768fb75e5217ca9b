#include "worker/checkpoint/writer.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/host_memory.h"
#include "common/logging.h"
#include "common/memory_tier_names.h"
#include "common/status.h"

namespace trainyard::worker::checkpoint {
namespace {

constexpr int64_t kAppendBytes = int64_t{16} << 20;

}  // namespace

CheckpointWriter::CheckpointWriter(FileSystem* fs, Clock* clock, WriterOptions options)
    : fs_(fs),
      clock_(clock),
      options_(std::move(options)),
      busy_(options_.snapshot_floats > 0),
      thread_([this] { Loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    while (busy_) changed_.Wait(&mu_);
    stop_ = true;
    changed_.SignalAll();
  }
  thread_.join();
}

absl::Status CheckpointWriter::Save(int64_t step, Manifest header,
                                    std::vector<SnapshotRecord> records,
                                    const std::function<absl::Status(float*)>& fill) {
  const int64_t start = clock_->NowNanosMonotonic();
  {
    absl::MutexLock lock(&mu_);
    while (busy_) changed_.Wait(&mu_);
  }
  const int64_t waited = clock_->NowNanosMonotonic() - start;
  int64_t floats = 0;
  for (const SnapshotRecord& r : records) floats += r.end - r.begin;
  EnsureHost(floats);
  if (absl::Status filled = fill(static_cast<float*>(host_.get())); !filled.ok()) {
    const std::string why = absl::StrCat("snapshot of step ", step, ": ", filled.message());
    absl::MutexLock lock(&mu_);
    last_ = absl::Status(filled.code(), why);
    outcomes_.push_back({.step = step, .message = why, .finished = clock_->Now()});
    return last_;
  }
  Job job;
  job.step = step;
  job.header = std::move(header);
  job.records = std::move(records);
  job.started_nanos = clock_->NowNanosMonotonic();
  job.blocked_seconds = (job.started_nanos - start) / 1e9;
  job.waited_seconds = waited / 1e9;
  {
    absl::MutexLock lock(&mu_);
    job_ = std::move(job);
    busy_ = true;
    changed_.SignalAll();
  }
  return absl::OkStatus();
}

bool CheckpointWriter::Busy() {
  absl::MutexLock lock(&mu_);
  return busy_;
}

absl::Status CheckpointWriter::Wait() {
  absl::MutexLock lock(&mu_);
  while (busy_) changed_.Wait(&mu_);
  return last_;
}

std::vector<SaveOutcome> CheckpointWriter::TakeOutcomes() {
  absl::MutexLock lock(&mu_);
  return std::exchange(outcomes_, {});
}

void CheckpointWriter::EnsureHost(int64_t floats) {
  if (floats <= host_floats_) return;
  const size_t bytes = (4 * static_cast<size_t>(floats) + kDirectIoAlignment - 1) /
                       kDirectIoAlignment * kDirectIoAlignment;
  // Every page touched now, not during a snapshot.
  host_ = AllocateHostMemory(bytes, kDirectIoAlignment);
  host_floats_ = floats;
}

void CheckpointWriter::Loop() {
  if (options_.snapshot_floats > 0) {
    EnsureHost(options_.snapshot_floats);
    absl::MutexLock lock(&mu_);
    busy_ = false;
    changed_.SignalAll();
  }
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && !job_.has_value()) changed_.Wait(&mu_);
      if (!job_) return;
      job = std::move(*job_);
      job_.reset();
    }
    SaveOutcome outcome = Write(job);
    {
      absl::MutexLock lock(&mu_);
      last_ = outcome.committed || outcome.message.empty() ? absl::OkStatus()
                                                           : absl::InternalError(outcome.message);
      outcomes_.push_back(std::move(outcome));
      busy_ = false;
      changed_.SignalAll();
    }
  }
}

SaveOutcome CheckpointWriter::WriteToMemory(const Job& job) {
  const std::string snapshot = MemorySnapshotName({options_.attempt, job.step});
  const std::string path = JoinPath(options_.dir, snapshot);
  SaveOutcome outcome{.step = job.step,
                      .path = path,
                      .blocked_seconds = job.blocked_seconds,
                      .waited_seconds = job.waited_seconds};
  absl::Status done = [&]() -> absl::Status {
    TY_ASSIGN_OR_RETURN(ShardFile shard, WriteShard(job, path));
    shard.clear_save_token();
    Manifest manifest = job.header;
    manifest.set_format_version(kFormatVersion);
    manifest.set_step(job.step);
    manifest.set_created_unix_ms(absl::ToUnixMillis(clock_->Now()));
    const std::string shard_file = shard.file();
    outcome.bytes = shard.bytes();
    *manifest.add_shards() = std::move(shard);
    const std::string json = SerializeManifest(std::move(manifest));
    const std::string manifest_file = MemoryRankManifestName(options_.rank);
    TY_RETURN_IF_ERROR(fs_->WriteFileAtomic(JoinPath(path, manifest_file), json));
    outcome.bytes += static_cast<int64_t>(json.size());
    if (options_.on_committed) {
      return options_.on_committed(job.step, snapshot, {shard_file, manifest_file});
    }
    return absl::OkStatus();
  }();
  outcome.write_seconds = (clock_->NowNanosMonotonic() - job.started_nanos) / 1e9;
  outcome.finished = clock_->Now();
  if (!done.ok()) {
    outcome.message = absl::StrCat("memory snapshot of step ", job.step, " failed on rank ",
                                   options_.rank, ": ", done.message());
    TY_LOG(WARNING) << outcome.message;
  } else {
    outcome.committed = true;
  }
  return outcome;
}

SaveOutcome CheckpointWriter::Write(const Job& job) {
  if (options_.memory_tier) return WriteToMemory(job);
  const std::string path = JoinPath(options_.dir, CheckpointDirName(job.step, options_.save_token));
  SaveOutcome outcome{.step = job.step,
                      .path = path,
                      .blocked_seconds = job.blocked_seconds,
                      .waited_seconds = job.waited_seconds};
  absl::StatusOr<ShardFile> shard = WriteShard(job, path);
  if (options_.rank != 0) {
    if (!shard.ok()) {
      outcome.message = absl::StrCat("checkpoint of step ", job.step, " failed on rank ",
                                     options_.rank, ": ", shard.status().message());
      // Tell rank 0 at once rather than let it wait for the shard (best effort: the disk may be
      // what failed).
      ShardFile failed;
      failed.set_rank(options_.rank);
      failed.set_save_token(options_.save_token);
      failed.set_error(outcome.message);
      (void)fs_->WriteFileAtomic(JoinPath(path, ShardIndexName(options_.rank)),
                                 failed.SerializeAsString());
      TY_LOG(WARNING) << outcome.message;
    } else {
      outcome.bytes = shard->bytes();
    }
    outcome.write_seconds = (clock_->NowNanosMonotonic() - job.started_nanos) / 1e9;
    outcome.finished = clock_->Now();
    return outcome;
  }
  absl::StatusOr<int64_t> bytes =
      shard.ok() ? Commit(job, path, *std::move(shard)) : absl::StatusOr<int64_t>(shard.status());
  outcome.write_seconds = (clock_->NowNanosMonotonic() - job.started_nanos) / 1e9;
  outcome.finished = clock_->Now();
  if (!bytes.ok()) {
    outcome.message =
        absl::StrCat("checkpoint of step ", job.step, " failed: ", bytes.status().message());
    TY_LOG(WARNING) << outcome.message << " (training goes on; earlier checkpoints are intact)";
    return outcome;
  }
  outcome.committed = true;
  outcome.bytes = *bytes;
  Prune(path);
  return outcome;
}

absl::StatusOr<ShardFile> CheckpointWriter::WriteShard(const Job& job, const std::string& path) {
  TY_RETURN_IF_ERROR(fs_->CreateDirs(path));
  ShardFile shard;
  shard.set_file(ShardFileName(options_.rank, options_.world));
  shard.set_rank(options_.rank);
  shard.set_save_token(options_.save_token);
  const std::string file = JoinPath(path, shard.file());
  // The memory tier is page cache already: no O_DIRECT there.
  TY_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, options_.memory_tier
                                                             ? fs_->NewWritableFile(file)
                                                             : fs_->NewDirectWritableFile(file));
  const char* base = reinterpret_cast<const char*>(host_.get());
  // Each piece is hashed just before it is written, while it is still in the cache.
  int64_t offset = 0, written = 0;
  auto write_up_to = [&](int64_t end, bool all) -> absl::Status {
    while (end - written >= kAppendBytes || (all && end > written)) {
      const int64_t n = std::min(kAppendBytes, end - written);
      TY_RETURN_IF_ERROR(out->Append(std::string_view(base + written, n)));
      written += n;
    }
    return absl::OkStatus();
  };
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash(XXH3_createState(),
                                                                &XXH3_freeState);
  for (const SnapshotRecord& r : job.records) {
    const int64_t bytes = 4 * (r.end - r.begin);
    TensorRecord* record = shard.add_records();
    record->set_name(r.name);
    record->set_kind(r.kind);
    record->set_dtype("f32");
    for (int64_t d : r.global_shape) record->add_global_shape(d);
    for (int64_t d : r.slab.offsets) record->add_offsets(d);
    for (int64_t d : r.slab.sizes) record->add_sizes(d);
    record->set_flat_begin(r.begin);
    record->set_flat_end(r.end);
    record->set_byte_offset(offset);
    XXH3_64bits_reset(hash.get());
    for (int64_t at = 0; at < bytes; at += kAppendBytes) {
      const int64_t n = std::min(kAppendBytes, bytes - at);
      XXH3_64bits_update(hash.get(), base + offset + at, n);
      TY_RETURN_IF_ERROR(write_up_to(offset + at + n, /*all=*/false));
    }
    record->set_xxh3(XXH3_64bits_digest(hash.get()));
    offset += bytes;
  }
  TY_RETURN_IF_ERROR(write_up_to(offset, /*all=*/true));
  if (!options_.memory_tier) TY_RETURN_IF_ERROR(out->Sync());
  TY_RETURN_IF_ERROR(out->Close());
  shard.set_bytes(offset);
  if (options_.rank != 0 && !options_.memory_tier) {
    // The index is rank 0's signal that this shard is durable; WriteFileAtomic also syncs the
    // directory, which makes the shard file's name durable.
    TY_RETURN_IF_ERROR(fs_->WriteFileAtomic(JoinPath(path, ShardIndexName(options_.rank)),
                                            shard.SerializeAsString()));
  }
  return shard;
}

absl::StatusOr<std::vector<ShardFile>> CheckpointWriter::GatherIndexes(const std::string& path,
                                                                       ShardFile own) {
  std::vector<ShardFile> shards(options_.world);
  shards[0] = std::move(own);
  const int64_t deadline =
      clock_->NowNanosMonotonic() + absl::ToInt64Nanoseconds(options_.gather_timeout);
  absl::Duration poll = absl::Milliseconds(1);
  for (int r = 1; r < options_.world; ++r) {
    const std::string index = JoinPath(path, ShardIndexName(r));
    for (;;) {
      absl::StatusOr<std::string> bytes = fs_->ReadFile(index);
      ShardFile shard;
      if (bytes.ok() && shard.ParseFromString(*bytes) &&
          shard.save_token() == options_.save_token) {
        if (!shard.error().empty()) return absl::AbortedError(shard.error());
        shards[r] = std::move(shard);
        break;
      }
      if (clock_->NowNanosMonotonic() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("rank ", r, "'s shard not written within ",
                         absl::FormatDuration(options_.gather_timeout)));
      }
      clock_->SleepFor(poll);
      poll = std::min(poll * 2, absl::Milliseconds(50));
    }
  }
  return shards;
}

absl::StatusOr<int64_t> CheckpointWriter::Commit(const Job& job, const std::string& path,
                                                 ShardFile own) {
  TY_ASSIGN_OR_RETURN(std::vector<ShardFile> shards, GatherIndexes(path, std::move(own)));
  Manifest manifest = job.header;
  manifest.set_format_version(kFormatVersion);
  manifest.set_step(job.step);
  manifest.set_created_unix_ms(absl::ToUnixMillis(clock_->Now()));
  int64_t bytes = 0;
  for (ShardFile& shard : shards) {
    shard.clear_save_token();
    bytes += shard.bytes();
    *manifest.add_shards() = std::move(shard);
  }
  const std::string json = SerializeManifest(std::move(manifest));
  // The checkpoint directory's own name, and the checkpoint root's, must be durable before the
  // manifest makes the checkpoint exist.
  TY_RETURN_IF_ERROR(fs_->SyncDir(Dirname(options_.dir)));
  TY_RETURN_IF_ERROR(fs_->SyncDir(options_.dir));
  if (options_.may_commit) {
    if (absl::Status fenced = options_.may_commit(); !fenced.ok()) {
      return absl::Status(fenced.code(), absl::StrCat("not committed: ", fenced.message()));
    }
  }
  const std::string manifest_path = JoinPath(path, kManifestName);
  if (absl::Status written = fs_->WriteFileAtomic(manifest_path, json); !written.ok()) {
    // The rename may have happened without becoming durable: take the manifest away so that a
    // failed save is not a checkpoint now and maybe another after a crash (best effort).
    (void)fs_->RemoveFile(manifest_path);
    (void)fs_->SyncDir(path);
    return written;
  }
  for (int r = 1; r < options_.world; ++r) {
    (void)fs_->RemoveFile(JoinPath(path, ShardIndexName(r)));  // no longer needed
  }
  return bytes + static_cast<int64_t>(json.size());
}

void CheckpointWriter::Prune(const std::string& committed_path) {
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(options_.dir);
  if (!names.ok()) return;
  const int64_t committed_step = StepOfPath(committed_path).value_or(0);
  std::vector<std::pair<int64_t, std::string>> kept;
  std::vector<std::string> remove;
  for (const std::string& name : *names) {
    const std::optional<int64_t> step = StepOfDirName(name);
    if (!step) continue;
    const std::string path = JoinPath(options_.dir, name);
    const bool ours = TokenOfDirName(name) == options_.save_token;
    if (!fs_->Exists(JoinPath(path, kManifestName))) {
      // Torn: a crashed run's, or one of ours that failed. A newer one of ours is in flight.
      if (!ours || *step < committed_step) remove.push_back(path);
    } else if (!ours && *step > options_.resumed_step) {
      remove.push_back(path);  // abandoned by the run that resumed from an older one
    } else {
      kept.emplace_back(*step, path);
    }
  }
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a > b; });
  for (size_t i = options_.keep; i < kept.size(); ++i) remove.push_back(kept[i].second);
  for (const std::string& path : remove) {
    if (absl::Status s = RemoveRecursively(*fs_, path); !s.ok()) {
      TY_LOG(WARNING) << "could not remove old checkpoint " << path << ": " << s.message();
    }
  }
  if (!remove.empty()) (void)fs_->SyncDir(options_.dir);
}

}  // namespace trainyard::worker::checkpoint
