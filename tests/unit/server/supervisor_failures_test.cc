// The Supervisor's failure handling, driven through its public calls with fake agents and a fake
// clock (no sockets, no sleeps): user errors fail at once, restarts back off and keep budgets per
// class, hangs are judged from the workers' reports or the coordinator's own progress check and
// blame the rank the others wait for, nodes where attempts keep failing are cordoned, Young–Daly
// orders saves through the progress reply, goodput splits the wall time, stragglers are flagged.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "common/filesystem.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/device_profile.h"
#include "server/mesh_advisor.h"
#include "server/supervisor.h"
#include "tests/unit/server/supervisor_fixture.h"

namespace trainyard::server {
namespace {

using testing::Agent;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::SupervisorTest;
using testing::TinySpec;

// One node of `ranks` CPU ranks; `fault_tolerance` holds the section's entries (flow-map items,
// comma separated) and `more` any further sections.
std::string FailureSpec(const std::string& name, int ranks, const std::string& fault_tolerance,
                        const std::string& more = "") {
  return absl::StrCat("name: ", name, R"(
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 1000, warmup_steps: 1, batch: )",
                      2 * ranks, R"(, seq_len: 16}
parallelism: {dp: )",
                      ranks, R"(}
resources: {nodes: 1, devices_per_node: )",
                      ranks, R"(}
fault_tolerance: {heartbeat_timeout_s: 5, )",
                      fault_tolerance, "}\n", more);
}

// What an agent was sent, by kind.
struct Sent {
  std::vector<StartWorkerOrder> starts;
  std::vector<StopWorkersOrder> stops;
};

class SupervisorFailurePolicyTest : public SupervisorTest {
 protected:
  Sent TakeSent(const Agent& agent) {
    Sent sent;
    for (AgentOrder& order : agent.channel->Take()) {
      if (auto* start = std::get_if<StartWorkerOrder>(&order)) sent.starts.push_back(*start);
      if (auto* stop = std::get_if<StopWorkersOrder>(&order)) sent.stops.push_back(*stop);
    }
    return sent;
  }

  // Attempt 1 of `id` runs on node-a (`a`, ranks 0 and 1) and node-b (`b`): node-b goes silent,
  // and once node-a's ranks are stopped the job restarts (on node-a alone, when it is elastic).
  void LoseNodeBOfTwoByTwo(const Agent& a, const Agent& b, const std::string& id) {
    supervisor_->AgentDisconnected("node-b", b.session);
    AdvanceWithHeartbeats(absl::Seconds(6), {a});
    Exit(a, id, 1, 0, 0, /*signal=*/15);
    Exit(a, id, 1, 1, 0, /*signal=*/15);
  }

  // Attempt `attempt` of `id`: every rank on `agent` started (pids 1000 + rank) and joined.
  void StartAndJoin(const Agent& agent, const std::string& id, int attempt, int world) {
    for (int rank = 0; rank < world; ++rank) Started(agent, id, attempt, rank);
    for (const auto& join : JoinAll(id, attempt, world)) ASSERT_TRUE(join.ok()) << join.status();
    ASSERT_EQ(State(id), JobState::kRunning);
  }

  // A committed save of 3 MiB, written in 3 s, that blocked training 2 s, written now.
  CheckpointInfo CommittedSave(int64_t step, const std::string& path) {
    CheckpointInfo saved;
    saved.step = step;
    saved.path = path;
    saved.state = CheckpointState::kCommitted;
    saved.bytes = int64_t{3} << 20;
    saved.write_seconds = 3;
    saved.blocked_seconds = 2;
    saved.written = clock_.Now();
    return saved;
  }

  ProgressUpdate Update(const std::string& id, int attempt, int rank, int64_t step,
                        int64_t total_steps = 1000) {
    ProgressUpdate update;
    update.job_id = id;
    update.attempt_id = attempt;
    update.rank = rank;
    update.step = step;
    update.total_steps = total_steps;
    update.loss = 3.0;
    return update;
  }

  OrderReply Report(const ProgressUpdate& update) {
    absl::StatusOr<OrderReply> reply = supervisor_->ReportProgress(update);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.value_or(OrderReply{});
  }

  std::vector<EventRecord> EventsOf(const std::string& id, const std::string& kind) {
    std::vector<EventRecord> events;
    for (const EventRecord& e : View(id).events) {
      if (e.kind == kind) events.push_back(e);
    }
    return events;
  }

  std::optional<NodeStatus> FindNode(const std::string& node_id) {
    for (const NodeStatus& node : supervisor_->Nodes()) {
      if (node.record.node_id == node_id) return node;
    }
    ADD_FAILURE() << "no node " << node_id;
    return std::nullopt;
  }
  bool IsCordoned(const std::string& node_id) {
    std::optional<NodeStatus> node = FindNode(node_id);
    return node.has_value() && node->cordoned;
  }

  static std::optional<RestartBudgetView> Budget(const JobHealth& health,
                                                 const std::string& failure_class) {
    for (const RestartBudgetView& b : health.restart_budgets) {
      if (b.failure_class == failure_class) return b;
    }
    return std::nullopt;
  }

  static HangReport WaitingForRank1(double waited_s) {
    HangReport report;
    report.rank = 0;
    report.step = 7;
    report.elapsed_s = waited_s + 0.5;
    report.limit_s = 30;
    report.operation = "all-reduce";
    report.group = "dp";
    report.waiting_for = {1};
    report.waiting_s = waited_s;
    return report;
  }
};

// --- Classification: user errors ---------------------------------------------------------------

TEST_F(SupervisorFailurePolicyTest, BadDataFailsTheJobAtOnceWithTheWorkersError) {
  const std::string id = Submit(TinySpec("bad-data", 1, 1, 0, /*max_restarts=*/3));
  Agent agent = Connect("node-a", 1);
  agent.channel->Take();
  StartAndJoin(agent, id, 1, 1);

  Exit(agent, id, 1, 0, /*code=*/2, 0,
       {"step 0",
        "trainyard-worker: error: data: shard /data/train-000.bin has 17 bytes, not a "
        "multiple of 2"});
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kFailed);
  EXPECT_EQ(view.job.attempts, 1);
  EXPECT_EQ(view.job.restarts, 0);
  EXPECT_THAT(view.job.message, HasSubstr("exited with code 2"));
  EXPECT_THAT(
      view.job.message,
      HasSubstr("error: data: shard /data/train-000.bin has 17 bytes, not a multiple of 2"));
  EXPECT_EQ(view.job.health.last_failure.failure_class, "user_error");
  EXPECT_EQ(view.job.health.last_failure.rank, 0);
  EXPECT_FALSE(view.job.health.last_failure.restarted);
  EXPECT_EQ(view.attempts[0].failure_class, "user_error");
  ASSERT_EQ(EventsOf(id, "user_error").size(), 1u);
  EXPECT_THAT(EventsOf(id, "user_error")[0].cause, HasSubstr("no restart can fix it"));
  EXPECT_TRUE(TakeSent(agent).starts.empty());  // three restarts allowed, none used
  // Time passing changes nothing.
  AdvanceWithHeartbeats(absl::Seconds(5), {agent});
  EXPECT_TRUE(TakeSent(agent).starts.empty());
  EXPECT_EQ(State(id), JobState::kFailed);
}

TEST_F(SupervisorFailurePolicyTest, OutOfMemoryForTheSpecsSizesIsAUserErrorToo) {
  const std::string id = Submit(TinySpec("too-big", 1, 2, 0, /*max_restarts=*/3));
  Agent agent = Connect("node-a", 2);
  agent.channel->Take();
  StartAndJoin(agent, id, 1, 2);

  Exit(agent, id, 1, 1, /*code=*/5, 0,
       {"trainyard-worker: error: out of memory: activations need 90 GiB, the device has 80 GiB"});
  // No restart: the peer is stopped (with the usual grace), and the job fails once it is gone.
  EXPECT_EQ(State(id), JobState::kRunning);
  Sent sent = TakeSent(agent);
  EXPECT_TRUE(sent.starts.empty());
  ASSERT_EQ(sent.stops.size(), 1u);
  EXPECT_EQ(sent.stops[0].ranks, std::vector<int>{0});
  EXPECT_EQ(sent.stops[0].grace, absl::Seconds(3));
  EXPECT_EQ(Report(Update(id, 1, 0, 3)).order, WorkerOrder::kStop);

  Exit(agent, id, 1, 0, 0, /*signal=*/15);
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kFailed);
  EXPECT_EQ(view.job.attempts, 1);
  EXPECT_EQ(view.job.restarts, 0);
  EXPECT_THAT(view.job.message, HasSubstr("rank 1 on node-a"));
  EXPECT_THAT(view.job.message, HasSubstr("exited with code 5"));
  EXPECT_THAT(view.job.message, HasSubstr("error: out of memory: activations need 90 GiB"));
  EXPECT_EQ(view.job.health.last_failure.failure_class, "user_error");
  EXPECT_EQ(view.job.health.last_failure.rank, 1);
  EXPECT_TRUE(TakeSent(agent).starts.empty());
  MetricsSnapshot metrics = supervisor_->Metrics();
  EXPECT_EQ(metrics.failures_by_class["user_error"], 1);
  EXPECT_EQ(metrics.restarts_by_cause.count("user_error"), 0u);
}

// --- Backoff and budgets ------------------------------------------------------------------------

TEST_F(SupervisorFailurePolicyTest, CrashRestartsAfterAnExponentialBackoff) {
  const std::string id = Submit(FailureSpec(
      "backoff", 1,
      "max_restarts: 3, backoff_initial_s: 4, backoff_max_s: 60, backoff_multiplier: 2, "
      "backoff_jitter: 0"));
  Agent agent = Connect("node-a", 1);
  ASSERT_EQ(TakeSent(agent).starts.size(), 1u);
  StartAndJoin(agent, id, 1, 1);

  const absl::Time first_failure = clock_.Now();
  Exit(agent, id, 1, 0, 0, /*signal=*/9);
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kRestarting);
  EXPECT_EQ(view.job.health.restart_at, first_failure + absl::Seconds(4));
  EXPECT_EQ(view.job.health.last_failure.failure_class, "crash");
  EXPECT_TRUE(view.job.health.last_failure.restarted);
  ASSERT_EQ(EventsOf(id, "crash").size(), 1u);
  EXPECT_THAT(EventsOf(id, "crash")[0].cause, HasSubstr("crash: restart 1 of 3 in 4s"));
  EXPECT_THAT(EventsOf(id, "requeued").back().cause, HasSubstr("backoff of 4s"));
  EXPECT_TRUE(TakeSent(agent).starts.empty());  // the slot is free, yet nothing starts
  // While the restart waits, the job's count of restarts and its crash budget agree (`status`
  // showed "0 restarts of 3" beside "crash 1/3").
  EXPECT_EQ(view.job.restarts, 1);
  ASSERT_TRUE(Budget(view.job.health, "crash").has_value());
  EXPECT_EQ(Budget(view.job.health, "crash")->used, view.job.restarts);

  AdvanceWithHeartbeats(absl::Milliseconds(3900), {agent});
  EXPECT_EQ(State(id), JobState::kRestarting);
  EXPECT_TRUE(TakeSent(agent).starts.empty());
  AdvanceWithHeartbeats(absl::Milliseconds(100), {agent});
  view = View(id);
  EXPECT_EQ(view.job.state, JobState::kStarting);
  EXPECT_EQ(view.job.current_attempt, 2);
  EXPECT_EQ(view.job.restarts, 1);
  EXPECT_EQ(view.job.health.restart_at, absl::InfinitePast());  // no longer waiting
  Sent sent = TakeSent(agent);
  ASSERT_EQ(sent.starts.size(), 1u);
  EXPECT_EQ(sent.starts[0].attempt_id, 2);

  // The second failure in a row (no checkpoint in between) waits twice as long.
  StartAndJoin(agent, id, 2, 1);
  const absl::Time second_failure = clock_.Now();
  Exit(agent, id, 2, 0, 0, /*signal=*/9);
  EXPECT_EQ(View(id).job.health.restart_at, second_failure + absl::Seconds(8));
  EXPECT_THAT(EventsOf(id, "crash").back().cause, HasSubstr("crash: restart 2 of 3 in 8s"));
  AdvanceWithHeartbeats(absl::Milliseconds(7900), {agent});
  EXPECT_EQ(State(id), JobState::kRestarting);
  EXPECT_TRUE(TakeSent(agent).starts.empty());
  AdvanceWithHeartbeats(absl::Milliseconds(100), {agent});
  EXPECT_EQ(State(id), JobState::kStarting);
  sent = TakeSent(agent);
  ASSERT_EQ(sent.starts.size(), 1u);
  EXPECT_EQ(sent.starts[0].attempt_id, 3);
}

// The jitter's draws come from SupervisorOptions::jitter_draw: with draws 0 and then 0.75 and a
// jitter of 0.5, the delays are 4 s × 0.5 and 8 s × 1.25.
TEST_F(SupervisorFailurePolicyTest, BackoffJitterTakesTheInjectedDraws) {
  std::vector<double> draws = {0.0, 0.75};
  options_.jitter_draw = [&draws] {
    const double draw = draws.front();
    draws.erase(draws.begin());
    return draw;
  };
  Restart();
  const std::string id = Submit(FailureSpec(
      "jitter", 1,
      "max_restarts: 3, backoff_initial_s: 4, backoff_max_s: 60, backoff_multiplier: 2, "
      "backoff_jitter: 0.5"));
  Agent agent = Connect("node-a", 1);
  StartAndJoin(agent, id, 1, 1);
  absl::Time failed = clock_.Now();
  Exit(agent, id, 1, 0, 0, /*signal=*/9);
  EXPECT_EQ(View(id).job.health.restart_at, failed + absl::Seconds(2));
  AdvanceWithHeartbeats(absl::Seconds(2), {agent});
  StartAndJoin(agent, id, 2, 1);
  failed = clock_.Now();
  Exit(agent, id, 2, 0, 0, /*signal=*/9);
  EXPECT_EQ(View(id).job.health.restart_at, failed + absl::Seconds(10));
  EXPECT_TRUE(draws.empty());
}

TEST_F(SupervisorFailurePolicyTest, ClassBudgetEndsHangRestartsWhileCrashesStillRestart) {
  const std::string id = Submit(FailureSpec(
      "budget", 1, "max_restarts: 3, max_restarts_by_cause: {hang: 1}, backoff_initial_s: 0"));
  Agent agent = Connect("node-a", 1);
  agent.channel->Take();

  StartAndJoin(agent, id, 1, 1);
  Exit(agent, id, 1, 0, /*code=*/4, 0, {"trainyard-worker: hang: step 3 has run 31.0 s"});
  ASSERT_EQ(State(id), JobState::kStarting);  // restarted at once (no backoff)
  StartAndJoin(agent, id, 2, 1);
  Exit(agent, id, 2, 0, 0, /*signal=*/9);
  ASSERT_EQ(State(id), JobState::kStarting);  // a crash still has budget
  StartAndJoin(agent, id, 3, 1);
  Exit(agent, id, 3, 0, /*code=*/4);

  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kFailed);
  EXPECT_EQ(view.job.attempts, 3);
  EXPECT_EQ(view.job.restarts, 2);
  EXPECT_EQ(view.job.health.last_failure.failure_class, "hang");
  EXPECT_FALSE(view.job.health.last_failure.restarted);
  std::vector<EventRecord> hangs = EventsOf(id, "hang");
  ASSERT_EQ(hangs.size(), 2u);
  EXPECT_THAT(hangs[0].cause, HasSubstr("hang: restart 1 of 3"));
  EXPECT_THAT(hangs[0].cause, HasSubstr("1 of 1 hang restarts used after this"));
  EXPECT_THAT(hangs[1].cause, HasSubstr("hang: its budget of 1 restarts is used up"));
  std::vector<EventRecord> crashes = EventsOf(id, "crash");
  ASSERT_EQ(crashes.size(), 1u);
  EXPECT_THAT(crashes[0].cause, HasSubstr("crash: restart 2 of 3"));
  EXPECT_EQ(view.events.back().kind, "failed");

  std::optional<RestartBudgetView> hang = Budget(view.job.health, "hang");
  ASSERT_TRUE(hang.has_value());
  EXPECT_EQ(hang->used, 1);
  EXPECT_EQ(hang->budget, 1);
  std::optional<RestartBudgetView> crash = Budget(view.job.health, "crash");
  ASSERT_TRUE(crash.has_value());
  EXPECT_EQ(crash->used, 1);
  EXPECT_EQ(crash->budget, 3);
  MetricsSnapshot metrics = supervisor_->Metrics();
  EXPECT_EQ(metrics.restarts_by_cause["hang"], 1);
  EXPECT_EQ(metrics.restarts_by_cause["crash"], 1);
  EXPECT_EQ(metrics.failures_by_class["hang"], 2);
}

// --- Hang detection -----------------------------------------------------------------------------

TEST_F(SupervisorFailurePolicyTest, HangDetectorBlamesTheRankTheOthersWaitForAfterTheGathering) {
  const std::string id = Submit(TinySpec("hung", 1, 2, 0, /*max_restarts=*/1));
  Agent agent = Connect("node-a", 2);
  agent.channel->Take();
  StartAndJoin(agent, id, 1, 2);
  for (int rank = 0; rank < 2; ++rank) Report(Update(id, 1, rank, 7, 10));

  ASSERT_TRUE(supervisor_->ReportHang(HangUpdate{id, 1, WaitingForRank1(30.5)}).ok());
  std::vector<EventRecord> reports = EventsOf(id, "hang_report");
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_THAT(reports[0].cause, HasSubstr("rank 0 on node-a"));
  EXPECT_THAT(reports[0].cause, HasSubstr("step 8 has run 31.0 s (limit 30.0 s)"));
  EXPECT_THAT(reports[0].cause,
              HasSubstr("blocked 30.5 s in all-reduce (dp group) waiting for rank 1"));
  // Rank 1 may still report: the verdict waits for it, up to the 2 s gathering window.
  EXPECT_EQ(State(id), JobState::kRunning);
  AdvanceWithHeartbeats(absl::Milliseconds(1900), {agent});
  EXPECT_EQ(State(id), JobState::kRunning);
  EXPECT_TRUE(TakeSent(agent).stops.empty());
  AdvanceWithHeartbeats(absl::Milliseconds(100), {agent});

  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kRestarting);
  EXPECT_EQ(view.attempts[0].failure_class, "hang");
  EXPECT_EQ(view.attempts[0].blamed_rank, 1);
  EXPECT_THAT(view.attempts[0].cause, HasSubstr("rank 1 on node-a"));
  EXPECT_THAT(view.attempts[0].cause,
              HasSubstr("is hung: rank 0 waited 30.5 s for it in all-reduce (dp group)"));
  const FailureSummary& last = view.job.health.last_failure;
  EXPECT_EQ(last.failure_class, "hang");
  EXPECT_EQ(last.rank, 1);
  EXPECT_EQ(last.node_id, "node-a");
  EXPECT_TRUE(last.restarted);
  // A hung rank will not drain: both are killed without grace.
  Sent sent = TakeSent(agent);
  ASSERT_EQ(sent.stops.size(), 1u);
  EXPECT_EQ(sent.stops[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(sent.stops[0].grace, absl::ZeroDuration());
  // A late report is accepted and ignored.
  HangReport late = WaitingForRank1(33);
  late.rank = 1;
  late.waiting_for = {0};
  EXPECT_TRUE(supervisor_->ReportHang(HangUpdate{id, 1, late}).ok());
  EXPECT_EQ(EventsOf(id, "hang_report").size(), 1u);

  // Rank 0's watchdog exit (code 4) and rank 1's kill do not move the blame.
  Exit(agent, id, 1, 0, /*code=*/4, 0, {"trainyard-worker: hang: step 8 has run 31.0 s"});
  Exit(agent, id, 1, 1, 0, /*signal=*/9);
  view = View(id);
  EXPECT_EQ(view.job.state, JobState::kStarting);
  EXPECT_EQ(view.attempts[0].state, AttemptState::kFailed);
  EXPECT_EQ(view.attempts[0].failure_class, "hang");
  EXPECT_EQ(view.attempts[0].blamed_rank, 1);
  EXPECT_EQ(view.job.health.last_failure.rank, 1);
  MetricsSnapshot metrics = supervisor_->Metrics();
  EXPECT_EQ(metrics.failures_by_class["hang"], 1);
  EXPECT_EQ(metrics.failures_by_class.count("crash"), 0u);
  EXPECT_EQ(metrics.restarts_by_cause["hang"], 1);
}

TEST_F(SupervisorFailurePolicyTest, HangDetectorDecidesAtOnceWhenTheWaitedForRankExits) {
  const std::string id = Submit(TinySpec("hung-exit", 1, 2, 0, /*max_restarts=*/1));
  Agent agent = Connect("node-a", 2);
  agent.channel->Take();
  StartAndJoin(agent, id, 1, 2);
  for (int rank = 0; rank < 2; ++rank) Report(Update(id, 1, rank, 7, 10));

  ASSERT_TRUE(supervisor_->ReportHang(HangUpdate{id, 1, WaitingForRank1(30.5)}).ok());
  EXPECT_EQ(State(id), JobState::kRunning);
  // Rank 1 is killed (by the kernel, say) while the reports are gathered: every running rank
  // is now accounted for, and the verdict comes without waiting for the window.
  Exit(agent, id, 1, 1, 0, /*signal=*/9);
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kRestarting);
  EXPECT_EQ(view.attempts[0].failure_class, "hang");
  EXPECT_EQ(view.attempts[0].blamed_rank, 1);
  EXPECT_THAT(view.attempts[0].cause, HasSubstr("rank 1 on node-a"));
  Sent sent = TakeSent(agent);
  ASSERT_EQ(sent.stops.size(), 1u);
  EXPECT_EQ(sent.stops[0].ranks, std::vector<int>{0});
  EXPECT_EQ(sent.stops[0].grace, absl::ZeroDuration());

  Exit(agent, id, 1, 0, /*code=*/4);
  view = View(id);
  EXPECT_EQ(view.job.state, JobState::kStarting);
  EXPECT_EQ(view.attempts[0].blamed_rank, 1);
  EXPECT_EQ(view.job.health.last_failure.failure_class, "hang");
  EXPECT_EQ(supervisor_->Metrics().failures_by_class.count("crash"), 0u);
}

TEST_F(SupervisorFailurePolicyTest, HangReportsForUnknownJobsAndRanksAreRefused) {
  const std::string id = Submit(TinySpec("refusals", 1, 2));
  Agent agent = Connect("node-a", 2);
  StartAndJoin(agent, id, 1, 2);
  EXPECT_EQ(supervisor_->ReportHang(HangUpdate{"j-999999", 1, WaitingForRank1(30)}).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(supervisor_->ReportHang(HangUpdate{id, 7, WaitingForRank1(30)}).code(),
            absl::StatusCode::kNotFound);
  HangReport outside = WaitingForRank1(30);
  outside.rank = 2;
  EXPECT_EQ(supervisor_->ReportHang(HangUpdate{id, 1, outside}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(EventsOf(id, "hang_report").empty());
  EXPECT_EQ(State(id), JobState::kRunning);
}

TEST_F(SupervisorFailurePolicyTest, ProgressCheckDetectorFindsASilentAttemptHung) {
  const std::string id = Submit(
      FailureSpec("silent", 1,
                  "max_restarts: 1, backoff_initial_s: 0, hang_floor_s: 2, hang_step_multiple: 10, "
                  "hang_startup_s: 60"));
  Agent agent = Connect("node-a", 1);
  agent.channel->Take();
  StartAndJoin(agent, id, 1, 1);

  ProgressUpdate update = Update(id, 1, 0, 1);
  update.max_step_ms = 100;  // 10 × 0.1 s is below the floor: the limit is 2 s
  Report(update);
  AdvanceWithHeartbeats(absl::Seconds(1), {agent});
  update.step = 2;
  Report(update);
  const absl::Time last_step = clock_.Now();
  EXPECT_DOUBLE_EQ(View(id).job.health.hang_limit_s, 2);
  // A report that does not advance the step is no progress.
  AdvanceWithHeartbeats(absl::Seconds(2), {agent});
  Report(update);

  // The limit (2 s) plus the coordinator's slack (3 s) from the last step, and not before.
  AdvanceWithHeartbeats(absl::Milliseconds(2900), {agent});
  EXPECT_EQ(State(id), JobState::kRunning);
  EXPECT_TRUE(TakeSent(agent).stops.empty());
  AdvanceWithHeartbeats(absl::Milliseconds(200), {agent});
  EXPECT_EQ(clock_.Now() - last_step, absl::Milliseconds(5100));

  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kRestarting);
  const FailureSummary& last = view.job.health.last_failure;
  EXPECT_EQ(last.failure_class, "hang");
  EXPECT_EQ(last.rank, 0);
  EXPECT_THAT(last.cause, HasSubstr("rank 0 on node-a"));
  EXPECT_THAT(last.cause, HasSubstr("no step finished"));
  EXPECT_NEAR(last.detection_seconds, 5.1, 1e-6);  // from the last step to the verdict
  Sent sent = TakeSent(agent);
  ASSERT_EQ(sent.stops.size(), 1u);
  EXPECT_EQ(sent.stops[0].grace, absl::ZeroDuration());

  Exit(agent, id, 1, 0, 0, /*signal=*/9);
  EXPECT_EQ(State(id), JobState::kStarting);
  EXPECT_EQ(View(id).attempts[0].failure_class, "hang");
}

// --- Quarantine ---------------------------------------------------------------------------------

TEST_F(SupervisorFailurePolicyTest, QuarantinePolicyCordonsANodeWhereAttemptsKeepFailing) {
  options_.quarantine.failures = 2;
  Restart();  // the supervisor takes the new options
  Agent a = Connect("node-a", 1);
  Agent b = Connect("node-b", 1);
  const std::string id = Submit(FailureSpec("unlucky", 1, "max_restarts: 3, backoff_initial_s: 0"));
  // Equal fits: the lower node id.
  ASSERT_EQ(TakeSent(a).starts.size(), 1u);
  ASSERT_TRUE(TakeSent(b).starts.empty());

  StartAndJoin(a, id, 1, 1);
  Exit(a, id, 1, 0, 0, /*signal=*/9);
  EXPECT_FALSE(IsCordoned("node-a"));
  ASSERT_EQ(TakeSent(a).starts.size(), 1u);  // one failure: node-a is still the best fit
  EXPECT_TRUE(EventsOf(id, "node_cordoned").empty());

  StartAndJoin(a, id, 2, 1);
  Exit(a, id, 2, 0, 0, /*signal=*/9);
  std::optional<NodeStatus> node_a = FindNode("node-a");
  ASSERT_TRUE(node_a.has_value());
  EXPECT_TRUE(node_a->cordoned);
  EXPECT_THAT(node_a->cordon_reason, HasSubstr("2 failures"));
  EXPECT_EQ(node_a->cordoned_until, clock_.Now() + absl::Minutes(30));
  EXPECT_FALSE(IsCordoned("node-b"));
  std::vector<EventRecord> cordoned = EventsOf(id, "node_cordoned");
  ASSERT_EQ(cordoned.size(), 1u);
  EXPECT_THAT(cordoned[0].cause, HasSubstr("node node-a cordoned"));
  // The third attempt goes to node-b, the only node left.
  EXPECT_TRUE(TakeSent(a).starts.empty());
  Sent on_b = TakeSent(b);
  ASSERT_EQ(on_b.starts.size(), 1u);
  EXPECT_EQ(on_b.starts[0].attempt_id, 3);
  EXPECT_EQ(View(id).attempts[2].ranks[0].node_id, "node-b");

  // A job submitted now waits rather than use node-a; uncordoning lets it run there.
  const std::string next = Submit(FailureSpec("next", 1, "max_restarts: 1"));
  EXPECT_EQ(State(next), JobState::kQueued);
  absl::StatusOr<NodeStatus> lifted = supervisor_->Uncordon("node-a");
  ASSERT_TRUE(lifted.ok()) << lifted.status();
  EXPECT_EQ(lifted->record.node_id, "node-a");
  EXPECT_FALSE(IsCordoned("node-a"));
  EXPECT_EQ(State(next), JobState::kStarting);
  EXPECT_EQ(TakeSent(a).starts.size(), 1u);
  EXPECT_EQ(supervisor_->Uncordon("node-a").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(supervisor_->Uncordon("node-z").status().code(), absl::StatusCode::kNotFound);
}

// A cordon and its lifting are stored: a restarted coordinator keeps the cordon, with its reason
// and end, and forgets it once it was lifted.
TEST_F(SupervisorFailurePolicyTest, CordonsSurviveACoordinatorRestart) {
  options_.quarantine.failures = 2;
  Restart();
  Agent a = Connect("node-a", 1);
  Agent b = Connect("node-b", 1);
  const std::string id = Submit(FailureSpec("unlucky", 1, "max_restarts: 3, backoff_initial_s: 0"));
  ASSERT_EQ(TakeSent(a).starts.size(), 1u);
  for (int attempt = 1; attempt <= 2; ++attempt) {
    StartAndJoin(a, id, attempt, 1);
    Exit(a, id, attempt, 0, 0, /*signal=*/9);
    if (attempt == 1) {
      ASSERT_EQ(TakeSent(a).starts.size(), 1u);
    }
  }
  std::optional<NodeStatus> before = FindNode("node-a");
  ASSERT_TRUE(before.has_value() && before->cordoned);

  Restart();
  std::optional<NodeStatus> after = FindNode("node-a");
  ASSERT_TRUE(after.has_value());
  EXPECT_TRUE(after->cordoned) << "the restart forgot the cordon";
  EXPECT_EQ(after->cordon_reason, before->cordon_reason);
  EXPECT_EQ(after->cordoned_until, before->cordoned_until);
  EXPECT_FALSE(IsCordoned("node-b"));

  ASSERT_TRUE(supervisor_->Uncordon("node-a").ok());
  Restart();
  EXPECT_FALSE(IsCordoned("node-a")) << "the restart brought a lifted cordon back";
}

// On a one-node cluster the failures that would cordon the node do not: a cordon would strand
// the job (it sat RESTARTING with "no node is connected" for the cooldown). The job goes on
// restarting there within its own limit, and an event says why the node was spared.
TEST_F(SupervisorFailurePolicyTest, QuarantineNeverStrandsAJobOnTheOnlyNodeThatCanRunIt) {
  options_.quarantine.failures = 2;
  Restart();
  Agent a = Connect("node-a", 1);
  const std::string id = Submit(FailureSpec("alone", 1, "max_restarts: 3, backoff_initial_s: 0"));
  ASSERT_EQ(TakeSent(a).starts.size(), 1u);
  StartAndJoin(a, id, 1, 1);
  Exit(a, id, 1, 0, 0, /*signal=*/9);
  ASSERT_EQ(TakeSent(a).starts.size(), 1u);
  StartAndJoin(a, id, 2, 1);
  Exit(a, id, 2, 0, 0, /*signal=*/9);

  EXPECT_FALSE(IsCordoned("node-a"));
  EXPECT_TRUE(EventsOf(id, "node_cordoned").empty());
  const std::vector<EventRecord> spared = EventsOf(id, "node_not_cordoned");
  ASSERT_EQ(spared.size(), 1u);
  EXPECT_THAT(spared[0].cause, HasSubstr("node node-a not cordoned (2 failures"));
  EXPECT_THAT(spared[0].cause, HasSubstr("no other connected node can run job " + id));
  const Sent third = TakeSent(a);
  ASSERT_EQ(third.starts.size(), 1u);
  EXPECT_EQ(third.starts[0].attempt_id, 3);
}

// A job that only cordoned nodes could run says so while it waits: which node, why, until when,
// and the command that lifts the cordon now.
TEST_F(SupervisorFailurePolicyTest, AJobWaitingOnACordonNamesTheNodeItsEndAndTheCommand) {
  options_.quarantine.failures = 2;
  Restart();
  Agent a = Connect("node-a", 1);
  Agent b = Connect("node-b", 1);
  Agent c = Connect("node-c", 1);
  const std::string id = Submit(FailureSpec("unlucky", 1, "max_restarts: 3, backoff_initial_s: 0"));
  ASSERT_EQ(TakeSent(a).starts.size(), 1u);  // equal fits: the lowest node id
  StartAndJoin(a, id, 1, 1);
  Exit(a, id, 1, 0, 0, /*signal=*/9);
  ASSERT_EQ(TakeSent(a).starts.size(), 1u);
  StartAndJoin(a, id, 2, 1);
  Exit(a, id, 2, 0, 0, /*signal=*/9);
  ASSERT_TRUE(IsCordoned("node-a"));  // node-b and node-c can run the job

  // Three nodes of one slot: only with node-a.
  const std::string wide = Submit(absl::StrReplaceAll(
      FailureSpec("wide", 3, "max_restarts: 1"), {{"resources: {nodes: 1, devices_per_node: 3}",
                                                   "resources: {nodes: 3, devices_per_node: 1}"}}));
  EXPECT_EQ(State(wide), JobState::kQueued);
  const std::string waiting = View(wide).job.waiting;
  EXPECT_THAT(waiting, HasSubstr("waiting for cordoned nodes: node node-a is cordoned until "));
  EXPECT_THAT(waiting, HasSubstr("(2 failures"));
  EXPECT_THAT(waiting, HasSubstr("`trainyard nodes uncordon node-a` lifts it now"));
  EXPECT_THAT(waiting, ::testing::Not(HasSubstr("no node is connected")));
}

TEST_F(SupervisorFailurePolicyTest, QuarantinePolicyIgnoresUserErrors) {
  options_.quarantine.failures = 2;
  Restart();
  Agent a = Connect("node-a", 1);
  for (const char* name : {"typo-1", "typo-2", "typo-3"}) {
    const std::string id = Submit(FailureSpec(name, 1, "max_restarts: 2"));
    ASSERT_EQ(State(id), JobState::kStarting) << name;
    StartAndJoin(a, id, 1, 1);
    Exit(a, id, 1, 0, /*code=*/2, 0, {"trainyard-worker: error: data: no such file"});
    ASSERT_EQ(State(id), JobState::kFailed) << name;
    EXPECT_TRUE(EventsOf(id, "node_cordoned").empty()) << name;
  }
  EXPECT_FALSE(IsCordoned("node-a"));
  EXPECT_EQ(supervisor_->Uncordon("node-a").status().code(), absl::StatusCode::kFailedPrecondition);
}

// --- Young–Daly checkpoint interval -------------------------------------------------------------

TEST_F(SupervisorFailurePolicyTest, YoungDalyPolicyOrdersSavesThroughTheProgressReply) {
  options_.node_mtbf = absl::Hours(1);  // M = 3600 s for a one-node job
  Restart();
  const std::string id = Submit(FailureSpec("auto", 2, "max_restarts: 1",
                                            "checkpoint: {dir: ckpt/auto, every_steps: auto}\n"));
  Agent agent = Connect("node-a", 2);
  StartAndJoin(agent, id, 1, 2);

  // Without a step time there is nothing to base an interval on.
  EXPECT_EQ(Report(Update(id, 1, 0, 1)).order, WorkerOrder::kContinue);
  ProgressUpdate update = Update(id, 1, 0, 2);
  update.step_times.total_ms = 200;
  OrderReply reply = Report(update);
  // δ is unknown: an early first save, 10 steps after the last one (none: step 0).
  EXPECT_EQ(reply.order, WorkerOrder::kCheckpoint);
  EXPECT_GT(reply.checkpoint_step, update.step);
  EXPECT_EQ(reply.checkpoint_step, 10);
  // Only rank 0 is ordered.
  ProgressUpdate peer = update;
  peer.rank = 1;
  EXPECT_EQ(Report(peer).order, WorkerOrder::kContinue);
  std::optional<YoungDalyView> young_daly = View(id).job.health.young_daly;
  ASSERT_TRUE(young_daly.has_value());
  EXPECT_EQ(young_daly->checkpoint_cost_s, 0.0);  // not measured yet
  EXPECT_EQ(young_daly->interval_s, 0.0);
  EXPECT_EQ(young_daly->interval_steps, 10);
  EXPECT_EQ(young_daly->next_step, 10);
  EXPECT_NEAR(young_daly->mtbf_s, 3600, 1e-6);

  // The save of step 10 committed and blocked training 2 s: δ = 2 s, and
  // τ = √(2·2·3600)·(1 + √(2/7200)/3 + (2/7200)/9) − 2 ≈ 118.67 s ≈ 593 steps of 0.2 s.
  const CheckpointInfo saved = CommittedSave(10, "ckpt/auto/step-10");
  update.step = 11;
  update.checkpoints = {saved};
  reply = Report(update);
  young_daly = View(id).job.health.young_daly;
  ASSERT_TRUE(young_daly.has_value());
  EXPECT_DOUBLE_EQ(young_daly->checkpoint_cost_s, 2);
  EXPECT_NEAR(young_daly->interval_s, 118.67, 0.01);
  EXPECT_EQ(young_daly->interval_steps, 593);
  EXPECT_EQ(reply.order, WorkerOrder::kCheckpoint);
  EXPECT_EQ(reply.checkpoint_step, 10 + 593);
  EXPECT_EQ(young_daly->next_step, 10 + 593);
  EXPECT_EQ(View(id).job.last_checkpoint.step, 10);

  // A fixed interval has no Young–Daly view.
  const std::string fixed =
      Submit(TinySpec("fixed") + "checkpoint: {dir: ckpt/fixed, every_steps: 50}\n");
  EXPECT_FALSE(View(fixed).job.health.young_daly.has_value());
}

// --- Goodput ------------------------------------------------------------------------------------

TEST_F(SupervisorFailurePolicyTest, GoodputSplitsTheWallTimeOfARunWithACrash) {
  const std::string id = Submit(TinySpec("goodput", 1, 1, 0, /*max_restarts=*/1));
  Agent agent = Connect("node-a", 1);  // attempt 1 scheduled at t = 0
  const auto step = [&](int attempt, int64_t reached) {
    AdvanceWithHeartbeats(absl::Seconds(1), {agent});
    ProgressUpdate update = Update(id, attempt, 0, reached, 5);
    update.step_times.total_ms = 1000;
    Report(update);
  };
  AdvanceWithHeartbeats(absl::Seconds(2), {agent});
  StartAndJoin(agent, id, 1, 1);
  step(1, 1);  // t = 3: the first completed step
  step(1, 2);  // t = 4
  AdvanceWithHeartbeats(absl::Seconds(1), {agent});
  Exit(agent, id, 1, 0, 0, /*signal=*/9);  // t = 5: crash; attempt 2 starts over from step 0
  ASSERT_EQ(State(id), JobState::kStarting);
  AdvanceWithHeartbeats(absl::Seconds(1), {agent});
  StartAndJoin(agent, id, 2, 1);
  step(2, 1);  // t = 7
  step(2, 3);  // t = 8
  step(2, 5);  // t = 9
  AdvanceWithHeartbeats(absl::Seconds(1), {agent});
  Exit(agent, id, 2, 0, 0);  // t = 10
  ASSERT_EQ(State(id), JobState::kSucceeded);

  GoodputView g = View(id).job.health.goodput;
  EXPECT_DOUBLE_EQ(g.wall_s, 10);
  EXPECT_GT(g.ratio, 0);
  EXPECT_LE(g.ratio, 1);
  EXPECT_NEAR(g.ratio, g.productive_s / g.wall_s, 1e-9);
  double restart_s = 0;
  for (const auto& [cause, seconds] : g.restart_s) restart_s += seconds;
  double lost_s = 0;
  for (const auto& [cause, seconds] : g.lost_s) lost_s += seconds;
  EXPECT_NEAR(g.productive_s + g.checkpoint_s + g.startup_s + g.other_s + restart_s + lost_s,
              g.wall_s, 1e-9);
  // Start-up until the first step (3 s); the crash cost its restart (t = 5 to 7) and the step
  // that attempt 1 trained and attempt 2 had to redo (1 s).
  EXPECT_NEAR(g.startup_s, 3, 1e-9);
  ASSERT_EQ(g.restart_s.count("crash"), 1u);
  EXPECT_NEAR(g.restart_s.at("crash"), 2, 1e-9);
  ASSERT_EQ(g.lost_s.count("crash"), 1u);
  EXPECT_NEAR(g.lost_s.at("crash"), 1, 1e-9);
  EXPECT_NEAR(g.productive_s, 2, 1e-9);
  // The account of a finished job is final.
  AdvanceWithHeartbeats(absl::Seconds(30), {agent});
  EXPECT_DOUBLE_EQ(View(id).job.health.goodput.wall_s, 10);
}

// The goodput account and the Young–Daly estimates are stored with the job: a coordinator
// restart changes none of them (before, δ went back to unknown, M̂ to the prior, and the goodput
// account started over at the restore).
TEST_F(SupervisorFailurePolicyTest, GoodputAndYoungDalyEstimatesSurviveACoordinatorRestart) {
  options_.node_mtbf = absl::Hours(1);
  Restart();
  const std::string id = Submit(FailureSpec("kept", 1, "max_restarts: 2, backoff_initial_s: 0",
                                            "checkpoint: {dir: ckpt/kept, every_steps: auto}\n"));
  Agent agent = Connect("node-a", 1);
  const auto step = [&](int attempt, int64_t reached, std::vector<CheckpointInfo> saves = {}) {
    AdvanceWithHeartbeats(absl::Seconds(1), {agent});
    ProgressUpdate update = Update(id, attempt, 0, reached, 1000);
    update.step_times.total_ms = 200;
    update.checkpoints = std::move(saves);
    Report(update);
  };
  AdvanceWithHeartbeats(absl::Seconds(2), {agent});
  StartAndJoin(agent, id, 1, 1);
  step(1, 5);
  const CheckpointInfo saved = CommittedSave(10, "ckpt/kept/step-10");
  step(1, 12, {saved});
  step(1, 20);
  AdvanceWithHeartbeats(absl::Seconds(1), {agent});
  Exit(agent, id, 1, 0, 0, /*signal=*/9);  // a crash: attempt 2 resumes from step 10
  AdvanceWithHeartbeats(absl::Seconds(1), {agent});
  StartAndJoin(agent, id, 2, 1);
  step(2, 14);
  step(2, 18);
  StoreProgress();
  const JobHealth before = View(id).job.health;
  ASSERT_TRUE(before.young_daly.has_value());
  ASSERT_DOUBLE_EQ(before.young_daly->checkpoint_cost_s, 2);
  ASSERT_GT(before.goodput.wall_s, 0);
  ASSERT_EQ(before.goodput.lost_s.count("crash"), 1u);

  Restart();
  const JobHealth after = View(id).job.health;
  ASSERT_TRUE(after.young_daly.has_value());
  EXPECT_DOUBLE_EQ(after.young_daly->checkpoint_cost_s, before.young_daly->checkpoint_cost_s);
  EXPECT_DOUBLE_EQ(after.young_daly->mtbf_s, before.young_daly->mtbf_s);
  EXPECT_DOUBLE_EQ(after.young_daly->interval_s, before.young_daly->interval_s);
  EXPECT_EQ(after.young_daly->interval_steps, before.young_daly->interval_steps);
  const GoodputView& g = after.goodput;
  const GoodputView& b = before.goodput;
  EXPECT_DOUBLE_EQ(g.wall_s, b.wall_s);
  EXPECT_DOUBLE_EQ(g.productive_s, b.productive_s);
  EXPECT_DOUBLE_EQ(g.checkpoint_s, b.checkpoint_s);
  EXPECT_DOUBLE_EQ(g.startup_s, b.startup_s);
  EXPECT_DOUBLE_EQ(g.other_s, b.other_s);
  EXPECT_EQ(g.restart_s, b.restart_s);
  EXPECT_EQ(g.lost_s, b.lost_s);
  EXPECT_DOUBLE_EQ(g.ratio, b.ratio);
}

// --- Stragglers ---------------------------------------------------------------------------------

TEST_F(SupervisorFailurePolicyTest, StragglerDetectorFlagsTheRankThatComputesNotTheOnesThatWait) {
  const std::string id = Submit(TinySpec("slow", 1, 3));
  Agent agent = Connect("node-a", 3);
  StartAndJoin(agent, id, 1, 3);
  // Every rank's step takes 200 ms, since the fast ones wait for the slow one in the
  // all-reduce; only the compute time (step less communication) tells rank 2 apart.
  for (int64_t step = 1; step <= 5; ++step) {
    for (int rank = 0; rank < 3; ++rank) {
      ProgressUpdate update = Update(id, 1, rank, step);
      update.step_times.total_ms = 200;
      update.step_times.communication_ms = rank == 2 ? 0 : 100;
      Report(update);
    }
  }
  std::vector<EventRecord> flagged = EventsOf(id, "straggler");
  ASSERT_EQ(flagged.size(), 1u);
  EXPECT_THAT(flagged[0].cause, HasSubstr("rank 2 on node-a"));
  EXPECT_THAT(flagged[0].cause, HasSubstr("2.00×"));
  const std::vector<StragglerView> stragglers = View(id).job.health.stragglers;
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0].rank, 2);
  EXPECT_EQ(stragglers[0].node_id, "node-a");
  EXPECT_NEAR(stragglers[0].score, 2.0, 1e-9);
  EXPECT_THAT(EventKinds(id), Not(Contains("straggler_recovered")));
}

TEST_F(SupervisorFailurePolicyTest, ExcludeStragglersPolicyRestartsAwayFromTheSlowNode) {
  // Two nodes of one rank each; a third node is free.
  const std::string id = Submit(absl::StrCat(R"(name: away
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 1000, warmup_steps: 1, batch: 4, seq_len: 16}
parallelism: {dp: 2}
resources: {nodes: 2, devices_per_node: 1}
fault_tolerance: {heartbeat_timeout_s: 5, backoff_initial_s: 0, exclude_stragglers: true}
)"));
  Agent a = Connect("node-a", 1);
  Agent b = Connect("node-b", 1);
  JoinAll(id, 1, 2);
  for (int64_t step = 1; step <= 5; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      ProgressUpdate update = Update(id, 1, rank, step);
      update.step_times.total_ms = 200;
      update.step_times.communication_ms = rank == 1 ? 0 : 120;
      Report(update);
    }
  }
  ASSERT_EQ(EventsOf(id, "straggler").size(), 1u);
  Agent c = Connect("node-c", 1);
  Exit(a, id, 1, 0, 0, /*signal=*/9);  // a crash elsewhere: the job restarts
  Exit(b, id, 1, 1, 0, /*signal=*/15);
  const JobView view = View(id);
  ASSERT_EQ(view.attempts.size(), 2u);
  std::set<std::string> nodes;
  for (const RankSlot& slot : view.attempts[1].ranks) nodes.insert(slot.node_id);
  EXPECT_EQ(nodes, (std::set<std::string>{"node-a", "node-c"}));
  const std::vector<EventRecord> excluded = EventsOf(id, "straggler_excluded");
  ASSERT_EQ(excluded.size(), 1u);
  EXPECT_THAT(excluded[0].cause, HasSubstr("avoids node node-b"));
}

// A shrink keeps the context-parallel degree (config::ResizedSpec): dp takes the loss, and the
// smaller attempt's ranks are told cp and their coordinates in it.
TEST_F(SupervisorFailurePolicyTest, ElasticShrinkKeepsTheContextParallelDegree) {
  const std::string id = Submit(R"(name: elastic-cp
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 1000, warmup_steps: 1, batch: 8, seq_len: 16}
parallelism: {dp: 2, cp: 2}
resources: {nodes: 2, devices_per_node: 2}
checkpoint: {dir: ckpt/elastic-cp, every_steps: 10}
fault_tolerance: {heartbeat_timeout_s: 5, backoff_initial_s: 0, min_nodes: 1}
)");
  Agent a = Connect("node-a", 2);
  Agent b = Connect("node-b", 2);
  JoinAll(id, 1, 4);
  EXPECT_EQ(View(id).attempts[0].mesh.cp, 2);
  LoseNodeBOfTwoByTwo(a, b, id);
  const JobView view = View(id);
  ASSERT_EQ(view.attempts.size(), 2u);
  ASSERT_EQ(view.attempts[1].ranks.size(), 2u);
  EXPECT_EQ(view.attempts[1].mesh.dp, 1);
  EXPECT_EQ(view.attempts[1].mesh.cp, 2);
  std::vector<EventRecord> resized = EventsOf(id, "resized");
  ASSERT_EQ(resized.size(), 1u);
  EXPECT_THAT(resized[0].cause, HasSubstr("runs on 1 of 2 nodes: dp 2 → 1, accumulation"));
  EXPECT_THAT(resized[0].cause, Not(HasSubstr("cp ")));  // unchanged, so not named
  auto joins = JoinAll(id, 2, 2);
  ASSERT_TRUE(joins[1].ok()) << joins[1].status();
  EXPECT_EQ(joins[1]->mesh.cp, 2);
  EXPECT_EQ(joins[1]->cp_rank, 1);
  EXPECT_EQ(joins[1]->dp_rank, 0);
}

// `parallelism: auto` is the planner's choice at every size: a shrink runs the mesh the planner
// picks for the smaller world (here not the one the static rule keeps), and each rank is told the
// micro-batch fitted to it, so the worker runs what the coordinator planned.
TEST_F(SupervisorFailurePolicyTest, ElasticShrinkOfAnAutoJobRunsThePlannersMeshForTheSmallerWorld) {
  const planner::DeviceProfile profile = *planner::LoadCpuProfile(*RealFileSystem(), "");
  options_.cpu_profile = profile;  // the placeholder, whatever this machine has calibrated
  Restart();
  const std::string yaml = R"(name: elastic-auto
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 1000, warmup_steps: 1, batch: 8, seq_len: 16}
parallelism: auto
resources: {nodes: 2, devices_per_node: 2}
checkpoint: {dir: ckpt/elastic-auto, every_steps: 10}
fault_tolerance: {heartbeat_timeout_s: 5, backoff_initial_s: 0, min_nodes: 1}
)";
  const std::string id = Submit(yaml);
  Agent a = Connect("node-a", 2);
  Agent b = Connect("node-b", 2);
  JoinAll(id, 1, 4);
  const Mesh full = View(id).attempts[0].mesh;
  // The premise: on one node the planner's mesh is not the full mesh's tp and pp kept.
  absl::StatusOr<config::JobSpec> one_node = config::ParseJobSpec(yaml, "test");
  ASSERT_TRUE(one_node.ok()) << one_node.status();
  one_node->resources.nodes = 1;
  absl::StatusOr<Admission> planned = AdmitSpec(*one_node, {}, profile);
  ASSERT_TRUE(planned.ok()) << planned.status();
  const config::ParallelismSpec& want = planned->spec.parallelism;
  ASSERT_TRUE(want.tp != full.tp || want.pp != full.pp)
      << "the planner keeps the full mesh's tp " << full.tp << " and pp " << full.pp;

  LoseNodeBOfTwoByTwo(a, b, id);
  const JobView view = View(id);
  ASSERT_EQ(view.attempts.size(), 2u);
  const Mesh& smaller = view.attempts[1].mesh;
  EXPECT_EQ(smaller.dp, want.dp);
  EXPECT_EQ(smaller.tp, want.tp);
  EXPECT_EQ(smaller.pp, want.pp);
  auto joins = JoinAll(id, 2, 2);
  ASSERT_TRUE(joins[0].ok()) << joins[0].status();
  // 8 sequences over dp ranks, in one micro-batch each unless the full size's was smaller.
  EXPECT_EQ(joins[0]->micro_batch, std::min(8 / smaller.dp, 8 / full.dp));
}

TEST_F(SupervisorFailurePolicyTest, ElasticPolicyShrinksOnANodeLossAndGrowsBackAtACheckpoint) {
  const std::string id = Submit(R"(name: elastic
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 1000, warmup_steps: 1, batch: 8, seq_len: 16}
parallelism: {dp: 2}
resources: {nodes: 2, devices_per_node: 1}
checkpoint: {dir: ckpt/elastic, every_steps: 10}
fault_tolerance: {heartbeat_timeout_s: 5, backoff_initial_s: 0, min_nodes: 1,
                  resize_cooldown_s: 30}
)");
  Agent a = Connect("node-a", 1);
  Agent b = Connect("node-b", 1);
  JoinAll(id, 1, 2);
  // node-b goes silent: its rank is lost; once rank 0 is gone the job restarts on node-a alone.
  supervisor_->AgentDisconnected("node-b", b.session);
  AdvanceWithHeartbeats(absl::Seconds(6), {a});
  Exit(a, id, 1, 0, 0, /*signal=*/15);
  JobView view = View(id);
  ASSERT_EQ(view.attempts.size(), 2u);
  ASSERT_EQ(view.attempts[1].ranks.size(), 1u);
  EXPECT_EQ(view.attempts[1].ranks[0].node_id, "node-a");
  EXPECT_EQ(view.attempts[1].mesh.dp, 1);
  std::vector<EventRecord> resized = EventsOf(id, "resized");
  ASSERT_EQ(resized.size(), 1u);
  EXPECT_THAT(resized[0].cause, HasSubstr("runs on 1 of 2 nodes: dp 2 → 1, accumulation 1 → 2"));
  EXPECT_THAT(resized[0].cause, HasSubstr("node-b lost"));
  JoinAll(id, 2, 1);

  // node-b is back, but within the cool-down of the shrink nothing happens.
  b = Connect("node-b", 1);
  AdvanceWithHeartbeats(absl::Seconds(10), {a, b});
  EXPECT_TRUE(EventsOf(id, "resize_requested").empty());
  AdvanceWithHeartbeats(absl::Seconds(21), {a, b});
  ASSERT_EQ(EventsOf(id, "resize_requested").size(), 1u);
  EXPECT_EQ(Report(Update(id, 2, 0, 40)).order, WorkerOrder::kDrain);  // checkpoint and stop
  Exit(a, id, 2, 0, 0);
  view = View(id);
  ASSERT_EQ(view.attempts.size(), 3u);
  EXPECT_EQ(view.attempts[2].ranks.size(), 2u);
  EXPECT_EQ(view.attempts[2].mesh.dp, 2);
  EXPECT_EQ(view.job.restarts, 1) << "growing back is not a restart after a failure";
  EXPECT_EQ(EventsOf(id, "resize").size(), 1u);
  resized = EventsOf(id, "resized");
  ASSERT_EQ(resized.size(), 2u);
  EXPECT_EQ(resized[1].cause,
            "attempt 3 runs on the 2 nodes asked for again, after 1 in attempt 2: dp 1 → 2, "
            "accumulation 2 → 1 (the global batch is kept)");
}

// fault_tolerance.max_nodes above resources.nodes: a job starts on the one node it asked for,
// grows onto a second when one is free (no cool-down before its first resize), and a job that
// finds both free starts on both; with another job queued behind it, it starts at its own size.
TEST_F(SupervisorFailurePolicyTest, ElasticPolicyGrowsPastItsSizeUpToMaxNodesWhenNodesAreFree) {
  const char* kSpec = R"(name: %s
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 1000, warmup_steps: 1, batch: 8, micro_batch: 2, seq_len: 16}
parallelism: {dp: 1}
resources: {nodes: 1, devices_per_node: 1}
checkpoint: {dir: ckpt/%s, every_steps: 10}
fault_tolerance: {heartbeat_timeout_s: 5, backoff_initial_s: 0, max_nodes: 2,
                  resize_cooldown_s: 30}
)";
  Agent a = Connect("node-a", 1);
  const std::string id = Submit(absl::StrFormat(kSpec, "grows", "grows"));
  JoinAll(id, 1, 1);
  Agent b = Connect("node-b", 1);
  AdvanceWithHeartbeats(absl::Seconds(2), {a, b});
  std::vector<EventRecord> requested = EventsOf(id, "resize_requested");
  ASSERT_EQ(requested.size(), 1u);
  EXPECT_THAT(requested[0].cause, HasSubstr("growing from 1 to 2 nodes (1 asked for, up to 2)"));
  EXPECT_EQ(Report(Update(id, 1, 0, 40)).order, WorkerOrder::kDrain);  // checkpoint and stop
  Exit(a, id, 1, 0, 0);
  JobView view = View(id);
  ASSERT_EQ(view.attempts.size(), 2u);
  EXPECT_EQ(view.attempts[1].ranks.size(), 2u);
  EXPECT_EQ(view.attempts[1].mesh.dp, 2);
  std::vector<EventRecord> resized = EventsOf(id, "resized");
  ASSERT_EQ(resized.size(), 1u);
  EXPECT_THAT(resized[0].cause,
              HasSubstr("runs on 2 nodes, above the 1 asked for: dp 1 → 2, accumulation 4 → 2"));
  EXPECT_THAT(resized[0].cause, HasSubstr("max_nodes 2; the nodes were free"));
  EXPECT_EQ(view.job.restarts, 0) << "growing is not a restart after a failure";
  auto joins = JoinAll(id, 2, 2);
  ASSERT_TRUE(joins[0].ok()) << joins[0].status();
  EXPECT_EQ(joins[0]->micro_batch, 2) << "its own size's micro-batch, accumulated twice";
}

// A job that could grow leaves alone the node another job freed when it failed: that job waits
// out its restart's backoff and needs it back.
TEST_F(SupervisorFailurePolicyTest, ElasticPolicyDoesNotGrowOntoTheNodeOfAJobInBackoff) {
  Agent a = Connect("node-a", 1);
  const std::string other = Submit(R"(name: other
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 1000, warmup_steps: 1, batch: 8, seq_len: 16}
resources: {nodes: 1, devices_per_node: 1}
fault_tolerance: {backoff_initial_s: 30, backoff_jitter: 0}
)");
  JoinAll(other, 1, 1);
  Agent b = Connect("node-b", 1);
  const std::string id = Submit(R"(name: grows
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 1000, warmup_steps: 1, batch: 8, seq_len: 16}
resources: {nodes: 1, devices_per_node: 1}
checkpoint: {dir: ckpt/grows, every_steps: 10}
fault_tolerance: {max_nodes: 2, resize_cooldown_s: 0}
)");
  ASSERT_EQ(View(id).attempts.size(), 1u);
  EXPECT_EQ(View(id).attempts[0].ranks[0].node_id, "node-b");
  JoinAll(id, 1, 1);
  Exit(a, other, 1, 0, /*code=*/1);  // a crash: restarted after 30 s
  ASSERT_EQ(View(other).job.state, JobState::kRestarting);
  AdvanceWithHeartbeats(absl::Seconds(10), {a, b});
  EXPECT_TRUE(EventsOf(id, "resize_requested").empty()) << "node-a is the other job's";
  AdvanceWithHeartbeats(absl::Seconds(25), {a, b});
  ASSERT_EQ(View(other).attempts.size(), 2u);
  EXPECT_EQ(View(other).attempts[1].ranks[0].node_id, "node-a");
  EXPECT_TRUE(EventsOf(id, "resize_requested").empty());
}

// Failures come from nodes: on twice the nodes it asked for, a job has half the MTBF, and its
// Young–Daly interval is chosen for that.
TEST_F(SupervisorFailurePolicyTest, ElasticPolicyStartsOnMoreNodesThanAskedWhenTheyAreFree) {
  options_.node_mtbf = absl::Hours(1);
  Restart();
  Agent a = Connect("node-a", 1);
  Agent b = Connect("node-b", 1);
  const std::string id = Submit(R"(name: wide
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 1000, warmup_steps: 1, batch: 8, seq_len: 16}
resources: {nodes: 1, devices_per_node: 1}
checkpoint: {dir: ckpt/wide, every_steps: auto}
fault_tolerance: {max_nodes: 2}
)");
  const JobView view = View(id);
  ASSERT_EQ(view.attempts.size(), 1u);
  EXPECT_EQ(view.attempts[0].ranks.size(), 2u);
  EXPECT_EQ(view.attempts[0].mesh.dp, 2);
  auto joins = JoinAll(id, 1, 2);
  ASSERT_TRUE(joins[1].ok()) << joins[1].status();
  EXPECT_EQ(joins[1]->world_size, 2);
  const std::optional<YoungDalyView> young_daly = View(id).job.health.young_daly;
  ASSERT_TRUE(young_daly.has_value());
  EXPECT_NEAR(young_daly->mtbf_s, 1800, 1e-6);  // the node's hour over 2 nodes
}

TEST_F(SupervisorFailurePolicyTest, ElasticPolicyGrowsAtMostOncePerCooldownWhileANodeFlaps) {
  const std::string id = Submit(R"(name: flapping
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 1000, warmup_steps: 1, batch: 8, seq_len: 16}
parallelism: {dp: 2}
resources: {nodes: 2, devices_per_node: 1}
checkpoint: {dir: ckpt/flapping, every_steps: 10}
fault_tolerance: {heartbeat_timeout_s: 5, backoff_initial_s: 0, min_nodes: 1, max_restarts: 10,
                  resize_cooldown_s: 60}
)");
  Agent a = Connect("node-a", 1);
  Agent b = Connect("node-b", 1);
  JoinAll(id, 1, 2);
  supervisor_->AgentDisconnected("node-b", b.session);
  AdvanceWithHeartbeats(absl::Seconds(6), {a});
  Exit(a, id, 1, 0, 0, /*signal=*/15);
  ASSERT_EQ(View(id).attempts.size(), 2u);  // shrunk onto node-a
  JoinAll(id, 2, 1);
  // node-b comes and goes three times in 30 s: inside the cool-down, no resize is even asked.
  for (int flap = 0; flap < 3; ++flap) {
    b = Connect("node-b", 1);
    AdvanceWithHeartbeats(absl::Seconds(5), {a, b});
    supervisor_->AgentDisconnected("node-b", b.session);
    AdvanceWithHeartbeats(absl::Seconds(5), {a});
  }
  EXPECT_TRUE(EventsOf(id, "resize_requested").empty());
  EXPECT_EQ(View(id).attempts.size(), 2u);
  // Past the cool-down, with node-b back for good, one resize.
  b = Connect("node-b", 1);
  AdvanceWithHeartbeats(absl::Seconds(31), {a, b});
  EXPECT_EQ(EventsOf(id, "resize_requested").size(), 1u);
  AdvanceWithHeartbeats(absl::Seconds(5), {a, b});
  EXPECT_EQ(EventsOf(id, "resize_requested").size(), 1u) << "one resize in flight at a time";
}

}  // namespace
}  // namespace trainyard::server
