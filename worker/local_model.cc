#include "worker/local_model.h"

#include <vector>

#include "common/status.h"

namespace trainyard::worker {

LocalModel::LocalModel(const config::ModelConfig& config, Backend* backend)
    : backend_(backend), layout_(config), source_(layout_, backend) {}

absl::StatusOr<std::unique_ptr<LocalModel>> LocalModel::Create(const config::ModelConfig& config,
                                                               Backend* backend) {
  TY_RETURN_IF_ERROR(config::ValidateModelConfig(config));
  std::unique_ptr<LocalModel> local(new LocalModel(config, backend));
  TY_ASSIGN_OR_RETURN(local->model_, Model::Create(config, backend, &local->source_));
  return local;
}

void LocalModel::InitParameters(uint64_t seed) {
  std::vector<float> host(layout_.total());
  layout_.Initialize(seed, host.data());
  LoadParameters(host.data());
}

void LocalModel::LoadParameters(const float* host) {
  backend_->CopyFromHost(params(), host, layout_.total());
}

void LocalModel::ReadParameters(float* host) const {
  backend_->CopyToHost(host, const_cast<LocalModel*>(this)->params(), layout_.total());
}

void LocalModel::ReadGradients(float* host) const {
  backend_->CopyToHost(host, const_cast<LocalModel*>(this)->grads(), layout_.total());
}

void LocalModel::ZeroGradients() { backend_->Fill(grads(), 0.0f, layout_.total()); }

}  // namespace trainyard::worker
