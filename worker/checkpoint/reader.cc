#include "worker/checkpoint/reader.h"

#include <omp.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/shape/tensor_slices.h"

namespace trainyard::worker::checkpoint {
namespace {

constexpr const char* kKinds[] = {"param", "exp_avg", "exp_avg_sq"};

// Elements (4 MiB) a direct read moves per pread(2): enough that the system calls cost nothing,
// few enough that the checksum after it reads them back from the cache.
constexpr int64_t kReadChunkFloats = int64_t{1} << 20;
// How far ahead of a direct read the disk is asked to be (MADV_WILLNEED): deep enough to keep a
// cold read streaming while the checksums run.
constexpr int64_t kReadAheadBytes = int64_t{64} << 20;

Hyperslab SlabOf(const TensorRecord& r) {
  return {{r.offsets().begin(), r.offsets().end()}, {r.sizes().begin(), r.sizes().end()}};
}

int64_t NumelOf(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return numel;
}

}  // namespace

// XXH3-64 over bytes handed in pieces: the same value as Checksum over them all at once.
class StreamingChecksum {
 public:
  StreamingChecksum() : state_(XXH3_createState()) {
    if (state_ == nullptr) throw std::bad_alloc();
  }
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;
  ~StreamingChecksum() { XXH3_freeState(state_); }
  void Reset() { XXH3_64bits_reset(state_); }
  void Add(const void* data, size_t bytes) { XXH3_64bits_update(state_, data, bytes); }
  uint64_t Value() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

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
  // Bytes [offset, offset + length) of the shard into `dst`, not through the mapping (pread for
  // a real file). At most kOpenFiles shards stay open for it, so that a checkpoint of thousands
  // of ranks does not run out of descriptors.
  absl::Status ReadAt(int shard, int64_t offset, int64_t length, void* dst) {
    auto open = std::find_if(open_.begin(), open_.end(),
                             [&](const OpenFile& f) { return f.shard == shard; });
    if (open == open_.end()) {
      TY_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                          fs_.OpenRandomAccess(FileName(shard)));
      if (open_.size() == kOpenFiles) open_.erase(open_.begin());  // the oldest
      open = open_.insert(open_.end(), OpenFile{shard, std::move(file)});
    }
    return open->file->ReadAt(static_cast<uint64_t>(offset), static_cast<size_t>(length), dst);
  }
  std::string FileName(int shard) const { return JoinPath(path_, manifest_.shards(shard).file()); }

 private:
  FileSystem& fs_;
  const std::string& path_;
  const Manifest& manifest_;
  std::vector<std::unique_ptr<ReadOnlyRegion>> regions_;
  static constexpr size_t kOpenFiles = 8;
  struct OpenFile {
    int shard;
    std::unique_ptr<RandomAccessFile> file;
  };
  std::vector<OpenFile> open_;  // oldest first
};

namespace {

// Checks that record `ref` of tensor `kind` with `global_shape` fits the tensor and lies in its
// file (from the manifest alone, reading no data); DATA_LOSS naming the file otherwise.
absl::Status CheckRecord(const ShardFiles& files, const CheckpointTensors::RecordRef& ref,
                         const std::vector<int64_t>& global_shape, const std::string& kind) {
  const TensorRecord& r = *ref.record;
  const std::vector<int64_t> shape(r.global_shape().begin(), r.global_shape().end());
  if (shape != global_shape || r.dtype() != "f32" || r.offsets_size() != r.sizes_size() ||
      r.sizes_size() != static_cast<int>(shape.size())) {
    return absl::DataLossError(absl::StrCat(files.FileName(ref.shard), ": record of ", r.name(),
                                            " (", kind, ") does not fit the tensor"));
  }
  const Hyperslab slab = SlabOf(r);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (slab.offsets[d] < 0 || slab.sizes[d] < 1 || slab.offsets[d] + slab.sizes[d] > shape[d]) {
      return absl::DataLossError(absl::StrCat(files.FileName(ref.shard), ": record of ", r.name(),
                                              " lies outside the tensor"));
    }
  }
  const int64_t count = r.flat_end() - r.flat_begin();
  if (r.flat_begin() < 0 || count < 0 || r.flat_end() > slab.numel() || r.byte_offset() < 0 ||
      r.byte_offset() + 4 * count > files.Bytes(ref.shard)) {
    return absl::DataLossError(absl::StrCat(files.FileName(ref.shard), ": record of ", r.name(),
                                            " lies outside the file"));
  }
  return absl::OkStatus();
}

absl::Status CoverageError(int64_t covered, int64_t numel, const std::string& name,
                           const std::string& kind) {
  return absl::DataLossError(absl::StrCat("the checkpoint holds ", covered, " of ", numel,
                                          " elements of ", name, " (", kind, ")"));
}

// Assembles global tensor `name` of `kind` and `global_shape` from its records into `global`
// (grown as needed, not cleared: the records must cover every element, which is checked),
// verifying each; with a null `global`, only verifies. `checksums`: whether to verify the
// records' bytes too (not again when a pass before did).
absl::Status Assemble(ShardFiles& files, const std::vector<CheckpointTensors::RecordRef>& refs,
                      const std::string& name, const std::vector<int64_t>& global_shape,
                      const std::string& kind, std::vector<float>* global, bool checksums) {
  const int64_t numel = NumelOf(global_shape);
  if (global != nullptr && static_cast<int64_t>(global->size()) < numel) global->resize(numel);
  int64_t covered = 0;
  for (const CheckpointTensors::RecordRef& ref : refs) {
    TY_RETURN_IF_ERROR(CheckRecord(files, ref, global_shape, kind));
    const TensorRecord& r = *ref.record;
    const int64_t count = r.flat_end() - r.flat_begin();
    const int64_t bytes = 4 * count;
    TY_ASSIGN_OR_RETURN(const uint8_t* base, files.Data(ref.shard));
    const uint8_t* data = base + r.byte_offset();
    if (checksums || global != nullptr) files.WillRead(ref.shard, r.byte_offset(), bytes);
    if (checksums && Checksum(data, bytes) != r.xxh3()) {
      return absl::DataLossError(absl::StrCat(files.FileName(ref.shard), ": checksum mismatch in ",
                                              r.name(), " (", kind, ")"));
    }
    if (global != nullptr) {
      ForEachRun(global_shape, SlabOf(r), r.flat_begin(), r.flat_end(),
                 [&](int64_t at, int64_t from, int64_t n) {
                   std::memcpy(global->data() + at, data + 4 * (from - r.flat_begin()), 4 * n);
                 });
    }
    covered += count;
  }
  if (covered != numel) return CoverageError(covered, numel, name, kind);
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
    ForEachRun(global_shape, SlabOf(r), r.flat_begin(), r.flat_end(),
               [&](int64_t at, int64_t from, int64_t n) {
                 runs.push_back({at, data + (from - r.flat_begin()), n});
               });
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.at < b.at; });
  const int64_t numel = NumelOf(global_shape);
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

void CheckpointTensors::Prefetch(const std::string& name, const std::string& kind,
                                 int64_t max_bytes, int64_t lo, int64_t hi) {
  auto it = index_.find({kind, name});
  if (it == index_.end()) return;
  for (const RecordRef& ref : it->second) {
    const TensorRecord& r = *ref.record;
    if (!files_->Data(ref.shard).ok() || r.byte_offset() < 0) continue;  // Verify will say why
    if (lo > 0 || hi < std::numeric_limits<int64_t>::max()) {
      // Only a record holding some of [lo, hi) (ReadRange's range); a malformed one is skipped
      // here and refused by the read.
      const std::vector<int64_t> shape(r.global_shape().begin(), r.global_shape().end());
      if (!CheckRecord(*files_, ref, shape, kind).ok()) continue;
      int64_t first = -1, last = -1;
      ForEachRun(shape, SlabOf(r), r.flat_begin(), r.flat_end(),
                 [&](int64_t at, int64_t, int64_t n) {
                   if (first < 0) first = at;
                   last = at + n;
                 });
      if (first < 0 || last <= lo || first >= hi) continue;
    }
    files_->Prefetch(ref.shard, r.byte_offset(),
                     std::min(max_bytes, 4 * (r.flat_end() - r.flat_begin())));
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

absl::StatusOr<bool> CheckpointTensors::ReadRange(const std::string& name, const std::string& kind,
                                                  const std::vector<int64_t>& global_shape,
                                                  int64_t lo, int64_t hi, float* dst) {
  auto it = index_.find({kind, name});
  if (it == index_.end()) {
    return absl::DataLossError(
        absl::StrCat(path_, ": the manifest has no ", name, " (", kind, ")"));
  }
  struct Piece {  // a record that is one run of the tensor, from element `at`
    const RecordRef* ref;
    int64_t at;
  };
  std::vector<Piece> pieces;
  for (const RecordRef& ref : it->second) {
    TY_RETURN_IF_ERROR(CheckRecord(*files_, ref, global_shape, kind));
    const TensorRecord& r = *ref.record;
    if (r.flat_end() == r.flat_begin()) continue;  // holds nothing
    int runs = 0;
    int64_t at = -1;
    ForEachRun(global_shape, SlabOf(r), r.flat_begin(), r.flat_end(),
               [&](int64_t a, int64_t, int64_t) {
                 at = a;
                 ++runs;
               });
    if (runs != 1) return false;  // not one run of the tensor
    pieces.push_back({&ref, at});
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.at < b.at; });
  int64_t covered = 0;  // the records must tile the tensor: no gap, no overlap
  for (const Piece& p : pieces) {
    if (p.at != covered) {
      return absl::DataLossError(absl::StrCat(path_, ": the records of ", name, " (", kind,
                                              ") leave a gap or overlap at element ", covered));
    }
    covered += p.ref->record->flat_end() - p.ref->record->flat_begin();
  }
  const int64_t numel = NumelOf(global_shape);
  if (covered != numel) return CoverageError(covered, numel, name, kind);
  for (const Piece& p : pieces) {
    const TensorRecord& r = *p.ref->record;
    const int64_t count = r.flat_end() - r.flat_begin();
    if (p.at + count <= lo || p.at >= hi) continue;  // none of it is wanted: not read
    TY_RETURN_IF_ERROR(ReadRecord(*p.ref, p.at, lo, hi, dst));
  }
  return true;
}

// Record `ref`, elements [at, at + count) of its tensor, read chunk by chunk and checksummed as
// it goes: what falls in [lo, hi) goes to dst, the rest (read only for the checksum) to scratch.
absl::Status CheckpointTensors::ReadRecord(const RecordRef& ref, int64_t at, int64_t lo, int64_t hi,
                                           float* dst) {
  const TensorRecord& r = *ref.record;
  TY_RETURN_IF_ERROR(files_->Data(ref.shard).status());
  const int64_t count = r.flat_end() - r.flat_begin();
  if (checksum_ == nullptr) checksum_ = std::make_unique<StreamingChecksum>();
  checksum_->Reset();
  for (int64_t x = 0; x < count;) {  // element x of the record is element at + x of the tensor
    const int64_t end = std::min(count, x + kReadChunkFloats);
    // Keep the disk kReadAheadBytes ahead: all of it at the start, a chunk's worth after that.
    const int64_t ahead = x == 0 ? 0 : 4 * (x - kReadChunkFloats) + kReadAheadBytes;
    if (ahead < 4 * count) {
      files_->Prefetch(
          ref.shard, r.byte_offset() + ahead,
          std::min(4 * count - ahead, x == 0 ? kReadAheadBytes : 4 * kReadChunkFloats));
    }
    const int64_t in_lo = std::clamp(lo - at, x, end), in_hi = std::clamp(hi - at, in_lo, end);
    const struct {
      int64_t begin, end;
      bool wanted;
    } parts[] = {{x, in_lo, false}, {in_lo, in_hi, true}, {in_hi, end, false}};
    for (const auto& part : parts) {
      const int64_t n = part.end - part.begin;
      if (n == 0) continue;
      if (!part.wanted && static_cast<int64_t>(scratch_.size()) < n) scratch_.resize(n);
      float* to = part.wanted ? dst + (at + part.begin - lo) : scratch_.data();
      TY_RETURN_IF_ERROR(files_->ReadAt(ref.shard, r.byte_offset() + 4 * part.begin, 4 * n, to));
      checksum_->Add(to, 4 * n);
    }
    x = end;
  }
  if (checksum_->Value() != r.xxh3()) {
    return absl::DataLossError(absl::StrCat(files_->FileName(ref.shard), ": checksum mismatch in ",
                                            r.name(), " (", r.kind(), ")"));
  }
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

namespace {

// A tensor LoadRankStateInto reads.
struct Wanted {
  int kind;
  const ParamTensor* t;
  bool whole;            // the rank holds all of it: its local elements are the global tensor's in
                         // row-major order
  StateSink::Target to;  // data == nullptr: through put
};

// Reads `w` through the sink's put (on the calling thread: put may copy to a device).
absl::Status ReadThroughPut(CheckpointTensors& tensors, const ParameterLayout& layout,
                            const Wanted& w, const StateSink& sink, std::vector<float>& global,
                            std::vector<float>& local) {
  const char* kind = kKinds[w.kind];
  const ParamTensor& t = *w.t;
  TY_RETURN_IF_ERROR(tensors.Verify(t.name, kind, t.global_shape));
  if (w.whole) {
    // From the mapped file when one record is all of it, else assembled.
    TY_ASSIGN_OR_RETURN(const float* values, tensors.WholeRecord(t.name, kind, t.global_shape));
    if (values == nullptr) {
      TY_RETURN_IF_ERROR(tensors.Read(t.name, kind, t.global_shape, global));
      values = global.data();
    }
    sink.put(w.kind, t, values);
    return absl::OkStatus();
  }
  TY_RETURN_IF_ERROR(tensors.Read(t.name, kind, t.global_shape, global));
  if (static_cast<int64_t>(local.size()) < t.numel) local.resize(t.numel);
  layout.Slice(t, global.data(), local.data());
  sink.put(w.kind, t, local.data());
  return absl::OkStatus();
}

// Starts the disk on (the start of) `w` while the tensor before it is read.
void PrefetchWanted(CheckpointTensors& tensors, const Wanted& w) {
  if (w.to.data != nullptr) {
    tensors.Prefetch(w.t->name, kKinds[w.kind], kReadAheadBytes, w.to.lo, w.to.hi);
  } else {
    tensors.Prefetch(w.t->name, kKinds[w.kind]);
  }
}

// Reads the direct-read tensors `direct` (largest first) on the rank's threads, each thread with
// its own reader taking the next unread one; the calling thread first reads `through` (put's),
// then joins them. A direct tensor whose records are not runs of it (ReadRange's false) is left
// in `fell_back` for the calling thread. The first error stops every thread.
absl::Status ReadInParallel(FileSystem& fs, const std::string& path, const Manifest& manifest,
                            const ParameterLayout& layout, const StateSink& sink,
                            const std::vector<Wanted>& direct, const std::vector<Wanted>& through,
                            std::vector<Wanted>& fell_back) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  absl::Status first_error;
  auto fail = [&](absl::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = std::move(status);
    failed = true;
  };
  std::vector<char> direct_fell_back(direct.size(), 0);
  const int threads = static_cast<int>(
      std::clamp<size_t>(omp_get_max_threads(), 1, std::max<size_t>(1, direct.size())));
#pragma omp parallel num_threads(threads)
  {
    try {
      CheckpointTensors tensors(fs, path, manifest);
      if (omp_get_thread_num() == 0) {
        std::vector<float> global, local;
        for (size_t i = 0; i < through.size() && !failed; ++i) {
          if (i + 1 < through.size()) PrefetchWanted(tensors, through[i + 1]);
          if (absl::Status s = ReadThroughPut(tensors, layout, through[i], sink, global, local);
              !s.ok()) {
            fail(std::move(s));
          }
        }
      }
      for (size_t i = next++; i < direct.size() && !failed; i = next++) {
        if (i + 1 < direct.size()) PrefetchWanted(tensors, direct[i + 1]);
        const Wanted& w = direct[i];
        absl::StatusOr<bool> read = tensors.ReadRange(w.t->name, kKinds[w.kind], w.t->global_shape,
                                                      w.to.lo, w.to.hi, w.to.data);
        if (!read.ok()) {
          fail(read.status());
        } else if (!*read) {
          direct_fell_back[i] = 1;
        }
      }
    } catch (const std::bad_alloc&) {
      fail(absl::ResourceExhaustedError(absl::StrCat(path, ": out of memory reading it")));
    }
  }
  for (size_t i = 0; i < direct.size(); ++i) {
    if (direct_fell_back[i]) fell_back.push_back(direct[i]);
  }
  return first_error;
}

}  // namespace

absl::Status LoadRankStateInto(FileSystem& fs, const std::string& path, const Manifest& manifest,
                               const ParameterLayout& layout, const StateSink& sink) {
  std::vector<Wanted> direct, through;
  for (int k = 0; k < 3; ++k) {
    for (const ParamTensor& t : layout.tensors()) {
      if (!sink.wants(k, t)) continue;
      // Read straight into place only a tensor the rank holds whole.
      const bool whole = t.numel == NumelOf(t.global_shape);
      const Wanted w{k, &t, whole, whole && sink.target ? sink.target(k, t) : StateSink::Target{}};
      (w.to.data != nullptr ? direct : through).push_back(w);
    }
  }
  // Largest first, so that the threads end together.
  std::stable_sort(direct.begin(), direct.end(),
                   [](const Wanted& a, const Wanted& b) { return a.t->numel > b.t->numel; });
  std::vector<Wanted> fell_back;
  TY_RETURN_IF_ERROR(ReadInParallel(fs, path, manifest, layout, sink, direct, through, fell_back));
  CheckpointTensors tensors(fs, path, manifest);
  std::vector<float> global, local;
  for (const Wanted& w : fell_back) {
    TY_RETURN_IF_ERROR(ReadThroughPut(tensors, layout, w, sink, global, local));
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
  // The coordinator records a checkpoint when rank 0 reports it, so one committed just before a
  // node died can be newer than the record: the record goes before the directory's checkpoints of
  // its step or older, not before all of them.
  const std::optional<int64_t> recorded_step = StepOfPath(recorded);
  bool recorded_added = recorded.empty();
  if (!spec.dir.empty() && fs.IsDirectory(spec.dir)) {
    for (const std::string& path : CheckpointsAt(fs, spec.dir)) {
      const std::optional<int64_t> step = StepOfPath(path);
      if (!recorded_added && (!recorded_step || !step || *step <= *recorded_step)) {
        add({recorded});
        recorded_added = true;
      }
      add({path});
    }
  }
  if (!recorded_added) add({recorded});
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
