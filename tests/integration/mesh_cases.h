// The meshes the engine's integration suites run, in one place: a mesh case, how it changes a
// spec, and the model-parallel meshes that the equivalence suite trains against the single
// process and the planner's accounting suite measures (every pipeline schedule among them).
#ifndef TRAINYARD_TESTS_INTEGRATION_MESH_CASES_H_
#define TRAINYARD_TESTS_INTEGRATION_MESH_CASES_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/logging.h"
#include "config/spec.h"
#include "worker/data/markov.h"

namespace trainyard::testenv {

struct MeshCase {
  const char* name;
  int dp = 1, tp = 1, pp = 1, cp = 1, zero = 0;
  bool sequence_parallel = false;
  config::PipelineSchedule schedule = config::PipelineSchedule::kOneForwardOneBackward;
  int virtual_stages = 1;
  int layers = 0;       // 0: the preset's
  bool untied = false;  // untie the embeddings (a tied one crosses stages only under ZeRO 0/1)
  bool recompute = false;
  bool qkv_bias = false;         // llama: Qwen2's biases on q, k and v (GPT-2 always has them)
  int head_dim = 0;              // llama: model.head_dim (0: width / heads)
  bool qk_norm = false;          // llama: Qwen3's norms of each query and key head
  bool whole_norms = false;      // llama: OLMoE's query and key norms over the whole projection
  int sliding_window = 0;        // llama: model.sliding_window (0: none)
  bool gemma = false;            // llama: Gemma's GeGLU and embeddings scaled by √width
  int full_layer = -1;           // llama, with a window: the one block without it (-1: none)
  bool post_norms = false;       // llama: norms of the attention's and the MLP's outputs (Gemma's)
  bool post_norms_only = false;  // llama: those norms, and none before the branches (OLMo 2's)
  // Gemma 2's scores: scaled by 3^-1/2, both capped at 1
  // (small enough to bend a tiny model's scores and logits).
  bool softcaps = false;
  // llama: Phi-4 mini's RoPE, 10 of the 16 dimensions of each head turned with LongRoPE whose
  // original context, 16, is shorter than a 24-position sequence but longer than its chunks.
  bool longrope = false;
  int nope_layer = -1;  // llama: the one block RoPE leaves unturned (SmolLM3's NoPE; -1: none)
  int rope_dim = 0;     // llama: model.rope_dim, the dimensions of each head RoPE turns (0: all)
  // llama: Granite's multipliers (embeddings times 6, branches times 0.5, scores times 1/16 in
  // place of the heads' 16^-1/2, logits divided by 2).
  bool granite = false;
  int micro_batch = 0;  // 0: the spec's
  int seq_len = 0;      // 0: the spec's (model.max_seq grows to it)
  // Mixture of experts (0: dense): four experts, top-2 (model.moe with every other field as
  // MoeMeshModel sets it), under the aux-loss or the bias rule.
  int experts = 0;
  bool bias_balance = false;
  int ep = 1;                    // expert parallelism (drawn from dp)
  float capacity_factor = 0.0f;  // 0: dropless
  bool shared_gate = false;      // llama: the shared expert gated per token (Qwen2-MoE's)
  // GLM-4.5's (DeepSeek-V3's) routing: the first block dense, sigmoid scores normalised over the
  // picks, which a selection bias chooses (the bias rule), the weights scaled by 2.5.
  bool glm45 = false;
  // ERNIE 4.5's MoE routing: the first block dense, softmax scores normalised over the picks,
  // which a selection bias chooses (the bias rule).
  bool ernie_moe = false;
  // MiniMax-M2's routing: sigmoid scores normalised over the picks, which a selection bias
  // chooses (the bias rule), no shared expert (with whole_norms, its model).
  bool minimax_m2 = false;
  // Group-limited routing (model.moe.groups and group_top_k; 0: none), the groups scored by
  // their two best (DeepSeek-V3's) or, with group_max, by their best (DeepSeek-V2's).
  int groups = 0;
  int group_top_k = 0;
  bool group_max = false;
  float z_loss = 0.0f;        // model.moe.z_loss_coeff (ST-MoE's router z-loss)
  float logit_z_loss = 0.0f;  // model.z_loss_coeff (PaLM's z-loss on the output logits)
  // model.document_token: the Markov chain's most frequent token begins each document, so that
  // documents of a few tokens cross micro-batches' chunks, stages' boundaries and ranks' shares.
  bool documents = false;
  // llama: multi-head latent attention (DeepSeek-V3's): a key/value head per query head, 4 of
  // each head's 16 dimensions turned, value heads of 8, latents of 24 (queries; with
  // latent_direct_queries none, the queries projected from the input) and 12.
  bool latent = false;
  bool latent_direct_queries = false;
};

// The token a Markov source emits most often (its stationary probability summed over the
// contexts it ends).
inline int32_t MostFrequentToken(const config::MarkovSpec& markov) {
  const absl::StatusOr<worker::MarkovChain> chain = worker::MarkovChain::Random(markov);
  TY_CHECK(chain.ok()) << chain.status();
  std::vector<double> frequency(chain->vocab());
  for (int64_t context = 0; context < chain->contexts(); ++context) {
    frequency[context % chain->vocab()] += chain->StationaryProbability(context);
  }
  return static_cast<int32_t>(std::max_element(frequency.begin(), frequency.end()) -
                              frequency.begin());
}

// Phi-4 mini's RoPE on the debug presets' heads of 16: the first 10 dimensions turned, with
// LongRoPE's five short and five long factors past an original context of `original`, and an
// attention factor of 1.2.
inline void PhiMiniRope(int original, config::ModelConfig* model) {
  model->rope_dim = 10;
  model->rope_scaling = {.original_max_seq = original,
                         .longrope = true,
                         .short_factor = {1.0f, 1.5f, 2.0f, 3.0f, 4.0f},
                         .long_factor = {2.0f, 3.0f, 5.0f, 11.0f, 30.0f},
                         .attention_factor = 1.2f};
}

// The MoE model of a mesh case: `experts` experts of hidden size 32 with top-2, one shared
// expert, on every block; an aux loss or a selection bias strong enough to matter in five steps.
inline void MoeMeshModel(const MeshCase& mesh, config::ModelConfig* model) {
  if (mesh.experts == 0) return;
  config::MoeConfig& moe = model->moe;
  moe.experts = mesh.experts;
  moe.top_k = 2;
  moe.shared_experts = 1;
  moe.ffn = 32;
  moe.balance = mesh.bias_balance ? config::MoeBalance::kBias : config::MoeBalance::kAuxLoss;
  moe.aux_loss_coeff = 0.1f;
  moe.bias_update_rate = 0.01f;
  moe.capacity_factor = mesh.capacity_factor;
  moe.shared_gate = mesh.shared_gate;
  if (mesh.glm45) {
    moe.dense_first = 1;
    moe.score = config::MoeScore::kSigmoid;
    moe.normalize_top_k = true;
    moe.balance = config::MoeBalance::kBias;
    moe.routed_scale = 2.5f;
  }
  if (mesh.minimax_m2) {
    moe.shared_experts = 0;
    moe.score = config::MoeScore::kSigmoid;
    moe.normalize_top_k = true;
    moe.balance = config::MoeBalance::kBias;
  }
  if (mesh.ernie_moe) {
    moe.dense_first = 1;
    moe.normalize_top_k = true;
    moe.balance = config::MoeBalance::kBias;
  }
  if (mesh.groups > 0) {
    moe.groups = mesh.groups;
    moe.group_top_k = mesh.group_top_k;
    if (mesh.group_max) moe.group_score = config::GroupScore::kMax;
  }
  moe.z_loss_coeff = mesh.z_loss;
}

// `spec` run on `mesh`: its model changes (layers, untied embeddings, recomputation), its micro-
// batch, its parallelism, and one node holding every rank.
inline void ApplyMesh(const MeshCase& mesh, config::JobSpec* spec) {
  if (mesh.layers > 0) spec->model.layers = mesh.layers;
  if (mesh.untied) spec->model.tied_embeddings = false;
  if (mesh.recompute) spec->model.recompute = true;
  if (spec->model.family == config::ModelFamily::kLlama) {
    spec->model.qkv_bias = spec->model.qkv_bias || mesh.qkv_bias;
    if (mesh.head_dim > 0) spec->model.explicit_head_dim = mesh.head_dim;
    spec->model.qk_norm = spec->model.qk_norm || mesh.qk_norm || mesh.whole_norms;
    if (mesh.whole_norms) spec->model.qk_norm_span = config::QkNormSpan::kProjection;
    if (mesh.sliding_window > 0) spec->model.sliding_window = mesh.sliding_window;
    if (mesh.full_layer >= 0) spec->model.full_attention_layers = {mesh.full_layer};
    spec->model.post_norms = spec->model.post_norms || mesh.post_norms || mesh.post_norms_only;
    if (mesh.post_norms_only) spec->model.pre_norms = false;
    spec->model.geglu = spec->model.geglu || mesh.gemma;
    spec->model.scale_embeddings = spec->model.scale_embeddings || mesh.gemma;
    if (mesh.longrope) PhiMiniRope(16, &spec->model);
    if (mesh.nope_layer >= 0) spec->model.nope_layers = {mesh.nope_layer};
    if (mesh.rope_dim > 0) spec->model.rope_dim = mesh.rope_dim;
    if (mesh.latent) {
      spec->model.kv_heads = spec->model.heads;
      spec->model.rope_dim = 4;
      spec->model.latent = {
          .q_rank = mesh.latent_direct_queries ? 0 : 24, .kv_rank = 12, .value_dim = 8};
    }
    if (mesh.granite) {
      spec->model.embedding_multiplier = 6.0f;
      spec->model.residual_multiplier = 0.5f;
      spec->model.attention_multiplier = 0.0625f;
      spec->model.logits_scaling = 2.0f;
    }
  }
  if (mesh.softcaps) {
    spec->model.attention_scale_dim = 3;
    spec->model.attention_softcap = 1.0f;
    spec->model.logit_softcap = 1.0f;
  }
  spec->model.z_loss_coeff = mesh.logit_z_loss;
  if (mesh.documents) spec->model.document_token = MostFrequentToken(spec->data.markov);
  MoeMeshModel(mesh, &spec->model);
  if (mesh.micro_batch > 0) spec->training.micro_batch = mesh.micro_batch;
  if (mesh.seq_len > 0) {
    spec->training.seq_len = mesh.seq_len;
    spec->model.max_seq = std::max(spec->model.max_seq, mesh.seq_len);
  }
  config::ParallelismSpec& p = spec->parallelism;
  p.dp = mesh.dp;
  p.tp = mesh.tp;
  p.pp = mesh.pp;
  p.cp = mesh.cp;
  p.ep = mesh.ep;
  p.zero = mesh.zero;
  p.sequence_parallel = mesh.sequence_parallel;
  p.schedule = mesh.schedule;
  p.virtual_stages = mesh.virtual_stages;
  spec->resources.nodes = 1;
  spec->resources.devices_per_node = mesh.dp * mesh.cp * mesh.tp * mesh.pp;
}

// A five-step job of a family's debug preset over a 64-token Markov chain (batch 8 in micro-
// batches of 2, sequences of 16, no evaluation) on `mesh`; the model's positions reach max_seq.
inline config::JobSpec DebugJob(config::ModelFamily family, const MeshCase& mesh, int max_seq) {
  config::JobSpec spec;
  spec.model = *config::Preset(family == config::ModelFamily::kGpt2 ? "gpt2-debug" : "llama-debug");
  spec.model.vocab = 64;
  spec.model.max_seq = max_seq;
  spec.data.markov.vocab = 64;
  spec.data.markov.train_tokens = 1 << 14;
  spec.data.markov.val_tokens = 1 << 10;
  spec.training.steps = 5;
  spec.training.batch = 8;
  spec.training.micro_batch = 2;
  spec.training.seq_len = 16;
  spec.training.lr = 1e-2;
  spec.training.warmup_steps = 2;
  spec.training.eval_every = 0;
  ApplyMesh(mesh, &spec);
  return spec;
}

inline constexpr config::PipelineSchedule kZeroBubble = config::PipelineSchedule::kZeroBubble;
inline constexpr config::PipelineSchedule kInterleaved = config::PipelineSchedule::kInterleaved;

// Tensor, sequence and pipeline parallelism with data parallelism and ZeRO, under every pipeline
// schedule, on the debug presets (two layers unless a case says more; a batch of 8 in
// micro-batches of 2).
inline constexpr MeshCase kModelParallelMeshes[] = {
    {.name = "tp2", .tp = 2},
    {.name = "pp2_4micro", .pp = 2},
    {.name = "dp2_tp2", .dp = 2, .tp = 2},
    {.name = "tp2_pp2", .tp = 2, .pp = 2},
    {.name = "dp2_pp2_zero1", .dp = 2, .pp = 2, .zero = 1},
    {.name = "dp2_tp2_zero3", .dp = 2, .tp = 2, .zero = 3},
    // The q, k and v biases split by heads like their weights' rows (grouped-query sections).
    {.name = "dp2_tp2_zero3_qkv_bias", .dp = 2, .tp = 2, .zero = 3, .qkv_bias = true},
    // Heads wider than width / heads (Mistral Nemo's and Qwen3's shape), split by tensor
    // parallelism, with the attention's output projection reducing across pipeline stages.
    {.name = "tp2_pp2_sp_wide_heads", .tp = 2, .pp = 2, .sequence_parallel = true, .head_dim = 32},
    // Qwen3's shape (wide heads, norms of each query and key head): each rank's heads give part
    // of the head norms' gradients, summed over the tensor-parallel group; and under ZB-H1 kept
    // for the weight pass.
    {.name = "dp2_tp2_zero3_qwen3", .dp = 2, .tp = 2, .zero = 3, .head_dim = 32, .qk_norm = true},
    {.name = "zb_tp2_pp2_qk_norm", .tp = 2, .pp = 2, .schedule = kZeroBubble, .qk_norm = true},
    // Gemma's model: each vocabulary shard's rows scaled before the sum, scattered under
    // sequence parallelism, on the first of two stages.
    {.name = "tp2_pp2_sp_gemma", .tp = 2, .pp = 2, .sequence_parallel = true, .gemma = true},
    // A window in one of two stages' blocks only (local and global blocks, Gemma's pattern).
    {.name = "pp2_window_second_full", .pp = 2, .sliding_window = 5, .full_layer = 1},
    // SmolLM3's NoPE block on the second stage, under zero bubble's split backward.
    {.name = "zb_pp2_nope", .pp = 2, .schedule = kZeroBubble, .nope_layer = 1},
    // Granite's multipliers: each rank's rows of a branch scaled under sequence parallelism, the
    // logits' divisor on the last stage's vocabulary shards, under zero bubble's split backward.
    {.name = "zb_tp2_pp2_sp_granite",
     .tp = 2,
     .pp = 2,
     .sequence_parallel = true,
     .schedule = kZeroBubble,
     .granite = true},
    // Norms of the branches' outputs: on each rank's rows under sequence parallelism, their
    // gradients summed over the group with the other norms' (kept for ZB-H1's weight pass).
    {.name = "dp2_tp2_sp_post_norms",
     .dp = 2,
     .tp = 2,
     .sequence_parallel = true,
     .post_norms = true},
    {.name = "zb_tp2_pp2_sp_post_norms",
     .tp = 2,
     .pp = 2,
     .sequence_parallel = true,
     .schedule = kZeroBubble,
     .post_norms = true},
    // Norms after each branch only: the branches read the residual stream's rows gathered under
    // sequence parallelism, the absent norms' gradient slots left unread; ZB-H1's split backward
    // and interleaved stages over them. With OLMo 2's q and k norms over the whole projection,
    // whose heads tensor parallelism splits: each row's sums and gradient dots summed over the
    // group, also when recomputed.
    {.name = "zb_tp2_pp2_sp_post_norms_only",
     .tp = 2,
     .pp = 2,
     .sequence_parallel = true,
     .schedule = kZeroBubble,
     .post_norms_only = true},
    {.name = "olmo2_zb_tp2_pp2_sp",
     .tp = 2,
     .pp = 2,
     .sequence_parallel = true,
     .schedule = kZeroBubble,
     .whole_norms = true,
     .post_norms_only = true},
    {.name = "olmo2_tp2_recompute",
     .tp = 2,
     .recompute = true,
     .whole_norms = true,
     .post_norms_only = true},
    {.name = "dp2_il_pp2_v2_post_norms_only_recompute",
     .dp = 2,
     .pp = 2,
     .schedule = kInterleaved,
     .virtual_stages = 2,
     .layers = 4,
     .recompute = true,
     .post_norms_only = true},
    // Gemma 2's capped scores and logits: each rank caps its heads' scores and its vocabulary
    // shard's logits, the loss's gradient taken through the cap on each shard.
    {.name = "tp2_sp_softcaps", .tp = 2, .sequence_parallel = true, .softcaps = true},
    // PaLM's z-loss on the logits through the cap, each vocabulary shard's gradient from the
    // merged log-sum-exps, its Σ lse² summed over the pipeline with the loss.
    {.name = "zloss_tp2_pp2_sp",
     .tp = 2,
     .pp = 2,
     .sequence_parallel = true,
     .softcaps = true,
     .logit_z_loss = 0.05f},
    // Documents: every stage and tensor-parallel rank masks its rows by their documents, and
    // micro-batches in flight on an interleaved schedule keep their own.
    {.name = "tp2_pp2_sp_documents",
     .tp = 2,
     .pp = 2,
     .sequence_parallel = true,
     .documents = true},
    {.name = "il_pp2_v2_documents",
     .pp = 2,
     .schedule = kInterleaved,
     .virtual_stages = 2,
     .layers = 4,
     .documents = true},
    {.name = "tp2_sp", .tp = 2, .sequence_parallel = true},
    {.name = "dp2_tp2_sp_zero2", .dp = 2, .tp = 2, .zero = 2, .sequence_parallel = true},
    {.name = "tp2_pp2_sp", .tp = 2, .pp = 2, .sequence_parallel = true},
    {.name = "pp4", .pp = 4, .layers = 4},
    // ZB-H1: the backward split into B and W passes.
    {.name = "zb_pp2", .pp = 2, .schedule = kZeroBubble},
    {.name = "zb_pp4", .pp = 4, .schedule = kZeroBubble, .layers = 4},
    {.name = "zb_dp2_pp2_zero1", .dp = 2, .pp = 2, .zero = 1, .schedule = kZeroBubble},
    {.name = "zb_dp2_pp2_zero3",
     .dp = 2,
     .pp = 2,
     .zero = 3,
     .schedule = kZeroBubble,
     .untied = true},
    {.name = "zb_tp2_pp2_sp", .tp = 2, .pp = 2, .sequence_parallel = true, .schedule = kZeroBubble},
    // Interleaved 1F1B: each rank holds V chunks of the layers.
    {.name = "il_pp2_v2", .pp = 2, .schedule = kInterleaved, .virtual_stages = 2, .layers = 4},
    {.name = "il_pp2_v3", .pp = 2, .schedule = kInterleaved, .virtual_stages = 3, .layers = 6},
    {.name = "il_pp4_v2", .pp = 4, .schedule = kInterleaved, .virtual_stages = 2, .layers = 8},
    {.name = "il_dp2_pp2_zero1",
     .dp = 2,
     .pp = 2,
     .zero = 1,
     .schedule = kInterleaved,
     .virtual_stages = 2,
     .layers = 4},
    {.name = "il_dp2_pp2_zero3",
     .dp = 2,
     .pp = 2,
     .zero = 3,
     .schedule = kInterleaved,
     .virtual_stages = 2,
     .layers = 4,
     .untied = true},
    {.name = "il_tp2_pp2_sp",
     .tp = 2,
     .pp = 2,
     .sequence_parallel = true,
     .schedule = kInterleaved,
     .virtual_stages = 2,
     .layers = 4},
    // Latent attention: its projections' gradients reduced over dp (ZeRO 3: sharded), computed
    // in a split backward's input pass (zero bubble), recomputed, across interleaved chunks; its
    // heads split by tensor parallelism (the latents' gradients summed over the group), with
    // sequence parallelism and ZeRO 1, and with the queries' projection split by heads too.
    {.name = "latent_dp2_zero3", .dp = 2, .zero = 3, .latent = true},
    {.name = "latent_tp2", .tp = 2, .latent = true},
    {.name = "latent_dp2_tp2_sp_zero1",
     .dp = 2,
     .tp = 2,
     .zero = 1,
     .sequence_parallel = true,
     .latent = true},
    {.name = "latent_tp2_pp2_zb_direct_queries",
     .tp = 2,
     .pp = 2,
     .schedule = kZeroBubble,
     .latent = true,
     .latent_direct_queries = true},
    {.name = "latent_pp2_zb", .pp = 2, .schedule = kZeroBubble, .latent = true},
    {.name = "latent_il_pp2_v2_recompute",
     .pp = 2,
     .schedule = kInterleaved,
     .virtual_stages = 2,
     .layers = 4,
     .recompute = true,
     .latent = true},
};

// Context parallelism alone and with every other axis, at a sequence length that is not a power
// of two (24 tokens: chunks of 6 at cp 2, of 3 at cp 4).
inline constexpr MeshCase kContextParallelMeshes[] = {
    {.name = "cp2", .cp = 2, .seq_len = 24},
    {.name = "cp4", .cp = 4, .seq_len = 24},
    {.name = "dp2_cp2_zero1", .dp = 2, .cp = 2, .zero = 1, .seq_len = 24},
    {.name = "cp2_zero2", .cp = 2, .zero = 2, .seq_len = 24},
    {.name = "dp2_cp2_zero3", .dp = 2, .cp = 2, .zero = 3, .seq_len = 24},
    {.name = "cp2_tp2", .tp = 2, .cp = 2, .seq_len = 24},
    // Qwen3's attention: the head norms act on each rank's rows before the ring.
    {.name = "cp2_qk_norm", .cp = 2, .qk_norm = true, .seq_len = 24},
    // A sliding window of 5 over chunks of 3: each query chunk sees its own chunk, all of the
    // one before and part of the one before that; the ring skips the blocks of older chunks.
    {.name = "cp4_window", .cp = 4, .sliding_window = 5, .seq_len = 24},
    // The window in the second block only: the ring skips blocks in that block's attention alone.
    {.name = "cp2_window_first_full", .cp = 2, .sliding_window = 5, .full_layer = 0, .seq_len = 24},
    {.name = "cp2_tp2_sp", .tp = 2, .cp = 2, .sequence_parallel = true, .seq_len = 24},
    {.name = "cp2_gemma", .cp = 2, .gemma = true, .seq_len = 24},
    // Capped scores in every block of the ring (the merge sees capped log-sum-exps).
    {.name = "cp2_softcaps", .cp = 2, .softcaps = true, .seq_len = 24},
    // PaLM's z-loss on the logits, each rank's Σ lse² over its tokens summed over the data- and
    // context-parallel ranks with the loss and ZeRO-1's gradient norm.
    {.name = "zloss_dp2_cp2_zero1",
     .dp = 2,
     .cp = 2,
     .zero = 1,
     .seq_len = 24,
     .logit_z_loss = 0.05f},
    // Every chunk turns with the long factors its whole sequence calls for.
    {.name = "cp2_longrope", .cp = 2, .longrope = true, .seq_len = 24},
    // The first block without RoPE: the ring's chunks keep their positions in the second only.
    {.name = "cp2_nope", .cp = 2, .nope_layer = 0, .seq_len = 24},
    {.name = "cp2_pp2", .pp = 2, .cp = 2, .seq_len = 24},
    {.name = "cp2_pp2_zb", .pp = 2, .cp = 2, .schedule = kZeroBubble, .seq_len = 24},
    {.name = "cp2_pp2_il",
     .pp = 2,
     .cp = 2,
     .schedule = kInterleaved,
     .virtual_stages = 2,
     .layers = 4,
     .seq_len = 24},
    {.name = "cp2_recompute", .cp = 2, .recompute = true, .seq_len = 24},
    // Documents across the ring: a query chunk's rows see the keys of another rank's chunks only
    // from their documents' starts on (with a window, from the later of the two).
    {.name = "cp4_documents", .cp = 4, .seq_len = 24, .documents = true},
    // Latent attention's value heads, narrower than its keys, around the ring.
    {.name = "latent_cp2_tp2_documents",
     .tp = 2,
     .cp = 2,
     .seq_len = 24,
     .documents = true,
     .latent = true},
    {.name = "cp2_tp2_window_documents",
     .tp = 2,
     .cp = 2,
     .sliding_window = 5,
     .seq_len = 24,
     .documents = true},
    // OLMo 2's blocks: norms after each branch only, the q and k norms over each rank's rows.
    {.name = "olmo2_dp2_cp2_zero3",
     .dp = 2,
     .cp = 2,
     .zero = 3,
     .whole_norms = true,
     .post_norms_only = true,
     .seq_len = 24},
};

// Mixture of experts with every other axis and schedule (context parallelism included), ZeRO 1
// and 3, recomputation, under both balance rules; and expert parallelism (the experts of a layer
// split over ep data-parallel ranks, tokens exchanged all-to-all) with each of them.
inline constexpr MeshCase kMixtureOfExpertsMeshes[] = {
    {.name = "moe_dp2", .dp = 2, .experts = 4},
    {.name = "moe_dp2_zero3", .dp = 2, .zero = 3, .experts = 4},
    {.name = "moe_tp2", .tp = 2, .experts = 4},
    {.name = "moe_dp2_tp2_sp_zero1",
     .dp = 2,
     .tp = 2,
     .zero = 1,
     .sequence_parallel = true,
     .experts = 4},
    {.name = "moe_pp2", .pp = 2, .experts = 4},
    {.name = "moe_zb_dp2_pp2_zero1",
     .dp = 2,
     .pp = 2,
     .zero = 1,
     .schedule = kZeroBubble,
     .experts = 4},
    {.name = "moe_il_pp2_v2",
     .pp = 2,
     .schedule = kInterleaved,
     .virtual_stages = 2,
     .layers = 4,
     .experts = 4},
    {.name = "moe_dp2_recompute", .dp = 2, .recompute = true, .experts = 4},
    {.name = "moe_bias_dp2_zero1", .dp = 2, .zero = 1, .experts = 4, .bias_balance = true},
    {.name = "moe_bias_dp2_tp2_zero3",
     .dp = 2,
     .tp = 2,
     .zero = 3,
     .experts = 4,
     .bias_balance = true},
    {.name = "moe_bias_zb_pp2",
     .pp = 2,
     .schedule = kZeroBubble,
     .experts = 4,
     .bias_balance = true},
    // Two MoE blocks per stage under a split backward with ZeRO-2: each weight pass hands on the
    // experts' gradients of input passes that may have run since.
    {.name = "moe_zb_dp2_pp2_zero2_4layers",
     .dp = 2,
     .pp = 2,
     .zero = 2,
     .schedule = kZeroBubble,
     .layers = 4,
     .untied = true,
     .experts = 4},
    {.name = "ep2_zb_pp2_zero3_4layers",
     .dp = 2,
     .pp = 2,
     .zero = 3,
     .schedule = kZeroBubble,
     .layers = 4,
     .untied = true,
     .experts = 4,
     .ep = 2},
    // GLM-4.5's routing: a dense first block on one stage, an MoE block whose biased sigmoid
    // scores' weights are scaled on the other, its experts over ep 2.
    {.name = "glm45_ep2_pp2_zero3",
     .dp = 2,
     .pp = 2,
     .zero = 3,
     .untied = true,
     .experts = 4,
     .ep = 2,
     .glm45 = true},
    // DeepSeek-V3's group-limited routing, under GLM-4.5's rule and dense first block: six experts
    // in three groups, two kept, with the micro-batch's tokens routed in pieces over sequence-
    // parallel ranks and the experts over ep 2.
    {.name = "groups_ep2_tp2_sp",
     .dp = 2,
     .tp = 2,
     .sequence_parallel = true,
     .experts = 6,
     .ep = 2,
     .glm45 = true,
     .groups = 3,
     .group_top_k = 2},
    {.name = "ep2", .dp = 2, .experts = 4, .ep = 2},
    {.name = "ep4", .dp = 4, .experts = 4, .ep = 4},
    {.name = "dp4_ep2_zero1", .dp = 4, .zero = 1, .experts = 4, .ep = 2},
    {.name = "dp4_ep2_zero3", .dp = 4, .zero = 3, .experts = 4, .ep = 2},
    {.name = "ep2_zero2", .dp = 2, .zero = 2, .experts = 4, .ep = 2},
    {.name = "ep2_tp2_sp", .dp = 2, .tp = 2, .sequence_parallel = true, .experts = 4, .ep = 2},
    {.name = "ep2_pp2", .dp = 2, .pp = 2, .experts = 4, .ep = 2},
    {.name = "ep2_zb_pp2", .dp = 2, .pp = 2, .schedule = kZeroBubble, .experts = 4, .ep = 2},
    {.name = "ep2_recompute", .dp = 2, .recompute = true, .experts = 4, .ep = 2},
    {.name = "ep2_bias_zero1", .dp = 2, .zero = 1, .experts = 4, .bias_balance = true, .ep = 2},
    // With context parallelism: a micro-batch's tokens split over the cp ranks, whose capacity
    // drops (capacity 1: about a quarter of the picks dropped), aux loss and loads are still the
    // micro-batch's; under ep the experts' gradients are summed over the cp ranks too.
    {.name = "moe_cp2_capacity", .cp = 2, .seq_len = 24, .experts = 4, .capacity_factor = 1.0f},
    {.name = "moe_cp4_capacity", .cp = 4, .seq_len = 24, .experts = 4, .capacity_factor = 1.0f},
    // The router z-loss of a micro-batch split over cp ranks is the whole micro-batch's (its Σ z²
    // travels with the picks), with the experts over ep 2.
    {.name = "moe_zloss_dp2_cp2_ep2",
     .dp = 2,
     .cp = 2,
     .seq_len = 24,
     .experts = 4,
     .ep = 2,
     .z_loss = 0.05f},
    {.name = "moe_bias_dp2_cp2_zero3",
     .dp = 2,
     .cp = 2,
     .zero = 3,
     .seq_len = 24,
     .experts = 4,
     .bias_balance = true},
    {.name = "moe_cp2_pp2_recompute",
     .pp = 2,
     .cp = 2,
     .recompute = true,
     .seq_len = 24,
     .experts = 4},
    {.name = "ep2_cp2_zero1", .dp = 2, .cp = 2, .zero = 1, .seq_len = 24, .experts = 4, .ep = 2},
    // OLMoE's query and key norms over each token's whole q and k (llama), on pipeline stages
    // under a split backward (the norms' weight gradients kept for the weight pass), with experts
    // and sequences split over data- and context-parallel ranks, and with the heads split over
    // tensor-parallel ranks under sequence parallelism.
    {.name = "moe_whole_norms_zb_pp2",
     .pp = 2,
     .schedule = kZeroBubble,
     .whole_norms = true,
     .experts = 4},
    {.name = "moe_whole_norms_dp2_cp2_ep2",
     .dp = 2,
     .cp = 2,
     .zero = 1,
     .whole_norms = true,
     .seq_len = 24,
     .experts = 4,
     .ep = 2},
    {.name = "moe_whole_norms_tp2_sp",
     .tp = 2,
     .sequence_parallel = true,
     .whole_norms = true,
     .experts = 4},
    // Qwen2-MoE's gated shared expert (llama): each rank's share of its hidden units gives part of
    // each row's gate gradient, summed over the tensor-parallel group; with a split backward, and
    // with expert parallelism and recomputation.
    {.name = "moe_gate_zb_tp2_pp2_sp",
     .tp = 2,
     .pp = 2,
     .sequence_parallel = true,
     .schedule = kZeroBubble,
     .qkv_bias = true,
     .experts = 4,
     .shared_gate = true},
    {.name = "moe_gate_ep2_tp2_recompute",
     .dp = 2,
     .tp = 2,
     .zero = 1,
     .recompute = true,
     .experts = 4,
     .ep = 2,
     .shared_gate = true},
};

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_MESH_CASES_H_
