// The checkpoint format (checkpoint.proto) and the rules that read it: directory and file names,
// the manifest's own checksum, which directories are committed checkpoints, and whether a
// checkpoint fits a model.
//
// Commit protocol (CheckpointWriter): every rank writes and syncs its shard file, then hands rank
// 0 its index; rank 0 writes the manifest to a temporary name, syncs it, renames it to
// `manifest.json` and syncs the directory. A directory without a manifest is torn: it is never
// loaded, and the next save removes it.
//
// Threading: plain functions over a FileSystem (which is thread-safe).
#ifndef TRAINYARD_WORKER_CHECKPOINT_FORMAT_H_
#define TRAINYARD_WORKER_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "config/model_config.h"
#include "worker/checkpoint/checkpoint.pb.h"

namespace trainyard::worker::checkpoint {

using v1::LatentSignature;
using v1::Manifest;
using v1::ModelSignature;
using v1::MoeSignature;
using v1::RopeScalingSignature;
using v1::ShardFile;
using v1::TensorRecord;

inline constexpr char kManifestName[] = "manifest.json";
inline constexpr int kFormatVersion = 1;

// "step-00000100-<token>": one directory per save. The token makes every save's directory new,
// so a save never writes into files a crashed earlier save left behind.
std::string CheckpointDirName(int64_t step, const std::string& save_token);
// The step of a checkpoint directory's name; nullopt for other names.
std::optional<int64_t> StepOfDirName(const std::string& name);
// The step of a checkpoint directory's path (its last component); nullopt for other paths.
std::optional<int64_t> StepOfPath(const std::string& path);
// The save token of a checkpoint directory's name; "" for other names.
std::string TokenOfDirName(const std::string& name);
std::string ShardFileName(int rank, int world);  // "shard-00001-of-00004.bin"
std::string ShardIndexName(int rank);            // "shard-00001.idx"

uint64_t Checksum(const void* data, size_t size);  // XXH3-64

ModelSignature SignatureOf(const config::ModelConfig& model);
// The model a checkpoint's signature describes (what an export writes): its shapes, its norm
// epsilon, RoPE base and scaling (the defaults when the checkpoint predates them), and an MoE
// model's routing (top_k, score, normalize_top_k). INVALID_ARGUMENT for an unknown family,
// inconsistent sizes, or an MoE checkpoint written before the routing was recorded
// (MoeSignature.top_k 0).
[[nodiscard]] absl::StatusOr<config::ModelConfig> ModelFromSignature(const ModelSignature& s);
// OK when a checkpoint of `saved` loads into `model`; otherwise INVALID_ARGUMENT naming the first
// field that differs ("model.width is 128 in the checkpoint, 256 in the spec", "model.moe.experts
// is 0 in the checkpoint, 8 in the spec" for a dense checkpoint and an MoE model).
[[nodiscard]] absl::Status CheckModelMatches(const ModelSignature& saved,
                                             const config::ModelConfig& model);

// The manifest's JSON with its checksum filled in.
std::string SerializeManifest(Manifest manifest);
// Reads and verifies `checkpoint_dir`/manifest.json. NOT_FOUND without one (a torn or foreign
// directory); DATA_LOSS when it does not parse or its checksum does not match.
[[nodiscard]] absl::StatusOr<Manifest> ReadManifest(FileSystem& fs,
                                                    const std::string& checkpoint_dir);
// The same for a manifest file of any name (a memory tier snapshot's per-rank manifests).
[[nodiscard]] absl::StatusOr<Manifest> ReadManifestFile(FileSystem& fs, const std::string& path);

// The checkpoint directories under `dir` that have a manifest file, newest step first (ties: the
// later name first). Manifests are not verified here. NOT_FOUND when `dir` does not exist.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ListCommitted(FileSystem& fs,
                                                                     const std::string& dir);

// The file at `path` and its parents joined.
std::string JoinPath(const std::string& dir, const std::string& name);

}  // namespace trainyard::worker::checkpoint

#endif  // TRAINYARD_WORKER_CHECKPOINT_FORMAT_H_
