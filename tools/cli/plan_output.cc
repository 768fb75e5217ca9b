#include "tools/cli/plan_output.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "planner/calibration.h"
#include "planner/explain.h"
#include "tools/cli/format.h"

namespace trainyard::cli {
namespace {

std::string Number(double value) { return absl::StrFormat("%.9g", value); }

std::string CandidateJson(const planner::Candidate& c) {
  const planner::RankMemory& m = c.memory;
  return absl::StrCat(
      "{\"mesh\":{\"dp\":", c.mesh.dp, ",\"tp\":", c.mesh.tp, ",\"pp\":", c.mesh.pp,
      ",\"cp\":", c.mesh.cp, ",\"ep\":", c.mesh.ep, ",\"zero\":", c.mesh.zero, ",\"schedule\":\"",
      config::ScheduleName(c.mesh.schedule), "\",\"virtual_stages\":", c.mesh.virtual_stages,
      "},\"memory_bytes\":{\"parameters\":", m.parameters, ",\"gradients\":", m.gradients,
      ",\"optimizer\":", m.optimizer, ",\"activations\":", m.activations, ",\"other\":", m.other(),
      ",\"total\":", m.total(), "},\"fits\":", c.fits ? "true" : "false",
      ",\"step_seconds\":{\"compute\":", Number(c.step.compute),
      ",\"communication\":", Number(c.step.communication), ",\"bubble\":", Number(c.step.bubble),
      ",\"total\":", Number(c.step.total), "},\"bubble_fraction\":", Number(c.bubble_fraction),
      ",\"communication_bytes\":{\"dp\":", c.bytes_dp, ",\"tp\":", c.bytes_tp,
      ",\"pp\":", c.bytes_pp, ",\"cp\":", c.bytes_cp, ",\"ep\":", c.bytes_ep,
      "},\"mfu\":", Number(c.mfu), "}");
}

std::string Gib(int64_t bytes) { return absl::StrFormat("%.2f", bytes / double{1 << 30}); }

}  // namespace

std::string PlanJson(const planner::Plan& plan) {
  std::string out = "{\"candidates\":[";
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    absl::StrAppend(&out, i > 0 ? "," : "", CandidateJson(plan.candidates[i]));
  }
  absl::StrAppend(&out, "],\"chosen\":", plan.chosen ? absl::StrCat(*plan.chosen) : "null",
                  ",\"explanation\":", JsonString(plan.explanation), ",\"young_daly\":");
  if (plan.young_daly) {
    const planner::YoungDaly& y = *plan.young_daly;
    absl::StrAppend(&out, "{\"checkpoint_seconds\":", Number(y.checkpoint_seconds),
                    ",\"mtbf_seconds\":", Number(y.mtbf_seconds),
                    ",\"interval_seconds\":", Number(y.interval_seconds), "}");
  } else {
    absl::StrAppend(&out, "null");
  }
  absl::StrAppend(&out, "}\n");
  return out;
}

namespace {

// After the mesh in the table: "" for 1F1B, " zb" for ZB-H1, " iV" for interleaved 1F1B over V
// virtual stages.
std::string ScheduleLabel(const config::ParallelismSpec& mesh) {
  if (mesh.pp == 1) return "";
  switch (mesh.schedule) {
    case config::PipelineSchedule::kOneForwardOneBackward:
      return "";
    case config::PipelineSchedule::kInterleaved:
      return absl::StrCat(" i", mesh.virtual_stages);
    case config::PipelineSchedule::kZeroBubble:
      return " zb";
  }
  return "";
}

// The table's mesh: "dp2 tp1 pp1 z0", "dp1 cp2 tp1 pp1 z0" with context parallelism.
std::string MeshLabel(const config::ParallelismSpec& mesh) {
  return absl::StrFormat("dp%d%s%s tp%d pp%d z%d%s", mesh.dp,
                         mesh.ep > 1 ? absl::StrCat(" ep", mesh.ep) : "",
                         mesh.cp > 1 ? absl::StrCat(" cp", mesh.cp) : "", mesh.tp, mesh.pp,
                         mesh.zero, ScheduleLabel(mesh));
}

}  // namespace

std::string PlanText(const planner::Plan& plan, const config::JobSpec& spec) {
  const config::ModelConfig& model = spec.model;
  // An MoE model's tokens each use a share of its parameters, which its FLOPs count.
  const std::string active =
      model.moe.enabled()
          ? absl::StrFormat(" (%.1fM active per token)", model.ActiveParameterCount() / 1e6)
          : "";
  std::string out = absl::StrFormat(
      "plan for %s: %s, %d layers, width %d, %.1fM parameters%s; batch %d × %d tokens\n"
      "on %d node(s) × %d: %s\n",
      spec.name, config::FamilyName(model.family), model.layers, model.width,
      model.ParameterCount() / 1e6, active, spec.training.batch, spec.training.seq_len, plan.nodes,
      plan.devices_per_node, plan.device.description);
  // Ring attention's bytes only where some candidate splits the sequences.
  const bool any_cp = std::any_of(plan.candidates.begin(), plan.candidates.end(),
                                  [](const planner::Candidate& c) { return c.mesh.cp > 1; });
  std::vector<std::vector<std::string>> rows = {
      {"mesh", "GiB/rank", "params", "grads", "optim", "activ", "other", "fits", "step", "compute",
       "comm", "bubble", "tok/s", "MFU", "dp bytes", "tp bytes", "pp bytes"}};
  if (any_cp) rows.front().push_back("cp bytes");
  // Expert parallelism's all-to-all bytes only where some candidate splits the experts.
  const bool any_ep = std::any_of(plan.candidates.begin(), plan.candidates.end(),
                                  [](const planner::Candidate& c) { return c.mesh.ep > 1; });
  if (any_ep) rows.front().push_back("ep bytes");
  for (const planner::Candidate& c : plan.candidates) {
    const planner::RankMemory& m = c.memory;
    rows.push_back({MeshLabel(c.mesh), Gib(m.total()), Gib(m.parameters), Gib(m.gradients),
                    Gib(m.optimizer), Gib(m.activations), Gib(m.other()), c.fits ? "yes" : "NO",
                    planner::HumanSeconds(c.step.total), planner::HumanSeconds(c.step.compute),
                    planner::HumanSeconds(c.step.communication),
                    planner::HumanSeconds(c.step.bubble), FormatCount(c.tokens_per_second),
                    absl::StrFormat("%.1f%%", 100 * c.mfu), planner::HumanBytes(c.bytes_dp),
                    planner::HumanBytes(c.bytes_tp), planner::HumanBytes(c.bytes_pp)});
    if (any_cp) rows.back().push_back(planner::HumanBytes(c.bytes_cp));
    if (any_ep) rows.back().push_back(planner::HumanBytes(c.bytes_ep));
  }
  absl::StrAppend(&out, "\n", Table(rows), "\n");
  // One sentence per line: each ends with ". " before the next mesh's name or the end.
  for (absl::string_view sentence : absl::StrSplit(plan.explanation, ". ")) {
    absl::StrAppend(&out, sentence, absl::EndsWith(sentence, ".") ? "" : ".", "\n");
  }
  if (plan.young_daly) {
    const planner::YoungDaly& y = *plan.young_daly;
    absl::StrAppendFormat(
        &out,
        "Young–Daly: checkpoint every %s of training (Daly's higher-order form; "
        "first-order √(2δM) = %s) for δ = %s per checkpoint and M = %s",
        planner::HumanSeconds(y.interval_seconds), planner::HumanSeconds(y.young_seconds),
        planner::HumanSeconds(y.checkpoint_seconds), planner::HumanSeconds(y.mtbf_seconds));
    if (plan.chosen) {
      absl::StrAppendFormat(&out, ": about %.0f steps of the chosen mesh",
                            y.interval_seconds / plan.candidates[*plan.chosen].step.total);
    }
    absl::StrAppend(&out, ".\n");
  }
  if (!plan.device.calibrated) {
    absl::StrAppend(&out,
                    "note: the cpu profile is a placeholder; `trainyard plan --calibrate` "
                    "measures this machine.\n");
  } else if (spec.model.moe.enabled() && plan.device.name == "cpu" &&
             plan.device.reference !=
                 planner::CalibrationReferenceName(planner::CalibrationReference(spec))) {
    // Expert GEMMs over a few rows run slower per FLOP than a dense reference's (docs/planner.md).
    absl::StrAppendFormat(&out,
                          "note: the cpu profile was measured on another model (%s); this MoE "
                          "model's small expert GEMMs run slower per FLOP, so its steps are "
                          "predicted short: `trainyard plan --calibrate SPEC` measures on this "
                          "spec's own model and micro-batch.\n",
                          plan.device.reference.empty() ? "not recorded" : plan.device.reference);
  }
  return out;
}

std::string CalibrationText(const planner::Calibration& c, const std::string& path, int kept) {
  std::string shared;
  for (const planner::SharedRanksCalibration& r : c.shared) {
    absl::StrAppendFormat(
        &shared,
        "  %d rank%s at once: reference pass %s, %.1f GFLOP/s effective; optimizer step %s",
        r.entry.ranks, r.entry.ranks == 1 ? "" : "s", planner::HumanSeconds(r.pass_seconds),
        r.entry.matmul_flops / 1e9, planner::HumanSeconds(r.optimizer_step_seconds));
    if (r.entry.ranks >= 2) {
      absl::StrAppendFormat(
          &shared, "; a tensor-parallel pair waits %s per pass in collectives, α = %.1f µs",
          planner::HumanSeconds(r.collective_seconds), r.entry.link.alpha_seconds * 1e6);
      if (r.entry.ranks == 2) {
        absl::StrAppendFormat(&shared, ", and computes %s, %.1f GFLOP/s",
                              planner::HumanSeconds(r.lockstep_compute_seconds),
                              r.entry.lockstep_matmul_flops / 1e9);
      }
    }
    if (r.entry.ranks >= 3) {
      absl::StrAppendFormat(
          &shared, "; all in pairs at once: %s, α = %.1f µs, computing %s, %.1f GFLOP/s",
          planner::HumanSeconds(r.lockstep_collective_seconds),
          r.entry.lockstep_alpha_seconds * 1e6, planner::HumanSeconds(r.lockstep_compute_seconds),
          r.entry.lockstep_matmul_flops / 1e9);
    }
    if (r.entry.ranks >= 2) {
      absl::StrAppendFormat(
          &shared, "; a communication thread's all-reduce beside compute: %s, α = %.1f µs",
          planner::HumanSeconds(r.background_seconds), r.entry.background_alpha_seconds * 1e6);
    }
    shared += "\n";
  }
  return absl::StrFormat(
      "calibrated the cpu profile on this machine:\n"
      "  GEMM (CPU backend, fp32): %.1f GFLOP/s at 512³, %.1f GFLOP/s at 1024³\n"
      "  memory bandwidth (elementwise add): %.1f GB/s\n"
      "  Gloo over loopback, 2 ranks: α = %.1f µs per message, β⁻¹ = %.2f GB/s\n"
      "  ranks sharing the cores (per rank, reference %s):\n%s"
      "  memory: %.1f GiB\n"
      "stored in %s; the profile the planner uses is %s\n",
      c.gemm_flops / 1e9, c.large_gemm_flops / 1e9, c.add_bytes_per_second / 1e9,
      c.alpha_seconds * 1e6, c.bytes_per_second / 1e9, c.reference_name, shared,
      c.profile.memory_bytes / double{1 << 30}, path,
      kept == 1 ? std::string("this calibration")
                : absl::StrCat("the median of the last ", kept,
                               " calibrations of this machine with this reference, this one "
                               "included (--calibrate --fresh starts over)"));
}

std::string CalibrationJson(const planner::Calibration& c, const std::string& path, int kept) {
  std::vector<std::string> shared;
  for (const planner::SharedRanksCalibration& r : c.shared) {
    shared.push_back(absl::StrCat(
        "{\"ranks\":", r.entry.ranks, ",\"pass_seconds\":", Number(r.pass_seconds),
        ",\"optimizer_step_seconds\":", Number(r.optimizer_step_seconds),
        ",\"optimizer_elements_per_second\":", Number(r.entry.optimizer_elements_per_second),
        ",\"matmul_flops\":", Number(r.entry.matmul_flops), ",\"collective_seconds\":",
        Number(r.collective_seconds), ",\"alpha_seconds\":", Number(r.entry.link.alpha_seconds),
        ",\"lockstep_collective_seconds\":", Number(r.lockstep_collective_seconds),
        ",\"lockstep_alpha_seconds\":", Number(r.entry.lockstep_alpha_seconds),
        ",\"lockstep_compute_seconds\":", Number(r.lockstep_compute_seconds),
        ",\"lockstep_matmul_flops\":", Number(r.entry.lockstep_matmul_flops),
        ",\"background_seconds\":", Number(r.background_seconds),
        ",\"background_alpha_seconds\":", Number(r.entry.background_alpha_seconds), "}"));
  }
  return absl::StrCat("{\"calibration\":{\"gemm_flops\":", Number(c.gemm_flops),
                      ",\"large_gemm_flops\":", Number(c.large_gemm_flops),
                      ",\"memory_bytes_per_second\":", Number(c.add_bytes_per_second),
                      ",\"alpha_seconds\":", Number(c.alpha_seconds),
                      ",\"bytes_per_second\":", Number(c.bytes_per_second),
                      ",\"reference\":", JsonString(c.reference_name), ",\"shared_ranks\":[",
                      absl::StrJoin(shared, ","), "],\"memory_bytes\":", c.profile.memory_bytes,
                      ",\"path\":", JsonString(path), ",\"calibrations_kept\":", kept, "}}\n");
}

}  // namespace trainyard::cli
