// LocalModel: a whole model on one rank whose parameters and gradients live in two flat buffers
// it owns (a LocalParamSource), with the conveniences of a flat parameter vector. What tests,
// calibration and benchmarks drive directly; a training rank runs Model over its own
// ParamSource (worker/parallel/sharded_params.h).
//
// Not thread-safe, like Model.
#ifndef TRAINYARD_WORKER_LOCAL_MODEL_H_
#define TRAINYARD_WORKER_LOCAL_MODEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/model_config.h"
#include "worker/backend.h"
#include "worker/model.h"
#include "worker/param_source.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker {

class LocalModel {
 public:
  // `backend` must outlive the model. INVALID_ARGUMENT on an inconsistent config.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LocalModel>> Create(
      const config::ModelConfig& config, Backend* backend);

  Model& model() { return *model_; }
  const config::ModelConfig& config() const { return model_->config(); }
  const ParameterLayout& layout() const { return layout_; }
  int64_t num_params() const { return layout_.total(); }

  // The flat buffers on the backend, in layout() order.
  float* params() { return source_.params(); }
  float* grads() { return source_.grads(); }
  void InitParameters(uint64_t seed);      // ParameterLayout::Initialize's values
  void LoadParameters(const float* host);  // layout().total() floats
  void ReadParameters(float* host) const;
  void ReadGradients(float* host) const;
  void ZeroGradients();

  // Model's whole-model passes (worker/model.h).
  [[nodiscard]] absl::StatusOr<double> ForwardBackward(const int32_t* inputs,
                                                       const int32_t* targets, int b, int t,
                                                       float grad_scale) {
    return model_->ForwardBackward(inputs, targets, b, t, grad_scale);
  }
  [[nodiscard]] absl::StatusOr<double> Loss(const int32_t* inputs, const int32_t* targets, int b,
                                            int t) {
    return model_->Loss(inputs, targets, b, t);
  }
  [[nodiscard]] absl::Status Logits(const int32_t* inputs, int b, int t, float* host_logits) {
    return model_->Logits(inputs, b, t, host_logits);
  }

 private:
  LocalModel(const config::ModelConfig& config, Backend* backend);

  Backend* backend_;
  ParameterLayout layout_;
  LocalParamSource source_;
  std::unique_ptr<Model> model_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_LOCAL_MODEL_H_
