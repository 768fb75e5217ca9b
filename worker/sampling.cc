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

// Writes the piece of tensor-parallel rank `tp_rank` on pipeline stage `stage` (its local
// parameters, `piece`) into `whole`, the model in ParameterLayout(spec.model) order.
void PlacePiece(const config::JobSpec& spec, const ParameterLayout& global, int tp_rank, int stage,
                const float* piece, float* whole) {
  const config::ParallelismSpec& mesh = spec.parallelism;
  const ParameterLayout local(
      spec.model, tp_rank, mesh.tp,
      StageChunks(spec.model, spec.training.seq_len, mesh.pp, mesh.virtual_stages, stage));
  for (const ParamTensor& t : local.tensors()) {
    if (!local.first() && t.name == "wte") continue;  // the last stage's tied copy
    const ParamTensor* g = global.Find(t.name);
    int64_t start = t.offset;
    for (const Hyperslab& slab : LocalPieces(t, tp_rank, mesh.tp)) {
      ForEachRun(t.global_shape, slab, 0, slab.numel(), [&](int64_t at, int64_t from, int64_t n) {
        const float* src = piece + start + from;
        std::copy(src, src + n, whole + g->offset + at);
      });
      start += slab.numel();
    }
  }
}

int64_t PieceSize(const config::JobSpec& spec, int tp_rank, int stage) {
  const config::ParallelismSpec& mesh = spec.parallelism;
  return ParameterLayout(
             spec.model, tp_rank, mesh.tp,
             StageChunks(spec.model, spec.training.seq_len, mesh.pp, mesh.virtual_stages, stage))
      .total();
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
      TY_RETURN_IF_ERROR(receive(*dims.tp, piece, PieceSize(spec, t, at.pp_rank), t));
      TY_RETURN_IF_ERROR(send(*dims.pp, piece.data(), static_cast<int64_t>(piece.size()), 0));
    }
    return std::vector<float>{};
  }
  const ParameterLayout global(spec.model);
  std::vector<float> whole(global.total());
  for (int stage = 0; stage < pp; ++stage) {
    for (int t = 0; t < tp; ++t) {
      const float* data = mine.data();
      if (stage > 0 || t > 0) {
        parallel::Communicator& from = stage == 0 ? *dims.tp : *dims.pp;
        TY_RETURN_IF_ERROR(receive(from, piece, PieceSize(spec, t, stage), stage == 0 ? t : stage));
        data = piece.data();
      }
      PlacePiece(spec, global, t, stage, data, whole.data());
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
  inputs.resize(std::min(config::kDefaultSamplePromptTokens, val.seq_len()));
  return inputs;
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
