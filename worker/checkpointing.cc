#include "worker/checkpointing.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/checkpoint/reader.h"
#include "worker/checkpoint/tensor_slices.h"

namespace trainyard::worker {

Checkpointer::Checkpointer(FileSystem* fs, Clock* clock, const config::JobSpec& spec,
                           const ParameterLayout& layout, CheckpointRank rank,
                           std::string save_token,
                           std::function<absl::StatusOr<double>(double)> agree)
    : fs_(fs),
      clock_(clock),
      spec_(spec),
      layout_(layout),
      rank_(rank),
      save_token_(std::move(save_token)),
      agree_(std::move(agree)) {}

absl::StatusOr<std::optional<std::string>> Checkpointer::Restore(TrainState& state,
                                                                 const std::string& recorded_path) {
  const std::vector<std::string> candidates =
      checkpoint::ResumeCandidates(*fs_, spec_.checkpoint, recorded_path);
  for (const std::string& path : candidates) {
    absl::StatusOr<checkpoint::Manifest> manifest = checkpoint::ReadManifest(*fs_, path);
    absl::StatusOr<checkpoint::RankState> loaded =
        manifest.ok() ? absl::InternalError("not loaded") : manifest.status();
    if (manifest.ok()) {
      if (absl::Status fits = checkpoint::CheckModelMatches(manifest->model(), spec_.model);
          !fits.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint ", path, " does not fit this job: ", fits.message()));
      }
      loaded = checkpoint::LoadRankState(*fs_, path, *manifest, layout_);
    }
    TY_ASSIGN_OR_RETURN(const double failures, agree_(loaded.ok() ? 0.0 : 1.0));
    if (failures > 0) {
      TY_LOG(WARNING) << "checkpoint " << path << " not loaded ("
                      << (loaded.ok() ? absl::StrCat(failures, " rank(s) could not read it")
                                      : std::string(loaded.status().message()))
                      << "); trying the one before it";
      continue;
    }
    TY_RETURN_IF_ERROR(state.params->RestoreState(loaded->params.get(), loaded->first_moment.get(),
                                                  loaded->second_moment.get()));
    state.step = manifest->step();
    state.last_loss = manifest->training().loss();
    resumed_step_ = state.step;
    if (spec_.checkpoint.enabled()) StartWriter(state);
    if (rank_.rank == 0) {
      const checkpoint::v1::WriterMesh& m = manifest->mesh();
      TY_LOG(INFO) << absl::StrFormat(
          "resumed from step %d: %s (written by dp %d x tp %d x pp %d, ZeRO-%d)", state.step, path,
          m.dp(), m.tp(), m.pp(), m.zero_stage());
    }
    return path;
  }
  if (!candidates.empty() && rank_.rank == 0) {
    TY_LOG(WARNING) << "no intact checkpoint among " << candidates.size()
                    << " found; starting from step 0";
  }
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
      const std::vector<checkpoint::Hyperslab> pieces =
          checkpoint::LocalPieces(t, layout_.tp_rank(), layout_.tp_size());
      for (const checkpoint::PieceRange& p : checkpoint::SplitByPiece(pieces, range.lo, range.hi)) {
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
  mesh->set_zero_stage(p.zero);
  mesh->set_sequence_parallel(p.sequence_parallel);
  mesh->set_micro_batch(rank_.micro_batch);
  return m;
}

void Checkpointer::StartWriter(const TrainState& state) {
  int64_t floats = 0;
  for (const auto& range : state.params->CheckpointRanges()) floats += 3 * (range.hi - range.lo);
  writer_ = std::make_unique<checkpoint::CheckpointWriter>(
      fs_, clock_,
      checkpoint::WriterOptions{.dir = spec_.checkpoint.dir,
                                .keep = spec_.checkpoint.keep,
                                .rank = rank_.rank,
                                .world = rank_.world,
                                .save_token = save_token_,
                                .resumed_step = resumed_step_,
                                .snapshot_floats = floats});
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
