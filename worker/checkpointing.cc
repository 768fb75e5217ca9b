#include "worker/checkpointing.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/checkpoint/reader.h"
#include "worker/shape/tensor_slices.h"

namespace trainyard::worker {

Checkpointer::Checkpointer(FileSystem* fs, Clock* clock, const config::JobSpec& spec,
                           const ParameterLayout& layout, CheckpointRank rank,
                           std::string save_token,
                           std::function<absl::Status(std::span<double>)> sum,
                           MemoryTierClient* tier, int attempt)
    : fs_(fs),
      clock_(clock),
      spec_(spec),
      layout_(layout),
      rank_(rank),
      save_token_(std::move(save_token)),
      sum_(std::move(sum)),
      tier_(spec.fault_tolerance.memory_tier_enabled() ? tier : nullptr),
      attempt_(attempt) {}

namespace {

// Snapshots each rank offers in the exchange: the newest few complete on its node.
constexpr int kOffered = 3;

// The ranks that wrote a checkpoint (one manifest each).
int WriterWorld(const checkpoint::v1::WriterMesh& m) {
  return m.dp() * std::max(m.cp(), 1) * m.tp() * m.pp();
}

// "dp 2 x tp 1 x pp 2", with cp where it was above 1.
std::string WriterMeshText(const checkpoint::v1::WriterMesh& m) {
  return absl::StrFormat("dp %d%s x tp %d x pp %d", m.dp(),
                         m.cp() > 1 ? absl::StrCat(" x cp ", m.cp()) : "", m.tp(), m.pp());
}

// A snapshot as one exactly representable number (0: none): step · 2^20 + attempt + 1.
double Encode(MemorySnapshotId id) {
  return static_cast<double>(id.step) * 1048576.0 + static_cast<double>(id.attempt + 1);
}
MemorySnapshotId Decode(double code) {
  const int64_t v = static_cast<int64_t>(code);
  return {static_cast<int>((v & 0xfffff) - 1), v >> 20};
}

}  // namespace

int64_t Checkpointer::SnapshotFloats(const TrainState& state) const {
  int64_t floats = 0;
  for (const auto& range : state.params->CheckpointRanges()) floats += 3 * (range.hi - range.lo);
  return floats;
}

std::vector<MemorySnapshotId> Checkpointer::CompleteSnapshots() const {
  std::vector<MemorySnapshotId> complete;
  absl::StatusOr<std::vector<std::string>> names = tier_->Complete();
  if (!names.ok()) {
    TY_LOG(WARNING) << "rank " << rank_.rank << ": the memory tier did not say what it holds ("
                    << names.status().message() << ")";
    return complete;
  }
  for (const std::string& name : *names) {
    if (std::optional<MemorySnapshotId> id = ParseMemorySnapshotName(name)) complete.push_back(*id);
    if (static_cast<int>(complete.size()) == kOffered) break;
  }
  return complete;
}

absl::StatusOr<checkpoint::RankState> Checkpointer::LoadMemorySnapshot(
    const std::string& dir, checkpoint::Manifest* merged) const {
  TY_ASSIGN_OR_RETURN(*merged, checkpoint::ReadManifestFile(
                                   *fs_, checkpoint::JoinPath(dir, MemoryRankManifestName(0))));
  const checkpoint::v1::WriterMesh& m = merged->mesh();
  const int world = WriterWorld(m);
  for (int r = 1; r < world; ++r) {
    TY_ASSIGN_OR_RETURN(
        const checkpoint::Manifest other,
        checkpoint::ReadManifestFile(*fs_, checkpoint::JoinPath(dir, MemoryRankManifestName(r))));
    if (other.step() != merged->step() || other.shards_size() != 1) {
      return absl::DataLossError(absl::StrCat(dir, ": rank ", r, "'s manifest does not match"));
    }
    *merged->add_shards() = other.shards(0);
  }
  TY_RETURN_IF_ERROR(checkpoint::CheckModelMatches(merged->model(), spec_.model));
  return checkpoint::LoadRankState(*fs_, dir, *merged, layout_);
}

absl::StatusOr<std::optional<std::string>> Checkpointer::RestoreFromMemory(
    TrainState& state, std::optional<int64_t> disk_step) {
  if (tier_ != nullptr && tier_dir_.empty()) {
    // Reserved before anything is written.
    absl::StatusOr<std::string> dir = tier_->Reserve(MemoryReservation(state));
    if (dir.ok()) {
      tier_dir_ = *dir;
    } else {
      TY_LOG(WARNING) << "rank " << rank_.rank
                      << " runs without the memory tier: " << dir.status().message();
      tier_ = nullptr;
    }
  }
  // Every rank takes part in the exchange, with or without a tier of its own.
  std::vector<double> offers(static_cast<size_t>(rank_.world) * kOffered, 0.0);
  if (!tier_dir_.empty()) {
    const std::vector<MemorySnapshotId> local = CompleteSnapshots();
    for (size_t i = 0; i < local.size(); ++i) offers[rank_.rank * kOffered + i] = Encode(local[i]);
  }
  TY_RETURN_IF_ERROR(sum_(offers));
  // The snapshots every rank holds, newest first.
  std::vector<double> common;
  for (int i = 0; i < kOffered; ++i) {
    const double code = offers[i];
    if (code == 0) continue;
    bool everywhere = true;
    for (int r = 1; everywhere && r < rank_.world; ++r) {
      const auto begin = offers.begin() + r * kOffered;
      everywhere = std::find(begin, begin + kOffered, code) != begin + kOffered;
    }
    if (everywhere) common.push_back(code);
  }
  for (const double code : common) {
    const MemorySnapshotId id = Decode(code);
    if (disk_step && id.step < *disk_step) break;  // a committed checkpoint is newer
    const std::string dir = checkpoint::JoinPath(tier_dir_, MemorySnapshotName(id));
    checkpoint::Manifest manifest;
    // From three nodes up the node lacks some ranks' files: its agent fetches them first.
    const absl::Status gathered =
        tier_ != nullptr ? tier_->Gather(MemorySnapshotName(id))
                         : absl::FailedPreconditionError("this rank runs without the memory tier");
    absl::StatusOr<checkpoint::RankState> loaded =
        gathered.ok() ? LoadMemorySnapshot(dir, &manifest) : gathered;
    double failures[1] = {loaded.ok() ? 0.0 : 1.0};
    TY_RETURN_IF_ERROR(sum_(failures));
    if (failures[0] > 0) {
      TY_LOG(WARNING) << "memory snapshot " << dir << " not loaded ("
                      << (loaded.ok() ? absl::StrCat(failures[0], " rank(s) could not read it")
                                      : std::string(loaded.status().message()))
                      << ")";
      continue;
    }
    TY_RETURN_IF_ERROR(state.params->RestoreState(loaded->params.get(), loaded->first_moment.get(),
                                                  loaded->second_moment.get()));
    state.step = manifest.step();
    state.last_loss = manifest.training().loss();
    resumed_step_ = state.step;
    if (rank_.rank == 0) {
      const checkpoint::v1::WriterMesh& m = manifest.mesh();
      TY_LOG(INFO) << absl::StrFormat(
          "resumed from step %d in the memory tier: %s (written by %s, ZeRO-%d)", state.step, dir,
          WriterMeshText(m), m.zero_stage());
    }
    return dir;
  }
  return std::nullopt;
}

absl::StatusOr<std::optional<std::string>> Checkpointer::Restore(TrainState& state,
                                                                 const std::string& recorded_path,
                                                                 bool* from_memory) {
  if (from_memory != nullptr) *from_memory = false;
  const std::vector<std::string> candidates =
      checkpoint::ResumeCandidates(*fs_, spec_.checkpoint, recorded_path);
  std::optional<int64_t> disk_step;
  bool mixed = false;  // this rank loaded a checkpoint another rank could not
  partial_state_ = false;
  for (const std::string& path : candidates) {
    std::optional<int64_t> step = checkpoint::StepOfPath(path);
    if (step && (!disk_step || *step > *disk_step)) disk_step = step;
  }
  if (spec_.fault_tolerance.memory_tier_enabled()) {
    TY_ASSIGN_OR_RETURN(std::optional<std::string> from, RestoreFromMemory(state, disk_step));
    if (tier_ != nullptr) StartMemoryWriter(state);
    if (from) {
      if (from_memory != nullptr) *from_memory = true;
      if (spec_.checkpoint.enabled()) StartWriter(state);
      return from;
    }
  }
  for (const std::string& path : candidates) {
    bool touched = false;  // this rank's state may have been (partly) replaced by this one
    absl::StatusOr<checkpoint::Manifest> manifest = checkpoint::ReadManifest(*fs_, path);
    absl::Status loaded = manifest.status();
    if (manifest.ok()) {
      if (absl::Status fits = checkpoint::CheckModelMatches(manifest->model(), spec_.model);
          !fits.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint ", path, " does not fit this job: ", fits.message()));
      }
      // Straight into the parameters and moments, one tensor at a time (read into them where
      // they are host memory). A damaged record found part way leaves a mix: `touched`.
      parallel::ShardedParams& params = *state.params;
      TY_RETURN_IF_ERROR(params.BeginRestore());
      loaded = checkpoint::LoadRankStateInto(
          *fs_, path, *manifest, layout_,
          {.wants = [&](int kind, const ParamTensor& t) { return params.WantsState(kind, t); },
           .put =
               [&](int kind, const ParamTensor& t, const float* local) {
                 touched = true;
                 params.RestoreTensor(kind, t, local);
               },
           .target =
               [&](int kind, const ParamTensor& t) {
                 const parallel::ShardedParams::Destination d = params.RestoreTarget(kind, t);
                 touched = touched || d.data != nullptr;
                 return checkpoint::StateSink::Target{.data = d.data, .lo = d.lo, .hi = d.hi};
               }});
    }
    double agreed[1] = {loaded.ok() ? 0.0 : 1.0};
    TY_RETURN_IF_ERROR(sum_(agreed));
    const double failures = agreed[0];
    if (failures > 0) {
      // A rank that loaded while another failed, or failed part way, keeps a mix: the next
      // candidate (or the step-0 state, below) replaces every tensor again.
      TY_LOG(WARNING) << "checkpoint " << path << " not loaded ("
                      << (!loaded.ok() ? std::string(loaded.message())
                                       : absl::StrCat(failures, " rank(s) could not read it"))
                      << "); trying the one before it";
      mixed = mixed || touched;
      continue;
    }
    TY_RETURN_IF_ERROR(state.params->FinishRestore());
    state.step = manifest->step();
    state.last_loss = manifest->training().loss();
    resumed_step_ = state.step;
    if (spec_.checkpoint.enabled()) StartWriter(state);
    if (rank_.rank == 0) {
      const checkpoint::v1::WriterMesh& m = manifest->mesh();
      TY_LOG(INFO) << absl::StrFormat("resumed from step %d: %s (written by %s, ZeRO-%d)",
                                      state.step, path, WriterMeshText(m), m.zero_stage());
    }
    return path;
  }
  if (!candidates.empty() && rank_.rank == 0) {
    TY_LOG(WARNING) << "no intact checkpoint among " << candidates.size()
                    << " found; starting from step 0";
  }
  partial_state_ = mixed;
  if (spec_.checkpoint.enabled()) StartWriter(state);
  return std::nullopt;
}

bool Checkpointer::Due(const TrainState& state, int64_t total_steps) const {
  if (!spec_.checkpoint.enabled()) return false;
  return state.step == total_steps || state.step % spec_.checkpoint.interval_steps() == 0;
}

std::vector<checkpoint::SnapshotRecord> Checkpointer::Records(
    const std::vector<parallel::ShardedParams::SavedRange>& ranges) const {
  std::vector<checkpoint::SnapshotRecord> records;
  for (const char* kind : {"param", "exp_avg", "exp_avg_sq"}) {
    for (const parallel::ShardedParams::SavedRange& range : ranges) {
      const ParamTensor& t = layout_.tensors()[range.tensor];
      const std::vector<Hyperslab> pieces = LocalPieces(t, layout_.tp_rank(), layout_.tp_size());
      for (const PieceRange& p : SplitByPiece(pieces, range.lo, range.hi)) {
        records.push_back({t.name, kind, t.global_shape, pieces[p.piece], p.begin, p.end});
      }
    }
  }
  return records;
}

checkpoint::Manifest Checkpointer::Header(const TrainState& state) const {
  checkpoint::Manifest m;
  m.set_job(spec_.name);
  *m.mutable_model() = checkpoint::SignatureOf(spec_.model);
  checkpoint::v1::TrainingPosition* t = m.mutable_training();
  t->set_step(state.step);
  t->set_samples_consumed(state.samples_consumed());
  t->set_tokens_consumed(state.samples_consumed() * state.seq_len);
  t->set_seed(state.seed);
  t->set_global_batch(state.global_batch);
  t->set_seq_len(state.seq_len);
  t->set_loss(state.last_loss);
  checkpoint::v1::WriterMesh* mesh = m.mutable_mesh();
  const config::ParallelismSpec& p = spec_.parallelism;
  mesh->set_dp(p.dp);
  mesh->set_tp(p.tp);
  mesh->set_pp(p.pp);
  mesh->set_cp(p.cp);
  mesh->set_zero_stage(p.zero);
  mesh->set_sequence_parallel(p.sequence_parallel);
  mesh->set_micro_batch(rank_.micro_batch);
  return m;
}

void Checkpointer::StartMemoryWriter(const TrainState& state) {
  memory_writer_ = std::make_unique<checkpoint::CheckpointWriter>(
      fs_, clock_,
      checkpoint::WriterOptions{
          .dir = tier_dir_,
          .rank = rank_.rank,
          .world = rank_.world,
          .snapshot_floats = SnapshotFloats(state),
          .memory_tier = true,
          .attempt = attempt_,
          .on_committed = [this, reservation = MemoryReservation(state)](
                              int64_t step, const std::string& snapshot,
                              std::vector<std::string> files) -> absl::Status {
            return MemoryCommitted(reservation, step, snapshot, std::move(files));
          }});
}

absl::Status Checkpointer::MemoryCommitted(int64_t reservation, int64_t step,
                                           const std::string& snapshot,
                                           std::vector<std::string> files) {
  const bool copy = step == copy_step_;
  absl::StatusOr<bool> copying = tier_->Committed(step, snapshot, files, copy);
  if (absl::IsFailedPrecondition(copying.status())) {
    // The agent holds no reservation for this rank: it restarted under it (and cleared its
    // tier, which this snapshot's writing made again). The same folder, reserved again, takes
    // this snapshot and the next ones as before.
    absl::StatusOr<std::string> dir = tier_->Reserve(reservation);
    if (dir.ok() && *dir == tier_dir_) {
      copying = tier_->Committed(step, snapshot, files, copy);
    } else if (dir.ok()) {  // the writer cannot follow it there: no more snapshots
      memory_failures_ = kMemoryFailuresTolerated;
      memory_paused_until_ns_ = std::numeric_limits<int64_t>::max();
      copying = absl::FailedPreconditionError(
          absl::StrCat("its node's tier moved from ", tier_dir_, " to ", *dir));
      TY_LOG(WARNING) << "rank " << rank_.rank
                      << " stops its memory snapshots: " << copying.status().message();
    } else {
      copying = Annotate(dir.status(), "reserving the rank's room in the memory tier again");
    }
  }
  if (copy && copying.ok() && !*copying) uncopied_step_ = step;
  if (copy) told_step_ = step;  // after uncopied_step_, which MemoryCopyPending reads
  if (copying.ok()) {
    memory_failures_ = 0;
    memory_pause_ns_ = kMemoryPauseFirstNs;
    return absl::OkStatus();
  }
  // The agent that owns the tier did not take it (it restarted, or is gone): nothing would prune
  // this snapshot, so it goes.
  const std::string dir = checkpoint::JoinPath(tier_dir_, snapshot);
  for (const std::string& file : files) {
    (void)fs_->RemoveFile(checkpoint::JoinPath(dir, file));
  }
  (void)fs_->RemoveDir(dir);  // when no other rank's files are in it
  MemoryFailed(copying.status());
  return copying.status();
}

int64_t Checkpointer::MemoryReservation(const TrainState& state) const {
  return 4 * SnapshotFloats(state) + 65536;
}

void Checkpointer::MemoryFailed(const absl::Status& why) {
  constexpr int64_t kForGood = std::numeric_limits<int64_t>::max();
  if (++memory_failures_ < kMemoryFailuresTolerated || memory_paused_until_ns_ == kForGood) return;
  // A snapshot begun before the pause (the writer's queue) does not lengthen it.
  const int64_t now = clock_->NowNanosMonotonic();
  if (now < memory_paused_until_ns_) return;
  const int64_t pause = memory_pause_ns_;
  memory_paused_until_ns_ = now + pause;
  memory_pause_ns_ = std::min(2 * pause, kMemoryPauseMostNs);
  TY_LOG(WARNING) << "rank " << rank_.rank << " pauses its memory snapshots for " << pause / 1e9
                  << " s: its node's agent did not take " << memory_failures_ << " in a row ("
                  << why.message() << ")";
}

bool Checkpointer::MemoryDue(const TrainState& state, int64_t total_steps, int64_t interval) const {
  return memory_writer_ != nullptr &&
         (memory_failures_ < kMemoryFailuresTolerated ||
          clock_->NowNanosMonotonic() >= memory_paused_until_ns_) &&
         state.step < total_steps && interval > 0 && state.step % interval == 0;
}

absl::Status Checkpointer::SaveToMemory(const TrainState& state, bool copy) {
  if (memory_writer_ == nullptr) return absl::FailedPreconditionError("no memory tier");
  const std::vector<parallel::ShardedParams::SavedRange> ranges = state.params->CheckpointRanges();
  absl::Status saved =
      memory_writer_->Save(state.step, Header(state), Records(ranges), [&](float* host) {
        if (copy) copy_step_ = state.step;  // the previous snapshot's commit has been told
        return state.params->Snapshot(ranges, host);
      });
  for (const checkpoint::SaveOutcome& o : memory_writer_->TakeOutcomes()) {
    // Failures are logged by the writer; a snapshot's cost is its blocking plus its writing.
    if (o.committed) memory_cost_seconds_ = o.blocked_seconds + o.write_seconds;
  }
  return saved;
}

bool Checkpointer::MemoryCopyPending() {
  if (memory_writer_ == nullptr) return false;
  // Only this rank's own copied snapshot makes a copy pending: none since the agent said its
  // last one ended.
  const int64_t copy_step = copy_step_;
  if (copy_step == copy_ended_step_) return false;
  // A snapshot to copy still being written: the agent does not know of it yet.
  if (copy_step > told_step_ && memory_writer_->Busy()) return true;
  // The agent queued no copy of it (the job has no peer node): there is nothing to ask.
  if (copy_step == uncopied_step_) {
    copy_ended_step_ = copy_step;
    return false;
  }
  const absl::StatusOr<bool> pending = tier_->CopyPending();
  // An agent without the call copies every snapshot: it has none pending.
  const bool answered = pending.ok() || absl::IsUnimplemented(pending.status());
  copy_unanswered_ = answered ? 0 : copy_unanswered_ + 1;
  // An agent that does not answer counts as still copying, for a few steps in a row: then it is
  // taken to copy nothing, so that it holds up neither the other nodes' copies for ever nor every
  // step for its deadline.
  if (answered ? pending.value_or(false) : copy_unanswered_ < kMemoryFailuresTolerated) {
    return true;
  }
  copy_ended_step_ = copy_step;
  return false;
}

void Checkpointer::WaitForMemory() {
  if (memory_writer_ != nullptr) (void)memory_writer_->Wait();
}

void Checkpointer::StartWriter(const TrainState& state) {
  const int64_t floats = SnapshotFloats(state);
  writer_ = std::make_unique<checkpoint::CheckpointWriter>(
      fs_, clock_,
      checkpoint::WriterOptions{.dir = spec_.checkpoint.dir,
                                .keep = spec_.checkpoint.keep,
                                .rank = rank_.rank,
                                .world = rank_.world,
                                .save_token = save_token_,
                                .resumed_step = resumed_step_,
                                .snapshot_floats = floats,
                                .may_commit = commit_guard_});
}

absl::Status Checkpointer::Save(const TrainState& state) {
  if (!spec_.checkpoint.enabled()) {
    return absl::FailedPreconditionError("the job has no checkpoint.dir");
  }
  if (writer_ == nullptr) StartWriter(state);
  const std::vector<parallel::ShardedParams::SavedRange> ranges = state.params->CheckpointRanges();
  return writer_->Save(state.step, Header(state), Records(ranges),
                       [&](float* host) { return state.params->Snapshot(ranges, host); });
}

absl::Status Checkpointer::Wait() {
  return writer_ == nullptr ? absl::OkStatus() : writer_->Wait();
}

std::vector<checkpoint::SaveOutcome> Checkpointer::TakeOutcomes() {
  return writer_ == nullptr ? std::vector<checkpoint::SaveOutcome>{} : writer_->TakeOutcomes();
}

}  // namespace trainyard::worker
