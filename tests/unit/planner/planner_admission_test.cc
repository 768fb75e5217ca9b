// The planner where jobs are admitted: `parallelism: auto` is the planner's fitting choice, a
// mesh that cannot fit is refused with the explanation (planner/admission.h), the coordinator's
// view of "the nodes it would run on" (server/mesh_advisor.h), and the run report's comparison
// (planner/run_report.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/admission.h"
#include "planner/planner.h"
#include "planner/run_report.h"
#include "planner/run_report_proto.h"
#include "server/mesh_advisor.h"

namespace trainyard::planner {
namespace {

using ::testing::HasSubstr;

config::JobSpec Gpt2Debug(int devices) {
  config::JobSpec spec;
  spec.name = "admit";
  spec.model = *config::Preset("gpt2-debug");
  spec.training.batch = 8;
  spec.training.seq_len = 32;
  spec.resources.devices_per_node = devices;
  spec.parallelism.dp = devices;
  return spec;
}

// A GPU-like profile whose one device holds `bytes`.
DeviceProfile DeviceWith(int64_t bytes) {
  DeviceProfile device = *PublishedProfile("h100");
  device.memory_bytes = bytes;
  return device;
}

config::ParallelismSpec PureDataParallel(int dp) {
  config::ParallelismSpec mesh;
  mesh.dp = dp;
  return mesh;
}

// Memory between the smallest footprint and plain data parallelism's: only sharded meshes fit.
int64_t TightMemory(const config::JobSpec& spec) {
  int64_t smallest = INT64_MAX;
  for (const config::ParallelismSpec& mesh : ValidMeshes(spec)) {
    smallest = std::min(smallest, Evaluate(spec, mesh, DeviceWith(1), {}).memory.total());
  }
  const int64_t plain = Evaluate(spec, PureDataParallel(4), DeviceWith(1), {}).memory.total();
  EXPECT_LT(smallest, plain);
  return (smallest + plain) / 2;
}

TEST(PlannerAdmission, AutoPicksTheFastestMeshThatFits) {
  const config::JobSpec spec = Gpt2Debug(4);
  const DeviceProfile device = DeviceWith(TightMemory(spec));
  absl::StatusOr<config::ParallelismSpec> mesh = ChooseMesh(spec, device, {}, "test");
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_TRUE(mesh->automatic);
  EXPECT_TRUE(Evaluate(spec, *mesh, device, {}).fits) << MeshName(*mesh);
  EXPECT_FALSE(mesh->dp == 4 && mesh->zero == 0) << "plain data parallelism does not fit";
  PlanRequest request;
  request.spec = spec;
  request.device = device;
  const Plan plan = *MakePlan(request);
  ASSERT_TRUE(plan.chosen.has_value());
  EXPECT_EQ(MeshName(*mesh), MeshName(plan.candidates[*plan.chosen].mesh));
}

TEST(PlannerAdmission, AutoWithNothingThatFitsExplains) {
  const config::JobSpec spec = Gpt2Debug(4);
  absl::StatusOr<config::ParallelismSpec> mesh =
      ChooseMesh(spec, DeviceWith(1024), {}, "node n1: 1 KiB");
  ASSERT_EQ(mesh.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(mesh.status().message(), HasSubstr("no mesh of the 4 ranks fits"));
  EXPECT_THAT(mesh.status().message(), HasSubstr("node n1: 1 KiB"));
  EXPECT_THAT(mesh.status().message(), HasSubstr("Nothing fits"));
}

TEST(PlannerAdmission, AMeshThatCannotFitIsRefusedWithItsFootprintAndOneThatFits) {
  config::JobSpec spec = Gpt2Debug(4);
  const DeviceProfile device = DeviceWith(TightMemory(spec));
  const absl::Status refused = CheckMeshFits(spec, device, {}, "GPU 0 of node n1");
  ASSERT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("does not fit in memory: dp 4 × tp 1 × pp 1, ZeRO-0"));
  EXPECT_THAT(refused.message(), HasSubstr("parameters"));
  EXPECT_THAT(refused.message(), HasSubstr("GPU 0 of node n1"));
  EXPECT_THAT(refused.message(), HasSubstr("`parallelism: auto` would choose it"));
  spec.parallelism = *ChooseMesh(spec, device, {}, "");
  EXPECT_TRUE(CheckMeshFits(spec, device, {}, "").ok());
}

// An MoE job's own mesh is checked, and the one `auto` would choose suggested, expert
// parallelism included.
TEST(PlannerAdmission, AnMoeMeshIsCheckedAndTheBestOneSuggested) {
  config::JobSpec spec = Gpt2Debug(4);
  spec.model.moe = config::MoeConfig{.experts = 4, .top_k = 2, .ffn = 64};
  const int64_t need = Evaluate(spec, spec.parallelism, DeviceWith(1), {}).memory.total();
  const absl::Status refused = CheckMeshFits(spec, DeviceWith(need - 1), {}, "node n1");
  ASSERT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("does not fit in memory: dp 4 × tp 1 × pp 1, ZeRO-0"));
  EXPECT_THAT(refused.message(),
              HasSubstr("per rank), and `parallelism: auto` would choose it: Chose "));
  EXPECT_TRUE(CheckMeshFits(spec, DeviceWith(need), {}, "node n1").ok());
}

server::NodeStatus CpuNode(const std::string& id, int64_t memory, bool connected = true) {
  server::NodeStatus node;
  node.record.node_id = id;
  node.record.cpu_slots = 4;
  node.record.memory_bytes = memory;
  node.connected = connected;
  return node;
}

DeviceProfile SharedCpu() {
  DeviceProfile cpu = DeviceWith(0);
  cpu.name = "cpu";
  cpu.shared_node = true;
  return cpu;
}

TEST(PlannerAdmission, CoordinatorChecksTheSmallestConnectedNodeOfTheJobsKind) {
  config::JobSpec spec = Gpt2Debug(4);
  const int64_t per_rank = TightMemory(spec);
  // Two ranks' worth is ample; the disconnected tiny node does not count.
  const std::vector<server::NodeStatus> nodes = {CpuNode("big", 64 * per_rank),
                                                 CpuNode("small", 4 * per_rank),
                                                 CpuNode("gone", 1024, /*connected=*/false)};
  const absl::StatusOr<server::Admission> refused = server::AdmitSpec(spec, nodes, SharedCpu());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("node small"));

  spec.parallelism.automatic = true;
  const absl::StatusOr<server::Admission> automatic = server::AdmitSpec(spec, nodes, SharedCpu());
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_TRUE(automatic->spec.parallelism.automatic);
  EXPECT_FALSE(automatic->spec.parallelism.dp == 4 && automatic->spec.parallelism.zero == 0);
  EXPECT_THAT(automatic->note, HasSubstr("node small"));
}

TEST(PlannerAdmission, WithNoNodeReportingMemoryTheJobIsAcceptedUnchecked) {
  config::JobSpec spec = Gpt2Debug(4);
  const absl::StatusOr<server::Admission> admitted =
      server::AdmitSpec(spec, {CpuNode("old-agent", 0)}, SharedCpu());
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_THAT(admitted->note, HasSubstr("memory not checked"));
  spec.resources.kind = config::DeviceKind::kGpu;
  EXPECT_TRUE(server::AdmitSpec(spec, {CpuNode("cpu-only", 1 << 30)}, SharedCpu()).ok());
}

TEST(PlannerRunReport, ShowsPredictedMeasuredAndTheErrorOfEach) {
  const config::JobSpec spec = Gpt2Debug(2);
  RunComparison c;
  c.mesh = spec.parallelism;
  c.device = "cpu";
  c.steps = 10;
  c.predicted = PredictRun(spec, DeviceWith(int64_t{1} << 40), {}, 0);
  c.measured = c.predicted;
  c.measured.step = c.predicted.step * 1.25;  // predicted 20% low
  c.measured.activations = 0;
  EXPECT_DOUBLE_EQ(RelativeError(8, 10), -0.2);
  EXPECT_TRUE(std::isinf(RelativeError(1, 0)));
  EXPECT_EQ(RelativeError(0, 0), 0);
  const std::string text = ComparisonText(FromProto(ToProto(c)));
  EXPECT_THAT(text, HasSubstr("predicted vs measured: dp 2 × tp 1 × pp 1, ZeRO-0"));
  EXPECT_THAT(text, HasSubstr("device profile cpu"));
  EXPECT_THAT(text, ::testing::ContainsRegex("memory parameters +[0-9]+ +[0-9]+ +\\+0\\.0%"));
  EXPECT_THAT(text,
              ::testing::ContainsRegex("step +[0-9.]+ (µs|ms|s) +[0-9.]+ (µs|ms|s) +-20\\.0%"));
  EXPECT_THAT(text, ::testing::ContainsRegex("memory activations +[0-9]+ +0 +n/a"));
  EXPECT_THAT(text, HasSubstr("bytes sent dp"));
  EXPECT_THAT(text, HasSubstr("MFU"));
  EXPECT_GT(c.predicted.bytes_dp, 0);
  EXPECT_EQ(c.predicted.bytes_pp, 0);
}

// MFU needs a true peak: against the uncalibrated CPU placeholder (50 GFLOP/s, which a 2-core
// machine's run beat at 149%) the report says it has none instead of printing a number, also
// after the coordinator's round trip.
TEST(PlannerRunReport, NoMfuWithoutAMeasuredPeak) {
  const config::JobSpec spec = Gpt2Debug(2);
  DeviceProfile device = *PublishedProfile("h100");
  device.calibrated = false;  // as LoadCpuProfile's placeholder is
  RunComparison c;
  c.mesh = spec.parallelism;
  c.device = device.name;
  c.steps = 3;
  c.predicted = PredictRun(spec, device, {}, 0);
  c.measured = c.predicted;
  c.measured.mfu = MfuAt(spec, device, 1e-6);  // a step far faster than the placeholder allows
  EXPECT_TRUE(std::isnan(c.predicted.mfu));
  EXPECT_TRUE(std::isnan(c.measured.mfu));
  const std::string text = ComparisonText(FromProto(ToProto(c)));
  EXPECT_THAT(text, ::testing::ContainsRegex("MFU +n/a +n/a +no measured peak"));
  EXPECT_THAT(text, ::testing::Not(::testing::ContainsRegex("MFU +[0-9]")));

  device.calibrated = true;
  EXPECT_GT(MfuAt(spec, device, 1.0), 0);
  EXPECT_TRUE(std::isfinite(PredictRun(spec, device, {}, 0).mfu));
}

// A cp mesh's report has ring attention's row; a mesh without context parallelism none.
TEST(PlannerRunReport, ContextParallelMeshesShowTheRingsBytes) {
  config::JobSpec spec = Gpt2Debug(2);
  spec.parallelism.dp = 1;
  spec.parallelism.cp = 2;
  RunComparison c;
  c.mesh = spec.parallelism;
  c.device = "cpu";
  c.steps = 2;
  c.predicted = PredictRun(spec, DeviceWith(int64_t{1} << 40), {}, 1);
  c.measured = c.predicted;
  EXPECT_GT(c.predicted.bytes_cp, 0);
  EXPECT_GT(c.predicted.bytes_dp, 0);  // the gradients' sum over the two cp ranks
  const std::string text = ComparisonText(c);
  EXPECT_THAT(text, HasSubstr("predicted vs measured: dp 1 × cp 2 × tp 1 × pp 1, ZeRO-0"));
  EXPECT_THAT(text, ::testing::ContainsRegex("bytes sent cp +[0-9]+ +[0-9]+ +\\+0\\.0%"));
  EXPECT_EQ(FromProto(ToProto(c)).mesh.cp, 2);
  EXPECT_THAT(ComparisonText(FromProto(ToProto(c))), HasSubstr("dp 1 × cp 2"));

  spec.parallelism.dp = 2;
  spec.parallelism.cp = 1;
  c.mesh = spec.parallelism;
  c.predicted = c.measured = PredictRun(spec, DeviceWith(int64_t{1} << 40), {}, 0);
  EXPECT_EQ(c.predicted.bytes_cp, 0);
  EXPECT_THAT(ComparisonText(c), ::testing::Not(HasSubstr("bytes sent cp")));
}

}  // namespace
}  // namespace trainyard::planner
