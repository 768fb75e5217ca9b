// Hugging Face's layout of the two families (GPT2LMHeadModel, LlamaForCausalLM, and
// MixtralForCausalLM for a Llama mixture-of-experts model of Mixtral's shape) against
// Trainyard's parameter layout (worker/shape/parameters.h): tensor names, how each of our tensors
// splits into theirs, and config.json.
//
// Every mapping is a list of pieces: a block of our global tensor's rows that is one of their
// tensors, stored as is or transposed (GPT-2's Conv1D keeps [in, out]). GPT-2: qkv.w [3C, C] is
// c_attn.weight transposed, the MLP's and projections' weights likewise. Llama: qkv.w's rows are
// q_proj, k_proj, v_proj; mlp.fc.w's rows are gate_proj then up_proj. Trainyard's RoPE is the
// half-split (rotate-half) convention Hugging Face's Llama uses, so q and k rows are not
// permuted; Llama 3's RoPE scaling is config.json's rope_scaling {"rope_type": "llama3", ...}.
// Gemma (GemmaForCausalLM): Llama's tensors for a model with model.activation geglu and
// model.scale_embeddings, each RMSNorm weight stored less one (HfTensorMap::shift).
// Phi-3 (Phi3ForCausalLM, read only): Llama's model with q, k and v fused in qkv_proj and gate
// and up in gate_up_proj (HfProjections). Mixtral: the router is block_sparse_moe.gate; expert j's
// rows of moe.experts.fc.w are its w1 (gate) then w3 (up), and its [C, ffn] slab of
// moe.experts.proj.w [E, C, ffn] is its w2. Mixtral's shape: every block an MoE block, no shared
// experts, softmax scores renormalised over the top k (normalize_top_k), no selection bias.
// Qwen3-MoE (model.qk_norm), OLMoE (qk_norm_span projection: q_norm and k_norm the whole
// projection's width) and Qwen2-MoE (qkv_bias and gated shared experts: mlp.shared_expert and
// mlp.shared_expert_gate) name the router mlp.gate and expert j's projections
// mlp.experts.j.gate_proj, up_proj and down_proj. OLMo 2 (Olmo2ForCausalLM) is a dense Llama
// model with OLMoE's query and key norms and model.pre_norms false: no input_layernorm, its
// post_attention_layernorm and post_feedforward_layernorm the branches' outputs' norms
// (attn.post_norm.w, mlp.post_norm.w). GLM (GlmForCausalLM) is a Llama model with biases on q, k
// and v, partial RoPE in neighbouring pairs (its q and k rows interleaved: HfPiece::head_rows)
// and gate_up_proj; GLM-4 (Glm4ForCausalLM) adds Gemma 2's four norms under its own names. The
// engine's internal vocabulary padding never reaches a checkpoint, so none shows. ERNIE 4.5
// (Ernie4_5ForCausalLM) and Helium (HeliumForCausalLM), read only, are Llama's model with RoPE
// in GLM's neighbouring pairs; Seed-OSS (SeedOssForCausalLM, read only) is Qwen2's. DeepSeek-V3
// (DeepseekV3ForCausalLM; Kimi K2's kimi_k2) holds latent attention (q_a_proj, q_a_layernorm,
// q_b_proj or q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj): each query head
// stored [nope | rope] where ours is [rope | nope], its rotary rows and the shared rotary key's in
// neighbouring pairs (HfPiece's our_rope_at and their_rope_at), over GLM-4.5's experts;
// DeepSeek-V2 (DeepseekV2ForCausalLM) the same attention, its RoPE always in pairs, over softmax
// routing without a selection bias.
//
// Threading: plain functions.
#ifndef TRAINYARD_WORKER_CONVERT_HF_FORMAT_H_
#define TRAINYARD_WORKER_CONVERT_HF_FORMAT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/model_config.h"
#include "worker/convert/safetensors.h"

namespace trainyard::worker::convert {

// Rows [row_begin, row_begin + rows) of one of our tensors, as the Hugging Face tensor `name`.
struct HfPiece {
  std::string name;
  int64_t row_begin = 0;
  int64_t rows = 0;
  bool transpose = false;  // theirs is [cols, rows] of ours
  // Theirs' shape where the rows do not imply it (the same elements in the same order): GraniteMoE
  // stacks its experts' weights as [experts, rows, cols]. Empty: HfShape's.
  std::vector<int64_t> shape = {};
  // GLM's RoPE turns neighbouring dimensions (2i, 2i + 1) of a head where ours turns i and
  // i + r/2: within each head of `head_rows` rows, theirs holds our first `rope_rows` (r) rows
  // interleaved, our row i as their row 2i and our row r/2 + i as their row 2i + 1; the head's
  // other rows in place. The query's and key's scores are the same either way. 0: our order.
  int64_t head_rows = 0, rope_rows = 0;
  // Where in each head the rotary rows start, in ours and in theirs (the head's other rows keep
  // their order around them): DeepSeek's latent attention stores a query head as [nope | rope]
  // where ours is [rope | nope], and kv_a_proj_with_mqa as the latent, then the rotary key.
  int64_t our_rope_at = 0, their_rope_at = 0;
  // Whether theirs holds the rotary rows in neighbouring pairs (above); false: in our order,
  // only moved (DeepSeek's rope_interleave false).
  bool pairs = true;
};

// One of our global tensors (the ParameterLayout name and shape) and the pieces that make it.
// Ours = theirs + shift: Gemma stores each RMSNorm weight less one (its norm multiplies by
// 1 + weight), so its norms' shift is 1; every other tensor's is 0.
struct HfTensorMap {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<HfPiece> pieces;
  float shift = 0.0f;
};

// The shape of `piece` of `tensor` in Hugging Face's layout (of a 3-d tensor [n, a, b], a piece
// of r rows is [r·a, b]).
std::vector<int64_t> HfShape(const HfTensorMap& tensor, const HfPiece& piece);
// Elements of one row of `tensor` (the product of its dimensions after the first).
int64_t RowElements(const HfTensorMap& tensor);
// The row of `piece`'s Hugging Face tensor that holds row `row` of the piece (counted from the
// piece's row_begin): `row` itself unless the piece's heads are interleaved (HfPiece::head_rows).
int64_t TheirRow(const HfPiece& piece, int64_t row);
// Whether `piece` is not our rows as they are: transposed or interleaved.
bool Reorders(const HfPiece& piece);

// How a Llama-family directory stores the attention's and MLP's input projections: q_proj,
// k_proj, v_proj and gate_proj, up_proj apart (Llama's, and every layout Trainyard writes), or
// fused as Phi-3's self_attn.qkv_proj (q, k, v rows in that order: our qkv.w) and
// mlp.gate_up_proj (gate rows, then up rows: our mlp.fc.w), or GLM's: the attention's apart, the
// MLP's fused, or Granite 4.0's: the attention's apart, the MLP as shared_mlp.input_linear (gate
// rows, then up rows) and shared_mlp.output_linear.
enum class HfProjections { kSeparate, kFused, kFusedMlp, kGraniteSharedMlp };

// How a mixture-of-experts block names and stores its experts: Mixtral's (block_sparse_moe.gate,
// block_sparse_moe.experts.J.w1, w3, w2), Qwen3-MoE's and OLMoE's (mlp.gate,
// mlp.experts.J.gate_proj, up_proj, down_proj), Qwen2-MoE's (Qwen3-MoE's, and a shared expert
// mlp.shared_expert.* gated by mlp.shared_expert_gate), GraniteMoE's (each kind's weights
// stacked in one tensor per block: block_sparse_moe.input_linear, output_linear), or GLM-4.5's
// (Qwen3-MoE's, ungated shared experts mlp.shared_experts.*, and the router's selection bias
// mlp.gate.e_score_correction_bias; DeepSeek-V3's too), or ERNIE 4.5's (GLM-4.5's, the bias [1,
// experts] as mlp.moe_statics.e_score_correction_bias), or MiniMax-M2's (Mixtral's, and the
// selection bias block_sparse_moe.e_score_correction_bias), or DeepSeek-V2's (GLM-4.5's without
// the selection bias).
enum class HfExperts {
  kMixtral,
  kQwen3Moe,
  kQwen2Moe,
  kGraniteMoe,
  kGlm4Moe,
  kErnieMoe,
  kMiniMaxM2,
  kDeepseekV2
};

// How a directory stores the model its config.json describes: its model_type, the projections,
// the experts, and whether its tensors are the language model of a multimodal checkpoint
// (Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration: language_model.model.X, or
// model.language_model.X as newer transformers save it, beside a vision tower and a projector
// Trainyard does not read).
struct HfLayout {
  std::string model_type;
  HfProjections projections = HfProjections::kSeparate;
  HfExperts experts = HfExperts::kMixtral;
  bool multimodal = false;
  // RoPE in neighbouring pairs (GLM's, ERNIE 4.5's, Helium's): q's and k's rows interleaved
  // (HfPiece::head_rows).
  bool interleaved_rope = false;
  // GLM's and GLM-4's (GlmForCausalLM, Glm4ForCausalLM): interleaved RoPE, the MLP's projections
  // fused, and GLM-4's norms of the branches' outputs post_self_attn_layernorm and
  // post_mlp_layernorm, its MLP's input's post_attention_layernorm.
  bool glm = false;
  // GLM-4.5's multi-token prediction layers, stored after the model's as model.layers.N.* with N
  // from this on, which the causal LM does not use: not read (0: every stored layer is read).
  int unread_layers_from = 0;
  // ERNIE 4.5's multi-token prediction tensors (model.mtp_*): names with this prefix are not read
  // (empty: none).
  std::string unread_prefix;
};

// The name a stored tensor is looked up by among HfTensors' pieces: GPT-2's without its
// "transformer." prefix, a multimodal checkpoint's language model's as the text model's
// (model.X, lm_head.X); none for the vision tower's and the projector's tensors, the layers from
// layout.unread_layers_from on and the names under layout.unread_prefix, which are not read.
std::optional<std::string> HfLookupName(const std::string& stored, config::ModelFamily family,
                                        const HfLayout& layout);

// Every tensor of `model` stored as `layout` says, in our layout's order (without a layout, as
// Trainyard writes it: HfExportLayout's). UNIMPLEMENTED, naming the field, for a model no layout
// above holds: a mixture-of-experts model of none of Mixtral's, GraniteMoE's, Qwen3-MoE's,
// OLMoE's or Qwen2-MoE's shapes, query and key norms over the whole projection or blocks without
// norms before their branches outside OLMoE's and OLMo 2's, or scores, caps or norms outside
// Gemma's; INVALID_ARGUMENT for gated shared experts in any
// experts' layout but Qwen2-MoE's, or that layout without them.
[[nodiscard]] absl::StatusOr<std::vector<HfTensorMap>> HfTensors(const config::ModelConfig& model,
                                                                 const HfLayout& layout);
[[nodiscard]] absl::StatusOr<std::vector<HfTensorMap>> HfTensors(const config::ModelConfig& model);

// The projections Trainyard writes `model` with: Phi-3's fused ones for a model that only
// Phi3ForCausalLM describes (partial RoPE or LongRoPE), else separate ones.
HfProjections HfExportProjections(const config::ModelConfig& model);
// The layout Trainyard writes `model` in: HfExportProjections' projections, and its experts in
// GraniteMoE's layout with Granite's multipliers (HfConfigJson writes it as
// GraniteMoeForCausalLM), in Qwen2-MoE's with gated shared experts, in Qwen3-MoE's with query
// and key norms (OLMoE's too), else in Mixtral's. model_type is left empty.
HfLayout HfExportLayout(const config::ModelConfig& model);

// Copies piece `piece` of our tensor `ours` (the tensor's global values) into `theirs`, laid
// out as Hugging Face's tensor, less the tensor's shift; and back, plus the shift.
void ToHf(const HfTensorMap& tensor, const HfPiece& piece, const float* ours, float* theirs);
void FromHf(const HfTensorMap& tensor, const HfPiece& piece, const float* theirs, float* ours);

// OK when a config.json Trainyard writes describes `model`; UNIMPLEMENTED, naming the field,
// for a sliding window in some blocks only that is not Qwen's max_window_layers (a model with
// qkv_bias or qk_norm whose full-attention blocks come first), or for partial RoPE or LongRoPE
// outside Phi-3's layout. What HfTensors refuses is refused there.
[[nodiscard]] absl::Status CheckHfWritable(const config::ModelConfig& model);

// config.json for `model` with `dtype` as its torch_dtype.
std::string HfConfigJson(const config::ModelConfig& model, TensorDtype dtype);

// The model a config.json describes (`source` names it in errors), and in `layout` (when given)
// how its tensors store it. A multimodal Gemma 3 config (model_type gemma3) describes its
// language model: text_config over transformers' Gemma3TextConfig defaults, read as gemma3_text;
// a Mistral 3 one (mistral3) likewise over MistralConfig's, read as mistral.
// INVALID_ARGUMENT, naming the file and field, for another model_type or a field missing or out
// of range.
[[nodiscard]] absl::StatusOr<config::ModelConfig> ModelFromHfConfig(const std::string& json,
                                                                    const std::string& source,
                                                                    HfLayout* layout = nullptr);

// The blocks a config.json's quantization_config says its FP8 weights are scaled in: {rows,
// cols} of weight_block_size for quant_method "fp8" (DeepSeek's fine-grained format, as Qwen3's
// FP8 releases and MiniMax-M2 use it: each F8_E4M3 weight beside its weight_scale_inv), or
// {0, 0} without a quantization_config. Another quant_method, format or block shape is
// INVALID_ARGUMENT naming the field.
[[nodiscard]] absl::StatusOr<std::array<int64_t, 2>> Fp8WeightBlock(const std::string& json,
                                                                    const std::string& source);

// The end-of-sequence ids of a config.json or generation_config.json (`source` names it in
// errors): its eos_token_id, a whole number or a list of them, each below `vocab`; none when the
// field is missing or null. INVALID_ARGUMENT, naming the file and field, otherwise.
[[nodiscard]] absl::StatusOr<std::vector<int32_t>> EndOfSequenceIds(const std::string& json,
                                                                    const std::string& source,
                                                                    int vocab);

}  // namespace trainyard::worker::convert

#endif  // TRAINYARD_WORKER_CONVERT_HF_FORMAT_H_
