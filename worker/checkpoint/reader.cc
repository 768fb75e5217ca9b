#include "worker/checkpoint/reader.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/shape/tensor_slices.h"

namespace trainyard::worker::checkpoint {
namespace {

constexpr const char* kKinds[] = {"param", "exp_avg", "exp_avg_sq"};

}  // namespace

// Maps shard files on first use and checks their size against the manifest.
class ShardFiles {
 public:
  ShardFiles(FileSystem& fs, const std::string& path, const Manifest& manifest)
      : fs_(fs), path_(path), manifest_(manifest), regions_(manifest.shards_size()) {}

  absl::StatusOr<const uint8_t*> Data(int shard) {
    if (!regions_[shard]) {
      const std::string file = JoinPath(path_, manifest_.shards(shard).file());
      TY_ASSIGN_OR_RETURN(regions_[shard], fs_.MapReadOnly(file));
      if (static_cast<int64_t>(regions_[shard]->size()) != manifest_.shards(shard).bytes()) {
        return absl::DataLossError(absl::StrCat(file, ": ", regions_[shard]->size(),
                                                " bytes, the manifest says ",
                                                manifest_.shards(shard).bytes()));
      }
    }
    return regions_[shard]->data();
  }
  int64_t Bytes(int shard) const { return manifest_.shards(shard).bytes(); }
  // After Data(shard): bytes [offset, offset + length) of the shard are about to be read, or
  // (Prefetch) will be soon.
  void WillRead(int shard, int64_t offset, int64_t length) const {
    regions_[shard]->WillRead(static_cast<size_t>(offset), static_cast<size_t>(length));
  }
  void Prefetch(int shard, int64_t offset, int64_t length) const {
    regions_[shard]->Prefetch(static_cast<size_t>(offset), static_cast<size_t>(length));
  }
  std::string FileName(int shard) const { return JoinPath(path_, manifest_.shards(shard).file()); }

 private:
  FileSystem& fs_;
  const std::string& path_;
  const Manifest& manifest_;
  std::vector<std::unique_ptr<ReadOnlyRegion>> regions_;
};

namespace {

// Assembles global tensor `name` of `kind` and `global_shape` from its records into `global`
// (grown as needed, not cleared: the records must cover every element, which is checked),
// verifying each; with a null `global`, only verifies. `checksums`: whether to verify the
// records' bytes too (not again when a pass before did).
absl::Status Assemble(ShardFiles& files, const std::vector<CheckpointTensors::RecordRef>& refs,
                      const std::string& name, const std::vector<int64_t>& global_shape,
                      const std::string& kind, std::vector<float>* global, bool checksums) {
  int64_t numel = 1;
  for (int64_t d : global_shape) numel *= d;
  if (global != nullptr && static_cast<int64_t>(global->size()) < numel) global->resize(numel);
  int64_t covered = 0;
  for (const CheckpointTensors::RecordRef& ref : refs) {
    const TensorRecord& r = *ref.record;
    const std::vector<int64_t> shape(r.global_shape().begin(), r.global_shape().end());
    if (shape != global_shape || r.dtype() != "f32" || r.offsets_size() != r.sizes_size() ||
        r.sizes_size() != static_cast<int>(shape.size())) {
      return absl::DataLossError(absl::StrCat(files.FileName(ref.shard), ": record of ", r.name(),
                                              " (", kind, ") does not fit the tensor"));
    }
    Hyperslab slab{{r.offsets().begin(), r.offsets().end()}, {r.sizes().begin(), r.sizes().end()}};
    for (size_t d = 0; d < shape.size(); ++d) {
      if (slab.offsets[d] < 0 || slab.sizes[d] < 1 || slab.offsets[d] + slab.sizes[d] > shape[d]) {
        return absl::DataLossError(absl::StrCat(files.FileName(ref.shard), ": record of ", r.name(),
                                                " lies outside the tensor"));
      }
    }
    const int64_t count = r.flat_end() - r.flat_begin();
    const int64_t bytes = 4 * count;
    if (r.flat_begin() < 0 || count < 0 || r.flat_end() > slab.numel() || r.byte_offset() < 0 ||
        r.byte_offset() + bytes > files.Bytes(ref.shard)) {
      return absl::DataLossError(absl::StrCat(files.FileName(ref.shard), ": record of ", r.name(),
                                              " lies outside the file"));
    }
    TY_ASSIGN_OR_RETURN(const uint8_t* base, files.Data(ref.shard));
    const uint8_t* data = base + r.byte_offset();
    if (checksums || global != nullptr) files.WillRead(ref.shard, r.byte_offset(), bytes);
    if (checksums && Checksum(data, bytes) != r.xxh3()) {
      return absl::DataLossError(absl::StrCat(files.FileName(ref.shard), ": checksum mismatch in ",
                                              r.name(), " (", kind, ")"));
    }
    if (global != nullptr) {
      ForEachRun(shape, slab, r.flat_begin(), r.flat_end(),
                 [&](int64_t at, int64_t from, int64_t n) {
                   std::memcpy(global->data() + at, data + 4 * (from - r.flat_begin()), 4 * n);
                 });
    }
    covered += count;
  }
  if (covered != numel) {
    return absl::DataLossError(absl::StrCat("the checkpoint holds ", covered, " of ", numel,
                                            " elements of ", name, " (", kind, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

CheckpointTensors::CheckpointTensors(FileSystem& fs, const std::string& path,
                                     const Manifest& manifest)
    : path_(path), files_(std::make_unique<ShardFiles>(fs, path_, manifest)) {
  for (int s = 0; s < manifest.shards_size(); ++s) {
    for (const TensorRecord& r : manifest.shards(s).records()) {
      index_[{r.kind(), r.name()}].push_back({s, &r});
    }
  }
}

CheckpointTensors::~CheckpointTensors() = default;

absl::Status CheckpointTensors::Read(const std::string& name, const std::string& kind,
                                     const std::vector<int64_t>& global_shape,
                                     std::vector<float>& global) {
  auto it = index_.find({kind, name});
  if (it == index_.end()) {
    return absl::DataLossError(
        absl::StrCat(path_, ": the manifest has no ", name, " (", kind, ")"));
  }
  const bool verified = verified_.count({kind, name}) > 0;
  return Assemble(*files_, it->second, name, global_shape, kind, &global, !verified);
}

absl::StatusOr<std::vector<std::span<const float>>> CheckpointTensors::Runs(
    const std::string& name, const std::string& kind, const std::vector<int64_t>& global_shape) {
  using Spans = std::vector<std::span<const float>>;
  auto it = index_.find({kind, name});
  if (it == index_.end() || verified_.count({kind, name}) == 0) return Spans{};
  struct Run {
    int64_t at;
    const float* data;
    int64_t count;
  };
  std::vector<Run> runs;
  for (const RecordRef& ref : it->second) {  // Verify checked that each lies in its file
    const TensorRecord& r = *ref.record;
    if (r.byte_offset() % 4 != 0) return Spans{};
    TY_ASSIGN_OR_RETURN(const uint8_t* base, files_->Data(ref.shard));
    const float* data = reinterpret_cast<const float*>(base + r.byte_offset());
    const Hyperslab slab{{r.offsets().begin(), r.offsets().end()},
                         {r.sizes().begin(), r.sizes().end()}};
    ForEachRun(global_shape, slab, r.flat_begin(), r.flat_end(),
               [&](int64_t at, int64_t from, int64_t n) {
                 runs.push_back({at, data + (from - r.flat_begin()), n});
               });
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.at < b.at; });
  int64_t numel = 1;
  for (int64_t d : global_shape) numel *= d;
  Spans spans;
  int64_t next = 0;
  for (const Run& run : runs) {
    if (run.at != next) return Spans{};  // a gap or an overlap: not a tiling
    if (!spans.empty() && spans.back().data() + spans.back().size() == run.data) {
      spans.back() = {spans.back().data(), spans.back().size() + run.count};
    } else {
      spans.emplace_back(run.data, run.count);
    }
    next += run.count;
  }
  if (next != numel) return Spans{};
  return spans;
}

void CheckpointTensors::Prefetch(const std::string& name, const std::string& kind) {
  auto it = index_.find({kind, name});
  if (it == index_.end()) return;
  for (const RecordRef& ref : it->second) {
    const TensorRecord& r = *ref.record;
    if (!files_->Data(ref.shard).ok() || r.byte_offset() < 0) continue;  // Verify will say why
    files_->Prefetch(ref.shard, r.byte_offset(), 4 * (r.flat_end() - r.flat_begin()));
  }
}

absl::StatusOr<const float*> CheckpointTensors::WholeRecord(
    const std::string& name, const std::string& kind, const std::vector<int64_t>& global_shape) {
  TY_ASSIGN_OR_RETURN(const std::vector<std::span<const float>> spans,
                      Runs(name, kind, global_shape));
  return spans.size() == 1 ? spans[0].data() : nullptr;
}

absl::Status CheckpointTensors::Verify(const std::string& name, const std::string& kind,
                                       const std::vector<int64_t>& global_shape) {
  auto it = index_.find({kind, name});
  if (it == index_.end()) {
    return absl::DataLossError(
        absl::StrCat(path_, ": the manifest has no ", name, " (", kind, ")"));
  }
  TY_RETURN_IF_ERROR(Assemble(*files_, it->second, name, global_shape, kind, nullptr, true));
  verified_.insert({kind, name});
  return absl::OkStatus();
}

absl::StatusOr<RankState> LoadRankState(FileSystem& fs, const std::string& path,
                                        const Manifest& manifest, const ParameterLayout& layout) {
  CheckpointTensors tensors(fs, path, manifest);
  RankState state;
  std::unique_ptr<float[]>* outputs[] = {&state.params, &state.first_moment, &state.second_moment};
  std::vector<float> global;
  for (int k = 0; k < 3; ++k) {
    // Not zero-filled: every element of every tensor is written below.
    outputs[k]->reset(new float[layout.total()]);
    for (const ParamTensor& t : layout.tensors()) {
      TY_RETURN_IF_ERROR(tensors.Read(t.name, kKinds[k], t.global_shape, global));
      layout.Slice(t, global.data(), outputs[k]->get() + t.offset);
    }
  }
  return state;
}

absl::Status LoadRankStateInto(FileSystem& fs, const std::string& path, const Manifest& manifest,
                               const ParameterLayout& layout, const StateSink& sink) {
  CheckpointTensors tensors(fs, path, manifest);
  // Every record this rank reads is verified before anything is handed over, so that a damaged
  // checkpoint changes nothing and the caller can fall back to another.
  std::vector<std::pair<int, const ParamTensor*>> wanted;
  for (int k = 0; k < 3; ++k) {
    for (const ParamTensor& t : layout.tensors()) {
      if (sink.wants(k, t)) wanted.emplace_back(k, &t);
    }
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (i + 1 < wanted.size())
      tensors.Prefetch(wanted[i + 1].second->name, kKinds[wanted[i + 1].first]);
    const auto [k, t] = wanted[i];
    TY_RETURN_IF_ERROR(tensors.Verify(t->name, kKinds[k], t->global_shape));
  }
  std::vector<float> global, local;
  for (int k = 0; k < 3; ++k) {
    for (const ParamTensor& t : layout.tensors()) {
      if (!sink.wants(k, t)) continue;
      int64_t numel = 1;
      for (int64_t d : t.global_shape) numel *= d;
      if (t.numel == numel) {
        // The rank holds the whole tensor: straight from the mapped file when one record is all
        // of it, else assembled in place.
        TY_ASSIGN_OR_RETURN(const float* whole,
                            tensors.WholeRecord(t.name, kKinds[k], t.global_shape));
        if (whole == nullptr) {
          TY_RETURN_IF_ERROR(tensors.Read(t.name, kKinds[k], t.global_shape, global));
          whole = global.data();
        }
        sink.put(k, t, whole);
        continue;
      }
      TY_RETURN_IF_ERROR(tensors.Read(t.name, kKinds[k], t.global_shape, global));
      if (static_cast<int64_t>(local.size()) < t.numel) local.resize(t.numel);
      layout.Slice(t, global.data(), local.data());
      sink.put(k, t, local.data());
    }
  }
  return absl::OkStatus();
}

namespace {

// A checkpoint directory itself, or the committed checkpoints of a checkpoint root.
std::vector<std::string> CheckpointsAt(FileSystem& fs, const std::string& path) {
  if (fs.Exists(JoinPath(path, kManifestName))) return {path};
  absl::StatusOr<std::vector<std::string>> committed = ListCommitted(fs, path);
  return committed.ok() ? *committed : std::vector<std::string>{};
}

}  // namespace

std::vector<std::string> ResumeCandidates(FileSystem& fs, const config::CheckpointSpec& spec,
                                          const std::string& recorded) {
  std::vector<std::string> out;
  auto add = [&](const std::vector<std::string>& paths) {
    for (const std::string& p : paths) {
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    }
  };
  if (!recorded.empty()) add({recorded});
  if (!spec.dir.empty() && fs.IsDirectory(spec.dir)) add(CheckpointsAt(fs, spec.dir));
  if (!spec.resume_from.empty()) add(CheckpointsAt(fs, spec.resume_from));
  return out;
}

absl::Status CheckResumeFrom(FileSystem& fs, const config::JobSpec& spec) {
  const std::string& from = spec.checkpoint.resume_from;
  if (from.empty()) return absl::OkStatus();
  auto bad = [&](absl::StatusCode code, const std::string& why) {
    return absl::Status(code, absl::StrCat("checkpoint.resume_from: ", why));
  };
  if (!fs.Exists(from))
    return bad(absl::StatusCode::kNotFound, absl::StrCat(from, ": no such file or directory"));
  if (!fs.IsDirectory(from)) {
    return bad(absl::StatusCode::kInvalidArgument, absl::StrCat(from, " is not a directory"));
  }
  absl::StatusOr<std::vector<std::string>> listed = fs.ListDir(from);
  if (!listed.ok()) {
    return bad(absl::StatusCode::kInvalidArgument,
               absl::StrCat("cannot read ", from, " (", listed.status().message(), ")"));
  }
  const std::vector<std::string> candidates = CheckpointsAt(fs, from);
  if (candidates.empty()) {
    return bad(absl::StatusCode::kInvalidArgument,
               absl::StrCat(from, " is not a checkpoint (no ", kManifestName,
                            ") and holds no committed checkpoints"));
  }
  absl::Status last;
  for (const std::string& path : candidates) {
    absl::StatusOr<Manifest> manifest = ReadManifest(fs, path);
    if (!manifest.ok()) {
      last = manifest.status();
      continue;
    }
    if (absl::Status fits = CheckModelMatches(manifest->model(), spec.model); !fits.ok()) {
      return bad(absl::StatusCode::kInvalidArgument, absl::StrCat(path, ": ", fits.message()));
    }
    return absl::OkStatus();
  }
  return bad(absl::StatusCode::kInvalidArgument,
             absl::StrCat("no intact manifest in ", from, " (", last.message(), ")"));
}

}  // namespace trainyard::worker::checkpoint
