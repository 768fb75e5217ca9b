// The planner through a real control plane on loopback: a job that cannot fit the memory of the
// connected nodes is refused at submit with the planner's explanation (exit 2); `parallelism:
// auto` runs on the mesh `trainyard plan` chooses; and at the end `trainyard report` (and
// `status`) show the prediction beside the measurement with the error of each.
#include <algorithm>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/controlplane_util.h"

namespace trainyard::testenv {
namespace {

using ::testing::HasSubstr;

// A Llama 1B on two CPU ranks with a batch whose activations no machine holds.
constexpr char kTooBig[] =
    "name: too-big\nmodel: {preset: llama-1b}\n"
    "data: {source: markov, markov: {vocab: 32, train_tokens: 50000, val_tokens: 2000}}\n"
    "training: {steps: 2, batch: 256, seq_len: 2048, eval_every: 0}\n"
    "resources: {nodes: 1, devices_per_node: 2}\n";

// The first candidate's mesh in `trainyard plan --json` (the chosen one when anything fits).
std::string ChosenMesh(const std::string& json) {
  std::smatch m;
  if (!std::regex_search(
          json, m,
          std::regex("\"mesh\":\\{\"dp\":(\\d+),\"tp\":(\\d+),\"pp\":(\\d+),\"cp\":(\\d+),"
                     "\"ep\":\\d+,\"zero\":(\\d+),\"schedule\":\"[a-z0-9-]+\",\"virtual_stages\":"
                     "\\d+\\}"))) {
    return "";
  }
  return absl::StrCat(m[1].str(), ",", m[2].str(), ",", m[3].str(), ",", m[4].str(), ",",
                      m[5].str());
}

// Submits `spec` and watches it to its end: its job id and its status.
void RunToTheEnd(ControlPlane& cp, const std::string& spec, std::string* job,
                 v1::GetJobReply* reply) {
  const ProcessResult submitted = cp.Cli({"submit", spec, "--watch"});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err;
  *job = submitted.out.substr(0, submitted.out.find('\n'));
  *reply = cp.Status(*job);
  ASSERT_GT(reply->attempts_size(), 0);
}

TEST(PlannerControlPlane, RefusesWhatCannotFitAndReportsPredictedVsMeasured) {
  ControlPlane cp("planner_cp");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  // The local agent registers (with its memory) before the first submission is checked.
  for (int i = 0; i < 100 && cp.Cli({"nodes"}).out.find("local") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }

  const std::string fixed =
      cp.WriteSpec("fixed.yaml", absl::StrCat(kTooBig, "parallelism: {dp: 2}\n"));
  const ProcessResult refused = cp.Cli({"submit", fixed});
  EXPECT_EQ(refused.exit_code, 2) << refused.out << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("does not fit in memory: dp 2 × tp 1 × pp 1, ZeRO-0 needs"));
  EXPECT_THAT(refused.err, HasSubstr("node local"));
  const std::string automatic =
      cp.WriteSpec("auto.yaml", absl::StrCat(kTooBig, "parallelism: auto\n"));
  const ProcessResult refused_auto = cp.Cli({"submit", automatic});
  EXPECT_EQ(refused_auto.exit_code, 2) << refused_auto.out << refused_auto.err;
  EXPECT_THAT(refused_auto.err, HasSubstr("Nothing fits"));

  std::string tiny = TinySpec({.name = "auto", .ranks_per_node = 2, .steps = 8});
  tiny = absl::StrReplaceAll(tiny, {{"parallelism: {dp: 2}", "parallelism: auto"}});
  const std::string spec = cp.WriteSpec("tiny.yaml", tiny);
  const ProcessResult plan = cp.Cli({"plan", spec, "--json"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  std::string job;
  v1::GetJobReply reply;
  ASSERT_NO_FATAL_FAILURE(RunToTheEnd(cp, spec, &job, &reply));
  const v1::Mesh& ran = reply.attempts(0).mesh();
  EXPECT_EQ(absl::StrCat(ran.dp(), ",", ran.tp(), ",", ran.pp(), ",", std::max(1, ran.cp()), ",",
                         ran.zero_stage()),
            ChosenMesh(plan.out))
      << plan.out;

  const ProcessResult report = cp.Cli({"report", job});
  EXPECT_EQ(report.exit_code, 0) << report.err;
  EXPECT_THAT(report.out, HasSubstr("predicted vs measured"));
  EXPECT_THAT(report.out, ::testing::ContainsRegex("memory parameters +[0-9]+ +[0-9]+ +\\+0\\.0%"));
  EXPECT_THAT(report.out, ::testing::ContainsRegex("bytes sent dp +[0-9]+ +[0-9]+ +[-+]"));
  EXPECT_THAT(report.out,
              ::testing::ContainsRegex("step +[0-9.]+ (µs|ms|s) +[0-9.]+ (µs|ms|s) +[-+]"));
  const v1::RunReport& run = reply.job().progress().run_report();
  EXPECT_EQ(run.steps(), 8);
  EXPECT_GT(run.measured().step_s(), 0);
  EXPECT_EQ(run.predicted().parameters_bytes(), run.measured().parameters_bytes());
  EXPECT_THAT(cp.Cli({"status", job}).out, HasSubstr("predicted vs measured"));
  EXPECT_THAT(cp.Cli({"logs", job, "--rank", "0"}).out, HasSubstr("predicted vs measured"));
}

// An MoE job's expert-parallel degree travels with its mesh: under `parallelism: auto` the
// attempt runs the mesh `trainyard plan` chooses, ep included; a written ep 2 is stored with the
// attempt and its ranks split the experts.
TEST(PlannerControlPlane, MoeMeshesCarryTheirExpertParallelDegree) {
  ControlPlane cp("planner_moe_cp");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  for (int i = 0; i < 100 && cp.Cli({"nodes"}).out.find("local") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::string tiny = TinySpec({.name = "moe",
                               .ranks_per_node = 2,
                               .steps = 4,
                               .model = "{preset: gpt2-debug, moe: {experts: 4, top_k: 2}}"});
  const std::string automatic = cp.WriteSpec(
      "moe-auto.yaml", absl::StrReplaceAll(tiny, {{"parallelism: {dp: 2}", "parallelism: auto"}}));
  const ProcessResult plan = cp.Cli({"plan", automatic, "--json"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  std::smatch chosen;
  ASSERT_TRUE(std::regex_search(plan.out, chosen,
                                std::regex("\"mesh\":\\{\"dp\":(\\d+),\"tp\":(\\d+),\"pp\":(\\d+),"
                                           "\"cp\":\\d+,\"ep\":(\\d+),\"zero\":(\\d+)")))
      << plan.out;
  std::string job;
  v1::GetJobReply reply;
  ASSERT_NO_FATAL_FAILURE(RunToTheEnd(cp, automatic, &job, &reply));
  EXPECT_EQ(reply.job().state(), v1::JOB_STATE_SUCCEEDED) << cp.Cli({"status", job}).out;
  const v1::Mesh& ran = reply.attempts(0).mesh();
  EXPECT_EQ(
      absl::StrCat(ran.dp(), ",", ran.tp(), ",", ran.pp(), ",", ran.ep(), ",", ran.zero_stage()),
      absl::StrCat(chosen[1].str(), ",", chosen[2].str(), ",", chosen[3].str(), ",",
                   chosen[4].str(), ",", chosen[5].str()))
      << plan.out;

  const std::string written = cp.WriteSpec(
      "moe-ep2.yaml",
      absl::StrReplaceAll(tiny, {{"parallelism: {dp: 2}", "parallelism: {dp: 2, ep: 2}"}}));
  ASSERT_NO_FATAL_FAILURE(RunToTheEnd(cp, written, &job, &reply));
  EXPECT_EQ(reply.job().state(), v1::JOB_STATE_SUCCEEDED) << cp.Cli({"status", job}).out;
  EXPECT_EQ(reply.attempts(0).mesh().ep(), 2);
  EXPECT_THAT(cp.Cli({"status", job}).out, HasSubstr("dp 2 (experts over ep 2) × tp 1"));
  EXPECT_THAT(cp.Cli({"logs", job, "--rank", "0"}).out, HasSubstr("(experts over ep 2)"));
}

// `schedule: auto` on a fixed pp 2 mesh: the coordinator's planner picks the schedule (and its
// virtual stages) at submit, the attempt records it, its ranks run it, and it is the one
// `trainyard plan` chooses for that mesh.
TEST(PlannerControlPlane, ScheduleAutoRunsThePlannersSchedule) {
  ControlPlane cp("planner_schedule_cp");
  cp.StartServer({.local_agent = true, .local_slots = 2});
  for (int i = 0; i < 100 && cp.Cli({"nodes"}).out.find("local") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::string tiny = TinySpec({.name = "schedule", .ranks_per_node = 2, .steps = 4});
  tiny =
      absl::StrReplaceAll(tiny, {{"parallelism: {dp: 2}", "parallelism: {pp: 2, schedule: auto}"},
                                 {"{preset: gpt2-debug}", "{preset: gpt2-debug, layers: 4}"},
                                 {"seq_len: 16,", "micro_batch: 1, seq_len: 16,"}});
  const std::string spec = cp.WriteSpec("schedule.yaml", tiny);
  const ProcessResult plan = cp.Cli({"plan", spec, "--json", "--mesh", "dp=1,tp=1,pp=2"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  std::smatch chosen;
  ASSERT_TRUE(std::regex_search(
      plan.out, chosen, std::regex("\"schedule\":\"([a-z0-9-]+)\",\"virtual_stages\":(\\d+)")))
      << plan.out;
  EXPECT_THAT(plan.out, HasSubstr("Schedule auto: "));
  std::string job;
  v1::GetJobReply reply;
  ASSERT_NO_FATAL_FAILURE(RunToTheEnd(cp, spec, &job, &reply));
  const v1::Mesh& ran = reply.attempts(0).mesh();
  EXPECT_EQ(ran.schedule(), chosen[1].str()) << plan.out;
  EXPECT_EQ(absl::StrCat(ran.virtual_stages()), chosen[2].str()) << plan.out;
  EXPECT_THAT(cp.Cli({"logs", job, "--rank", "0"}).out,
              HasSubstr(absl::StrCat("ZeRO-0, ", chosen[1].str())));
}

}  // namespace
}  // namespace trainyard::testenv
