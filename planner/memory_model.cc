#include "planner/memory_model.h"

#include <algorithm>
#include <vector>

#include "worker/shape/schedule.h"

namespace trainyard::planner {
namespace {

// Replays the calls the model makes on its parameter source (worker/param_source.h) through
// ShardedParams' bookkeeping of transient buffers, sizes only. A reduced gradient's staging is
// freed at the next hand-over, as ShardedParams does (it waits there for a reduction that lags).
class TransientReplay {
 public:
  explicit TransientReplay(const RankShape& s)
      : s_(s),
        zero_(s.mesh.zero),
        gathered_(s.group_sizes.size(), false),
        gather_pending_(s.group_sizes.size(), false),
        holds_(s.group_sizes.size(), 0),
        staging_(s.group_sizes.size(), false) {}

  void Acquire(int g) {
    if (zero_ < 3) return;
    if (!gathered_[g]) Gather(g);
    gather_pending_[g] = false;
    ++holds_[g];
  }
  void Prefetch(int g) {
    if (zero_ < 3 || g < 0 || g >= static_cast<int>(gathered_.size())) return;
    if (!gathered_[g]) Gather(g);
  }
  void Release(int g) {
    if (zero_ < 3) return;
    if (--holds_[g] == 0 && !gather_pending_[g]) {
      gathered_[g] = false;
      Add(-Bytes(g));
    }
  }
  void Gradients(int g) {
    if (zero_ < 2 || staging_[g]) return;
    staging_[g] = true;
    Add(Bytes(g));
  }
  void Ready(int g) {
    if (zero_ < 2) return;
    FreeReduced();
    staging_[g] = false;
    pending_.push_back(Bytes(g));
  }
  // The optimizer step (ShardedParams::FinishGradients, FinishUpdate): waits for everything and
  // frees prefetched groups nobody holds.
  void FinishStep() {
    FreeReduced();
    for (size_t g = 0; g < gathered_.size(); ++g) {
      gather_pending_[g] = false;
      if (holds_[g] == 0 && gathered_[g]) {
        gathered_[g] = false;
        Add(-Bytes(static_cast<int>(g)));
      }
    }
  }
  int64_t peak() const { return peak_; }

 private:
  int64_t Bytes(int g) const { return 4 * s_.padded(g); }
  void Gather(int g) {
    gathered_[g] = true;
    gather_pending_[g] = true;
    Add(Bytes(g));
  }
  void FreeReduced() {
    for (int64_t bytes : pending_) Add(-bytes);
    pending_.clear();
  }
  void Add(int64_t delta) {
    now_ += delta;
    peak_ = std::max(peak_, now_);
  }

  const RankShape& s_;
  const int zero_;
  std::vector<bool> gathered_, gather_pending_;
  std::vector<int> holds_;
  std::vector<bool> staging_;
  std::vector<int64_t> pending_;
  int64_t now_ = 0, peak_ = 0;
};

int FinalGroup(const RankShape& s) { return static_cast<int>(s.group_sizes.size()) - 1; }

// Model::BackwardBlocks through chunk `c`: with a split backward (the input-gradient pass) no
// gradients.
void ReplayBackwardBlocks(const RankShape& s, int c, TransientReplay& r) {
  const bool split = s.split_backward();
  const worker::PipelineStage& chunk = s.chunks[c];
  const int first = chunk.first_layer;
  for (int l = first + chunk.num_layers - 1; l >= first; --l) {
    r.Acquire(s.block_group(c, l));
    if (l > first) r.Prefetch(s.block_group(c, l - 1));
    if (!split) {
      r.Gradients(s.block_group(c, l));
      r.Ready(s.block_group(c, l));
    }
    r.Release(s.block_group(c, l));
  }
  if (chunk.first && !split) {
    r.Gradients(0);
    r.Ready(0);
  }
}

// Model::StageWeightGradients of chunk `c`: the blocks' gradients, then the embedding's; no
// parameters.
void ReplayWeightPass(const RankShape& s, int c, TransientReplay& r) {
  const worker::PipelineStage& chunk = s.chunks[c];
  const int first = chunk.first_layer;
  for (int l = first + chunk.num_layers - 1; l >= first; --l) {
    r.Gradients(s.block_group(c, l));
    r.Ready(s.block_group(c, l));
  }
  if (chunk.first) {
    r.Gradients(0);
    r.Ready(0);
  }
}

// Model::StageForward of chunk `c`: the forward pass, and on the last virtual stage the loss and
// the whole backward.
void ReplayStageForward(const RankShape& s, int c, TransientReplay& r) {
  const worker::PipelineStage& chunk = s.chunks[c];
  const int first = chunk.first_layer, end = first + chunk.num_layers;
  if (chunk.first) {
    r.Acquire(0);
    if (chunk.num_layers > 0) r.Prefetch(s.block_group(c, first));
    r.Release(0);
  }
  for (int l = first; l < end; ++l) {
    if (l + 1 < end) {
      r.Prefetch(s.block_group(c, l + 1));
    } else if (chunk.last) {
      r.Prefetch(FinalGroup(s));
    }
    r.Acquire(s.block_group(c, l));
    r.Release(s.block_group(c, l));
  }
  if (!chunk.last) return;
  const int final_group = FinalGroup(s);
  const int head = s.tied_head_in_embedding_group() ? 0 : final_group;
  r.Acquire(final_group);
  r.Acquire(head);  // the chunked loss
  r.Gradients(head);
  r.Release(head);
  r.Gradients(final_group);  // the final norm's backward
  r.Ready(final_group);
  r.Release(final_group);
  ReplayBackwardBlocks(s, c, r);
}

}  // namespace

int ActivationSlots(const RankShape& s) {
  if (s.mesh.pp == 1) return 1;
  return worker::ActivationSlots(s.schedule(), s.stage_index);
}

int64_t ActivationSlotBytes(const RankShape& s, const BackendShape& backend) {
  const config::ModelConfig& c = s.model;
  const int64_t tp = s.mesh.tp;
  const bool sp = s.mesh.sequence_parallel && tp > 1;
  const int64_t n = s.rows(), nr = sp ? n / tp : n, w = c.width;
  const int64_t heads = c.heads / tp, kv = c.kv_heads / tp, d = c.head_dim();
  const int64_t qkv = (heads + 2 * kv) * d, attn = heads * d, ffn = c.ffn_hidden / tp;
  const int64_t fc = c.family == config::ModelFamily::kGpt2 ? ffn : 2 * ffn;
  const int64_t vocab = c.vocab / tp;
  const int64_t layers = s.chunk_layers(), saved = c.recompute ? 1 : layers;
  const int64_t chunk_rows = std::clamp<int64_t>(backend.max_logits_chunk / vocab, 1, n);
  const int64_t ints = 2 * n + (tp > 1 ? 2 * n : 0);
  int64_t acts = (layers + 1) * nr * w;                                          // residual stream
  acts += saved * (2 * n * w + n * qkv + n * attn + nr * w + n * fc + n * ffn);  // per block
  if (sp) acts += saved * 2 * nr * w;               // the norms' local rows
  int64_t floats = saved * (4 * nr + n * heads);    // norm statistics, attention log-sum-exp
  acts += 2 * n * w + chunk_rows * vocab + nr * w;  // lnf, tmp, logits, dx
  floats += 2 * nr + 4 * chunk_rows;                // lnf statistics, loss statistics
  if (sp) {
    acts += 4 * nr * w + n * w;  // lnf, tmp, dln and dlnf local rows; dx full rows
    floats += 4 * w;             // norm-gradient scratch
  }
  acts += n * w + n * attn + n * qkv + n * fc + n * ffn + n * w;  // dln .. dlnf
  if (s.split_backward()) {  // what each block's weight pass needs from its input-gradient pass
    acts += layers * (2 * n * w + n * fc + n * qkv) + (s.first() ? n * w : 0);
    floats += layers * 4 * w;
  }
  return acts * backend.act_bytes + 4 * floats + 4 * ints;
}

int64_t RingBufferBytes(const RankShape& s, const BackendShape& backend) {
  if (s.mesh.cp == 1) return 0;
  const config::ModelConfig& c = s.model;
  const int64_t n = s.rows(), d = c.head_dim();
  const int64_t heads = c.heads / s.mesh.tp, kv_heads = c.kv_heads / s.mesh.tp;
  const int64_t kv = n * 2 * kv_heads * d;
  const int64_t partial = n / 2 * heads * d, partial_lse = n / 2 * heads;
  return (5 * kv + partial) * backend.act_bytes + 4 * partial_lse;
}

int64_t TransientPeakBytes(const RankShape& s) {
  if (s.mesh.zero < 2) return 0;
  TransientReplay r(s);
  const std::vector<worker::Pass> passes =
      s.mesh.pp == 1 ? std::vector<worker::Pass>(s.micro_batches, worker::Pass{})
                     : worker::PassOrder(s.schedule(), s.stage_index);
  for (const worker::Pass& pass : passes) {
    switch (pass.kind) {
      case worker::PassKind::kForward:
        ReplayStageForward(s, pass.chunk, r);  // the last virtual stage's backward too
        break;
      case worker::PassKind::kBackward:
        if (!s.chunks[pass.chunk].last) ReplayBackwardBlocks(s, pass.chunk, r);
        break;
      case worker::PassKind::kWeight:
        ReplayWeightPass(s, pass.chunk, r);
        break;
    }
  }
  r.FinishStep();
  return r.peak();
}

RankMemory PredictRankMemory(const RankShape& s, const BackendShape& backend) {
  int64_t padded = 0, shard = 0;
  for (size_t g = 0; g < s.group_sizes.size(); ++g) {
    padded += s.padded(g);
    shard += s.chunk(g);
  }
  const int zero = s.mesh.zero;
  RankMemory m;
  m.parameters = 4 * (zero < 3 ? padded : shard);
  m.gradients = 4 * (zero < 2 ? padded : shard);
  m.optimizer = 2 * 4 * (zero == 0 ? padded : shard);
  m.activations =
      ActivationSlots(s) * ActivationSlotBytes(s, backend) + RingBufferBytes(s, backend);
  m.transient = TransientPeakBytes(s);
  if (s.mesh.pp > 1) {
    const bool sp = s.mesh.sequence_parallel && s.mesh.tp > 1;
    const int64_t count = s.rows() / (sp ? s.mesh.tp : 1) * s.model.width;
    const int64_t slots = ActivationSlots(s);
    // Several chunks per rank: every rank receives (its later chunks) and sends (its earlier ones).
    const bool receives = !s.first() || s.chunks.size() > 1;
    const bool sends = !s.last() || s.chunks.size() > 1;
    const int64_t buffers = (receives ? slots + 1 : 0) + (sends ? slots + 1 : 0);
    m.pipeline_buffers = buffers * count * backend.act_bytes;
  }
  return m;
}

}  // namespace trainyard::planner
