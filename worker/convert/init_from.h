// model.init_from: a job's first parameters from published weights instead of the seed's random
// initialisation — a Hugging Face model directory of either family (config.json and
// model.safetensors, or shards with model.safetensors.index.json; F32, BF16 or F16, or
// block-quantized FP8: F8_E4M3 weights beside their weight_scale_inv) or an llm.c
// GPT-2 model file (magic 20240326, version 3 fp32 or 5 bf16, its vocabulary padded).
//
// Opening checks everything that does not need the tensors' values: the config (or llm.c's
// header) against the spec's model, field by field, and every tensor's presence, dtype, shape and
// byte range; no tensor missing and none extra. A checkpoint to resume from takes precedence:
// init_from only decides step 0.
//
// Threading: a WeightSource is used by one thread.
#ifndef TRAINYARD_WORKER_CONVERT_INIT_FROM_H_
#define TRAINYARD_WORKER_CONVERT_INIT_FROM_H_

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "config/model_config.h"
#include "config/spec.h"
#include "worker/convert/hf_format.h"
#include "worker/convert/safetensors.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker::convert {

// Where a Hugging Face tensor lies: its file and entry, and for an FP8 weight of a
// block-quantized checkpoint its scales' (weight_scale_inv, one per block of block[0] rows ×
// block[1] columns, each multiplying its block's decoded values).
struct HfSource {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
  const SafetensorsFile* scale_file = nullptr;
  const TensorInfo* scale = nullptr;
  std::array<int64_t, 2> block = {0, 0};

  // Elements [begin, begin + count) of the tensor, row-major, as fp32 values.
  void Read(int64_t begin, int64_t count, float* out) const;
};

class WeightSource {
 public:
  // INVALID_ARGUMENT with one line naming the file (and tensor) for anything wrong with `path`.
  // With `expected`, the files' model must be it (checked before the tensors): otherwise
  // INVALID_ARGUMENT naming the first field that differs and both values.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<WeightSource>> Open(
      FileSystem& fs, const std::string& path, const config::ModelConfig* expected = nullptr);
  ~WeightSource();

  // The model the files describe (norm epsilon and RoPE base included).
  const config::ModelConfig& model() const { return model_; }
  // "Hugging Face gpt2 (F32, 1 file)", "llm.c GPT-2 (version 3, fp32)".
  const std::string& description() const { return description_; }

  // Our global tensor `name` (a ParameterLayout name) into the first numel elements of `global`
  // (grown when smaller).
  [[nodiscard]] absl::Status Read(const std::string& name, std::vector<float>& global);

  // Every tensor of `layout` (one rank's slice of `model()`), at its offset in `host`.
  [[nodiscard]] absl::Status ReadLayout(const ParameterLayout& layout, float* host);
  // The same handed to `put` one tensor at a time (valid during the call).
  [[nodiscard]] absl::Status ReadEach(
      const ParameterLayout& layout,
      const std::function<void(const ParamTensor& t, const float* local)>& put);

 private:
  WeightSource() = default;
  // Our tensor `name` as it lies in the mapped file when it needs no conversion (fp32, one
  // piece, not transposed or shifted, 4-byte aligned), else nullptr.
  const float* Direct(const std::string& name) const;
  // Elements [begin, begin + count) of our global tensor `name`, row-major, into `out`: only
  // those elements are read (a transposed piece a segment of each of its rows at a time).
  [[nodiscard]] absl::Status ReadRange(const std::string& name, int64_t begin, int64_t count,
                                       float* out) const;
  [[nodiscard]] absl::Status OpenHf(FileSystem& fs, const std::string& dir,
                                    const config::ModelConfig* expected);
  [[nodiscard]] absl::Status OpenLlmc(FileSystem& fs, const std::string& file,
                                      const config::ModelConfig* expected);
  // Pairs each F8_E4M3 tensor X of pieces_ with X_scale_inv (then no tensor of its own), for
  // blocks of `block` (config.json's weight_block_size; {0, 0}: the checkpoint is not
  // block-quantized, and an F8_E4M3 tensor is refused).
  [[nodiscard]] absl::Status AttachFp8Scales(const std::array<int64_t, 2>& block);

  config::ModelConfig model_;
  std::string description_;
  // Hugging Face: the safetensors files, each of our tensors' pieces, and where each piece is.
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, HfTensorMap> maps_;
  std::map<std::string, HfSource> pieces_;
  // llm.c: the mapped file, its dtype, and each of our tensors' first element in it.
  std::unique_ptr<ReadOnlyRegion> llmc_;
  TensorDtype llmc_dtype_ = TensorDtype::kF32;
  std::map<std::string, std::pair<int64_t, int64_t>> llmc_offsets_;  // name -> (offset, numel)
};

// OK when spec.init_from is empty, or names weights whose model is the spec's. Errors start with
// "model.init_from: " and name the field and both values ("model.width is 768 in
// gpt2/config.json, 512 in the spec").
[[nodiscard]] absl::Status CheckInitFrom(FileSystem& fs, const config::JobSpec& spec);

// The spec's init_from weights for one rank's `layout`, handed to `put` one tensor at a time
// (its local values, valid during the call); returns their description(). Nothing is handed over
// unless the files check out.
[[nodiscard]] absl::StatusOr<std::string> LoadInitFrom(
    FileSystem& fs, const config::JobSpec& spec, const ParameterLayout& layout,
    const std::function<void(const ParamTensor& t, const float* local)>& put);

}  // namespace trainyard::worker::convert

#endif  // TRAINYARD_WORKER_CONVERT_INIT_FROM_H_
