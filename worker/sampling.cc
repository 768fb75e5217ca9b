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

// The layout of the rank of context-parallel coordinate 0 and data-parallel coordinate ep_rank
// (the rank of its expert-parallel group; 0 without expert parallelism) at (tp_rank, stage).
ParameterLayout PeerLayout(const config::JobSpec& spec, int tp_rank, int stage, int ep_rank,
                           int ep_size) {
  const config::ParallelismSpec& mesh = spec.parallelism;
  return ParameterLayout(
      spec.model, tp_rank, mesh.tp,
      StageChunks(spec.model, spec.training.seq_len, mesh.pp, mesh.virtual_stages, stage), ep_rank,
      ep_size);
}

// Writes `piece`, the parameters of the rank whose layout is `local`, into `whole`, the model in
// ParameterLayout(spec.model) order (`global`). A rank of expert-parallel coordinate > 0 adds
// only its experts (its other tensors are the coordinate 0 rank's).
void PlacePiece(const ParameterLayout& local, const ParameterLayout& global, const float* piece,
                float* whole, bool experts_only) {
  for (const ParamTensor& t : local.tensors()) {
    if (!local.first() && t.name == "wte") continue;  // the last stage's tied copy
    if (experts_only && t.experts == 0) continue;
    const float* held = piece + t.offset;
    float* to = whole + global.Find(t.name)->offset;
    ForEachLocalRun(t, local.tp_rank(), local.tp_size(), [&](int64_t at, int64_t from, int64_t n) {
      std::copy(held + from, held + from + n, to + at);
    });
  }
}

// The gather's point-to-point messages, in backend memory: NCCL and the host-staging
// communicator move device buffers.
class PieceMail {
 public:
  explicit PieceMail(Backend& backend) : backend_(backend) {}
  absl::Status Send(parallel::Communicator& comm, const float* host, int64_t n, int peer) {
    Buffer<float> buffer = backend_.AllocFloat(n);
    backend_.CopyFromHost(buffer.data(), host, n);
    return comm.Send(buffer.data(), n, peer, kGatherTag);
  }
  absl::Status Receive(parallel::Communicator& comm, std::vector<float>& host, int64_t n,
                       int peer) {
    Buffer<float> buffer = backend_.AllocFloat(n);
    host.resize(n);
    TY_RETURN_IF_ERROR(comm.Recv(buffer.data(), n, peer, kGatherTag));
    backend_.CopyToHost(host.data(), buffer.data(), n);
    return absl::OkStatus();
  }

 private:
  Backend& backend_;
};

}  // namespace

// The pieces travel in a fixed order that every rank derives alike: stage by stage, within a
// stage tensor-parallel rank by rank, within those expert-parallel rank by rank. A (tp, stage)
// position's ep ranks send to its ep rank 0 over the ep group; its tp ranks' pieces go to tp rank
// 0 over the tp group; a later stage's tp rank 0 relays its stage's pieces to rank 0 over the pp
// group.
absl::StatusOr<std::vector<float>> GatherWholeModel(const config::JobSpec& spec,
                                                    const ParallelDims& dims,
                                                    const ParameterLayout& local,
                                                    parallel::ShardedParams& params,
                                                    Backend& backend) {
  std::vector<float> mine(local.total());
  TY_RETURN_IF_ERROR(params.GatherParameters(mine.data()));  // ZeRO-3: over the dp group
  const MeshPosition& at = dims.at;
  const int ep = dims.ep != nullptr ? dims.ep->size() : 1;
  if (at.dp_rank >= ep || at.cp_rank != 0) return std::vector<float>{};
  const int tp = spec.parallelism.tp, pp = spec.parallelism.pp;
  const int64_t size = local.total();  // every piece of a stage has its size
  PieceMail mail(backend);
  if (at.dp_rank != 0) {
    TY_RETURN_IF_ERROR(mail.Send(*dims.ep, mine.data(), size, 0));
    return std::vector<float>{};
  }
  // This position's pieces, one at a time, to `comm`'s rank 0: its own, then its ep ranks'.
  std::vector<float> piece;
  auto forward_own = [&](parallel::Communicator& comm) -> absl::Status {
    TY_RETURN_IF_ERROR(mail.Send(comm, mine.data(), size, 0));
    for (int e = 1; e < ep; ++e) {
      TY_RETURN_IF_ERROR(mail.Receive(*dims.ep, piece, size, e));
      TY_RETURN_IF_ERROR(mail.Send(comm, piece.data(), size, 0));
    }
    return absl::OkStatus();
  };
  if (at.tp_rank != 0) {
    TY_RETURN_IF_ERROR(forward_own(*dims.tp));
    return std::vector<float>{};
  }
  if (at.pp_rank != 0) {  // a later stage's first tensor-parallel rank relays its stage's pieces
    TY_RETURN_IF_ERROR(forward_own(*dims.pp));
    for (int t = 1; t < tp; ++t) {
      const int64_t n = PeerLayout(spec, t, at.pp_rank, 0, ep).total();
      for (int e = 0; e < ep; ++e) {
        TY_RETURN_IF_ERROR(mail.Receive(*dims.tp, piece, n, t));
        TY_RETURN_IF_ERROR(mail.Send(*dims.pp, piece.data(), n, 0));
      }
    }
    return std::vector<float>{};
  }
  const ParameterLayout global(spec.model);
  std::vector<float> whole(global.total());
  for (int stage = 0; stage < pp; ++stage) {
    for (int t = 0; t < tp; ++t) {
      for (int e = 0; e < ep; ++e) {
        const ParameterLayout peer = PeerLayout(spec, t, stage, e, ep);
        const float* data = mine.data();
        if (stage > 0 || t > 0 || e > 0) {
          parallel::Communicator& from = stage > 0 ? *dims.pp : t > 0 ? *dims.tp : *dims.ep;
          TY_RETURN_IF_ERROR(mail.Receive(from, piece, peer.total(),
                                          stage > 0 ? stage
                                          : t > 0   ? t
                                                    : e));
          data = piece.data();
        }
        PlacePiece(peer, global, data, whole.data(), /*experts_only=*/e > 0);
      }
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
          .top_p = static_cast<float>(training.sample_top_p),
          .seed = training.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(step)};
}

std::string SampleLine(int64_t step, const std::vector<int32_t>& prompt,
                       const std::vector<int32_t>& generated, int vocab,
                       const data::Tokenizer* tokenizer) {
  if (tokenizer != nullptr) {
    // The prompt reads from the start of a text; the continuation runs on from it (a
    // SentencePiece tokenizer's leading space is dropped from the one, not the other).
    std::string continuation;
    for (int32_t id : generated) continuation += tokenizer->TokenBytes(id);
    return absl::StrCat("sample step ", step, " | \"", absl::CEscape(tokenizer->Decode(prompt)),
                        "\" → \"", absl::CEscape(continuation), "\"");
  }
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
