#include "worker/shape/stages.h"

#include <algorithm>
#include <limits>

namespace trainyard::worker {

std::vector<PipelineStage> BalanceStages(const config::ModelConfig& c, int seq_len, int stages) {
  const double width = c.width, ffn = c.ffn_hidden;
  const double attn = c.attention_width();
  const double fc = c.family == config::ModelFamily::kGpt2 ? ffn : 2 * ffn;
  // Per token: matmul parameters (a multiply-add each) plus the attention scores and values.
  const double projections = c.latent.enabled() ? c.LatentProjectionCount() : c.qkv_width() * width;
  const double block = projections + width * attn + fc * width + width * ffn +
                       2.0 * seq_len * c.attention_flop_width();
  const double head = static_cast<double>(c.vocab) * width;
  const int layers = c.layers;
  auto cost = [&](int first, int last_excl, bool is_last) {
    return (last_excl - first) * block + (is_last ? head : 0.0);
  };
  // best[s][l]: the least possible maximum stage cost placing layers [0, l) on stages [0, s).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= stages; ++s) {
    for (int l = s; l <= layers; ++l) {
      for (int k = s - 1; k < l; ++k) {
        const double c2 = std::max(best[s - 1][k], cost(k, l, s == stages));
        if (c2 < best[s][l]) {
          best[s][l] = c2;
          cut[s][l] = k;
        }
      }
    }
  }
  std::vector<PipelineStage> out(stages);
  int end = layers;
  for (int s = stages; s >= 1; --s) {
    const int begin = cut[s][end];
    out[s - 1] = PipelineStage{begin, end - begin, s == 1, s == stages};
    end = begin;
  }
  return out;
}

int VirtualStage(int stages, int stage, int chunk) { return chunk * stages + stage; }

StageChunk StageChunkOf(int stages, int virtual_stage) {
  return {.stage = virtual_stage % stages, .chunk = virtual_stage / stages};
}

std::vector<PipelineStage> StageChunks(const config::ModelConfig& c, int seq_len, int stages,
                                       int virtual_stages, int stage) {
  if (virtual_stages <= 1) return {BalanceStages(c, seq_len, stages)[stage]};
  const int chunks = stages * virtual_stages;
  const int per_chunk = c.layers / chunks;
  std::vector<PipelineStage> out;
  for (int k = 0; k < virtual_stages; ++k) {
    const int v = VirtualStage(stages, stage, k);
    out.push_back(PipelineStage{v * per_chunk, per_chunk, v == 0, v == chunks - 1});
  }
  return out;
}

}  // namespace trainyard::worker
