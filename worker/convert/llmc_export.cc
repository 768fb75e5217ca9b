#include "worker/convert/llmc_export.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status.h"
#include "worker/checkpoint/format.h"
#include "worker/checkpoint/reader.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker::convert {
namespace {

constexpr int32_t kMagic = 20240326;
constexpr int kHeaderInts = 256;
constexpr int64_t kVocabMultiple = 128;

// The per-layer tensors in llm.c's order (each kind for all layers together).
constexpr const char* kLayerTensors[] = {"ln1.w",       "ln1.b",       "attn.qkv.w", "attn.qkv.b",
                                         "attn.proj.w", "attn.proj.b", "ln2.w",      "ln2.b",
                                         "mlp.fc.w",    "mlp.fc.b",    "mlp.proj.w", "mlp.proj.b"};

absl::Status CheckLlmcModel(const config::ModelConfig& m) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "; llm.c's model file holds a GPT-2 with tied embeddings, an MLP of ",
                     "4 × width and no experts"));
  };
  if (m.family != config::ModelFamily::kGpt2) {
    return bad(absl::StrCat("model.family is ", config::FamilyName(m.family)));
  }
  if (m.moe.enabled()) return bad("model.moe: a mixture-of-experts model");
  if (!m.tied_embeddings) return bad("model.tied_embeddings is false");
  if (m.ffn_hidden != 4 * m.width) {
    return bad(
        absl::StrCat("model.ffn_hidden is ", m.ffn_hidden, ", not 4 × width (", 4 * m.width, ")"));
  }
  return absl::OkStatus();
}

// Appends tensors to the file in the export's dtype.
class LlmcWriter {
 public:
  LlmcWriter(std::unique_ptr<WritableFile> file, TensorDtype dtype)
      : file_(std::move(file)), dtype_(dtype) {}

  absl::Status Append(const float* values, int64_t count) {
    if (dtype_ == TensorDtype::kF32) {
      bytes_ += 4 * count;
      return file_->Append({reinterpret_cast<const char*>(values), static_cast<size_t>(4 * count)});
    }
    bits_.resize(count);
    for (int64_t i = 0; i < count; ++i) bits_[i] = FloatToBf16Bits(values[i]);
    bytes_ += 2 * count;
    return file_->Append(
        {reinterpret_cast<const char*>(bits_.data()), static_cast<size_t>(2 * count)});
  }
  absl::Status AppendRaw(const void* data, size_t bytes) {
    return file_->Append({static_cast<const char*>(data), bytes});
  }
  absl::Status Finish() {
    TY_RETURN_IF_ERROR(file_->Sync());
    return file_->Close();
  }
  int64_t tensor_bytes() const { return bytes_; }

 private:
  std::unique_ptr<WritableFile> file_;
  TensorDtype dtype_;
  std::vector<uint16_t> bits_;
  int64_t bytes_ = 0;
};

absl::Status WriteLlmc(FileSystem& fs, const std::string& path, const std::string& checkpoint,
                       const checkpoint::Manifest& manifest, const config::ModelConfig& m,
                       TensorDtype dtype, int64_t* tensor_bytes) {
  const int64_t c = m.width, vocab = m.vocab;
  const int64_t padded = (vocab + kVocabMultiple - 1) / kVocabMultiple * kVocabMultiple;
  std::vector<int32_t> header(kHeaderInts, 0);
  const int32_t fields[] = {
      kMagic,  dtype == TensorDtype::kF32 ? 3 : 5, m.max_seq, m.vocab, m.layers, m.heads,
      m.width, static_cast<int32_t>(padded)};
  std::copy(std::begin(fields), std::end(fields), header.begin());
  TY_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs.NewWritableFile(path));
  LlmcWriter out(std::move(file), dtype);
  TY_RETURN_IF_ERROR(out.AppendRaw(header.data(), 4 * header.size()));
  const ParameterLayout layout(m);
  checkpoint::CheckpointTensors reader(fs, checkpoint, manifest);
  std::vector<float> values;
  auto append = [&](const std::string& name) -> absl::Status {
    const ParamTensor* t = layout.Find(name);
    if (t == nullptr) return absl::InternalError(absl::StrCat("no tensor ", name));
    TY_RETURN_IF_ERROR(reader.Read(name, "param", t->global_shape, values));
    return out.Append(values.data(), t->numel);
  };
  TY_RETURN_IF_ERROR(append("wte"));
  const std::vector<float> padding((padded - vocab) * c, 0.0f);
  TY_RETURN_IF_ERROR(out.Append(padding.data(), static_cast<int64_t>(padding.size())));
  TY_RETURN_IF_ERROR(append("wpe"));
  for (const char* kind : kLayerTensors) {
    for (int l = 0; l < m.layers; ++l) TY_RETURN_IF_ERROR(append(absl::StrCat("h.", l, ".", kind)));
  }
  TY_RETURN_IF_ERROR(append("lnf.w"));
  TY_RETURN_IF_ERROR(append("lnf.b"));
  *tensor_bytes = out.tensor_bytes();
  return out.Finish();
}

}  // namespace

absl::StatusOr<ExportResult> ExportLlmc(FileSystem& fs, const std::string& source,
                                        const ExportOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const std::string& out = options.out_dir;
  if (out.empty()) return absl::InvalidArgumentError("--out FILE is required");
  if (options.max_shard_bytes > 0) {
    return absl::InvalidArgumentError("--max-shard-size is not used with --format llmc");
  }
  if (fs.Exists(out)) {
    return absl::InvalidArgumentError(
        absl::StrCat(out, " exists (an llm.c export writes a new file)"));
  }
  TY_ASSIGN_OR_RETURN(auto found, FindCheckpoint(fs, source));
  const auto& [checkpoint, manifest] = found;
  absl::StatusOr<config::ModelConfig> model = checkpoint::ModelFromSignature(manifest.model());
  absl::Status usable = model.ok() ? CheckLlmcModel(*model) : model.status();
  if (!usable.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(checkpoint, ": ", usable.message()));
  }
  ExportResult result;
  TY_RETURN_IF_ERROR(WriteThenRename(fs, out, [&](const std::string& staging) {
    return WriteLlmc(fs, staging, checkpoint, manifest, *model, options.dtype,
                     &result.tensor_bytes);
  }));
  result.checkpoint = checkpoint;
  result.step = manifest.step();
  result.files = 1;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace trainyard::worker::convert
