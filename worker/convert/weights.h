// A whole model's weights for one process (`trainyard sample`), from wherever they are: a
// checkpoint of any mesh, a Hugging Face directory or an llm.c model file.
//
// Threading: plain functions.
#ifndef TRAINYARD_WORKER_CONVERT_WEIGHTS_H_
#define TRAINYARD_WORKER_CONVERT_WEIGHTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "config/model_config.h"

namespace trainyard::worker::convert {

// A whole model's weights, from any of: a checkpoint directory, a checkpoint root (its newest
// committed checkpoint), a Hugging Face model directory or an llm.c model file.
struct LoadedWeights {
  config::ModelConfig model;
  std::vector<float> params;  // ParameterLayout(model) order
  std::string description;
  // A Hugging Face directory's end-of-sequence ids (generation_config.json's eos_token_id, or
  // without that file config.json's, as transformers' generate reads them); empty otherwise.
  std::vector<int32_t> eos_ids;
};
[[nodiscard]] absl::StatusOr<LoadedWeights> LoadModelWeights(FileSystem& fs,
                                                             const std::string& path);

}  // namespace trainyard::worker::convert

#endif  // TRAINYARD_WORKER_CONVERT_WEIGHTS_H_
