#include "worker/convert/weights.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/checkpoint/format.h"
#include "worker/checkpoint/reader.h"
#include "worker/convert/hf_export.h"
#include "worker/convert/hf_format.h"
#include "worker/convert/init_from.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker::convert {

absl::StatusOr<LoadedWeights> LoadModelWeights(FileSystem& fs, const std::string& path) {
  LoadedWeights out;
  const bool checkpoint =
      fs.IsDirectory(path) && !fs.Exists(checkpoint::JoinPath(path, "config.json")) &&
      (fs.Exists(checkpoint::JoinPath(path, checkpoint::kManifestName)) ||
       !checkpoint::ListCommitted(fs, path).value_or(std::vector<std::string>{}).empty());
  if (!checkpoint) {
    TY_ASSIGN_OR_RETURN(std::unique_ptr<WeightSource> source, WeightSource::Open(fs, path));
    out.model = source->model();
    const ParameterLayout layout(out.model);
    out.params.resize(layout.total());
    TY_RETURN_IF_ERROR(source->ReadLayout(layout, out.params.data()));
    out.description = absl::StrCat(path, ": ", source->description());
    if (fs.IsDirectory(path)) {
      std::string config = checkpoint::JoinPath(path, "generation_config.json");
      if (!fs.Exists(config)) config = checkpoint::JoinPath(path, "config.json");
      TY_ASSIGN_OR_RETURN(const std::string text, fs.ReadFile(config));
      TY_ASSIGN_OR_RETURN(out.eos_ids, EndOfSequenceIds(text, config, out.model.vocab));
    }
    return out;
  }
  TY_ASSIGN_OR_RETURN(auto found, FindCheckpoint(fs, path));
  const auto& [dir, manifest] = found;
  absl::StatusOr<config::ModelConfig> model = checkpoint::ModelFromSignature(manifest.model());
  if (!model.ok()) {
    return absl::Status(model.status().code(), absl::StrCat(dir, ": ", model.status().message()));
  }
  out.model = *std::move(model);
  const ParameterLayout layout(out.model);
  out.params.resize(layout.total());
  checkpoint::CheckpointTensors tensors(fs, dir, manifest);
  std::vector<float> global;
  for (const ParamTensor& t : layout.tensors()) {
    TY_RETURN_IF_ERROR(tensors.Read(t.name, "param", t.global_shape, global));
    layout.Slice(t, global.data(), out.params.data() + t.offset);
  }
  out.description = absl::StrCat(dir, ": step ", manifest.step(), " of job ", manifest.job());
  return out;
}

}  // namespace trainyard::worker::convert
