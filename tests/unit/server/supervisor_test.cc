#include "server/supervisor.h"

#include <map>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/server/supervisor_fixture.h"

namespace trainyard::server {
namespace {

using testing::Agent;
using ::testing::HasSubstr;
using testing::RecordingWatcher;
using testing::SupervisorTest;
using testing::TinySpec;

TEST_F(SupervisorTest, BadSpecIsRefusedWithItsFieldPathAndNothingIsStored) {
  SubmitRequest request;
  request.spec_yaml = TinySpec("bad") + "training: {stpes: 3}\n";
  request.spec_source = "job.yaml";
  auto job = supervisor_->Submit(request);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("job.yaml:"));
  request.spec_yaml =
      "name: x\nmodel: {preset: gpt2-debug}\ndata: {source: markov}\n"
      "training: {stpes: 3}\n";
  job = supervisor_->Submit(request);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr("training.stpes"));
  EXPECT_TRUE(supervisor_->ListJobs({}, 0).empty());
  Restart();
  EXPECT_TRUE(supervisor_->ListJobs({}, 0).empty());
}

TEST_F(SupervisorTest, AgentsWaitUntilTheCoordinatorKnowsItsOwnAddress) {
  // The coordinator's server starts before its port, and so the address its workers reach it
  // at, is known: an agent connecting then must not be given workers to start without it.
  options_.coordinator_address = "";
  Restart();
  const std::string id = Submit(TinySpec("early"));
  NodeRecord node;
  node.node_id = "node-a";
  node.cpu_slots = 2;
  auto channel = std::make_shared<testing::RecordingChannel>();
  auto early = supervisor_->AgentConnected(node, {}, {}, channel, [](const RegisteredOrder&) {});
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(channel->TakeOf<StartWorkerOrder>().empty());
  EXPECT_EQ(State(id), JobState::kQueued);

  supervisor_->SetCoordinatorAddress("127.0.0.1:7001");
  Agent agent = Connect("node-a", 2);
  auto starts = agent.channel->TakeOf<StartWorkerOrder>();
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[0].coordinator_address, "127.0.0.1:7001");
}

TEST_F(SupervisorTest, JobRunsToSuccessThroughEveryState) {
  const std::string id = Submit(TinySpec("ok"));
  auto watcher = std::make_shared<RecordingWatcher>();
  ASSERT_TRUE(supervisor_->Watch(id, watcher).ok());
  EXPECT_EQ(State(id), JobState::kQueued);

  Agent agent = Connect("node-a", 2);
  EXPECT_EQ(State(id), JobState::kStarting);
  auto starts = agent.channel->TakeOf<StartWorkerOrder>();
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[0].job_id, id);
  EXPECT_EQ(starts[0].attempt_id, 1);
  EXPECT_EQ(starts[1].rank, 1);
  EXPECT_EQ(starts[1].coordinator_address, "127.0.0.1:7000");
  Started(agent, id, 1, 0);
  Started(agent, id, 1, 1);

  auto joins = JoinAll(id, 1, 2);
  ASSERT_TRUE(joins[1].ok()) << joins[1].status();
  EXPECT_EQ(joins[1]->world_size, 2);
  EXPECT_EQ(joins[1]->dp_rank, 1);
  EXPECT_EQ(joins[1]->local_world_size, 2);
  EXPECT_EQ(joins[1]->kv_prefix, "jobs/" + id + "/attempts/1/");
  EXPECT_THAT(joins[1]->spec_yaml, HasSubstr("name: ok"));
  EXPECT_EQ(State(id), JobState::kRunning);
  EXPECT_TRUE(kv_->Set(joins[0]->kv_prefix + "addr/0", "x").ok());

  ProgressUpdate progress;
  progress.job_id = id;
  progress.attempt_id = 1;
  progress.rank = 0;
  progress.step = 2;
  progress.total_steps = 5;
  progress.loss = 4.5;
  progress.step_times.total_ms = 100;
  progress.checkpoint = CheckpointInfo{2, "/ckpt/2", absl::InfinitePast()};
  auto order = supervisor_->ReportProgress(progress);
  ASSERT_TRUE(order.ok());
  EXPECT_EQ(order->order, WorkerOrder::kContinue);
  JobView view = View(id);
  EXPECT_EQ(view.job.progress.step, 2);
  EXPECT_EQ(view.job.progress.eta, absl::Milliseconds(300));
  EXPECT_EQ(view.job.last_checkpoint.path, "/ckpt/2");

  Exit(agent, id, 1, 0, 0);
  EXPECT_EQ(State(id), JobState::kRunning);
  Exit(agent, id, 1, 1, 0);
  view = View(id);
  EXPECT_EQ(view.job.state, JobState::kSucceeded);
  ASSERT_EQ(view.attempts.size(), 1u);
  EXPECT_EQ(view.attempts[0].state, AttemptState::kSucceeded);
  EXPECT_EQ(view.attempts[0].ranks[0].pid, 1000);
  EXPECT_THAT(EventKinds(id), ::testing::ElementsAre("submitted", "scheduled", "running",
                                                     "checkpoint", "succeeded"));
  EXPECT_EQ(watcher->states.back(), JobState::kSucceeded);
  EXPECT_THAT(watcher->events,
              ::testing::ElementsAre("scheduled", "running", "checkpoint", "succeeded"));
  // The attempt's KV space is gone and its slots are free again.
  EXPECT_EQ(kv_->Set(joins[0]->kv_prefix + "late", "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_->FreeNodes()[0].free_cpu_slots.size(), 2u);
  // Late reports of the ended attempt are refused.
  EXPECT_EQ(supervisor_->ReportProgress(progress).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SupervisorTest, FailedRankRestartsUpToTheLimitThenFails) {
  const std::string id = Submit(TinySpec("flaky", 1, 2, 0, /*max_restarts=*/1));
  Agent agent = Connect("node-a", 2);
  agent.channel->Take();
  JoinAll(id, 1, 2);

  Exit(agent, id, 1, 1, 3, 0, {"step 1", "boom"});
  EXPECT_EQ(State(id), JobState::kRestarting);
  auto stops = agent.channel->TakeOf<StopWorkersOrder>();
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].ranks, std::vector<int>{0});
  EXPECT_EQ(stops[0].grace, absl::Seconds(3));
  // The peer is told to stop through its progress reply too.
  ProgressUpdate progress;
  progress.job_id = id;
  progress.attempt_id = 1;
  EXPECT_EQ(supervisor_->ReportProgress(progress)->order, WorkerOrder::kStop);

  Exit(agent, id, 1, 0, 0, /*signal=*/15);
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kStarting);
  EXPECT_EQ(view.job.current_attempt, 2);
  EXPECT_EQ(view.job.restarts, 1);
  EXPECT_EQ(view.attempts[0].state, AttemptState::kFailed);
  EXPECT_THAT(view.attempts[0].cause, HasSubstr("rank 1 on node-a"));
  EXPECT_THAT(view.attempts[0].cause, HasSubstr("exited with code 3"));
  EXPECT_EQ(agent.channel->TakeOf<StartWorkerOrder>().size(), 2u);
  // A worker of the superseded attempt is refused.
  progress.attempt_id = 1;
  EXPECT_EQ(supervisor_->ReportProgress(progress).status().code(),
            absl::StatusCode::kFailedPrecondition);

  JoinAll(id, 2, 2);
  Exit(agent, id, 2, 0, 0, /*signal=*/9);
  EXPECT_EQ(State(id), JobState::kRunning);  // no restarts left: failing, rank 1 still alive
  Exit(agent, id, 2, 1, 0, 15);
  view = View(id);
  EXPECT_EQ(view.job.state, JobState::kFailed);
  EXPECT_THAT(view.job.message, HasSubstr("rank 0 on node-a"));
  EXPECT_THAT(view.job.message, HasSubstr("signal 9"));
  ASSERT_TRUE(view.attempts[0].ranks[1].exit.has_value());
  EXPECT_EQ(view.attempts[0].ranks[1].exit->last_log_lines,
            (std::vector<std::string>{"step 1", "boom"}));
  EXPECT_THAT(EventKinds(id),
              ::testing::ElementsAre("submitted", "scheduled", "running", "collective_timeout",
                                     "requeued", "scheduled", "running", "crash", "failed"));
  auto metrics = supervisor_->Metrics();
  EXPECT_EQ(metrics.restarts_by_cause["collective_timeout"], 1);
  EXPECT_EQ(metrics.failures_by_class["crash"], 1);
  EXPECT_EQ(metrics.attempts_total, 2);
  EXPECT_EQ(metrics.jobs_by_state[JobState::kFailed], 1);
}

TEST_F(SupervisorTest, CancelStopsWorkersAndEndsOnlyWhenTheyAreGone) {
  const std::string id = Submit(TinySpec("c"));
  Agent agent = Connect("node-a", 2);
  agent.channel->Take();
  JoinAll(id, 1, 2);
  auto cancelled = supervisor_->Cancel(id, "user asked");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_TRUE(cancelled->cancel_requested);
  EXPECT_EQ(cancelled->state, JobState::kRunning);
  auto stops = agent.channel->TakeOf<StopWorkersOrder>();
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(stops[0].grace, absl::Seconds(3));
  // Unanswered, the stop order is sent again after twice the grace period.
  AdvanceWithHeartbeats(absl::Seconds(5), {agent});
  EXPECT_TRUE(agent.channel->TakeOf<StopWorkersOrder>().empty());
  AdvanceWithHeartbeats(absl::Seconds(1), {agent});
  EXPECT_EQ(agent.channel->TakeOf<StopWorkersOrder>().size(), 1u);

  Exit(agent, id, 1, 0, 0, 15);
  EXPECT_EQ(State(id), JobState::kRunning);
  Exit(agent, id, 1, 1, 0, 9);
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kCancelled);
  EXPECT_EQ(view.attempts[0].state, AttemptState::kCancelled);
  EXPECT_EQ(view.job.restarts, 0);  // a cancelled job is never restarted
  // Cancelling again is a no-op; a finished job cannot be cancelled.
  EXPECT_TRUE(supervisor_->Cancel(id, "").ok());
}

TEST_F(SupervisorTest, CancelOfAQueuedJobIsImmediateAndFinishedJobsRefuse) {
  const std::string queued = Submit(TinySpec("q"));
  EXPECT_THAT(View(queued).job.waiting, ::testing::EndsWith("no node is connected"));
  EXPECT_THAT(supervisor_->ListJobs({}, 0)[0].waiting, ::testing::EndsWith("no node is connected"));
  auto cancelled = supervisor_->Cancel(queued, "", "alice");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state, JobState::kCancelled);
  EXPECT_EQ(View(queued).events.back().cause, "cancelled by alice");
  // Its slots are never taken.
  Agent agent = Connect("node-a", 2);
  EXPECT_TRUE(agent.channel->TakeOf<StartWorkerOrder>().empty());

  const std::string done = Submit(TinySpec("d"));
  JoinAll(done, 1, 2);
  Exit(agent, done, 1, 0, 0);
  Exit(agent, done, 1, 1, 0);
  EXPECT_EQ(supervisor_->Cancel(done, "").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(supervisor_->Cancel("j-999999", "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SupervisorTest, JobsThatEachNeedEverySlotRunOneAfterTheOtherByPriority) {
  const std::string low = Submit(TinySpec("low", 1, 2, /*priority=*/0));
  const std::string high = Submit(TinySpec("high", 1, 2, /*priority=*/10));
  Agent agent = Connect("node-a", 2);
  EXPECT_EQ(State(high), JobState::kStarting);
  EXPECT_EQ(State(low), JobState::kQueued);
  JoinAll(high, 1, 2);
  Exit(agent, high, 1, 0, 0);
  EXPECT_EQ(State(low), JobState::kQueued);  // gang: one free slot is not enough
  Exit(agent, high, 1, 1, 0);
  EXPECT_EQ(State(high), JobState::kSucceeded);
  EXPECT_EQ(State(low), JobState::kStarting);
}

TEST_F(SupervisorTest, FourRankJobSpansTwoAgents) {
  const std::string id = Submit(TinySpec("wide", /*nodes=*/2, /*per_node=*/2));
  Agent a = Connect("node-a", 2);
  EXPECT_EQ(State(id), JobState::kQueued);
  Agent b = Connect("node-b", 2);
  EXPECT_EQ(State(id), JobState::kStarting);
  auto on_a = a.channel->TakeOf<StartWorkerOrder>();
  auto on_b = b.channel->TakeOf<StartWorkerOrder>();
  ASSERT_EQ(on_a.size(), 2u);
  ASSERT_EQ(on_b.size(), 2u);
  EXPECT_EQ(on_a[0].rank, 0);
  EXPECT_EQ(on_b[0].rank, 2);
  EXPECT_EQ(on_b[0].local_rank, 0);
  auto joins = JoinAll(id, 1, 4);
  EXPECT_EQ(joins[3]->node_id, "node-b");
  EXPECT_EQ(joins[3]->local_world_size, 2);
}

// A context-parallel mesh reaches every rank: its degree in the Join reply's mesh and each rank's
// coordinates laid out as config::CoordinatesOf lays them (tensor, context, data, pipeline).
TEST_F(SupervisorTest, JoinRepliesCarryTheContextParallelMesh) {
  const std::string id =
      Submit(absl::StrReplaceAll(TinySpec("ring", /*nodes=*/2, /*per_node=*/2),
                                 {{"parallelism: {dp: 4}", "parallelism: {dp: 2, cp: 2}"}}));
  Agent a = Connect("node-a", 2);
  Agent b = Connect("node-b", 2);
  for (int rank = 0; rank < 4; ++rank) Started(rank < 2 ? a : b, id, 1, rank);
  auto joins = JoinAll(id, 1, 4);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(joins[rank].ok()) << joins[rank].status();
    EXPECT_EQ(joins[rank]->mesh.cp, 2);
    EXPECT_EQ(joins[rank]->mesh.dp, 2);
    EXPECT_EQ(joins[rank]->cp_rank, rank % 2) << rank;
    EXPECT_EQ(joins[rank]->dp_rank, rank / 2) << rank;
  }
  EXPECT_EQ(View(id).attempts.back().mesh.cp, 2);
  Restart();  // from the store
  EXPECT_EQ(View(id).job.requirements.mesh.cp, 2);
  EXPECT_EQ(View(id).attempts.back().mesh.cp, 2);
}

// An agent's progress relay forwards its node's reports as one batch: each is answered as a
// direct report would be, and an agent may speak only for the ranks placed on its node.
TEST_F(SupervisorTest, ANodesProgressBatchIsAnsweredPerReportAndOnlyForItsOwnRanks) {
  const std::string id = Submit(TinySpec("wide", /*nodes=*/2, /*per_node=*/2));
  Agent a = Connect("node-a", 2);
  Agent b = Connect("node-b", 2);
  for (int rank = 0; rank < 4; ++rank) Started(rank < 2 ? a : b, id, 1, rank);
  JoinAll(id, 1, 4);
  std::vector<ProgressUpdate> updates(4);
  for (int rank = 0; rank < 4; ++rank) {
    updates[rank].job_id = id;
    updates[rank].attempt_id = 1;
    updates[rank].rank = rank;
    updates[rank].step = 3;
    updates[rank].total_steps = 5;
  }
  updates[3].attempt_id = 7;  // no such attempt
  auto answers = supervisor_->ReportNodeProgress("node-a", a.session, updates);
  ASSERT_TRUE(answers.ok()) << answers.status();
  ASSERT_EQ(answers->size(), 4u);
  EXPECT_TRUE((*answers)[0].ok());
  EXPECT_TRUE((*answers)[1].ok());
  EXPECT_TRUE(absl::IsPermissionDenied((*answers)[2].status())) << (*answers)[2].status();
  EXPECT_THAT(std::string((*answers)[2].status().message()), HasSubstr("node-a"));
  EXPECT_TRUE(absl::IsNotFound((*answers)[3].status())) << (*answers)[3].status();
  StoreProgress();
  EXPECT_EQ(View(id).job.progress.step, 3) << "rank 0's report is the job's progress";

  // A heartbeat that rides on the batch is taken as a Heartbeat message is: its stray worker
  // is stopped, and the reports are answered as before.
  a.channel->Take();
  const std::vector<RunningWorker> heartbeat = {RunningWorker{id, 1, 0, 1000},
                                                RunningWorker{"j-424242", 1, 0, 77}};
  auto with_heartbeat =
      supervisor_->ReportNodeProgress("node-a", a.session, {updates[0], updates[1]}, &heartbeat);
  ASSERT_TRUE(with_heartbeat.ok()) << with_heartbeat.status();
  EXPECT_TRUE((*with_heartbeat)[0].ok());
  EXPECT_TRUE((*with_heartbeat)[1].ok());
  std::vector<AgentOrder> orders = a.channel->Take();
  ASSERT_EQ(orders.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<StopWorkersOrder>(orders[0]));
  EXPECT_EQ(std::get<StopWorkersOrder>(orders[0]).job_id, "j-424242");

  // A replaced session speaks for nobody.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      supervisor_->ReportNodeProgress("node-b", b.session + 1000, {updates[2]}).status()));
  ASSERT_TRUE(supervisor_->Cancel(id, "user asked").ok());
  auto stopping = supervisor_->ReportNodeProgress("node-b", b.session, {updates[2]});
  ASSERT_TRUE(stopping.ok());
  ASSERT_TRUE((*stopping)[0].ok());
  EXPECT_EQ((*stopping)[0]->order, WorkerOrder::kStop);
}

// Admission checks the smallest node connected at submit (here none: unchecked); a node that
// connects later and cannot hold the job's ranks is passed over at placement, and the job says
// why it waits until one that can connects.
TEST_F(SupervisorTest, PlacementSkipsNodesTooSmallForTheJobsRanks) {
  const std::string id = Submit(TinySpec("fits-big"));
  auto connect = [this](const std::string& node_id, int64_t memory) {
    NodeRecord node;
    node.node_id = node_id;
    node.hostname = node_id + ".example";
    node.cpu_slots = 2;
    node.memory_bytes = memory;
    auto session = supervisor_->AgentConnected(
        node, {}, {}, std::make_shared<testing::RecordingChannel>(), [](const RegisteredOrder&) {});
    ASSERT_TRUE(session.ok()) << session.status();
  };
  connect("node-tiny", int64_t{1} << 20);  // 1 MiB for two ranks
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kQueued);
  EXPECT_THAT(view.job.waiting, HasSubstr("of memory each (the planner's prediction)"));
  connect("node-big", int64_t{64} << 30);
  view = View(id);
  EXPECT_EQ(view.job.state, JobState::kStarting);
  ASSERT_FALSE(view.attempts.empty());
  EXPECT_EQ(view.attempts.back().ranks[0].node_id, "node-big");
}

// A restarted agent adopts workers whose StartWorker orders it never saw: its registration
// answer carries their live attempts' secrets, so its relay and memory tier admit them.
TEST_F(SupervisorTest, RegistrationNamesTheSecretsOfTheLiveAttemptsItsWorkersBelongTo) {
  options_.attempt_secret = [](const std::string& job, int attempt) {
    return absl::StrCat("secret:", job, ":", attempt);
  };
  Restart();
  const std::string id = Submit(TinySpec("adopted"));
  Agent agent = Connect("node-a", 2);
  Started(agent, id, 1, 0);
  Started(agent, id, 1, 1);
  NodeRecord node;
  node.node_id = "node-a";
  node.hostname = "node-a.example";
  node.cpu_slots = 2;
  std::optional<RegisteredOrder> registered;
  auto session = supervisor_->AgentConnected(
      node,
      {RunningWorker{id, 1, 0, 1000}, RunningWorker{id, 1, 1, 1001}, RunningWorker{id, 9, 0, 1002}},
      {}, std::make_shared<testing::RecordingChannel>(),
      [&](const RegisteredOrder& r) { registered = r; });
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE(registered);
  ASSERT_EQ(registered->adopted.size(), 1u) << "one per live attempt, none for attempt 9";
  EXPECT_EQ(registered->adopted[0].job_id, id);
  EXPECT_EQ(registered->adopted[0].attempt_id, 1);
  EXPECT_EQ(registered->adopted[0].secret, absl::StrCat("secret:", id, ":1"));
  EXPECT_EQ(registered->adopted[0].memory_peer_address, "") << "one node: no peer copies";
}

// An agent restarted under the workers of a two-node attempt hears where its memory tier copies
// their snapshots (the other node's tier, as the start orders said), also without secrets.
TEST_F(SupervisorTest, RegistrationNamesTheMemoryPeerOfTheAttemptsItsWorkersBelongTo) {
  const auto node = [](const std::string& id) {
    NodeRecord record;
    record.node_id = id;
    record.hostname = id + ".example";
    record.cpu_slots = 1;
    record.memory_tier_address = id + ":7000";
    return record;
  };
  std::optional<RegisteredOrder> registered;
  std::map<std::string, Agent> agents;
  const auto connect = [&](const std::string& id, const std::vector<RunningWorker>& running) {
    Agent& agent = agents[id];
    agent = {std::make_shared<testing::RecordingChannel>(), 0, id};
    auto session = supervisor_->AgentConnected(node(id), running, {}, agent.channel,
                                               [&](const RegisteredOrder& r) { registered = r; });
    EXPECT_TRUE(session.ok()) << session.status();
    agent.session = session.value_or(0);
  };
  const std::string id = Submit(TinySpec("pair", /*nodes=*/2, /*ranks_per_node=*/1));
  connect("node-a", {});
  connect("node-b", {});
  const JobView view = View(id);
  ASSERT_EQ(view.attempts.size(), 1u);
  ASSERT_EQ(view.attempts[0].ranks.size(), 2u);
  const std::string first = view.attempts[0].ranks[0].node_id;
  const std::string second = view.attempts[0].ranks[1].node_id;
  ASSERT_NE(first, second);
  for (const RankSlot& slot : view.attempts[0].ranks)
    Started(agents[slot.node_id], id, 1, slot.rank);

  connect(second, {RunningWorker{id, 1, 1, 1001}});
  ASSERT_TRUE(registered);
  ASSERT_EQ(registered->adopted.size(), 1u);
  EXPECT_EQ(registered->adopted[0].secret, "") << "this coordinator issues no secrets";
  EXPECT_EQ(registered->adopted[0].memory_peer_address, first + ":7000");
  EXPECT_THAT(registered->adopted[0].memory_tier_addresses,
              ::testing::ElementsAre(first + ":7000", second + ":7000"));
}

TEST_F(SupervisorTest, RestartedCoordinatorAdoptsRunningWorkersAndStartsNothingTwice) {
  const std::string id = Submit(TinySpec("survivor"));
  Agent agent = Connect("node-a", 2);
  agent.channel->Take();
  Started(agent, id, 1, 0);
  Started(agent, id, 1, 1);
  JoinAll(id, 1, 2);
  ProgressUpdate progress;
  progress.job_id = id;
  progress.attempt_id = 1;
  progress.step = 3;
  progress.total_steps = 5;
  ASSERT_TRUE(supervisor_->ReportProgress(progress).ok());

  Restart();
  EXPECT_EQ(State(id), JobState::kRunning);
  // A stray worker of an attempt that does not exist is stopped; the job's workers are adopted.
  Agent back = Connect("node-a", 2,
                       {RunningWorker{id, 1, 0, 1000}, RunningWorker{id, 1, 1, 1001},
                        RunningWorker{"j-424242", 1, 0, 77}});
  std::vector<AgentOrder> orders = back.channel->Take();
  ASSERT_EQ(orders.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<StopWorkersOrder>(orders[0]));
  EXPECT_EQ(std::get<StopWorkersOrder>(orders[0]).job_id, "j-424242");
  EXPECT_EQ(State(id), JobState::kRunning);
  EXPECT_EQ(View(id).events.back().kind, "adopted");
  // Progress continues on the same attempt, and a re-join is answered at once.
  EXPECT_EQ(supervisor_->ReportProgress(progress)->order, WorkerOrder::kContinue);
  auto rejoin = JoinAll(id, 1, 1);
  EXPECT_TRUE(rejoin[0].ok());
  Exit(back, id, 1, 0, 0);
  Exit(back, id, 1, 1, 0);
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kSucceeded);
  EXPECT_EQ(view.job.attempts, 1);
}

TEST_F(SupervisorTest, WorkerThatDiedWhileTheCoordinatorWasDownFailsTheAttempt) {
  const std::string id = Submit(TinySpec("gone"));
  Agent agent = Connect("node-a", 2);
  Started(agent, id, 1, 0);
  Started(agent, id, 1, 1);
  JoinAll(id, 1, 2);
  Restart();
  WorkerExit exited{id, 1, 1, RankExit{}};
  exited.exit.signal = 9;
  exited.exit.pid = 1001;
  Agent back = Connect("node-a", 2, {RunningWorker{id, 1, 0, 1000}}, {exited});
  EXPECT_EQ(State(id), JobState::kRestarting);
  auto stops = back.channel->TakeOf<StopWorkersOrder>();
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].ranks, std::vector<int>{0});
}

TEST_F(SupervisorTest, QueuedJobsSurviveARestart) {
  const std::string id = Submit(TinySpec("waiting"), "req-1");
  Restart();
  EXPECT_EQ(State(id), JobState::kQueued);
  // The idempotency key still finds the job after the restart.
  EXPECT_EQ(Submit(TinySpec("waiting"), "req-1"), id);
  EXPECT_EQ(supervisor_->ListJobs({}, 0).size(), 1u);
  Agent agent = Connect("node-a", 2);
  EXPECT_EQ(State(id), JobState::kStarting);
  EXPECT_EQ(agent.channel->TakeOf<StartWorkerOrder>().size(), 2u);
}

TEST_F(SupervisorTest, LostNodeFailsItsRanksAfterTheJobsHeartbeatTimeout) {
  const std::string id = Submit(TinySpec("lost"));  // heartbeat_timeout_s: 5
  Agent agent = Connect("node-a", 2);
  JoinAll(id, 1, 2);
  supervisor_->AgentDisconnected("node-a", agent.session);
  clock_.Advance(absl::Seconds(4));
  supervisor_->Tick();
  EXPECT_EQ(State(id), JobState::kRunning);
  clock_.Advance(absl::Seconds(2));
  supervisor_->Tick();
  JobView view = View(id);
  EXPECT_EQ(view.job.state, JobState::kRestarting);  // attempt failed, waiting for slots
  EXPECT_EQ(view.attempts[0].state, AttemptState::kFailed);
  EXPECT_THAT(view.attempts[0].cause, HasSubstr("node lost"));
  EXPECT_EQ(supervisor_->Metrics().restarts_by_cause["node_lost"], 1);
  // The node comes back (its workers died with it): the job restarts there.
  Agent back = Connect("node-a", 2);
  EXPECT_EQ(State(id), JobState::kStarting);
  EXPECT_EQ(back.channel->TakeOf<StartWorkerOrder>()[0].attempt_id, 2);
}

TEST_F(SupervisorTest, JoinTimesOutNamingMissingRanks) {
  const std::string id = Submit(TinySpec("slow"));
  Agent agent = Connect("node-a", 2);
  std::optional<absl::StatusOr<JoinInfo>> answer;
  supervisor_->Join(id, 1, 0, clock_.Now() + absl::Seconds(30),
                    [&](absl::StatusOr<JoinInfo> info) { answer = info; });
  AdvanceWithHeartbeats(absl::Seconds(29), {agent});
  EXPECT_FALSE(answer.has_value());
  AdvanceWithHeartbeats(absl::Seconds(1), {agent});
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(answer->status().message()), HasSubstr("missing ranks: 1"));

  std::optional<absl::StatusOr<JoinInfo>> bad;
  supervisor_->Join(id, 1, 5, absl::InfiniteFuture(), [&](auto info) { bad = info; });
  EXPECT_EQ(bad->status().code(), absl::StatusCode::kInvalidArgument);
  supervisor_->Join(id, 9, 0, absl::InfiniteFuture(), [&](auto info) { bad = info; });
  EXPECT_EQ(bad->status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SupervisorTest, ShutdownEndsWaitersAndWatchersButKeepsJobs) {
  const std::string id = Submit(TinySpec("s"));
  Agent agent = Connect("node-a", 2);
  auto watcher = std::make_shared<RecordingWatcher>();
  ASSERT_TRUE(supervisor_->Watch(id, watcher).ok());
  std::optional<absl::StatusOr<JoinInfo>> answer;
  supervisor_->Join(id, 1, 0, absl::InfiniteFuture(), [&](auto info) { answer = info; });
  supervisor_->Shutdown();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(watcher->closed.has_value());
  ASSERT_TRUE(agent.channel->closed().has_value());
  EXPECT_EQ(agent.channel->closed()->code(), absl::StatusCode::kUnavailable);
  SubmitRequest request;
  request.spec_yaml = TinySpec("late");
  EXPECT_EQ(supervisor_->Submit(request).status().code(), absl::StatusCode::kUnavailable);
  Restart();
  EXPECT_EQ(State(id), JobState::kStarting);
}

TEST_F(SupervisorTest, ListJobsFiltersByStateNewestFirst) {
  const std::string a = Submit(TinySpec("a"));
  const std::string b = Submit(TinySpec("b"));
  ASSERT_TRUE(supervisor_->Cancel(a, "").ok());
  auto all = supervisor_->ListJobs({}, 0);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].id, b);
  EXPECT_TRUE(all[0].spec_yaml.empty());
  auto queued = supervisor_->ListJobs({JobState::kQueued}, 0);
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0].id, b);
  EXPECT_EQ(supervisor_->ListJobs({}, 1).size(), 1u);
  auto logs = supervisor_->LocateLogs(b, 0, std::nullopt);
  EXPECT_EQ(logs.status().code(), absl::StatusCode::kNotFound);  // not started yet
}

}  // namespace
}  // namespace trainyard::server
