// The decoder-only transformer with an explicit forward and backward per layer (no autograd).
//
// One Model owns its parameters and gradients (flat buffers in ParameterLayout order) and the
// activation memory for the micro-batch shape it last ran. Not thread-safe: one training loop
// drives it; its Backend may parallelise inside each operation.
#ifndef TRAINYARD_WORKER_MODEL_H_
#define TRAINYARD_WORKER_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/model_config.h"
#include "worker/backend.h"
#include "worker/buffer.h"
#include "worker/parameters.h"

namespace trainyard::worker {

class Model {
 public:
  // `backend` must outlive the model. Fails with INVALID_ARGUMENT on an inconsistent config.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const config::ModelConfig& config,
                                                       Backend* backend);
  ~Model();

  const config::ModelConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  int64_t num_params() const { return layout_.total(); }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }

  void InitParameters(uint64_t seed);
  void LoadParameters(const float* host);  // layout().total() floats
  void ReadParameters(float* host) const;
  void ReadGradients(float* host) const;
  void ZeroGradients();

  // One micro-batch of `b` sequences of `t` tokens (inputs and targets are host arrays of b·t
  // tokens). Accumulates the gradient of grad_scale · Σ cross-entropy into grads() and returns
  // Σ cross-entropy over the b·t positions. INVALID_ARGUMENT for t > max_seq or a token outside
  // the vocabulary.
  absl::StatusOr<double> ForwardBackward(const int32_t* inputs, const int32_t* targets, int b,
                                         int t, float grad_scale);
  // Σ cross-entropy without gradients.
  absl::StatusOr<double> Loss(const int32_t* inputs, const int32_t* targets, int b, int t);
  // Full logits [b, t, vocab] into a host array (tests and inference).
  absl::Status Logits(const int32_t* inputs, int b, int t, float* host_logits);

 private:
  struct LayerActivations;
  struct Activations;

  Model(const config::ModelConfig& config, Backend* backend);
  absl::Status Prepare(const int32_t* inputs, const int32_t* targets, int b, int t);
  void EnsureActivations(int b, int t);
  // Runs embedding and every block; leaves the final norm's output in acts_->lnf.
  void Forward(bool keep_layer_activations);
  void BlockForward(int layer, LayerActivations& a);
  void BlockBackward(int layer, LayerActivations& a, float* dx);
  void FinalNorm();
  void FinalNormBackward(float* dx);
  // Cross-entropy over the final hidden states, chunk by chunk; with gradients it also writes
  // d(lnf) and accumulates the LM head's weight gradient.
  double ChunkedLoss(float grad_scale, bool with_grad);

  float* P(int64_t offset) { return offset < 0 ? nullptr : params_.data() + offset; }
  float* G(int64_t offset) { return offset < 0 ? nullptr : grads_.data() + offset; }

  config::ModelConfig config_;
  ParameterLayout layout_;
  Backend* backend_;
  Buffer<float> params_;
  Buffer<float> grads_;
  std::unique_ptr<Activations> acts_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_MODEL_H_
