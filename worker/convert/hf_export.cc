#include "worker/convert/hf_export.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/status.h"
#include "worker/checkpoint/format.h"
#include "worker/checkpoint/reader.h"
#include "worker/convert/hf_format.h"

namespace trainyard::worker::convert {
namespace {

using checkpoint::JoinPath;
using checkpoint::Manifest;

}  // namespace

absl::StatusOr<std::pair<std::string, Manifest>> FindCheckpoint(FileSystem& fs,
                                                                const std::string& source) {
  if (!fs.Exists(source)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no such file or directory"));
  }
  if (fs.Exists(JoinPath(source, checkpoint::kManifestName))) {
    TY_ASSIGN_OR_RETURN(Manifest manifest, checkpoint::ReadManifest(fs, source));
    return std::pair{source, std::move(manifest)};
  }
  absl::StatusOr<std::vector<std::string>> committed = checkpoint::ListCommitted(fs, source);
  if (!committed.ok() || committed->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " is not a checkpoint (no manifest.json) and holds no committed checkpoints"));
  }
  absl::Status last;
  for (const std::string& path : *committed) {
    absl::StatusOr<Manifest> manifest = checkpoint::ReadManifest(fs, path);
    if (manifest.ok()) return std::pair{path, *std::move(manifest)};
    last = manifest.status();
  }
  return absl::DataLossError(
      absl::StrCat("no intact manifest in ", source, " (", last.message(), ")"));
}

namespace {

// The output files: one model.safetensors, or consecutive groups of tensors of at most
// max_shard_bytes each (a tensor larger than that alone in its file), `dtype` each but the
// selection bias.
std::vector<std::vector<TensorInfo>> PlanFiles(const std::vector<HfTensorMap>& tensors,
                                               TensorDtype dtype, int64_t max_shard_bytes) {
  std::vector<std::vector<TensorInfo>> files(1);
  int64_t bytes = 0;
  for (const HfTensorMap& t : tensors) {
    // The routers' selection bias stays F32 whatever the dtype, as transformers keeps GLM-4.5's
    // e_score_correction_bias: it only picks experts, and rounded it would pick others.
    const TensorDtype kind = absl::EndsWith(t.name, ".moe.router.bias") ? TensorDtype::kF32 : dtype;
    for (const HfPiece& piece : t.pieces) {
      TensorInfo info{piece.name, kind, HfShape(t, piece)};
      if (max_shard_bytes > 0 && bytes > 0 && bytes + info.bytes() > max_shard_bytes) {
        files.emplace_back();
        bytes = 0;
      }
      bytes += info.bytes();
      files.back().push_back(std::move(info));
    }
  }
  return files;
}

std::string FileName(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
}

std::string IndexJson(const std::vector<std::vector<TensorInfo>>& files, int64_t total) {
  std::string json =
      absl::StrCat("{\n  \"metadata\": {\"total_size\": ", total, "},\n  \"weight_map\": {");
  bool first = true;
  for (size_t f = 0; f < files.size(); ++f) {
    for (const TensorInfo& t : files[f]) {
      absl::StrAppend(&json, first ? "\n" : ",\n", "    ", JsonString(t.name), ": ",
                      JsonString(FileName(f, files.size())));
      first = false;
    }
  }
  return json + "\n  }\n}\n";
}

absl::Status CheckDestination(FileSystem& fs, const std::string& out) {
  if (out.empty()) return absl::InvalidArgumentError("--out DIR is required");
  if (!fs.Exists(out)) return absl::OkStatus();
  if (!fs.IsDirectory(out)) return absl::InvalidArgumentError(absl::StrCat(out, " is a file"));
  TY_ASSIGN_OR_RETURN(std::vector<std::string> entries, fs.ListDir(out));
  if (!entries.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(out,
                                                   " is not empty (an export writes a new "
                                                   "directory)"));
  }
  return absl::OkStatus();
}

// Elements [begin, begin + count) of the concatenation of `spans`.
std::vector<std::span<const float>> SliceOfSpans(const std::vector<std::span<const float>>& spans,
                                                 int64_t begin, int64_t count) {
  std::vector<std::span<const float>> out;
  int64_t at = 0;  // where the span in hand starts
  for (std::span<const float> s : spans) {
    const int64_t size = static_cast<int64_t>(s.size());
    const int64_t lo = std::max(begin, at), hi = std::min(begin + count, at + size);
    if (hi > lo) out.push_back(s.subspan(lo - at, hi - lo));
    at += size;
  }
  return out;
}

// Streams every tensor of the checkpoint through the safetensors writers into `dir`.
absl::Status WriteTensors(FileSystem& fs, const std::string& dir, const std::string& checkpoint,
                          const Manifest& manifest, const std::vector<HfTensorMap>& tensors,
                          const std::vector<std::vector<TensorInfo>>& files) {
  checkpoint::CheckpointTensors reader(fs, checkpoint, manifest);
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"trainyard.job", manifest.job()},
      {"trainyard.step", absl::StrCat(manifest.step())}};
  size_t file = 0;
  TY_ASSIGN_OR_RETURN(
      std::unique_ptr<SafetensorsWriter> writer,
      SafetensorsWriter::Create(fs, JoinPath(dir, FileName(0, files.size())), files[0], metadata));
  size_t in_file = 0;
  std::vector<float> global, converted;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const HfTensorMap& t = tensors[i];
    // The next tensor comes off the disk while this one is checked, converted and written.
    if (i + 1 < tensors.size()) reader.Prefetch(tensors[i + 1].name, "param");
    // Straight from the mapped shard files, whichever ranks' records hold the tensor; only the
    // transposed or interleaved pieces (GPT-2's Conv1D weights, GLM's q and k), shifted tensors
    // (Gemma's norms), and a tensor whose records do not tile it in order, pass through a buffer.
    TY_RETURN_IF_ERROR(reader.Verify(t.name, "param", t.shape));
    TY_ASSIGN_OR_RETURN(std::vector<std::span<const float>> runs,
                        reader.Runs(t.name, "param", t.shape));
    const bool converts =
        t.shift != 0.0f ||
        std::any_of(t.pieces.begin(), t.pieces.end(), [](const HfPiece& p) { return Reorders(p); });
    const float* whole = runs.size() == 1 ? runs[0].data() : nullptr;
    if (whole == nullptr && (runs.empty() || converts)) {
      TY_RETURN_IF_ERROR(reader.Read(t.name, "param", t.shape, global));
      whole = global.data();
    }
    const int64_t cols = RowElements(t);
    for (const HfPiece& piece : t.pieces) {
      if (in_file == files[file].size()) {
        TY_RETURN_IF_ERROR(writer->Finish());
        ++file;
        in_file = 0;
        TY_ASSIGN_OR_RETURN(
            writer, SafetensorsWriter::Create(fs, JoinPath(dir, FileName(file, files.size())),
                                              files[file], metadata));
      }
      if (Reorders(piece) || t.shift != 0.0f) {
        converted.resize(files[file][in_file].numel());
        ToHf(t, piece, whole, converted.data());
        TY_RETURN_IF_ERROR(writer->Write(piece.name, converted.data()));
      } else if (whole != nullptr) {
        TY_RETURN_IF_ERROR(writer->Write(piece.name, whole + piece.row_begin * cols));
      } else {
        const std::vector<std::span<const float>> parts =
            SliceOfSpans(runs, piece.row_begin * cols, piece.rows * cols);
        TY_RETURN_IF_ERROR(writer->Write(piece.name, parts));
      }
      ++in_file;
    }
  }
  return writer->Finish();
}

}  // namespace

absl::StatusOr<ExportResult> ExportHf(FileSystem& fs, const std::string& source,
                                      const ExportOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  TY_RETURN_IF_ERROR(CheckDestination(fs, options.out_dir));
  TY_ASSIGN_OR_RETURN(auto found, FindCheckpoint(fs, source));
  const auto& [checkpoint, manifest] = found;
  absl::StatusOr<config::ModelConfig> model = checkpoint::ModelFromSignature(manifest.model());
  const absl::Status writable = model.ok() ? CheckHfWritable(*model) : model.status();
  absl::StatusOr<std::vector<HfTensorMap>> tensors =
      writable.ok() ? HfTensors(*model, HfExportLayout(*model))
                    : absl::StatusOr<std::vector<HfTensorMap>>(writable);
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(checkpoint, ": ", tensors.status().message()));
  }
  const std::vector<std::vector<TensorInfo>> files =
      PlanFiles(*tensors, options.dtype, options.max_shard_bytes);
  int64_t total = 0;
  for (const auto& f : files) {
    for (const TensorInfo& t : f) total += t.bytes();
  }
  TY_RETURN_IF_ERROR(WriteThenRename(fs, options.out_dir, [&](const std::string& staging) {
    TY_RETURN_IF_ERROR(fs.CreateDirs(staging));
    TY_RETURN_IF_ERROR(WriteTensors(fs, staging, checkpoint, manifest, *tensors, files));
    if (files.size() > 1) {
      TY_RETURN_IF_ERROR(fs.WriteFileAtomic(JoinPath(staging, "model.safetensors.index.json"),
                                            IndexJson(files, total)));
    }
    TY_RETURN_IF_ERROR(
        fs.WriteFileAtomic(JoinPath(staging, "config.json"), HfConfigJson(*model, options.dtype)));
    return fs.SyncDir(staging);
  }));
  ExportResult result;
  result.checkpoint = checkpoint;
  result.step = manifest.step();
  result.tensor_bytes = total;
  result.files = static_cast<int>(files.size());
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

absl::Status WriteThenRename(FileSystem& fs, const std::string& out,
                             const std::function<absl::Status(const std::string&)>& write) {
  const std::string staging = absl::StrCat(out, ".exporting");
  if (fs.Exists(staging)) TY_RETURN_IF_ERROR(RemoveRecursively(fs, staging));
  absl::Status written = write(staging);
  // An empty directory at `out` is allowed (the caller checked it is empty); rename needs it gone.
  if (written.ok() && fs.IsDirectory(out)) written = fs.RemoveDir(out);
  if (written.ok()) written = fs.RenameFile(staging, out);
  if (written.ok()) written = fs.SyncDir(Dirname(out));
  if (!written.ok() && fs.Exists(staging)) (void)RemoveRecursively(fs, staging);
  return written;
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  std::string number = absl::AsciiStrToUpper(text);
  int64_t unit = 1;
  const std::pair<const char*, int64_t> suffixes[] = {{"KIB", int64_t{1} << 10},
                                                      {"MIB", int64_t{1} << 20},
                                                      {"GIB", int64_t{1} << 30},
                                                      {"KB", 1000},
                                                      {"MB", 1000 * 1000},
                                                      {"GB", 1000 * 1000 * 1000},
                                                      {"B", 1}};
  for (const auto& [suffix, bytes] : suffixes) {
    if (absl::EndsWith(number, suffix)) {
      number.resize(number.size() - std::string(suffix).size());
      unit = bytes;
      break;
    }
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(number, &value) || value < 1 || value > (int64_t{1} << 50) / unit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a size must be a positive number of bytes (\"500MB\", \"2GiB\"), got '", text, "'"));
  }
  return value * unit;
}

}  // namespace trainyard::worker::convert
