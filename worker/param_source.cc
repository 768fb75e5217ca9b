#include "worker/param_source.h"

namespace trainyard::worker {

LocalParamSource::LocalParamSource(const ParameterLayout& layout, Backend* backend)
    : layout_(layout),
      params_(backend->AllocFloat(layout.total())),
      grads_(backend->AllocFloat(layout.total())) {}

absl::StatusOr<const float*> LocalParamSource::Acquire(int group) {
  return params_.data() + layout_.groups()[group].begin;
}

absl::StatusOr<float*> LocalParamSource::Gradients(int group) {
  return grads_.data() + layout_.groups()[group].begin;
}

}  // namespace trainyard::worker
