#include "config/mesh.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trainyard::config {
namespace {

using Problem = std::optional<SpecProblem>;

constexpr int kMaxDegree = 65536;

Problem Bad(std::string path, std::string reason, std::vector<std::string> related = {}) {
  return SpecProblem{std::move(path), std::move(reason), std::move(related)};
}

Problem CheckDegrees(const ParallelismSpec& m) {
  const std::pair<const char*, int> degrees[] = {
      {"dp", m.dp}, {"tp", m.tp}, {"pp", m.pp},
      {"cp", m.cp}, {"ep", m.ep}, {"virtual_stages", m.virtual_stages}};
  for (const auto& [name, value] : degrees) {
    if (value < 1 || value > kMaxDegree) {
      return Bad(absl::StrCat("parallelism.", name),
                 absl::StrCat("must be between 1 and ", kMaxDegree, ", got ", value));
    }
  }
  if (m.zero < 0 || m.zero > 3) {
    return Bad("parallelism.zero", absl::StrCat("ZeRO stage must be 0, 1, 2 or 3, got ", m.zero));
  }
  return std::nullopt;
}

// dp x cp x tp x pp must use every device. The problem names the first factor that, changed
// alone, would make the product fit (dp before tp before pp before cp), with the value that would.
Problem CheckWorldSize(const ParallelismSpec& m, const ResourcesSpec& r) {
  const int64_t product = int64_t{m.dp} * m.cp * m.tp * m.pp;
  const int64_t world = int64_t{r.nodes} * r.devices_per_node;
  if (product == world) return std::nullopt;
  const std::string cp = m.cp == 1 ? "" : absl::StrCat(" × cp ", m.cp);
  const std::string what =
      absl::StrCat("dp ", m.dp, cp, " × tp ", m.tp, " × pp ", m.pp, " = ", product,
                   " ranks, but resources provide ", world, " (nodes ", r.nodes,
                   " × devices_per_node ", r.devices_per_node, ")");
  const std::vector<std::string> resources = {"resources.devices_per_node", "resources.nodes"};
  const struct {
    const char* name;
    int64_t others;
  } factors[] = {{"dp", int64_t{m.cp} * m.tp * m.pp},
                 {"tp", int64_t{m.dp} * m.cp * m.pp},
                 {"pp", int64_t{m.dp} * m.cp * m.tp},
                 {"cp", int64_t{m.dp} * m.tp * m.pp}};
  for (const auto& factor : factors) {
    if (world % factor.others != 0) continue;
    std::vector<std::string> related = {"parallelism"};
    related.insert(related.end(), resources.begin(), resources.end());
    return Bad(absl::StrCat("parallelism.", factor.name),
               absl::StrCat(what, "; ", factor.name, " ", world / factor.others, " would fit"),
               std::move(related));
  }
  return Bad("parallelism.dp", what, {"parallelism.tp", "parallelism.pp", "parallelism"});
}

Problem CheckTensorParallelInANode(const ParallelismSpec& m, const ResourcesSpec& r) {
  if (r.devices_per_node % m.tp != 0) {
    return Bad(
        "parallelism.tp",
        absl::StrCat("tp ", m.tp, " does not divide resources.devices_per_node ",
                     r.devices_per_node, " (a tensor-parallel group must stay inside one node)"),
        {"resources.devices_per_node"});
  }
  return std::nullopt;
}

Problem CheckTensorParallel(const ParallelismSpec& m, const JobSpec& spec) {
  const std::pair<const char*, int> sharded[] = {{"heads", spec.model.heads},
                                                 {"kv_heads", spec.model.kv_heads},
                                                 {"ffn_hidden", spec.model.ffn_hidden},
                                                 {"vocab", spec.model.vocab}};
  for (const auto& [name, value] : sharded) {
    if (value % m.tp != 0) {
      return Bad("parallelism.tp",
                 absl::StrCat("model.", name, " ", value, " is not divisible by tp ", m.tp,
                              " (tensor parallelism splits them evenly)"),
                 {absl::StrCat("model.", name), "model.preset"});
    }
  }
  // Each expert's MLP (and the shared experts', shared_experts × ffn wide) is split column- and
  // row-parallel like the dense MLP.
  const MoeConfig& moe = spec.model.moe;
  if (moe.enabled() && moe.ffn % m.tp != 0) {
    return Bad("parallelism.tp",
               absl::StrCat("model.moe.ffn ", moe.ffn, " is not divisible by tp ", m.tp,
                            " (tensor parallelism splits every expert's MLP evenly)"),
               {"model.moe.ffn", "model.moe"});
  }
  return std::nullopt;
}

Problem CheckPipeline(const ParallelismSpec& m, const ModelConfig& model) {
  if (m.pp > model.layers) {
    return Bad("parallelism.pp",
               absl::StrCat("pp ", m.pp, " exceeds model.layers ", model.layers,
                            " (every pipeline stage needs at least one layer)"),
               {"model.layers", "model.preset"});
  }
  // The first and last stages each hold the tied embedding and sum its gradients every step,
  // which needs the whole gradient on both: not sharded over the data-parallel group.
  if (m.pp > 1 && model.tied_embeddings && m.zero >= 2) {
    return Bad("parallelism.zero",
               absl::StrCat("ZeRO-", m.zero,
                            " cannot keep a token embedding tied across pipeline stages (ZeRO-0 "
                            "or 1 can)"),
               {"model.tied_embeddings", "parallelism.pp"});
  }
  return std::nullopt;
}

Problem CheckBatch(const ParallelismSpec& m, const TrainingSpec& t) {
  if (m.dp == 1) return std::nullopt;  // the single-replica rules are checked with training
  if (t.batch % m.dp != 0) {
    return Bad("training.batch",
               absl::StrCat("batch ", t.batch, " is not divisible by dp ", m.dp,
                            " (every data-parallel replica takes an equal share)"),
               {"parallelism.dp"});
  }
  if (t.micro_batch > 0 && t.batch % (int64_t{m.dp} * t.micro_batch) != 0) {
    return Bad("training.micro_batch",
               absl::StrCat("batch ", t.batch, " is not divisible by dp ", m.dp, " × micro_batch ",
                            t.micro_batch, " = ", int64_t{m.dp} * t.micro_batch),
               {"training.batch", "parallelism.dp"});
  }
  return std::nullopt;
}

// The ranks that split one replica of the model, or of its sequences: what an elastic resize
// keeps while dp takes the rest.
int64_t ModelParallelSize(const ParallelismSpec& m) { return int64_t{m.tp} * m.pp * m.cp; }

// The head-tail split cuts every sequence into 2 · cp equal chunks.
Problem CheckContextParallel(const ParallelismSpec& m, const TrainingSpec& t) {
  if (m.cp == 1) return std::nullopt;
  if (t.seq_len % (2 * int64_t{m.cp}) != 0) {
    return Bad("parallelism.cp",
               absl::StrCat("training.seq_len ", t.seq_len,
                            " is not divisible by 2 × cp = ", 2 * int64_t{m.cp},
                            " (each sequence is cut into 2 · cp equal chunks, two per rank)"),
               {"training.seq_len"});
  }
  return std::nullopt;
}

// The MoE layers' kernels are the CPU backend's until the CUDA ones have run on a device.
Problem CheckMixtureOfExpertsDevices(const ModelConfig& model, const ResourcesSpec& r) {
  if (!model.moe.enabled() || r.kind != DeviceKind::kGpu) return std::nullopt;
  return Bad("model.moe",
             "needs CPU ranks: the MoE layers have not run on a GPU yet (leave out model.moe, or "
             "write resources.kind: cpu)",
             {"resources.kind"});
}

// The sliding window runs on the CPU kernels until the CUDA attention kernels' has run on a
// device (it is checked against the CPU reference in emulation).
Problem CheckSlidingWindowDevices(const ModelConfig& model, const ResourcesSpec& r) {
  if (model.sliding_window == 0 || r.kind != DeviceKind::kGpu) return std::nullopt;
  return Bad("model.sliding_window",
             "needs CPU ranks: the CUDA attention kernels' sliding window has not run on a GPU "
             "yet (leave it out, or write resources.kind: cpu)",
             {"resources.kind"});
}

// Documents run on the CPU kernels until the CUDA attention kernels' mask has run on a device (it
// is checked against the CPU reference in emulation).
Problem CheckDocumentMaskDevices(const ModelConfig& model, const ResourcesSpec& r) {
  if (model.document_token < 0 || r.kind != DeviceKind::kGpu) return std::nullopt;
  return Bad("model.document_token",
             "needs CPU ranks: the CUDA attention kernels' document mask has not run on a GPU "
             "yet (leave it out, or write resources.kind: cpu)",
             {"resources.kind"});
}

// Latent attention's value heads are narrower than its query and key heads, which the CUDA
// attention kernels do not take.
Problem CheckLatentAttentionDevices(const ModelConfig& model, const ResourcesSpec& r) {
  if (!model.latent.enabled() || r.kind != DeviceKind::kGpu) return std::nullopt;
  return Bad("model.latent_attention",
             "needs CPU ranks: the CUDA attention kernels take value heads as wide as the query "
             "and key heads (write resources.kind: cpu)",
             {"resources.kind"});
}

// Expert parallelism splits each MoE layer's experts over groups of ep data-parallel ranks.
Problem CheckExpertParallel(const ParallelismSpec& m, const ModelConfig& model) {
  if (m.ep == 1) return std::nullopt;
  if (!model.moe.enabled()) {
    return Bad("parallelism.ep",
               absl::StrCat("ep ", m.ep, " needs a mixture-of-experts model (model.moe)"),
               {"model.moe"});
  }
  if (model.moe.experts % m.ep != 0) {
    return Bad("parallelism.ep",
               absl::StrCat("ep ", m.ep, " does not divide model.moe.experts ", model.moe.experts,
                            " (each rank of an expert-parallel group holds experts / ep)"),
               {"model.moe.experts"});
  }
  if (m.dp % m.ep != 0) {
    return Bad("parallelism.ep",
               absl::StrCat("ep ", m.ep, " does not divide dp ", m.dp,
                            " (expert-parallel groups are drawn from the data-parallel ranks)"),
               {"parallelism.dp"});
  }
  return std::nullopt;
}

// Sequence parallelism splits each micro-batch's tokens (a rank's share of each sequence under
// context parallelism) over the tensor-parallel group.
Problem CheckSequenceParallel(const ParallelismSpec& m, const TrainingSpec& t) {
  if (!m.sequence_parallel || m.tp == 1) return std::nullopt;
  const int64_t local_seq = t.seq_len / std::max(m.cp, 1);
  const int64_t tokens = int64_t{MicroBatchPerRank(t, m)} * local_seq;
  if (tokens % m.tp != 0) {
    const std::string share = m.cp == 1 ? "" : absl::StrCat(" of cp ", m.cp);
    return Bad("parallelism.sequence_parallel",
               absl::StrCat(tokens, " tokens per micro-batch (", MicroBatchPerRank(t, m), " × ",
                            local_seq, share, ") do not split over tp ", m.tp),
               {"training.micro_batch", "training.seq_len", "parallelism.tp"});
  }
  return std::nullopt;
}

int64_t MicroBatchesPerStep(const ParallelismSpec& m, const TrainingSpec& t) {
  const int micro = MicroBatchPerRank(t, m);
  return micro > 0 && m.dp > 0 ? t.batch / m.dp / micro : 0;
}

std::string MicroBatchesText(const ParallelismSpec& m, const TrainingSpec& t) {
  return absl::StrCat("batch ", t.batch, " / dp ", m.dp, " / micro_batch ", MicroBatchPerRank(t, m),
                      " gives ", MicroBatchesPerStep(m, t));
}

// Interleaved 1F1B needs two or more chunks per rank, layers that split into pp · V equal
// chunks, and micro-batches in whole rounds of pp (Megatron's rule).
Problem CheckInterleaved(const ParallelismSpec& m, const JobSpec& spec) {
  const int v = m.virtual_stages;
  if (v < 2 || v > kMaxDegree) {
    return Bad("parallelism.virtual_stages",
               absl::StrCat("interleaved needs virtual_stages of at least 2 (model chunks per "
                            "pipeline rank), got ",
                            v),
               {"parallelism.schedule"});
  }
  const int64_t chunks = int64_t{m.pp} * v;
  if (spec.model.layers % chunks != 0) {
    return Bad("parallelism.virtual_stages",
               absl::StrCat("model.layers ", spec.model.layers, " do not split into pp ", m.pp,
                            " × virtual_stages ", v, " = ", chunks, " chunks of equal size"),
               {"model.layers", "parallelism.pp"});
  }
  const int64_t micro_batches = MicroBatchesPerStep(m, spec.training);
  if (micro_batches < m.pp || micro_batches % m.pp != 0) {
    return Bad(
        "training.micro_batch",
        absl::StrCat("interleaved runs micro-batches in rounds of pp = ", m.pp,
                     " and needs a multiple of it per step; ", MicroBatchesText(m, spec.training)),
        {"training.batch", "parallelism.schedule"});
  }
  return std::nullopt;
}

// Every schedule but 1F1B needs a pipeline; ZB-H1 every block's activations until its weight
// pass, and a steady state.
Problem CheckSchedule(const ParallelismSpec& m, const JobSpec& spec) {
  if (m.virtual_stages != 1 && m.schedule != PipelineSchedule::kInterleaved) {
    return Bad("parallelism.virtual_stages",
               absl::StrCat("virtual_stages ", m.virtual_stages,
                            " needs schedule: interleaved (the only schedule with several model "
                            "chunks per rank), not ",
                            ScheduleName(m.schedule)),
               {"parallelism.schedule"});
  }
  if (m.schedule == PipelineSchedule::kOneForwardOneBackward) return std::nullopt;
  const char* name = ScheduleName(m.schedule);
  if (m.pp == 1) {
    return Bad("parallelism.schedule",
               absl::StrCat(name, " needs pp > 1 (one stage has no pipeline to schedule)"),
               {"parallelism.pp"});
  }
  if (m.schedule == PipelineSchedule::kInterleaved) return CheckInterleaved(m, spec);
  if (spec.model.recompute) {
    return Bad("parallelism.schedule",
               absl::StrCat(name,
                            " keeps every block's activations until its weight pass and cannot "
                            "run with model.recompute"),
               {"model.recompute"});
  }
  if (MicroBatchesPerStep(m, spec.training) < m.pp) {
    return Bad("training.micro_batch",
               absl::StrCat(name, " needs at least pp = ", m.pp, " micro-batches per step; ",
                            MicroBatchesText(m, spec.training)),
               {"training.batch", "parallelism.schedule"});
  }
  return std::nullopt;
}

}  // namespace

const char* ScheduleName(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kOneForwardOneBackward:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
    case PipelineSchedule::kZeroBubble:
      return "zero-bubble";
  }
  return "?";
}

std::optional<PipelineSchedule> ScheduleFromName(std::string_view name) {
  for (PipelineSchedule s : {PipelineSchedule::kOneForwardOneBackward,
                             PipelineSchedule::kInterleaved, PipelineSchedule::kZeroBubble}) {
    if (name == ScheduleName(s)) return s;
  }
  return std::nullopt;
}

int MicroBatchPerRank(const TrainingSpec& training, const ParallelismSpec& mesh) {
  if (training.micro_batch > 0) return training.micro_batch;
  return mesh.dp > 0 ? training.batch / mesh.dp : training.batch;
}

std::optional<JobSpec> ResizedSpec(const JobSpec& spec, int nodes, const ParallelismSpec* given) {
  if (nodes == spec.resources.nodes) return spec;
  if (nodes < 1) return std::nullopt;
  JobSpec resized = spec;
  resized.resources.nodes = nodes;
  const int world = nodes * spec.resources.devices_per_node;
  const int64_t model_parallel = ModelParallelSize(spec.parallelism);
  ParallelismSpec mesh = spec.parallelism;
  mesh.automatic = false;
  mesh.dp = static_cast<int>(world / model_parallel);
  // Expert-parallel groups are drawn from the data-parallel ranks: on fewer of them the experts
  // spread over the largest group both still divide (checkpoints reshard across ep).
  if (mesh.dp > 0) mesh.ep = std::gcd(mesh.ep, mesh.dp);
  // The full-size micro-batch, kept when it divides the new share of the batch.
  const int micro = MicroBatchPerRank(spec.training, spec.parallelism);
  auto fit_micro = [&](const ParallelismSpec& m) {
    const int share = m.dp > 0 ? spec.training.batch / m.dp : 0;
    int chosen = std::min(micro, std::max(share, 1));
    while (chosen > 1 && share % chosen != 0) --chosen;
    return chosen;
  };
  if (given != nullptr) {
    resized.parallelism = *given;
    resized.training.micro_batch = fit_micro(*given);
    if (FindMeshProblem(*given, resized).has_value()) return std::nullopt;
    return resized;
  }
  bool valid = world % model_parallel == 0 && mesh.dp > 0;
  if (valid) {
    // With the micro-batch it would run (a schedule may need several per step).
    resized.training.micro_batch = fit_micro(mesh);
    valid = !FindMeshProblem(mesh, resized).has_value();
  }
  if (!valid) {
    resized.training.micro_batch = 0;
    absl::StatusOr<ParallelismSpec> chosen = ChooseParallelism(resized);
    if (!chosen.ok()) return std::nullopt;
    mesh = *chosen;
    mesh.automatic = spec.parallelism.automatic;
  }
  resized.parallelism = mesh;
  resized.training.micro_batch = fit_micro(mesh);
  if (FindMeshProblem(mesh, resized).has_value()) return std::nullopt;
  return resized;
}

std::optional<JobSpec> GrownSpec(const JobSpec& spec, int nodes) {
  if (nodes <= spec.resources.nodes) return std::nullopt;
  const int64_t world = int64_t{nodes} * spec.resources.devices_per_node;
  const int64_t model_parallel = ModelParallelSize(spec.parallelism);
  if (model_parallel < 1 || world % model_parallel != 0) return std::nullopt;
  const int64_t dp = world / model_parallel;
  if (dp > spec.training.batch || spec.training.batch % dp != 0) return std::nullopt;
  ParallelismSpec mesh = spec.parallelism;
  mesh.automatic = false;
  mesh.dp = static_cast<int>(dp);
  return ResizedSpec(spec, nodes, &mesh);
}

std::optional<SpecProblem> FindMeshProblem(const ParallelismSpec& mesh, const JobSpec& spec) {
  if (Problem p = CheckDegrees(mesh)) return p;
  if (Problem p = CheckWorldSize(mesh, spec.resources)) return p;
  if (Problem p = CheckTensorParallelInANode(mesh, spec.resources)) return p;
  if (Problem p = CheckMixtureOfExpertsDevices(spec.model, spec.resources)) return p;
  if (Problem p = CheckSlidingWindowDevices(spec.model, spec.resources)) return p;
  if (Problem p = CheckDocumentMaskDevices(spec.model, spec.resources)) return p;
  if (Problem p = CheckLatentAttentionDevices(spec.model, spec.resources)) return p;
  return FindShardingProblem(mesh, spec);
}

std::optional<SpecProblem> FindShardingProblem(const ParallelismSpec& mesh, const JobSpec& spec) {
  if (Problem p = CheckDegrees(mesh)) return p;
  if (Problem p = CheckTensorParallel(mesh, spec)) return p;
  if (Problem p = CheckPipeline(mesh, spec.model)) return p;
  if (Problem p = CheckBatch(mesh, spec.training)) return p;
  if (Problem p = CheckContextParallel(mesh, spec.training)) return p;
  if (Problem p = CheckExpertParallel(mesh, spec.model)) return p;
  if (Problem p = CheckSequenceParallel(mesh, spec.training)) return p;
  return CheckSchedule(mesh, spec);
}

absl::Status MeshProblemStatus(const std::optional<SpecProblem>& problem) {
  if (!problem.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(problem->path, ": ", problem->reason));
}

MeshCoordinates CoordinatesOf(const ParallelismSpec& mesh, int rank) {
  const int tp = std::max(mesh.tp, 1), dp = std::max(mesh.dp, 1), cp = std::max(mesh.cp, 1);
  return MeshCoordinates{.dp = rank / (tp * cp) % dp,
                         .tp = rank % tp,
                         .pp = rank / (tp * cp * dp),
                         .cp = rank / tp % cp};
}

int RankAt(const ParallelismSpec& mesh, const MeshCoordinates& at) {
  const int tp = std::max(mesh.tp, 1), dp = std::max(mesh.dp, 1), cp = std::max(mesh.cp, 1);
  return ((at.pp * dp + at.dp) * cp + at.cp) * tp + at.tp;
}

absl::StatusOr<ParallelismSpec> ChooseParallelism(const JobSpec& spec) {
  const int world = spec.resources.nodes * spec.resources.devices_per_node;
  std::vector<ParallelismSpec> candidates;
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp != 0) continue;
    for (int pp = 1; pp <= world / tp; ++pp) {
      if ((world / tp) % pp != 0) continue;
      ParallelismSpec mesh;
      mesh.automatic = true;
      mesh.dp = world / tp / pp;
      mesh.tp = tp;
      mesh.pp = pp;
      mesh.zero = spec.parallelism.zero;
      candidates.push_back(mesh);
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const ParallelismSpec& a, const ParallelismSpec& b) {
                     if (ModelParallelSize(a) != ModelParallelSize(b)) {
                       return ModelParallelSize(a) < ModelParallelSize(b);
                     }
                     return a.pp < b.pp;
                   });
  for (const ParallelismSpec& mesh : candidates) {
    if (!FindMeshProblem(mesh, spec)) return mesh;
  }
  ParallelismSpec pure_dp;
  pure_dp.dp = world;
  pure_dp.zero = spec.parallelism.zero;
  const Problem why = FindMeshProblem(pure_dp, spec);
  return absl::InvalidArgumentError(absl::StrCat(
      "no dp × tp × pp split of the ", world, " ranks fits the model and batch (with dp ", world,
      ": ", why ? absl::StrCat(why->path, ": ", why->reason) : std::string("resources are invalid"),
      ")"));
}

}  // namespace trainyard::config
