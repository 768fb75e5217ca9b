// ParamSource: where the model finds its parameters and puts its gradients, one ParamGroup at a
// time. The model announces what it needs and when gradients are final; the source decides where
// state lives: all local (LocalParamSource), or sharded over data-parallel ranks with its
// collectives overlapped with the backward pass (parallel::ShardedParams, ZeRO stages 0–3).
//
// Threading: called from the training thread only.
#ifndef TRAINYARD_WORKER_PARAM_SOURCE_H_
#define TRAINYARD_WORKER_PARAM_SOURCE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend.h"
#include "worker/buffer.h"
#include "worker/shape/parameters.h"

namespace trainyard::worker {

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // The group's full parameters, valid until the matching Release. Calls nest (a group may be
  // acquired again while held; each Acquire is paired with one Release).
  [[nodiscard]] virtual absl::StatusOr<const float*> Acquire(int group) = 0;
  // Whether Acquire returns the same memory, holding only that group, for the source's life (so
  // that a backend may keep converted copies of its weights: Backend::KeepWeightCopy).
  virtual bool persistent() const { return true; }
  virtual void Release(int group) = 0;
  // A hint: the model will acquire `group` next, so a sharded source can start gathering it.
  virtual void Prefetch(int group) {}
  // Where the backward pass accumulates the group's full gradient for the current micro-batch
  // (zeroed by the source when a micro-batch starts).
  [[nodiscard]] virtual absl::StatusOr<float*> Gradients(int group) = 0;
  // The group's gradient of the current micro-batch is complete.
  [[nodiscard]] virtual absl::Status GradientsReady(int group) = 0;
};

// Everything in two flat buffers on the backend: parameters and accumulated gradients.
class LocalParamSource final : public ParamSource {
 public:
  LocalParamSource(const ParameterLayout& layout, Backend* backend);

  [[nodiscard]] absl::StatusOr<const float*> Acquire(int group) override;
  void Release(int group) override {}
  [[nodiscard]] absl::StatusOr<float*> Gradients(int group) override;
  [[nodiscard]] absl::Status GradientsReady(int group) override { return absl::OkStatus(); }

  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }

 private:
  const ParameterLayout& layout_;
  Buffer<float> params_;
  Buffer<float> grads_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_PARAM_SOURCE_H_
