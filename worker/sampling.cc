#include "worker/sampling.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/shape/stages.h"
#include "worker/shape/tensor_slices.h"

namespace trainyard::worker {
namespace {

// Tag of the gather's point-to-point messages (distinct from the pipeline's activations).
constexpr uint32_t kGatherTag = 0x53414d50;  // "SAMP"

// The layout of the rank of data- and context-parallel coordinate 0 at (tp_rank, stage).
ParameterLayout PeerLayout(const config::JobSpec& spec, int tp_rank, int stage) {
  const config::ParallelismSpec& mesh = spec.parallelism;
  return ParameterLayout(
      spec.model, tp_rank, mesh.tp,
      StageChunks(spec.model, spec.training.seq_len, mesh.pp, mesh.virtual_stages, stage));
}

// Writes `piece`, the parameters of the rank whose layout is `local`, into `whole`, the model in
// ParameterLayout(spec.model) order (`global`).
void PlacePiece(const ParameterLayout& local, const ParameterLayout& global, const float* piece,
                float* whole) {
  for (const ParamTensor& t : local.tensors()) {
    if (!local.first() && t.name == "wte") continue;  // the last stage's tied copy
    const float* held = piece + t.offset;
    float* to = whole + global.Find(t.name)->offset;
    ForEachLocalRun(t, local.tp_rank(), local.tp_size(), [&](int64_t at, int64_t from, int64_t n) {
      std::copy(held + from, held + from + n, to + at);
    });
  }
}

}  // namespace

absl::StatusOr<std::vector<float>> GatherWholeModel(const config::JobSpec& spec,
                                                    const ParallelDims& dims,
                                                    const ParameterLayout& local,
                                                    parallel::ShardedParams& params,
                                                    Backend& backend) {
  if (spec.model.moe.enabled()) {
    return absl::InvalidArgumentError("a mixture-of-experts model cannot be gathered for samples");
  }
  std::vector<float> mine(local.total());
  TY_RETURN_IF_ERROR(params.GatherParameters(mine.data()));  // ZeRO-3: over the dp group
  const MeshPosition& at = dims.at;
  if (at.dp_rank != 0 || at.cp_rank != 0) return std::vector<float>{};
  const int tp = spec.parallelism.tp, pp = spec.parallelism.pp;
  // Pieces travel in backend memory: NCCL and the host-staging communicator move device buffers.
  auto send = [&](parallel::Communicator& comm, const float* host, int64_t n, int peer) {
    Buffer<float> buffer = backend.AllocFloat(n);
    backend.CopyFromHost(buffer.data(), host, n);
    return comm.Send(buffer.data(), n, peer, kGatherTag);
  };
  auto receive = [&](parallel::Communicator& comm, std::vector<float>& host, int64_t n, int peer) {
    Buffer<float> buffer = backend.AllocFloat(n);
    host.resize(n);
    TY_RETURN_IF_ERROR(comm.Recv(buffer.data(), n, peer, kGatherTag));
    backend.CopyToHost(host.data(), buffer.data(), n);
    return absl::OkStatus();
  };
  if (at.tp_rank != 0) {
    TY_RETURN_IF_ERROR(send(*dims.tp, mine.data(), local.total(), 0));
    return std::vector<float>{};
  }
  std::vector<float> piece;
  if (at.pp_rank != 0) {  // a later stage's first tensor-parallel rank relays its group's pieces
    TY_RETURN_IF_ERROR(send(*dims.pp, mine.data(), local.total(), 0));
    for (int t = 1; t < tp; ++t) {
      TY_RETURN_IF_ERROR(receive(*dims.tp, piece, PeerLayout(spec, t, at.pp_rank).total(), t));
      TY_RETURN_IF_ERROR(send(*dims.pp, piece.data(), static_cast<int64_t>(piece.size()), 0));
    }
    return std::vector<float>{};
  }
  const ParameterLayout global(spec.model);
  std::vector<float> whole(global.total());
  for (int stage = 0; stage < pp; ++stage) {
    for (int t = 0; t < tp; ++t) {
      const ParameterLayout peer = PeerLayout(spec, t, stage);
      const float* data = mine.data();
      if (stage > 0 || t > 0) {
        parallel::Communicator& from = stage == 0 ? *dims.tp : *dims.pp;
        TY_RETURN_IF_ERROR(receive(from, piece, peer.total(), stage == 0 ? t : stage));
        data = piece.data();
      }
      PlacePiece(peer, global, data, whole.data());
    }
  }
  return whole;
}

std::vector<int32_t> SamplePrompt(const config::TrainingSpec& training, const BatchSampler& val) {
  if (!training.sample_prompt.empty()) {
    return std::vector<int32_t>(training.sample_prompt.begin(), training.sample_prompt.end());
  }
  if (!training.sample_prompt_tokens.empty()) return training.sample_prompt_tokens;
  std::vector<int32_t> inputs(val.seq_len()), targets(val.seq_len());
  val.FillEvalWindows(0, 1, inputs.data(), targets.data());
  inputs.resize(config::SamplePromptLength(training));
  return inputs;
}

SampleOptions SampleOptionsAt(const config::TrainingSpec& training, int64_t step) {
  return {.tokens = training.sample_tokens,
          .temperature = static_cast<float>(training.sample_temperature),
          .top_k = training.sample_top_k,
          .seed = training.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(step)};
}

std::string SampleLine(int64_t step, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& generated, int vocab) {
  if (vocab != 256) {
    return absl::StrCat("sample step ", step, " | ", absl::StrJoin(prompt, " "), " → ",
                        absl::StrJoin(generated, " "));
  }
  auto text = [](const std::vector<int32_t>& tokens) {
    return absl::CEscape(std::string(tokens.begin(), tokens.end()));
  };
  return absl::StrCat("sample step ", step, " | \"", text(prompt), "\" → \"", text(generated),
                      "\"");
}

}  // namespace trainyard::worker
