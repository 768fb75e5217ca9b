#include "planner/run_report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/mesh.h"
#include "planner/explain.h"
#include "planner/memory_model.h"
#include "planner/planner.h"
#include "planner/rank_shape.h"

namespace trainyard::planner {
namespace {

std::string ErrorText(double predicted, double measured) {
  const double error = RelativeError(predicted, measured);
  if (std::isinf(error)) return "n/a";
  return absl::StrFormat("%+.1f%%", 100 * error);
}

void AddRow(std::string* out, const std::string& what, const std::string& predicted,
            const std::string& measured, const std::string& error) {
  absl::StrAppendFormat(out, "  %-26s %14s %14s %9s\n", what, predicted, measured, error);
}

void AddBytes(std::string* out, const std::string& what, int64_t predicted, int64_t measured) {
  AddRow(out, what, absl::StrCat(predicted), absl::StrCat(measured),
         ErrorText(static_cast<double>(predicted), static_cast<double>(measured)));
}

void AddSeconds(std::string* out, const std::string& what, double predicted, double measured) {
  AddRow(out, what, HumanSeconds(predicted), HumanSeconds(measured),
         ErrorText(predicted, measured));
}

}  // namespace

RunFigures PredictRun(const config::JobSpec& spec, const DeviceProfile& device,
                      const LoopOptions& loop, int rank) {
  const config::ParallelismSpec& mesh = spec.parallelism;
  const Candidate whole = Evaluate(spec, mesh, device, loop);
  const config::MeshCoordinates at = config::CoordinatesOf(mesh, rank);
  const RankShape shape = ShapeOf(spec, mesh, at.pp);
  const BackendShape backend{device.act_bytes, device.max_logits_chunk,
                             device.logits_vocab_multiple};
  const RankMemory memory = PredictRankMemory(shape, backend);
  RunFigures f;
  f.parameters = memory.parameters;
  f.gradients = memory.gradients;
  f.optimizer = memory.optimizer;
  f.activations = memory.activations;
  f.transient = memory.transient;
  f.bytes_dp = TotalBytes(DataParallelTraffic(shape, loop, DataGroupRank(mesh, at)));
  f.bytes_tp = TotalBytes(TensorParallelTraffic(shape, backend, loop, at.tp));
  f.bytes_pp = TotalBytes(PipelineTraffic(shape, backend, loop, at.pp)) +
               TotalBytes(TiedEmbeddingTraffic(shape));
  f.bytes_cp = TotalBytes(ContextParallelTraffic(shape, backend));
  f.bytes_ep = TotalBytes(ExpertParallelTraffic(shape, backend));
  f.step = whole.step.total;
  f.compute = whole.step.compute;
  f.communication = whole.step.communication;
  f.bubble = whole.step.bubble;
  f.bubble_fraction = whole.bubble_fraction;
  f.mfu = device.calibrated ? whole.mfu : std::numeric_limits<double>::quiet_NaN();
  return f;
}

double MfuAt(const config::JobSpec& spec, const DeviceProfile& device, double step_seconds) {
  // A placeholder profile's peak is no machine's: an MFU against it means nothing (it read 149%
  // on a 2-core machine).
  if (!device.calibrated) return std::numeric_limits<double>::quiet_NaN();
  const double share = device.shared_node ? spec.resources.devices_per_node : 1;
  const double peak = device.peak_flops / std::max(1.0, share);
  if (!(step_seconds > 0) || !(peak > 0)) return 0;
  return ModelFlopsPerStep(spec) / (step_seconds * spec.parallelism.world_size() * peak);
}

double RelativeError(double predicted, double measured) {
  if (measured == 0) return predicted == 0 ? 0 : std::numeric_limits<double>::infinity();
  return (predicted - measured) / measured;
}

std::string ComparisonText(const RunComparison& c) {
  const RunFigures& p = c.predicted;
  const RunFigures& m = c.measured;
  std::string out = absl::StrFormat(
      "predicted vs measured: %s, rank 0, per step (mean of %d steps), device profile %s\n",
      MeshName(c.mesh), c.steps, c.device);
  AddRow(&out, "", "predicted", "measured", "error");
  AddBytes(&out, "memory parameters", p.parameters, m.parameters);
  AddBytes(&out, "memory gradients", p.gradients, m.gradients);
  AddBytes(&out, "memory optimizer", p.optimizer, m.optimizer);
  AddBytes(&out, "memory activations", p.activations, m.activations);
  AddBytes(&out, "memory transient", p.transient, m.transient);
  AddBytes(&out, "memory total", p.total(), m.total());
  AddBytes(&out, "bytes sent dp", p.bytes_dp, m.bytes_dp);
  AddBytes(&out, "bytes sent tp", p.bytes_tp, m.bytes_tp);
  AddBytes(&out, "bytes sent pp", p.bytes_pp, m.bytes_pp);
  // Ring attention's row for a cp mesh, whose prediction is never 0; a report that came over the
  // wire has no cp figures (v1::RunFigures carries none yet) and shows no row rather than zeros.
  if (c.mesh.cp > 1 && (p.bytes_cp > 0 || m.bytes_cp > 0)) {
    AddBytes(&out, "bytes sent cp", p.bytes_cp, m.bytes_cp);
  }
  if (c.mesh.ep > 1 && (p.bytes_ep > 0 || m.bytes_ep > 0)) {
    AddBytes(&out, "bytes sent ep", p.bytes_ep, m.bytes_ep);
  }
  AddSeconds(&out, "step", p.step, m.step);
  AddSeconds(&out, "step compute", p.compute, m.compute);
  AddSeconds(&out, "step communication", p.communication, m.communication);
  AddSeconds(&out, "step bubble", p.bubble, m.bubble);
  AddRow(&out, "bubble fraction", absl::StrFormat("%.3f", p.bubble_fraction),
         absl::StrFormat("%.3f", m.bubble_fraction),
         ErrorText(p.bubble_fraction, m.bubble_fraction));
  if (std::isfinite(p.mfu) && std::isfinite(m.mfu)) {
    AddRow(&out, "MFU", absl::StrFormat("%.2f%%", 100 * p.mfu),
           absl::StrFormat("%.2f%%", 100 * m.mfu), ErrorText(p.mfu, m.mfu));
  } else {
    AddRow(&out, "MFU", "n/a", "n/a",
           "no measured peak: the profile is not calibrated (trainyard plan --calibrate)");
  }
  return out;
}

}  // namespace trainyard::planner
