// `trainyard export --format hf`: a Trainyard checkpoint of any mesh as a Hugging Face model
// directory (config.json, model.safetensors or shards with model.safetensors.index.json) that
// `transformers` loads as GPT2LMHeadModel or LlamaForCausalLM.
//
// It streams: one global tensor is assembled from the checkpoint's records at a time (each
// verified), converted and appended, so the process holds one tensor, not the model. The
// directory is written under a temporary name and renamed into place at the end: a failed export
// leaves nothing at the destination.
//
// Threading: plain functions.
#ifndef TRAINYARD_WORKER_CONVERT_HF_EXPORT_H_
#define TRAINYARD_WORKER_CONVERT_HF_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "worker/checkpoint/format.h"
#include "worker/convert/safetensors.h"

namespace trainyard::worker::convert {

struct ExportOptions {
  std::string out_dir;  // must not exist, or be an empty directory
  TensorDtype dtype = TensorDtype::kF32;
  int64_t max_shard_bytes = 0;  // 0: one model.safetensors
};

struct ExportResult {
  std::string checkpoint;  // the checkpoint directory exported
  int64_t step = 0;
  int64_t tensor_bytes = 0;  // the tensors' bytes written
  int files = 0;             // safetensors files
  double seconds = 0;
};

// Exports `source`: a checkpoint directory, or a checkpoint root whose newest committed
// checkpoint with an intact manifest is taken. INVALID_ARGUMENT for bad input (no checkpoint, a
// destination that is not empty, a mixture-of-experts model); DATA_LOSS for a damaged
// checkpoint.
[[nodiscard]] absl::StatusOr<ExportResult> ExportHf(FileSystem& fs, const std::string& source,
                                                    const ExportOptions& options);

// The checkpoint `source` names: itself (a directory with a manifest), or a checkpoint root's
// newest committed checkpoint whose manifest is intact; its path and verified manifest.
[[nodiscard]] absl::StatusOr<std::pair<std::string, checkpoint::Manifest>> FindCheckpoint(
    FileSystem& fs, const std::string& source);

// Publishes an export at `out` whole or not at all: `write` fills a staging path beside it
// (`out` + ".exporting", removed first if a failed export left one), which is then renamed to
// `out` and the parent directory synced. On failure the staging path is removed.
[[nodiscard]] absl::Status WriteThenRename(
    FileSystem& fs, const std::string& out,
    const std::function<absl::Status(const std::string& staging)>& write);

// Parses "--max-shard-size"'s value: bytes, or with a KB/MB/GB/KiB/MiB/GiB suffix ("5GB").
[[nodiscard]] absl::StatusOr<int64_t> ParseByteSize(const std::string& text);

}  // namespace trainyard::worker::convert

#endif  // TRAINYARD_WORKER_CONVERT_HF_EXPORT_H_
