#include "planner/run_report_proto.h"

#include <algorithm>

namespace trainyard::planner {
namespace {

trainyard::v1::RunFigures FiguresToProto(const RunFigures& f) {
  trainyard::v1::RunFigures out;
  out.set_parameters_bytes(f.parameters);
  out.set_gradients_bytes(f.gradients);
  out.set_optimizer_bytes(f.optimizer);
  out.set_activations_bytes(f.activations);
  out.set_transient_bytes(f.transient);
  out.set_dp_bytes(f.bytes_dp);
  out.set_tp_bytes(f.bytes_tp);
  out.set_pp_bytes(f.bytes_pp);
  out.set_cp_bytes(f.bytes_cp);
  out.set_ep_bytes(f.bytes_ep);
  out.set_step_s(f.step);
  out.set_compute_s(f.compute);
  out.set_communication_s(f.communication);
  out.set_bubble_s(f.bubble);
  out.set_bubble_fraction(f.bubble_fraction);
  out.set_mfu(f.mfu);
  return out;
}

RunFigures FiguresFromProto(const trainyard::v1::RunFigures& f) {
  RunFigures out;
  out.parameters = f.parameters_bytes();
  out.gradients = f.gradients_bytes();
  out.optimizer = f.optimizer_bytes();
  out.activations = f.activations_bytes();
  out.transient = f.transient_bytes();
  out.bytes_dp = f.dp_bytes();
  out.bytes_tp = f.tp_bytes();
  out.bytes_pp = f.pp_bytes();
  out.bytes_cp = f.cp_bytes();
  out.bytes_ep = f.ep_bytes();
  out.step = f.step_s();
  out.compute = f.compute_s();
  out.communication = f.communication_s();
  out.bubble = f.bubble_s();
  out.bubble_fraction = f.bubble_fraction();
  out.mfu = f.mfu();
  return out;
}

}  // namespace

trainyard::v1::RunReport ToProto(const RunComparison& c) {
  trainyard::v1::RunReport report;
  report.mutable_mesh()->set_dp(c.mesh.dp);
  report.mutable_mesh()->set_tp(c.mesh.tp);
  report.mutable_mesh()->set_pp(c.mesh.pp);
  report.mutable_mesh()->set_zero_stage(c.mesh.zero);
  report.mutable_mesh()->set_cp(c.mesh.cp);
  report.set_device(c.device);
  report.set_steps(c.steps);
  *report.mutable_predicted() = FiguresToProto(c.predicted);
  *report.mutable_measured() = FiguresToProto(c.measured);
  return report;
}

RunComparison FromProto(const trainyard::v1::RunReport& report) {
  RunComparison c;
  c.mesh.dp = report.mesh().dp();
  c.mesh.tp = report.mesh().tp();
  c.mesh.pp = report.mesh().pp();
  c.mesh.zero = report.mesh().zero_stage();
  c.mesh.cp = std::max(1, report.mesh().cp());  // 0: a report from before context parallelism
  c.device = report.device();
  c.steps = report.steps();
  c.predicted = FiguresFromProto(report.predicted());
  c.measured = FiguresFromProto(report.measured());
  return c;
}

}  // namespace trainyard::planner
