// Specs that must be refused: each with the exact field path, position and a phrase of the reason,
// and always one line. Then the hostile ones (deep nesting, alias bombs, huge files), which must
// also be refused quickly, and random corruptions of a good spec, which must never crash.
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "config/spec.h"
#include "gtest/gtest.h"

namespace trainyard::config {
namespace {

struct BadSpec {
  const char* label;
  std::string yaml;
  std::string location;  // "line:column"
  std::string path;
  std::string reason_part;
};

// A valid spec that the cases below each break in one place.
std::string Base(const std::string& training, const std::string& data = "") {
  return absl::StrCat("name: job\nmodel:\n  preset: gpt2-debug\n", data, "training:\n", training);
}

// The gpt2-debug model (2 layers, 4 heads, ffn 256) with extra top-level sections from line 4.
std::string WithSections(const std::string& sections) {
  return absl::StrCat("name: job\nmodel:\n  preset: gpt2-debug\n", sections);
}

std::string ManyLabels(int count) {
  std::string labels = "labels: {";
  for (int i = 0; i < count; ++i) absl::StrAppend(&labels, i ? ", " : "", "k", i, ": v");
  return labels + "}\n";
}

// The gpt2-debug model (2 layers, ffn 256) with `moe` on line 4 and extra sections from line 5.
std::string WithMoe(const std::string& moe, const std::string& sections = "") {
  return absl::StrCat("name: job\nmodel:\n  preset: gpt2-debug\n  moe: ", moe, "\n", sections);
}

// model.moe: its fields, and the mesh rules it brings.
std::vector<BadSpec> MoeBadSpecs() {
  return {
      {"moe without experts", WithMoe("{top_k: 2}"), "4:8", "model.moe.experts",
       "required: the routed experts of each MoE block"},
      {"moe with zero experts", WithMoe("{experts: 0}"), "4:18", "model.moe.experts",
       "must be at least 1 (a dense model leaves out model.moe)"},
      {"moe with negative experts", WithMoe("{experts: -2}"), "4:18", "model.moe.experts",
       "must be between 1 and 65536, got -2"},
      {"moe with too many experts", WithMoe("{experts: 65537}"), "4:18", "model.moe.experts",
       "must be between 1 and 65536, got 65537"},
      {"moe as a number", WithMoe("8"), "4:8", "model.moe", "expected a mapping"},
      {"moe field typo", WithMoe("{experts: 4, topk: 2}"), "4:21", "model.moe.topk",
       "unknown field; did you mean 'top_k'?"},
      {"top_k over experts", WithMoe("{experts: 4, top_k: 5}"), "4:28", "model.moe.top_k",
       "must be between 1 and experts 4, got 5"},
      {"top_k zero", WithMoe("{experts: 4, top_k: 0}"), "4:28", "model.moe.top_k",
       "must be between 1 and experts 4, got 0"},
      {"negative shared experts", WithMoe("{experts: 4, shared_experts: -1}"), "4:37",
       "model.moe.shared_experts", "must be at least 0, got -1"},
      {"shared gate without shared experts", WithMoe("{experts: 4, shared_gate: true}"), "4:34",
       "model.moe.shared_gate", "gates the shared experts, and model.moe.shared_experts is 0"},
      {"shared gate on gpt2", WithMoe("{experts: 4, shared_experts: 1, shared_gate: true}"), "4:53",
       "model.moe.shared_gate", "is the llama family's (GPT-2's shared experts have biases)"},
      {"every beyond the layers", WithMoe("{experts: 4, every: 3}"), "4:28", "model.moe.every",
       "must be between 1 and layers 2, got 3"},
      {"every zero", WithMoe("{experts: 4, every: 0}"), "4:28", "model.moe.every",
       "must be between 1 and layers 2, got 0"},
      {"every block kept dense", WithMoe("{experts: 4, dense_first: 2}"), "4:34",
       "model.moe.dense_first",
       "must be at least 0 and leave an MoE block among the 2 (every 1), got 2"},
      {"dense_first negative", WithMoe("{experts: 4, dense_first: -1}"), "4:34",
       "model.moe.dense_first",
       "must be at least 0 and leave an MoE block among the 2 (every 1), got -1"},
      {"routed scale zero", WithMoe("{experts: 4, routed_scale: 0}"), "4:35",
       "model.moe.routed_scale", "must be positive, got 0"},
      {"routed scale as a word", WithMoe("{experts: 4, routed_scale: big}"), "4:35",
       "model.moe.routed_scale", "expected a number, got 'big'"},
      {"groups not dividing the experts", WithMoe("{experts: 4, groups: 3}"), "4:29",
       "model.moe.groups", "must divide experts 4 into groups of at least two (or be 1), got 3"},
      {"groups of one expert", WithMoe("{experts: 4, groups: 4}"), "4:29", "model.moe.groups",
       "must divide experts 4 into groups of at least two (or be 1), got 4"},
      {"more groups kept than there are", WithMoe("{experts: 4, groups: 2, group_top_k: 3}"),
       "4:45", "model.moe.group_top_k", "must be between 0 (every group) and groups 2, got 3"},
      {"kept groups short of top_k", WithMoe("{experts: 4, top_k: 3, groups: 2, group_top_k: 1}"),
       "4:55", "model.moe.group_top_k", "keeps 1 of 2 groups of 2 experts, fewer than top_k 3"},
      {"unknown group score", WithMoe("{experts: 4, groups: 2, group_top_k: 1, group_score: top2}"),
       "4:61", "model.moe.group_score", "unknown group score 'top2'; expected top2_sum or max"},
      {"negative router z-loss", WithMoe("{experts: 4, z_loss_coeff: -0.1}"), "4:35",
       "model.moe.z_loss_coeff", "must be zero or positive, got -0.1"},
      {"expert ffn zero", WithMoe("{experts: 4, ffn: 0}"), "4:26", "model.moe.ffn",
       "must be at least 1, got 0"},
      {"expert ffn as a word", WithMoe("{experts: 4, ffn: wide}"), "4:26", "model.moe.ffn",
       "expected an integer, got 'wide'"},
      {"score typo", WithMoe("{experts: 4, score: softmx}"), "4:28", "model.moe.score",
       "unknown router score 'softmx'; did you mean 'softmax'?"},
      {"unknown score", WithMoe("{experts: 4, score: relu}"), "4:28", "model.moe.score",
       "unknown router score 'relu'; expected softmax or sigmoid"},
      {"unknown balance rule", WithMoe("{experts: 4, balance: none}"), "4:30", "model.moe.balance",
       "unknown balance rule 'none'; expected aux_loss or bias"},
      {"normalize_top_k as a word", WithMoe("{experts: 4, normalize_top_k: yes}"), "4:38",
       "model.moe.normalize_top_k", "expected true or false, got 'yes'"},
      {"negative aux_loss_coeff", WithMoe("{experts: 4, aux_loss_coeff: -0.1}"), "4:37",
       "model.moe.aux_loss_coeff", "must be zero or positive, got -0.1"},
      {"zero bias_update_rate", WithMoe("{experts: 4, balance: bias, bias_update_rate: 0}"), "4:54",
       "model.moe.bias_update_rate", "must be positive, got 0"},
      {"negative capacity_factor", WithMoe("{experts: 4, capacity_factor: -1}"), "4:38",
       "model.moe.capacity_factor", "must be 0 (dropless) or positive, got -1"},
      {"infinite capacity_factor", WithMoe("{experts: 4, capacity_factor: inf}"), "4:38",
       "model.moe.capacity_factor", "expected a finite number"},
      {"expert ffn not divisible by tp",
       WithMoe("{experts: 4, ffn: 102}",
               "resources: {devices_per_node: 4}\nparallelism: {tp: 4}\n"),
       "6:19", "parallelism.tp",
       "model.moe.ffn 102 is not divisible by tp 4 (tensor parallelism splits every expert's MLP "
       "evenly)"},
      {"ep without moe",
       WithSections("resources: {devices_per_node: 2}\nparallelism: {dp: 2, ep: 2}\n"), "5:26",
       "parallelism.ep", "ep 2 needs a mixture-of-experts model (model.moe)"},
      {"ep below one", WithSections("parallelism: {ep: 0}\n"), "4:19", "parallelism.ep",
       "must be between 1 and 65536, got 0"},
      {"ep not dividing the experts",
       WithMoe("{experts: 3}", "resources: {devices_per_node: 2}\nparallelism: {dp: 2, ep: 2}\n"),
       "6:26", "parallelism.ep",
       "ep 2 does not divide model.moe.experts 3 (each rank of an expert-parallel group holds "
       "experts / ep)"},
      {"ep not dividing dp",
       WithMoe("{experts: 4}", "resources: {devices_per_node: 2}\nparallelism: {dp: 2, ep: 4}\n"),
       "6:26", "parallelism.ep",
       "ep 4 does not divide dp 2 (expert-parallel groups are drawn from the data-parallel "
       "ranks)"},
      {"moe on GPUs", WithMoe("{experts: 4}", "resources: {kind: gpu}\n"), "4:8", "model.moe",
       "needs CPU ranks: the MoE layers have not run on a GPU yet (leave out model.moe, or write "
       "resources.kind: cpu)"},
  };
}

// The run sections: parallelism, resources, checkpoint, fault_tolerance, priority, labels.
std::vector<BadSpec> RunSectionBadSpecs() {
  return {
      {"world size: dp", WithSections("parallelism:\n  dp: 2\n"), "5:7", "parallelism.dp",
       "dp 2 × tp 1 × pp 1 = 2 ranks, but resources provide 1 (nodes 1 × devices_per_node 1); "
       "dp 1 would fit"},
      {"world size: tp",
       WithSections("resources: {devices_per_node: 3}\nparallelism: {dp: 3, tp: 2}\n"), "5:26",
       "parallelism.tp",
       "= 6 ranks, but resources provide 3 (nodes 1 × devices_per_node 3); tp 1 would fit"},
      {"world size: no single factor",
       WithSections(
           "resources: {nodes: 3, devices_per_node: 2}\nparallelism: {dp: 2, tp: 2, pp: 2}\n"),
       "5:19", "parallelism.dp", "dp 2 × tp 2 × pp 2 = 8 ranks, but resources provide 6"},
      {"world size: cp", WithSections("resources: {devices_per_node: 2}\nparallelism: {cp: 4}\n"),
       "5:19", "parallelism.cp",
       "dp 1 × cp 4 × tp 1 × pp 1 = 4 ranks, but resources provide 2 (nodes 1 × devices_per_node "
       "2); cp 2 would fit"},
      {"cp below one", WithSections("parallelism: {cp: 0}\n"), "4:19", "parallelism.cp",
       "must be between 1 and 65536, got 0"},
      {"sequence not in 2 × cp chunks",
       WithSections("resources: {devices_per_node: 2}\nparallelism: {cp: 2}\n"
                    "training: {seq_len: 30}\n"),
       "5:19", "parallelism.cp",
       "training.seq_len 30 is not divisible by 2 × cp = 4 (each sequence is cut into 2 · cp "
       "equal chunks, two per rank)"},
      {"sequence parallelism: a cp share's tokens over tp",
       WithSections("resources: {devices_per_node: 8}\nparallelism: {cp: 2, tp: 4, "
                    "sequence_parallel: true}\ntraining: {batch: 1, seq_len: 4}\n"),
       "5:48", "parallelism.sequence_parallel",
       "2 tokens per micro-batch (1 × 2 of cp 2) do not split over tp 4"},
      {"heads not divisible by tp",
       WithSections("resources: {devices_per_node: 3}\nparallelism: {dp: 1, tp: 3}\n"), "5:26",
       "parallelism.tp", "model.heads 4 is not divisible by tp 3"},
      {"kv_heads not divisible by tp",
       "name: job\nmodel:\n  preset: llama-debug\nresources: {devices_per_node: 4}\n"
       "parallelism: {tp: 4}\n",
       "5:19", "parallelism.tp", "model.kv_heads 2 is not divisible by tp 4"},
      {"tp across nodes", WithSections("resources: {nodes: 2}\nparallelism: {tp: 2}\n"), "5:19",
       "parallelism.tp",
       "tp 2 does not divide resources.devices_per_node 1 (a tensor-parallel group must stay "
       "inside one node)"},
      {"sequence parallelism: tokens over tp",
       WithSections("resources: {devices_per_node: 2}\nparallelism: {tp: 2, sequence_parallel: "
                    "true}\ntraining: {batch: 1, seq_len: 15}\n"),
       "5:41", "parallelism.sequence_parallel",
       "15 tokens per micro-batch (1 × 15) do not split over tp 2"},
      {"pp over layers", WithSections("resources: {devices_per_node: 4}\nparallelism: {pp: 4}\n"),
       "5:19", "parallelism.pp", "pp 4 exceeds model.layers 2"},
      {"batch not divisible by dp",
       WithSections(
           "resources: {devices_per_node: 3}\nparallelism: {dp: 3}\ntraining: {batch: 8}\n"),
       "6:19", "training.batch", "batch 8 is not divisible by dp 3"},
      {"batch not divisible by dp x micro_batch",
       WithSections("resources: {devices_per_node: 2}\nparallelism: {dp: 2}\n"
                    "training: {batch: 12, micro_batch: 4}\n"),
       "6:36", "training.micro_batch", "batch 12 is not divisible by dp 2 × micro_batch 4 = 8"},
      {"vocab not divisible by tp",
       "name: job\nmodel:\n  preset: gpt2-debug\n  vocab: 250\nresources: {devices_per_node: 4}\n"
       "parallelism: {tp: 4}\n",
       "6:19", "parallelism.tp", "model.vocab 250 is not divisible by tp 4"},
      {"tied embedding across stages under ZeRO-2",
       WithSections("resources: {devices_per_node: 4}\nparallelism: {dp: 2, pp: 2, zero: 2}\n"),
       "5:35", "parallelism.zero", "ZeRO-2 cannot keep a token embedding tied across pipeline"},
      {"unknown schedule",
       WithSections("resources: {devices_per_node: 2}\nparallelism: {pp: 2, schedule: gpipe}\n"),
       "5:32", "parallelism.schedule",
       "unknown pipeline schedule 'gpipe'; expected 1f1b, interleaved, zero-bubble or auto"},
      {"schedule typo",
       WithSections(
           "resources: {devices_per_node: 2}\nparallelism: {pp: 2, schedule: zero_bubble}\n"),
       "5:32", "parallelism.schedule", "did you mean 'zero-bubble'?"},
      {"zero-bubble without a pipeline", WithSections("parallelism: {schedule: zero-bubble}\n"),
       "4:25", "parallelism.schedule", "zero-bubble needs pp > 1"},
      {"zero-bubble with recompute",
       "name: job\nmodel:\n  preset: gpt2-debug\n  recompute: true\n"
       "resources: {devices_per_node: 2}\nparallelism: {pp: 2, schedule: zero-bubble}\n",
       "6:32", "parallelism.schedule", "cannot run with model.recompute"},
      {"zero-bubble with fewer micro-batches than stages",
       WithSections(
           "resources: {devices_per_node: 2}\nparallelism: {pp: 2, schedule: zero-bubble}\n"
           "training: {batch: 2, micro_batch: 2}\n"),
       "6:35", "training.micro_batch",
       "zero-bubble needs at least pp = 2 micro-batches per step; batch 2 / dp 1 / micro_batch 2 "
       "gives 1"},
      {"virtual stages without interleaving",
       WithSections("resources: {devices_per_node: 2}\nparallelism: {pp: 2, virtual_stages: 2}\n"),
       "5:38", "parallelism.virtual_stages",
       "virtual_stages 2 needs schedule: interleaved (the only schedule with several model chunks "
       "per rank), not 1f1b"},
      {"virtual stages under an automatic schedule",
       WithSections("resources: {devices_per_node: 2}\n"
                    "parallelism: {pp: 2, virtual_stages: 2, schedule: auto}\n"),
       "5:38", "parallelism.virtual_stages",
       "with schedule: auto the planner chooses virtual_stages"},
      {"virtual stages under zero-bubble",
       WithSections("resources: {devices_per_node: 2}\n"
                    "parallelism: {pp: 2, schedule: zero-bubble, virtual_stages: 2}\n"),
       "5:61", "parallelism.virtual_stages",
       "needs schedule: interleaved (the only schedule with several model chunks per rank), not "
       "zero-bubble"},
      {"interleaved without virtual stages",
       WithSections(
           "resources: {devices_per_node: 2}\nparallelism: {pp: 2, schedule: interleaved}\n"
           "training: {batch: 8, micro_batch: 2}\n"),
       "5:32", "parallelism.virtual_stages",
       "interleaved needs virtual_stages of at least 2 (model chunks per pipeline rank), got 1"},
      {"interleaved over one virtual stage",
       WithSections("resources: {devices_per_node: 2}\n"
                    "parallelism: {pp: 2, schedule: interleaved, virtual_stages: 1}\n"
                    "training: {batch: 8, micro_batch: 2}\n"),
       "5:61", "parallelism.virtual_stages",
       "interleaved needs virtual_stages of at least 2 (model chunks per pipeline rank), got 1"},
      {"interleaved without a pipeline",
       WithSections("parallelism: {schedule: interleaved, virtual_stages: 2}\n"), "4:25",
       "parallelism.schedule", "interleaved needs pp > 1"},
      {"interleaved over fewer layers than chunks",
       WithSections("resources: {devices_per_node: 2}\n"
                    "parallelism: {pp: 2, schedule: interleaved, virtual_stages: 2}\n"
                    "training: {batch: 8, micro_batch: 2}\n"),
       "5:61", "parallelism.virtual_stages",
       "model.layers 2 do not split into pp 2 × virtual_stages 2 = 4 chunks of equal size"},
      {"interleaved over layers in unequal chunks",
       "name: job\nmodel:\n  preset: gpt2-debug\n  layers: 6\nresources: {devices_per_node: 2}\n"
       "parallelism: {pp: 2, schedule: interleaved, virtual_stages: 2}\n"
       "training: {batch: 8, micro_batch: 2}\n",
       "6:61", "parallelism.virtual_stages",
       "model.layers 6 do not split into pp 2 × virtual_stages 2 = 4 chunks of equal size"},
      {"interleaved with fewer micro-batches than stages",
       "name: job\nmodel:\n  preset: gpt2-debug\n  layers: 4\nresources: {devices_per_node: 2}\n"
       "parallelism: {pp: 2, schedule: interleaved, virtual_stages: 2}\n"
       "training: {batch: 2, micro_batch: 2}\n",
       "7:35", "training.micro_batch",
       "interleaved runs micro-batches in rounds of pp = 2 and needs a multiple of it per step; "
       "batch 2 / dp 1 / micro_batch 2 gives 1"},
      {"interleaved with micro-batches in a partial round",
       "name: job\nmodel:\n  preset: gpt2-debug\n  layers: 4\nresources: {devices_per_node: 2}\n"
       "parallelism: {pp: 2, schedule: interleaved, virtual_stages: 2}\n"
       "training: {batch: 6, micro_batch: 2}\n",
       "7:35", "training.micro_batch", "batch 6 / dp 1 / micro_batch 2 gives 3"},
      {"interleaved with a partial round per replica",
       "name: job\nmodel:\n  preset: gpt2-debug\n  layers: 4\nresources: {devices_per_node: 4}\n"
       "parallelism: {dp: 2, pp: 2, schedule: interleaved, virtual_stages: 2}\n"
       "training: {batch: 12, micro_batch: 2}\n",
       "7:36", "training.micro_batch", "batch 12 / dp 2 / micro_batch 2 gives 3"},
      {"interleaved with the whole batch in one micro-batch",
       "name: job\nmodel:\n  preset: gpt2-debug\n  layers: 4\nresources: {devices_per_node: 2}\n"
       "parallelism: {pp: 2, schedule: interleaved, virtual_stages: 2}\n",
       "6:32", "training.micro_batch", "batch 8 / dp 1 / micro_batch 8 gives 1"},
      {"zero stage", WithSections("parallelism: {zero: 4}\n"), "4:21", "parallelism.zero",
       "ZeRO stage must be 0, 1, 2 or 3, got 4"},
      {"zero dp", WithSections("parallelism: {dp: 0}\n"), "4:19", "parallelism.dp",
       "must be between 1 and 65536, got 0"},
      {"parallelism word", WithSections("parallelism: manual\n"), "4:14", "parallelism",
       "expected auto or a mapping of dp, tp, pp, zero, got 'manual'"},
      {"auto finds no mesh", WithSections("resources: {devices_per_node: 3}\nparallelism: auto\n"),
       "5:14", "parallelism",
       "auto: no dp × tp × pp split of the 3 ranks fits the model and batch (with dp 3: "
       "training.batch: batch 8 is not divisible by dp 3"},
      {"parallelism typo", WithSections("parallelism: {dq: 2}\n"), "4:15", "parallelism.dq",
       "did you mean 'dp'?"},
      {"device kind typo", WithSections("resources: {kind: gpuu}\n"), "4:19", "resources.kind",
       "unknown device kind 'gpuu'; did you mean 'gpu'?"},
      {"zero nodes", WithSections("resources:\n  nodes: 0\n"), "5:10", "resources.nodes",
       "must be between 1 and 4096, got 0"},
      {"devices as word", WithSections("resources:\n  devices_per_node: two\n"), "5:21",
       "resources.devices_per_node", "expected an integer, got 'two'"},
      {"checkpoint without dir", WithSections("checkpoint:\n  every_steps: 100\n"), "5:3",
       "checkpoint.dir", "required"},
      {"checkpoint empty dir", WithSections("checkpoint: {dir: \"\"}\n"), "4:19", "checkpoint.dir",
       "must not be empty"},
      {"checkpoint every zero", WithSections("checkpoint: {dir: ckpt, every_steps: 0}\n"), "4:38",
       "checkpoint.every_steps", "must be at least 1 or auto, got 0"},
      {"checkpoint every word", WithSections("checkpoint: {dir: ckpt, every_steps: sometimes}\n"),
       "4:38", "checkpoint.every_steps", "expected an integer or auto, got 'sometimes'"},
      {"checkpoint keep zero", WithSections("checkpoint: {dir: ckpt, keep: 0}\n"), "4:31",
       "checkpoint.keep", "must be between 1 and 1000, got 0"},
      {"negative max_restarts", WithSections("fault_tolerance:\n  max_restarts: -1\n"), "5:17",
       "fault_tolerance.max_restarts", "must be between 0 and 1000, got -1"},
      {"min_nodes over nodes",
       WithSections(
           "resources: {nodes: 2}\nparallelism: {dp: 2}\nfault_tolerance: {min_nodes: 3}\n"),
       "6:30", "fault_tolerance.min_nodes", "must be between 1 and resources.nodes 2, got 3"},
      {"max_nodes under nodes",
       WithSections(
           "resources: {nodes: 2}\nparallelism: {dp: 2}\nfault_tolerance: {max_nodes: 1}\n"),
       "6:30", "fault_tolerance.max_nodes", "must be between resources.nodes 2 and 4096, got 1"},
      {"max_nodes with no larger mesh",
       WithSections("training: {batch: 4, seq_len: 16}\nresources: {nodes: 2}\nparallelism: {dp: "
                    "2}\nfault_tolerance: {max_nodes: 3}\n"),
       "7:30", "fault_tolerance.max_nodes",
       "the job cannot grow: no size from 3 to 3 nodes has a valid mesh"},
      {"min_nodes zero", WithSections("fault_tolerance: {min_nodes: 0}\n"), "4:30",
       "fault_tolerance.min_nodes", "must be at least 1, got 0"},
      {"heartbeat timeout too short", WithSections("fault_tolerance: {heartbeat_timeout_s: 0.5}\n"),
       "4:40", "fault_tolerance.heartbeat_timeout_s", "must be between 1 and 3600 seconds"},
      {"jitter over one", WithSections("fault_tolerance: {backoff_jitter: 2}\n"), "4:35",
       "fault_tolerance.backoff_jitter", "must be between 0 and 1, got 2"},
      {"cause budget over max_restarts",
       WithSections("fault_tolerance: {max_restarts: 2, max_restarts_by_cause: {hang: 3}}\n"),
       "4:66", "fault_tolerance.max_restarts_by_cause.hang",
       "must be between 0 and max_restarts 2, got 3"},
      {"unknown cause", WithSections("fault_tolerance: {max_restarts_by_cause: {flaky: 1}}\n"),
       "4:43", "fault_tolerance.max_restarts_by_cause.flaky", "unknown field"},
      {"hang floor zero", WithSections("fault_tolerance: {hang_floor_s: 0}\n"), "4:33",
       "fault_tolerance.hang_floor_s", "must be between 1 s and 86400 s, got 0 s"},
      {"auto bounds reversed",
       WithSections("checkpoint: {dir: ckpt, min_every_steps: 50, max_every_steps: 20}\n"), "4:63",
       "checkpoint.max_every_steps", "must be between min_every_steps 50 and 1000000000, got 20"},
      {"priority out of range", WithSections("priority: 5000\n"), "4:11", "priority",
       "must be between -1000 and 1000, got 5000"},
      {"priority word", WithSections("priority: high\n"), "4:11", "priority",
       "expected an integer, got 'high'"},
      {"labels list", WithSections("labels: [a, b]\n"), "4:9", "labels",
       "expected a mapping of strings to strings, got a sequence"},
      {"nested label", WithSections("labels: {team: {a: b}}\n"), "4:16", "labels.team",
       "expected a string, got a mapping"},
      {"bad label key", WithSections("labels: {\"bad key!\": x}\n"), "4:22", "labels.'bad key!'",
       "a label key is 1-63 letters"},
      {"long label value",
       WithSections(absl::StrCat("labels: {note: ", std::string(300, 'a'), "}\n")), "4:16",
       "labels.note", "a label value is at most 256 bytes, got 300"},
      {"colliding label keys", WithSections("labels: {a.b: x, a-b: y}\n"), "4:15", "labels.'a.b'",
       "collides with labels.a-b: both become the metrics label label_a_b"},
      {"too many labels", WithSections(ManyLabels(33)), "4:9", "labels",
       "at most 32 labels are allowed, got 33"},
  };
}

// training.sample_*: the gpt2-debug model has a byte-level vocabulary (256) and max_seq 64, so the
// default prompt is 16 tokens of the default seq_len 32.
std::vector<BadSpec> SampleBadSpecs() {
  const std::string wide_vocab =
      "name: job\nmodel:\n  preset: gpt2-debug\n  vocab: 512\ntraining:\n  sample_every: 5\n"
      "  sample_prompt: hi\n";
  return {
      {"negative sample_every", Base("  sample_every: -1\n"), "5:17", "training.sample_every",
       "must be at least 0, got -1"},
      {"no sample tokens", Base("  sample_every: 5\n  sample_tokens: 0\n"), "6:18",
       "training.sample_tokens", "must be at least 1, got 0"},
      {"negative temperature", Base("  sample_every: 5\n  sample_temperature: -1\n"), "6:23",
       "training.sample_temperature", "must be 0 (greedy) or positive, got -1"},
      {"negative top_k", Base("  sample_every: 5\n  sample_top_k: -3\n"), "6:17",
       "training.sample_top_k", "must be at least 0, got -3"},
      {"top_p of 0", Base("  sample_every: 5\n  sample_top_p: 0\n"), "6:17",
       "training.sample_top_p", "must be in (0, 1] (1: every token), got 0"},
      {"top_p above 1", Base("  sample_every: 5\n  sample_top_p: 1.5\n"), "6:17",
       "training.sample_top_p", "must be in (0, 1] (1: every token), got 1.5"},
      {"both prompts",
       Base("  sample_every: 5\n  sample_prompt: hi\n  sample_prompt_tokens: [1]\n"), "6:18",
       "training.sample_prompt", "give sample_prompt or sample_prompt_tokens, not both"},
      {"text prompt of a wide vocabulary", wide_vocab, "7:18", "training.sample_prompt",
       "needs training.sample_tokenizer or a byte-level model (model.vocab 256), this one has "
       "512 tokens"},
      {"empty tokenizer", Base("  sample_every: 5\n  sample_tokenizer: \"\"\n"), "6:21",
       "training.sample_tokenizer", "must not be empty"},
      {"prompt token outside the vocabulary",
       Base("  sample_every: 5\n  sample_prompt_tokens: [1, 300]\n"), "6:25",
       "training.sample_prompt_tokens", "token 300 is outside the vocabulary [0, 256)"},
      {"prompt token not a number", Base("  sample_prompt_tokens: [1, x]\n"), "5:29",
       "training.sample_prompt_tokens", "expected an integer, got 'x'"},
      {"prompt tokens as a string", Base("  sample_prompt_tokens: \"1 2\"\n"), "5:25",
       "training.sample_prompt_tokens", "expected a list of integers"},
      {"sample past max_seq", Base("  sample_every: 5\n  sample_tokens: 60\n"), "6:18",
       "training.sample_tokens", "a prompt of 16 tokens and 60 new ones exceed model.max_seq 64"},
  };
}

// Fields given explicitly that the rest of the spec makes no-ops: each is refused, named.
std::vector<BadSpec> UnusedFieldBadSpecs() {
  const std::string no_samples = "only used when sample_every is positive";
  return {
      {"sample_tokens without samples", Base("  sample_tokens: 8\n"), "5:18",
       "training.sample_tokens", no_samples},
      {"qk_norm_span without qk_norm",
       "name: job\nmodel:\n  preset: llama-debug\n  qk_norm_span: projection\n", "4:17",
       "model.qk_norm_span", "only spans the norms of model.qk_norm: true"},
      {"sample_prompt with sample_every 0", Base("  sample_every: 0\n  sample_prompt: hi\n"),
       "6:18", "training.sample_prompt", no_samples},
      {"sample_prompt_tokens without samples", Base("  sample_prompt_tokens: [1]\n"), "5:25",
       "training.sample_prompt_tokens", no_samples},
      {"sample_temperature without samples", Base("  sample_temperature: 0.5\n"), "5:23",
       "training.sample_temperature", no_samples},
      {"sample_top_k without samples", Base("  sample_top_k: 5\n"), "5:17", "training.sample_top_k",
       no_samples},
      {"sample_tokenizer without samples", Base("  sample_tokenizer: tok.json\n"), "5:21",
       "training.sample_tokenizer", no_samples},
      {"sample_top_p without samples", Base("  sample_top_p: 0.9\n"), "5:17",
       "training.sample_top_p", no_samples},
      {"sample_top_p with greedy samples",
       Base(
           "  sample_every: 5\n  sample_tokens: 8\n  sample_temperature: 0\n  sample_top_p: 0.9\n"),
       "8:17", "training.sample_top_p", "not used when sample_temperature is 0"},
      {"sample_top_k with greedy samples",
       Base("  sample_every: 5\n  sample_tokens: 8\n  sample_temperature: 0\n  sample_top_k: 5\n"),
       "8:17", "training.sample_top_k", "not used when sample_temperature is 0"},
      {"eval_batches without evaluation", Base("  eval_every: 0\n  eval_batches: 2\n"), "6:17",
       "training.eval_batches", "only used when eval_every is positive"},
      {"decay_steps with a cosine schedule", Base("  decay_steps: 4\n"), "5:16",
       "training.decay_steps", "only used with schedule: wsd (this job's cosine schedule"},
      {"decay_shape with a linear schedule", Base("  schedule: linear\n  decay_shape: cosine\n"),
       "6:16", "training.decay_shape", "only used with schedule: wsd"},
      {"min_lr_ratio with a constant schedule", Base("  schedule: constant\n  min_lr_ratio: 0.1\n"),
       "6:17", "training.min_lr_ratio", "not used with schedule: constant"},
      {"threads on GPU ranks", WithSections("training: {threads: 2}\nresources: {kind: gpu}\n"),
       "4:21", "training.threads", "only used by CPU ranks (resources.kind is gpu)"},
      {"straggler_window without detection",
       WithSections("fault_tolerance: {straggler_margin: 0, straggler_window: 3}\n"), "4:58",
       "fault_tolerance.straggler_window", "straggler_margin: 0 turns off"},
      {"resize_cooldown_s of a job that cannot resize",
       WithSections("checkpoint: {dir: ckpt}\nfault_tolerance: {resize_cooldown_s: 10}\n"), "5:38",
       "fault_tolerance.resize_cooldown_s", "only used by a job that may grow"},
      {"resize_cooldown_s of an elastic job without checkpoints",
       WithSections("resources: {nodes: 2}\nparallelism: {dp: 2}\nfault_tolerance: {min_nodes: "
                    "1, resize_cooldown_s: 10}\n"),
       "6:52", "fault_tolerance.resize_cooldown_s", "with checkpoint.dir"},
      {"exclude_stragglers without detection",
       WithSections("fault_tolerance: {straggler_margin: 0, exclude_stragglers: true}\n"), "4:60",
       "fault_tolerance.exclude_stragglers", "needs straggler detection"},
      {"keep without a checkpoint dir", WithSections("checkpoint: {resume_from: old, keep: 2}\n"),
       "4:38", "checkpoint.keep", "needs checkpoint.dir"},
      {"val_fraction beside val_path",
       Base("  steps: 10\n",
            "data:\n  source: bin\n  path: a.bin\n  val_path: b.bin\n  val_fraction: 0.1\n"),
       "8:17", "data.val_fraction", "not used when val_path is given"},
      {"aux_loss_coeff with the bias rule",
       WithMoe("{experts: 4, balance: bias, aux_loss_coeff: 0.1}"), "4:52",
       "model.moe.aux_loss_coeff", "only used with balance: aux_loss"},
      {"bias_update_rate with the auxiliary loss", WithMoe("{experts: 4, bias_update_rate: 0.01}"),
       "4:39", "model.moe.bias_update_rate", "only used with balance: bias"},
      {"a group score with every group kept", WithMoe("{experts: 4, group_score: max}"), "4:34",
       "model.moe.group_score", "only scores groups when group_top_k keeps fewer than groups"},
      {"bounds of a fixed interval",
       WithSections("checkpoint: {dir: ckpt, every_steps: 5, min_every_steps: 2}\n"), "4:58",
       "checkpoint.min_every_steps", "it needs every_steps: auto"},
      {"markov path", Base("  steps: 10\n", "data:\n  source: markov\n  path: x.bin\n"), "6:9",
       "data.path", "not used when source is markov"},
      {"markov block with bin",
       Base("  steps: 10\n", "data:\n  source: bin\n  path: a.bin\n  markov: {vocab: 2}\n"), "7:11",
       "data.markov", "only used when source is markov"},
      {"rope on gpt2", "name: job\nmodel: {preset: gpt2-debug, rope_theta: 1e4}\n", "2:41",
       "model.rope_theta", "only the llama family"},
      {"rope_dim on gpt2", "name: job\nmodel: {preset: gpt2-debug, rope_dim: 4}\n", "2:39",
       "model.rope_dim", "only the llama family"},
      {"nope_layers on gpt2", "name: job\nmodel: {preset: gpt2-debug, nope_layers: [1]}\n", "2:42",
       "model.nope_layers", "only the llama family"},
      {"rope scaling on gpt2",
       "name: job\nmodel: {preset: gpt2-debug, rope_scaling: {type: llama3, factor: 8}}\n", "2:43",
       "model.rope_scaling", "only the llama family"},
  };
}

std::vector<BadSpec> BadSpecs() {
  return {
      {"rope scaling of another type",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: dynamic, factor: 8}}\n",
       "2:51", "model.rope_scaling.type", "is 'dynamic'; it must be llama3"},
      {"yarn without its original context",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: yarn, factor: 8}}\n", "2:44",
       "model.rope_scaling.original_max_seq", "required by yarn"},
      {"yarn with Llama 3's bands",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: yarn, factor: 8, "
       "original_max_seq: 16, low_freq_factor: 2}}\n",
       "2:107", "model.rope_scaling.low_freq_factor", "is not yarn's"},
      {"yarn's betas crossed",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: yarn, factor: 8, "
       "original_max_seq: 16, beta_fast: 1, beta_slow: 2}}\n",
       "2:101", "model.rope_scaling.beta_fast", "must be at least beta_slow 2, got 1"},
      {"llama3 scaling with yarn's truncate",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: llama3, factor: 8, "
       "truncate: false}}\n",
       "2:80", "model.rope_scaling.truncate", "is yarn's (type yarn)"},
      {"longrope with a factor",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: longrope, factor: 8}}\n",
       "2:69", "model.rope_scaling.factor", "is not longrope's"},
      {"longrope without long factors",
       "name: job\nmodel: {preset: llama-debug, rope_dim: 2, rope_scaling: {type: longrope, "
       "original_max_seq: 8, short_factor: [1]}}\n",
       "2:57", "model.rope_scaling.long_factor", "required by longrope"},
      {"longrope factors for other pairs",
       "name: job\nmodel: {preset: llama-debug, rope_dim: 4, rope_scaling: {type: longrope, "
       "original_max_seq: 8, short_factor: [1], long_factor: [2]}}\n",
       "2:109", "model.rope_scaling.short_factor", "needs one factor per rotated pair, 2"},
      {"longrope factor not positive",
       "name: job\nmodel: {preset: llama-debug, rope_dim: 2, rope_scaling: {type: longrope, "
       "original_max_seq: 8, short_factor: [1], long_factor: [0]}}\n",
       "2:127", "model.rope_scaling.long_factor", "every factor must be positive"},
      {"longrope factor not a number",
       "name: job\nmodel: {preset: llama-debug, rope_dim: 2, rope_scaling: {type: longrope, "
       "original_max_seq: 8, short_factor: [x], long_factor: [1]}}\n",
       "2:110", "model.rope_scaling.short_factor", "expected a finite 32-bit number"},
      {"llama3 scaling with longrope's factors",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: llama3, factor: 8, "
       "short_factor: [1]}}\n",
       "2:84", "model.rope_scaling.short_factor", "is longrope's (type longrope)"},
      {"odd rope_dim", "name: job\nmodel: {preset: llama-debug, rope_dim: 5}\n", "2:40",
       "model.rope_dim", "must be even and at most head_dim 16"},
      {"rope_dim wider than the head", "name: job\nmodel: {preset: llama-debug, rope_dim: 18}\n",
       "2:40", "model.rope_dim", "must be even and at most head_dim 16"},
      {"linear rope scaling with Llama 3's bands",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: linear, factor: 8, "
       "low_freq_factor: 2}}\n",
       "2:87", "model.rope_scaling.low_freq_factor", "is Llama 3's (type llama3); linear scaling"},
      {"rope scaling without a factor",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: llama3}}\n", "2:44",
       "model.rope_scaling.factor", "required"},
      {"rope scaling that shrinks",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: llama3, factor: 0.5}}\n",
       "2:67", "model.rope_scaling.factor", "must be at least 1, got 0.5"},
      {"rope scaling's bands crossed",
       "name: job\nmodel: {preset: llama-debug, rope_scaling: {type: llama3, factor: 8, "
       "low_freq_factor: 4, high_freq_factor: 2}}\n",
       "2:108", "model.rope_scaling.high_freq_factor", "must exceed low_freq_factor 4, got 2"},
      {"string for int", Base("  steps: many\n"), "5:10", "training.steps",
       "expected an integer, got 'many'"},
      {"quoted int", Base("  steps: \"300\"\n"), "5:10", "training.steps",
       "expected an integer, got the quoted string '300'"},
      {"float for int", Base("  batch: 3.5\n"), "5:10", "training.batch",
       "expected an integer, got '3.5'"},
      {"exponent for int", Base("  steps: 1e3\n"), "5:10", "training.steps", "(write it as 1000)"},
      {"int out of range", Base("  batch: 99999999999\n"), "5:10", "training.batch",
       "out of range"},
      {"list for map", "name: job\nmodel: {preset: gpt2-debug}\ntraining: [1, 2]\n", "3:11",
       "training", "expected a mapping, got a sequence"},
      {"map for int", Base("  steps: {a: 1}\n"), "5:10", "training.steps",
       "expected an integer, got a mapping"},
      {"empty value", Base("  steps:\n  batch: 2\n"), "5:3", "training.steps",
       "expected an integer, got null"},
      {"zero steps", Base("  steps: 0\n"), "5:10", "training.steps", "must be at least 1, got 0"},
      {"negative steps", Base("  steps: -5\n"), "5:10", "training.steps", "got -5"},
      {"micro_batch", Base("  batch: 16\n  micro_batch: 5\n"), "6:16", "training.micro_batch",
       "batch 16 is not divisible by micro_batch 5"},
      {"seq_len over max_seq", Base("  seq_len: 128\n"), "5:12", "training.seq_len",
       "seq_len 128 exceeds model.max_seq 64"},
      {"zero lr", Base("  lr: 0\n"), "5:7", "training.lr", "must be positive"},
      {"negative lr", Base("  lr: -1e-3\n"), "5:7", "training.lr", "must be positive"},
      {"nan lr", Base("  lr: nan\n"), "5:7", "training.lr", "expected a finite number"},
      {"beta1 of one", Base("  beta1: 1.0\n"), "5:10", "training.beta1", "must be in [0, 1)"},
      {"negative beta2", Base("  beta2: -0.1\n"), "5:10", "training.beta2", "must be in [0, 1)"},
      {"schedule typo", Base("  schedule: cosin\n"), "5:13", "training.schedule",
       "did you mean 'cosine'?"},
      {"warmup too long", Base("  steps: 10\n  warmup_steps: 20\n"), "6:17",
       "training.warmup_steps", "longer than the run"},
      {"wsd typo", Base("  schedule: wds\n"), "5:13", "training.schedule", "did you mean 'wsd'?"},
      {"wsd without decay_steps", Base("  schedule: wsd\n"), "5:13", "training.decay_steps",
       "is required with schedule: wsd"},
      {"wsd with a negative decay", Base("  schedule: wsd\n  decay_steps: -3\n"), "6:16",
       "training.decay_steps", "must be at least 1, got -3"},
      {"wsd decay past the run",
       Base("  steps: 20\n  warmup_steps: 5\n  schedule: wsd\n  decay_steps: 16\n"), "8:16",
       "training.decay_steps", "a decay of 16 steps after a warmup of 5 does not fit the run"},
      {"wsd decay shape typo", Base("  schedule: wsd\n  decay_steps: 4\n  decay_shape: sqrt\n"),
       "7:16", "training.decay_shape", "unknown decay shape 'sqrt'"},
      {"bool as word", "name: job\nmodel:\n  preset: gpt2-debug\n  recompute: yes\n", "4:14",
       "model.recompute", "expected true or false, got 'yes'"},
      {"unknown source", Base("  steps: 10\n", "data:\n  source: csv\n"), "5:11", "data.source",
       "unknown source 'csv'"},
      {"bin without path", Base("  steps: 10\n", "data:\n  source: bin\n"), "5:11", "data.path",
       "required when source is bin"},
      {"val_fraction too big",
       Base("  steps: 10\n", "data:\n  source: text\n  path: a.txt\n  val_fraction: 1.5\n"), "7:17",
       "data.val_fraction", "must be in (0, 1), got 1.5"},
      {"val_fraction zero",
       Base("  steps: 10\n", "data:\n  source: bin\n  path: a.bin\n  val_fraction: 0\n"), "7:17",
       "data.val_fraction", "must be in (0, 1)"},
      {"markov vocab over model vocab", Base("  steps: 10\n", "data:\n  markov: {vocab: 300}\n"),
       "5:19", "data.markov.vocab", "vocab 300 exceeds model.vocab 256"},
      {"markov with too many contexts",
       Base("  steps: 10\n", "data:\n  markov: {order: 6, vocab: 64}\n"), "5:19",
       "data.markov.order", "more than 65536 contexts"},
      {"markov with too many transitions",
       "name: job\nmodel: {preset: gpt2-debug, vocab: 8192}\ndata: {markov: {vocab: 4097}}\n",
       "3:24", "data.markov.vocab", "more than 16777216 transition probabilities"},
      {"negative markov order", Base("  steps: 10\n", "data:\n  markov: {order: -1}\n"), "5:19",
       "data.markov.order", "must be at least 0"},
      {"text needs byte vocab",
       "name: job\nmodel:\n  preset: gpt2-debug\n  vocab: 64\ndata: {source: text, path: a}\n",
       "4:10", "model.vocab", "needs vocab >= 256"},
      {"width not divisible by heads", "name: job\nmodel:\n  preset: gpt2-debug\n  width: 66\n",
       "4:10", "model.heads", "width 66 is not divisible by heads 4"},
      {"llama kv heads", "name: job\nmodel:\n  preset: llama-debug\n  kv_heads: 3\n", "4:13",
       "model.kv_heads", "heads 4 is not divisible by kv_heads 3"},
      {"qkv_bias on gpt2", "name: job\nmodel:\n  preset: gpt2-debug\n  qkv_bias: true\n", "4:13",
       "model.qkv_bias", "is for the llama family (GPT-2's projections always have biases)"},
      {"head_dim on gpt2", "name: job\nmodel:\n  preset: gpt2-debug\n  head_dim: 32\n", "4:13",
       "model.head_dim", "is for the llama family (GPT-2's heads are width / heads wide)"},
      {"qk_norm on gpt2", "name: job\nmodel:\n  preset: gpt2-debug\n  qk_norm: true\n", "4:12",
       "model.qk_norm", "is for the llama family"},
      {"unknown qk_norm_span",
       "name: job\nmodel:\n  preset: llama-debug\n  qk_norm: true\n  qk_norm_span: heads\n", "5:17",
       "model.qk_norm_span", "unknown norm span 'heads'; did you mean 'head'?"},
      {"activation on gpt2", "name: job\nmodel:\n  preset: gpt2-debug\n  activation: geglu\n",
       "4:15", "model.activation",
       "is for the llama family (the gpt2 family's MLP is GELU, ungated)"},
      {"unknown activation", "name: job\nmodel:\n  preset: llama-debug\n  activation: gelu\n",
       "4:15", "model.activation", "unknown activation 'gelu'; did you mean 'geglu'?"},
      {"scale_embeddings on gpt2",
       "name: job\nmodel:\n  preset: gpt2-debug\n  scale_embeddings: true\n", "4:21",
       "model.scale_embeddings", "is for the llama family"},
      {"sliding_window on gpt2", "name: job\nmodel:\n  preset: gpt2-debug\n  sliding_window: 8\n",
       "4:19", "model.sliding_window", "is for the llama family"},
      {"nope_layers beyond the layers",
       "name: job\nmodel: {preset: llama-debug, nope_layers: [0, 2]}\n", "2:43",
       "model.nope_layers", "layer 2 is not one of the 2 layers (0 to 1)"},
      {"residual_multiplier on gpt2",
       "name: job\nmodel: {preset: gpt2-debug, residual_multiplier: 0.5}\n", "2:50",
       "model.residual_multiplier", "is for the llama family"},
      {"logits_scaling of 0", "name: job\nmodel: {preset: llama-debug, logits_scaling: 0}\n",
       "2:46", "model.logits_scaling", "must be positive (1 for none), got 0"},
      {"embedding_multiplier with scale_embeddings",
       "name: job\nmodel: {preset: llama-debug, scale_embeddings: true, embedding_multiplier: "
       "12}\n",
       "2:76", "model.embedding_multiplier", "both scale the embeddings; set one"},
      {"attention_multiplier with attention_scale_dim",
       "name: job\nmodel: {preset: llama-debug, attention_scale_dim: 8, attention_multiplier: "
       "0.1}\n",
       "2:76", "model.attention_multiplier", "both set the scores' scale; set one"},
      {"negative attention_multiplier",
       "name: job\nmodel: {preset: llama-debug, attention_multiplier: -1}\n", "2:52",
       "model.attention_multiplier", "must be positive (0 for head_dim^-1/2), got -1"},
      {"nope_layers out of order", "name: job\nmodel: {preset: llama-debug, nope_layers: [1, 0]}\n",
       "2:43", "model.nope_layers", "each layer once, in increasing order"},
      {"full_attention_layers without a window",
       "name: job\nmodel:\n  preset: llama-debug\n  full_attention_layers: [1]\n", "4:26",
       "model.full_attention_layers", "needs a sliding_window"},
      {"full_attention_layers beyond the layers",
       "name: job\nmodel:\n  preset: llama-debug\n  sliding_window: 4\n"
       "  full_attention_layers: [2]\n",
       "5:26", "model.full_attention_layers", "layer 2 is not one of the 2 layers (0 to 1)"},
      {"full_attention_layers repeated",
       "name: job\nmodel:\n  preset: llama-debug\n  sliding_window: 4\n"
       "  full_attention_layers: [1, 1]\n",
       "5:26", "model.full_attention_layers", "each layer once, in increasing order"},
      {"rope_local_theta without a window",
       "name: job\nmodel:\n  preset: llama-debug\n  rope_local_theta: 10000\n", "4:21",
       "model.rope_local_theta", "needs a sliding_window"},
      {"post_norms on gpt2", "name: job\nmodel:\n  preset: gpt2-debug\n  post_norms: true\n",
       "4:15", "model.post_norms", "is for the llama family"},
      {"pre_norms false without post_norms",
       "name: job\nmodel:\n  preset: llama-debug\n  pre_norms: false\n", "4:14", "model.pre_norms",
       "is false without model.post_norms"},
      {"pre_norms false on gpt2", "name: job\nmodel:\n  preset: gpt2-debug\n  pre_norms: false\n",
       "4:14", "model.pre_norms", "the gpt2 family's blocks norm their inputs"},
      {"negative attention_scale_dim",
       "name: job\nmodel:\n  preset: llama-debug\n  attention_scale_dim: -2\n", "4:24",
       "model.attention_scale_dim", "must be positive (0 for head_dim), got -2"},
      {"negative attention_softcap",
       "name: job\nmodel:\n  preset: gpt2-debug\n  attention_softcap: -50\n", "4:22",
       "model.attention_softcap", "must be a positive cap (0 for none), got -50"},
      {"logit_softcap .inf", "name: job\nmodel:\n  preset: llama-debug\n  logit_softcap: .inf\n",
       "4:18", "model.logit_softcap", "expected a number, got '.inf'"},
      {"negative z_loss_coeff", "name: job\nmodel:\n  preset: gpt2-debug\n  z_loss_coeff: -1e-4\n",
       "4:17", "model.z_loss_coeff", "must be zero or positive, got -0.0001"},
      {"z_loss_coeff not a number",
       "name: job\nmodel:\n  preset: llama-debug\n  z_loss_coeff: lots\n", "4:17",
       "model.z_loss_coeff", "expected a number, got 'lots'"},
      {"document_token past the vocabulary",
       "name: job\nmodel:\n  preset: llama-debug\n  document_token: 256\n", "4:19",
       "model.document_token",
       "must be a token id below the vocabulary of 256 (leave it out for attention across the "
       "whole sequence), got 256"},
      {"negative document_token", "name: job\nmodel:\n  preset: gpt2-debug\n  document_token: -2\n",
       "4:19", "model.document_token", "must be a token id below the vocabulary of 256"},
      {"document_token not a number",
       "name: job\nmodel:\n  preset: gpt2-debug\n  document_token: eos\n", "4:19",
       "model.document_token", "expected an integer"},
      {"document_token on GPUs",
       "name: job\nmodel:\n  preset: llama-debug\n  document_token: 1\nresources: {kind: gpu}\n",
       "4:19", "model.document_token",
       "needs CPU ranks: the CUDA attention kernels' document mask has not run on a GPU yet "
       "(leave it out, or write resources.kind: cpu)"},
      {"latent_attention without kv_rank",
       "name: job\nmodel:\n  preset: llama-debug\n  latent_attention: {q_rank: 8}\n", "4:21",
       "model.latent_attention.kv_rank", "required: the rank of the latent"},
      {"latent_attention with an unknown key",
       "name: job\nmodel:\n  preset: llama-debug\n  latent_attention: {kv_rank: 8, rank: 2}\n",
       "4:34", "model.latent_attention.rank", "unknown field; did you mean 'q_rank'?"},
      {"latent_attention negative q_rank",
       "name: job\nmodel:\n  preset: llama-debug\n  kv_heads: 4\n  rope_dim: 8\n"
       "  latent_attention: {q_rank: -1, kv_rank: 8}\n",
       "6:30", "model.latent_attention.q_rank", "must be at least 0"},
      {"latent_attention with a zero norm_eps",
       "name: job\nmodel:\n  preset: llama-debug\n  kv_heads: 4\n  rope_dim: 8\n"
       "  latent_attention: {kv_rank: 8, norm_eps: 0}\n",
       "6:44", "model.latent_attention.norm_eps", "must be a positive number, got 0"},
      {"latent_attention on gpt2",
       "name: job\nmodel:\n  preset: gpt2-debug\n  latent_attention: {kv_rank: 8, value_dim: 8}\n",
       "3:3", "model.family", "latent attention is for the llama family"},
      {"latent_attention with grouped heads",
       "name: job\nmodel:\n  preset: llama-debug\n  rope_dim: 8\n  latent_attention: {kv_rank: "
       "8}\n",
       "3:11", "model.kv_heads", "must equal heads 4"},
      {"latent_attention without rope_dim",
       "name: job\nmodel:\n  preset: llama-debug\n  kv_heads: 4\n  latent_attention: {kv_rank: 8, "
       "value_dim: 8}\n",
       "3:3", "model.rope_dim", "must be set below head_dim 16"},
      {"latent_attention on GPUs",
       "name: job\nmodel:\n  preset: llama-debug\n  kv_heads: 4\n  rope_dim: 8\n"
       "  latent_attention: {kv_rank: 8}\nresources: {kind: gpu}\n",
       "6:21", "model.latent_attention",
       "needs CPU ranks: the CUDA attention kernels take value heads as wide as the query and key "
       "heads"},
      {"negative sliding_window",
       "name: job\nmodel:\n  preset: llama-debug\n  sliding_window: -1\n", "4:19",
       "model.sliding_window", "must be a number of positions (0 for none), got -1"},
      {"sliding_window on GPUs",
       "name: job\nmodel:\n  preset: llama-debug\n  sliding_window: 8\nresources: {kind: gpu}\n",
       "4:19", "model.sliding_window",
       "needs CPU ranks: the CUDA attention kernels' sliding window has not run on a GPU yet "
       "(leave it out, or write resources.kind: cpu)"},
      {"odd head_dim", "name: job\nmodel:\n  preset: llama-debug\n  head_dim: 15\n", "4:13",
       "model.head_dim", "RoPE needs an even head dimension, got 15"},
      {"head_dim 1", "name: job\nmodel:\n  preset: llama-debug\n  head_dim: 1\n", "4:13",
       "model.head_dim", "must be at least 2, got 1"},
      {"unknown preset", "name: job\nmodel:\n  preset: gpt2-debgu\n", "3:11", "model.preset",
       "did you mean 'gpt2-debug'?"},
      {"family mismatch", "name: job\nmodel:\n  preset: gpt2-debug\n  family: llama\n", "4:11",
       "model.family", "is a gpt2 model, not llama"},
      {"no preset, no family", "name: job\nmodel:\n  layers: 2\n", "3:3", "model.family",
       "required when no preset is given"},
      {"no preset, missing size",
       "name: job\nmodel: {family: gpt2, layers: 2, width: 64, heads: 4, vocab: 256, "
       "max_seq: 64}\n",
       "2:8", "model.ffn_hidden", "required when no preset is given"},
      {"unknown field typo", Base("  stpes: 10\n"), "5:3", "training.stpes",
       "unknown field; did you mean 'steps'?"},
      {"unknown top-level field", "name: job\nmodel: {preset: gpt2-debug}\ntrainig: {}\n", "3:1",
       "trainig", "did you mean 'training'?"},
      {"unknown field, no suggestion", Base("  colour: red\n"), "5:3", "training.colour",
       "unknown field (known fields: steps, batch,"},
      {"duplicate key", Base("  steps: 1\n  steps: 2\n"), "6:3", "training.steps",
       "duplicate key (first given on line 5)"},
      {"missing name", "model: {preset: gpt2-debug}\n", "1:1", "name", "required field"},
      {"missing model", "name: job\n", "1:1", "model", "required field"},
      {"bad name", "name: my job\nmodel: {preset: gpt2-debug}\n", "1:7", "name",
       "may contain only letters"},
      {"top level is a list", "- name: job\n", "1:1", "spec", "expected a mapping, got a sequence"},
      {"empty spec", "", "1:1", "spec", "empty"},
      {"comment-only spec", "# nothing here\n", "1:1", "spec", "empty"},
      {"two documents", "name: a\nmodel: {preset: gpt2-debug}\n---\nname: b\n", "3:1", "spec",
       "only one YAML document"},
      {"syntax error", "name: job\nmodel: {preset: gpt2-debug\ntraining: {steps: 1}\n", "3:9",
       "model", "invalid YAML"},
      {"mapping after sequence", "name: job\nmodel:\n  - 1\n  preset: gpt2-debug\n", "4:3", "spec",
       "invalid YAML"},
      {"tag", Base("  steps: !!int 5\n"), "5:10", "training.steps", "YAML tags are not allowed"},
      {"anchor", "name: job\nmodel: &m {preset: gpt2-debug}\n", "2:8", "model",
       "YAML anchors are not allowed"},
      {"merge key alias", "name: job\nmodel: {preset: gpt2-debug}\ntraining:\n  <<: *defaults\n",
       "4:7", "training.<<", "invalid YAML"},
      {"complex key", "name: job\nmodel: {preset: gpt2-debug}\n? [a, b]\n: 1\n", "3:3", "spec",
       "keys must be plain strings"},
      {"newline in value stays one line", Base("  schedule: \"cos\\nine\"\n"), "5:13",
       "training.schedule", "unknown schedule 'cos\\nine'"},
  };
}

void ExpectRefused(const BadSpec& bad, const SpecLimits& limits = SpecLimits()) {
  SCOPED_TRACE(bad.label);
  absl::StatusOr<JobSpec> spec = ParseJobSpec(bad.yaml, "job.yaml", limits);
  ASSERT_FALSE(spec.ok()) << bad.yaml;
  const absl::Status& status = spec.status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  const std::string prefix = absl::StrCat("job.yaml:", bad.location, ": ", bad.path, ": ");
  EXPECT_TRUE(absl::StartsWith(status.message(), prefix))
      << "want prefix [" << prefix << "] got [" << status.message() << "]";
  EXPECT_TRUE(absl::StrContains(status.message(), bad.reason_part))
      << "want [" << bad.reason_part << "] in [" << status.message() << "]";
  EXPECT_FALSE(absl::StrContains(status.message(), "\n")) << status;
}

TEST(SpecErrorsTest, EachBadSpecNamesFieldAndPosition) {
  ASSERT_GE(BadSpecs().size(), 15u);
  for (const BadSpec& bad : BadSpecs()) ExpectRefused(bad);
}

TEST(SpecErrorsTest, EachBadRunSectionNamesFieldAndPosition) {
  ASSERT_GE(RunSectionBadSpecs().size(), 30u);
  for (const BadSpec& bad : RunSectionBadSpecs()) ExpectRefused(bad);
}

TEST(SpecErrorsTest, EachBadSampleSpecNamesFieldAndPosition) {
  for (const BadSpec& bad : SampleBadSpecs()) ExpectRefused(bad);
}

TEST(SpecErrorsTest, EachFieldWithoutEffectIsRefusedNamingIt) {
  for (const BadSpec& bad : UnusedFieldBadSpecs()) ExpectRefused(bad);
}

// A spec read back from the job store (or by a worker from its coordinator) may have been
// accepted by a build that did not refuse fields without effect yet: it keeps parsing, and each
// such field is named.
TEST(SpecErrorsTest, AStoredSpecIgnoresFieldsWithoutEffectAndNamesThem) {
  for (const BadSpec& bad : UnusedFieldBadSpecs()) {
    std::vector<std::string> ignored;
    absl::StatusOr<JobSpec> spec = ParseStoredJobSpec(bad.yaml, "job 7", &ignored);
    ASSERT_TRUE(spec.ok()) << bad.label << ": " << spec.status();
    ASSERT_EQ(ignored.size(), 1u) << bad.label;
    EXPECT_TRUE(absl::StartsWith(ignored[0], bad.path + ": ")) << ignored[0];
    EXPECT_TRUE(absl::StrContains(ignored[0], bad.reason_part)) << ignored[0];
  }
  std::vector<std::string> ignored;
  absl::StatusOr<JobSpec> spec = ParseStoredJobSpec(
      Base("  steps: 10\n  eval_every: 0\n  eval_batches: 2\n  schedule: constant\n"
           "  min_lr_ratio: 0.1\n"),
      "job 7", &ignored);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(ignored.size(), 2u);
  EXPECT_TRUE(absl::StartsWith(ignored[0], "training.eval_batches: ")) << ignored[0];
  EXPECT_TRUE(absl::StartsWith(ignored[1], "training.min_lr_ratio: ")) << ignored[1];
  EXPECT_EQ(spec->training.steps, 10);
}

// Only fields without effect are let through: every other refusal holds for a stored spec.
TEST(SpecErrorsTest, AStoredSpecIsRefusedForEverythingElse) {
  for (const std::vector<BadSpec>& cases :
       {BadSpecs(), RunSectionBadSpecs(), SampleBadSpecs(), MoeBadSpecs()}) {
    for (const BadSpec& bad : cases) {
      std::vector<std::string> ignored;
      absl::StatusOr<JobSpec> spec = ParseStoredJobSpec(bad.yaml, "job 7", &ignored);
      ASSERT_FALSE(spec.ok()) << bad.label;
      EXPECT_TRUE(absl::StrContains(spec.status().message(), bad.reason_part))
          << bad.label << ": " << spec.status();
      EXPECT_TRUE(ignored.empty()) << bad.label << ": " << ignored[0];
    }
  }
}

TEST(SpecErrorsTest, TheSameFieldsAreAcceptedWhereTheyTakeEffect) {
  for (const char* training :
       {"  sample_every: 5\n  sample_tokens: 8\n  sample_temperature: 0.5\n  sample_top_k: 5\n",
        "  sample_every: 5\n  sample_tokens: 8\n  sample_temperature: 0\n",
        "  eval_every: 10\n  eval_batches: 2\n", "  schedule: linear\n  min_lr_ratio: 0.1\n",
        "  threads: 2\n"}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(Base(training), "job.yaml");
    EXPECT_TRUE(spec.ok()) << training << spec.status();
  }
  for (const char* sections :
       {"fault_tolerance: {straggler_margin: 0.5, straggler_window: 3}\n",
        "resources: {nodes: 2}\nparallelism: {dp: 2}\ncheckpoint: {dir: ckpt}\nfault_tolerance: "
        "{min_nodes: 1, resize_cooldown_s: 10}\n",
        "checkpoint: {dir: ckpt}\nfault_tolerance: {max_nodes: 2, resize_cooldown_s: 10}\n"}) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(WithSections(sections), "job.yaml");
    EXPECT_TRUE(spec.ok()) << sections << spec.status();
  }
}

// max_nodes above resources.nodes where a larger size has a valid mesh (4 nodes: dp 4 divides the
// batch of 8, though 3 nodes' dp 3 does not).
TEST(SpecErrorsTest, MaxNodesAboveTheSizeIsAcceptedWhenALargerMeshExists) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(
      WithSections("training: {batch: 8, seq_len: 16}\nresources: {nodes: 2}\nparallelism: {dp: "
                   "2}\nfault_tolerance: {max_nodes: 4}\n"),
      "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_nodes(), 4);
}

TEST(SpecErrorsTest, EachBadMoeSpecNamesFieldAndPosition) {
  for (const BadSpec& bad : MoeBadSpecs()) ExpectRefused(bad);
}

TEST(SpecErrorsTest, DataAndCheckpointPathsOutsideTheRootsAreRefused) {
  SpecLimits limits;
  limits.allowed_data_roots = {"/srv/data", "/mnt/shared/corpora/"};
  limits.allowed_checkpoint_roots = {"/srv/checkpoints"};
  auto data = [](const std::string& fields) {
    return absl::StrCat("name: job\nmodel: {preset: gpt2-debug}\ndata:\n  source: bin\n", fields);
  };
  const std::vector<BadSpec> outside = {
      {"absolute path elsewhere", data("  path: /etc/passwd\n"), "5:9", "data.path",
       "'/etc/passwd' ('/etc/passwd') is outside the allowed directories: /srv/data, "
       "/mnt/shared/corpora"},
      {"dot-dot escape", data("  path: /srv/data/../secrets/train.bin\n"), "5:9", "data.path",
       "('/srv/secrets/train.bin') is outside the allowed directories"},
      {"sibling with a common prefix", data("  path: /srv/data2/train.bin\n"), "5:9", "data.path",
       "is outside the allowed directories"},
      {"relative path", data("  path: ../../etc/shadow\n"), "5:9", "data.path",
       "is outside the allowed directories"},
      {"glob that could match ..", data("  path: /srv/data/.*/x.bin\n"), "5:9", "data.path",
       "a path component starting with '.' may not contain glob characters"},
      {"validation path", data("  path: /srv/data/a.bin\n  val_path: /tmp/val.bin\n"), "6:13",
       "data.val_path", "'/tmp/val.bin' ('/tmp/val.bin') is outside"},
      {"checkpoint dir",
       "name: job\nmodel: {preset: gpt2-debug}\ncheckpoint: {dir: /srv/data/ckpt}\n", "3:19",
       "checkpoint.dir", "is outside the allowed directories: /srv/checkpoints"},
      {"samples' tokenizer",
       "name: job\nmodel: {preset: gpt2-debug}\ntraining: {sample_every: 5, sample_tokens: 8, "
       "sample_tokenizer: /etc/tok.json}\n",
       "3:65", "training.sample_tokenizer", "'/etc/tok.json' ('/etc/tok.json') is outside"},
  };
  for (const BadSpec& bad : outside) ExpectRefused(bad, limits);

  for (const char* inside : {"/srv/data/train.bin", "/srv/data/shards/train_*.bin",
                             "/srv/data/./a/../b.bin", "/mnt/shared/corpora/x.bin", "/srv/data"}) {
    SCOPED_TRACE(inside);
    absl::StatusOr<JobSpec> spec =
        ParseJobSpec(data(absl::StrCat("  path: ", inside, "\n")), "job.yaml", limits);
    EXPECT_TRUE(spec.ok()) << spec.status();
  }
  // Without roots nothing is confined (the standalone worker).
  EXPECT_TRUE(ParseJobSpec(data("  path: /etc/passwd\n"), "job.yaml").ok());
}

// Parses `yaml`, expecting a fast refusal whose message starts with `prefix`.
void ExpectFastRefusal(const std::string& yaml, const std::string& prefix,
                       const std::string& reason_part) {
  const absl::Time start = absl::Now();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml, "hostile.yaml");
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(spec.status().message(), prefix)) << spec.status();
  EXPECT_TRUE(absl::StrContains(spec.status().message(), reason_part)) << spec.status();
  EXPECT_FALSE(absl::StrContains(spec.status().message(), "\n"));
  EXPECT_LT(took, absl::Seconds(2));
}

TEST(HostileSpecsTest, TenThousandDeepFlowNesting) {
  std::string yaml = "name: deep\nmodel: {preset: gpt2-debug}\ntraining: ";
  yaml.append(10000, '[').append(10000, ']').append("\n");
  // training's value is depth 2 (the top mapping is 1); the n-th '[' sits at column 10 + n and
  // opens depth n + 1, so the 32nd, at column 42, is the first one refused.
  ExpectFastRefusal(yaml, "hostile.yaml:3:42: training[0][0]", "nesting is deeper than 32 levels");
}

TEST(HostileSpecsTest, TenThousandDeepMappingsAndBlockSequences) {
  std::string maps = "name: deep\nmodel: {preset: gpt2-debug}\ndata: ";
  for (int i = 0; i < 10000; ++i) maps += "{a: ";
  maps.append("1").append(10000, '}').append("\n");
  ExpectFastRefusal(maps, "hostile.yaml:3:", "nesting is deeper than 32 levels");

  std::string dashes = "name: deep\nmodel:\n";
  for (int i = 0; i < 10000; ++i) dashes += "- ";
  dashes += "x\n";
  ExpectFastRefusal(dashes, "hostile.yaml:3:", "nesting is deeper than 32 levels");

  // Exactly 32 levels is allowed by the YAML layer (and then refused as a wrong type).
  std::string limit = "name: deep\nmodel: {preset: gpt2-debug}\ntraining: ";
  limit.append(31, '[').append(31, ']').append("\n");
  absl::StatusOr<JobSpec> spec = ParseJobSpec(limit, "limit.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(absl::StartsWith(spec.status().message(),
                               "limit.yaml:3:11: training: expected a mapping, got a sequence"))
      << spec.status();
}

TEST(HostileSpecsTest, BillionLaughsIsRefusedAtTheFirstAnchor) {
  std::string yaml = "name: lol\nmodel: {preset: gpt2-debug}\nlol0: &a0 [\"lol\"]\n";
  for (int i = 1; i < 30; ++i) {
    absl::StrAppend(&yaml, "lol", i, ": &a", i, " [");
    for (int j = 0; j < 10; ++j) absl::StrAppend(&yaml, j ? ", " : "", "*a", i - 1);
    yaml += "]\n";
  }
  yaml += "training: {steps: *a29}\n";
  ExpectFastRefusal(yaml, "hostile.yaml:3:7: lol0: ", "YAML anchors are not allowed");
}

TEST(HostileSpecsTest, SpecOverOneMebibyteIsRefusedBeforeParsing) {
  std::string yaml = "name: big\nmodel: {preset: gpt2-debug}\n";
  yaml.append("# ").append(kMaxSpecBytes, 'x').append("\n");
  ExpectFastRefusal(yaml, "hostile.yaml:1:1: spec: ", "the limit is 1048576");
  // Just under the limit is read normally.
  std::string fits = "name: big\nmodel: {preset: gpt2-debug}\n# ";
  fits += std::string(kMaxSpecBytes - fits.size() - 1, 'x') + "\n";
  ASSERT_EQ(fits.size(), kMaxSpecBytes);
  EXPECT_TRUE(ParseJobSpec(fits).ok());
}

TEST(HostileSpecsTest, ManyKeysAndLongSequencesStayFast) {
  std::string yaml = "name: wide\nmodel: {preset: gpt2-debug}\ntraining:\n";
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&yaml, "  k", i, ": 1\n");
  ExpectFastRefusal(yaml, "hostile.yaml:4:3: training.k0: ", "unknown field");
  std::string list = "name: long\nmodel: {preset: gpt2-debug}\ndata: [";
  for (int i = 0; i < 50000; ++i) absl::StrAppend(&list, i ? "," : "", "1");
  list += "]\n";
  ExpectFastRefusal(list, "hostile.yaml:3:7: data: ", "expected a mapping");
}

// Random byte edits of a good spec: every result is either a spec or a one-line
// INVALID_ARGUMENT, never a crash, hang or other code.
TEST(HostileSpecsTest, RandomCorruptionsNeverCrash) {
  const std::string good =
      "name: tiny\nmodel:\n  preset: gpt2-debug\n  layers: 2\ndata:\n  source: markov\n"
      "  markov: {order: 1, vocab: 32, seed: 7}\ntraining:\n  steps: 300\n  batch: 16\n"
      "  seq_len: 32\n  lr: 3.0e-3\n  schedule: cosine\n";
  ASSERT_TRUE(ParseJobSpec(good).ok());
  const std::string alphabet = "{}[]:-,&*!|>'\"#%@`?\n\t 019.eaxz\\\x01\xff";
  std::mt19937 rng(12345);
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (text.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          text.insert(at, 1, c);
          break;
        case 1:
          if (at < text.size()) text[at] = c;
          break;
        default:
          if (at < text.size()) text.erase(at, 1);
      }
    }
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text, "fuzz.yaml");
    if (spec.ok()) {
      ++accepted;
      EXPECT_TRUE(ValidateJobSpec(*spec).ok());
      continue;
    }
    ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
    ASSERT_TRUE(absl::StartsWith(spec.status().message(), "fuzz.yaml:")) << spec.status();
    ASSERT_FALSE(absl::StrContains(spec.status().message(), "\n")) << spec.status();
  }
  EXPECT_GT(accepted, 0);  // some edits land in comments-free but harmless places
}

TEST(SpecErrorsTest, InvalidUtf8AndNulBytesAreRefusedWithTheirPlace) {
  const std::string base = "name: job\nmodel:\n  preset: gpt2-debug\n";
  const struct {
    std::string yaml;
    const char* want;
  } cases[] = {
      {base + "# a\xff\n", "job.yaml:4:4: spec: invalid UTF-8 (byte 0xff)"},
      {base + "# \xc3x\n", "job.yaml:4:3: spec: invalid UTF-8 (byte 0xc3)"},
      {base + "# \xed\xa0\x80\n", "job.yaml:4:3: spec: invalid UTF-8"},  // a surrogate
      {base + "# \xc0\xaf\n", "job.yaml:4:3: spec: invalid UTF-8"},      // overlong
      {base + "# \xe2\x9c", "job.yaml:4:3: spec: invalid UTF-8: a truncated sequence"},
      {base + std::string("# a\0b\n", 6), "job.yaml:4:4: spec: a NUL byte"},
  };
  for (const auto& c : cases) {
    const absl::StatusOr<JobSpec> spec = ParseJobSpec(c.yaml, "job.yaml", SpecLimits());
    ASSERT_FALSE(spec.ok()) << c.want;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(spec.status().message(), c.want)) << spec.status();
  }
  // Well-formed UTF-8 anywhere in the text is fine.
  EXPECT_TRUE(ParseJobSpec(base + "# z\xc3\xbcrich \xe2\x9c\x93 \xf0\x9d\x9b\x91\n", "job.yaml",
                           SpecLimits())
                  .ok());
}

}  // namespace
}  // namespace trainyard::config
