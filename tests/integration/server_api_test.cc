// The coordinator's gRPC API end to end, with a fake agent and the test playing the workers:
// WatchJob streams every state to the final one, the KV space long-polls, GetLogs is routed
// through the agent, cancellation stops workers with the configured grace, a failed rank is
// restarted and then fails the job with its exit and log lines, /metrics shows progress, and the
// server refuses an exposed address without TLS or a state directory already in use.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/server_harness.h"
#include "tests/integration/subprocess.h"

namespace trainyard::testenv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// GET http://<address><path>; the body ("" on failure).
std::string HttpGet(const std::string& address, const std::string& path) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", address, "\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[8192];
      for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

class ServerApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_ = MakeScratchDir("server_api").string();
    server_ = std::make_unique<ServerProcess>(scratch_ + "/state",
                                              std::vector<std::string>{"--stop-grace", "2"});
    ASSERT_TRUE(server_->ok()) << server_->log();
    jobs_ = server_->JobStub();
    workers_ = server_->WorkerStub();
  }
  void TearDown() override {
    agent_.reset();
    if (HasFailure() && server_ != nullptr) {
      std::fprintf(stderr, "trainyard-server's log:\n%s\n", server_->log().c_str());
    }
    server_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(scratch_, ignored);
  }

  std::string Submit(const std::string& spec) {
    v1::SubmitJobRequest request;
    request.set_spec_yaml(spec);
    v1::SubmitJobReply reply;
    grpc::Status status = jobs_->SubmitJob(Deadline(10).get(), request, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return reply.job().id();
  }

  v1::GetJobReply GetJob(const std::string& id) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::GetJobReply reply;
    grpc::Status status = jobs_->GetJob(Deadline(5).get(), request, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return reply;
  }

  // Polls until the job is in `state`, for up to 30 s: on a loaded two-core machine the
  // supervisor can take seconds to act on the exits a test reports. Returns the last reply.
  v1::GetJobReply WaitForState(const std::string& id, v1::JobState state) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    v1::GetJobReply reply = GetJob(id);
    while (reply.job().state() != state && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      reply = GetJob(id);
    }
    return reply;
  }

  // Connects the fake agent and takes the StartWorker orders of `world` ranks of `job`.
  void StartAgent(int slots) {
    agent_ = std::make_unique<FakeAgent>(server_->channel(), "node-a", slots);
    ASSERT_TRUE(agent_->NextOf(v1::CoordinatorMessage::kRegistered).has_value());
  }
  void ExpectStarts(const std::string& job, int attempt, int world) {
    for (int rank = 0; rank < world; ++rank) {
      std::optional<v1::CoordinatorMessage> start = agent_->NextOf(v1::CoordinatorMessage::kStart);
      ASSERT_TRUE(start.has_value()) << "no start for rank " << rank;
      EXPECT_EQ(start->start().job_id(), job);
      EXPECT_EQ(start->start().attempt_id(), attempt);
      agent_->Started(job, attempt, start->start().rank(), 5000 + 10 * attempt + rank);
    }
  }

  std::vector<v1::JoinReply> JoinAll(const std::string& job, int attempt, int world) {
    std::vector<v1::JoinReply> replies(world);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < world; ++rank) {
      ranks.emplace_back([&, rank] {
        v1::JoinRequest request;
        request.set_job_id(job);
        request.set_attempt_id(attempt);
        request.set_rank(rank);
        grpc::Status status = workers_->Join(Deadline(20).get(), request, &replies[rank]);
        EXPECT_TRUE(status.ok()) << status.error_message();
      });
    }
    for (std::thread& t : ranks) t.join();
    return replies;
  }

  v1::ProgressReply Report(const std::string& job, int attempt, int64_t step) {
    v1::ProgressReport report;
    report.set_job_id(job);
    report.set_attempt_id(attempt);
    report.set_step(step);
    report.set_total_steps(5);
    report.set_loss(4.0);
    report.set_tokens_per_second(1234);
    report.mutable_step_times()->set_total_ms(20);
    v1::ProgressReply reply;
    grpc::Status status = workers_->ReportProgress(Deadline(5).get(), report, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return reply;
  }

  std::string scratch_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<FakeAgent> agent_;
};

TEST_F(ServerApiTest, WatchStreamsEveryStateAndEndsWithTheJob) {
  const std::string job = Submit(SmallSpec("watched"));
  std::vector<v1::JobUpdate> updates;
  std::atomic<bool> subscribed{false};
  grpc::Status watch_status;
  std::thread watcher([&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::WatchJobRequest request;
    request.set_job_id(job);
    auto reader = v1::JobService::NewStub(server_->channel())->WatchJob(&context, request);
    v1::JobUpdate update;
    while (reader->Read(&update)) {
      updates.push_back(update);
      subscribed = true;
    }
    watch_status = reader->Finish();
  });
  // The first update (the job as it is) arrives before anything else happens to the job.
  for (int i = 0; i < 500 && !subscribed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(subscribed);
  StartAgent(2);
  ExpectStarts(job, 1, 2);
  std::vector<v1::JoinReply> joins = JoinAll(job, 1, 2);
  EXPECT_EQ(Report(job, 1, 3).order(), v1::ORDER_CONTINUE);

  // The metrics endpoint shows the step, the loss and the node while the job runs: the step once
  // it is stored (progress is written every second).
  const std::string metrics_address =
      WaitForFileLine(scratch_ + "/state/metrics.addr", std::chrono::seconds(5));
  const std::string step_line =
      absl::StrCat("trainyard_job_step{job_id=\"", job, "\",job_name=\"watched\"} 3");
  std::string metrics = HttpGet(metrics_address, "/metrics");
  for (int i = 0; i < 50 && metrics.find(step_line) == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    metrics = HttpGet(metrics_address, "/metrics");
  }
  EXPECT_THAT(metrics, HasSubstr(step_line));
  EXPECT_THAT(metrics, HasSubstr("trainyard_jobs{state=\"RUNNING\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("trainyard_node_connected{node=\"node-a\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("trainyard_job_tokens_per_second{"));

  agent_->Exited(job, 1, 0, 0, 0);
  agent_->Exited(job, 1, 1, 0, 0);
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  std::vector<v1::JobState> states;
  bool saw_step = false;
  for (const v1::JobUpdate& update : updates) {
    if (states.empty() || states.back() != update.job().state()) {
      states.push_back(update.job().state());
    }
    saw_step = saw_step || update.job().progress().step() == 3;
  }
  EXPECT_THAT(states, ElementsAre(v1::JOB_STATE_QUEUED, v1::JOB_STATE_STARTING,
                                  v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED));
  EXPECT_TRUE(saw_step);
  ASSERT_FALSE(updates.empty());
  EXPECT_EQ(updates.back().event().kind(), "succeeded");
}

TEST_F(ServerApiTest, KeyValueSpaceLongPollsAndEndsWithTheAttempt) {
  const std::string job = Submit(SmallSpec("kv"));
  StartAgent(2);
  ExpectStarts(job, 1, 2);
  const std::string prefix = JoinAll(job, 1, 2)[0].kv_prefix();
  ASSERT_EQ(prefix, absl::StrCat("jobs/", job, "/attempts/1/"));

  v1::KvGetReply waited;
  std::atomic<int64_t> getter_tid{0};
  std::thread getter([&] {
    getter_tid = ThisThreadId();
    v1::KvGetRequest request;
    request.set_key(prefix + "gloo/rank0");
    request.set_wait_ms(10000);
    EXPECT_TRUE(workers_->KvGet(Deadline(15).get(), request, &waited).ok());
  });
  // The set comes while the get waits for it (its thread sleeps in the call).
  while (getter_tid.load() == 0) std::this_thread::yield();
  EXPECT_TRUE(WaitUntilBlocked(getter_tid.load(), std::chrono::milliseconds(10000)));
  v1::KvSetRequest set;
  set.set_key(prefix + "gloo/rank0");
  set.set_value(std::string("10.0.0.1:2\0x", 12));
  v1::KvSetReply set_reply;
  ASSERT_TRUE(workers_->KvSet(Deadline(5).get(), set, &set_reply).ok());
  getter.join();
  EXPECT_TRUE(waited.found());
  EXPECT_EQ(waited.value(), std::string("10.0.0.1:2\0x", 12));

  v1::KvGetRequest missing;
  missing.set_key(prefix + "nobody");
  missing.set_wait_ms(300);
  v1::KvGetReply missing_reply;
  const auto before = std::chrono::steady_clock::now();
  ASSERT_TRUE(workers_->KvGet(Deadline(5).get(), missing, &missing_reply).ok());
  EXPECT_FALSE(missing_reply.found());
  EXPECT_GE(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(250));

  v1::KvSetRequest stray;
  stray.set_key("elsewhere/key");
  EXPECT_EQ(workers_->KvSet(Deadline(5).get(), stray, &set_reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  agent_->Exited(job, 1, 0, 0, 0);
  agent_->Exited(job, 1, 1, 0, 0);
  ASSERT_EQ(WaitForState(job, v1::JOB_STATE_SUCCEEDED).job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(workers_->KvSet(Deadline(5).get(), set, &set_reply).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ServerApiTest, LogsAreReadThroughTheAgent) {
  const std::string job = Submit(SmallSpec("logs"));
  StartAgent(2);
  ExpectStarts(job, 1, 2);
  std::string received;
  grpc::Status status;
  std::thread client([&] {
    v1::GetLogsRequest request;
    request.set_job_id(job);
    request.set_rank(1);
    request.set_tail_lines(50);
    auto context = Deadline(20);
    auto reader = jobs_->GetLogs(context.get(), request);
    v1::LogChunk chunk;
    while (reader->Read(&chunk)) {
      EXPECT_EQ(chunk.rank(), 1);
      received += chunk.data();
    }
    status = reader->Finish();
  });
  std::optional<v1::CoordinatorMessage> read = agent_->NextOf(v1::CoordinatorMessage::kReadLogs);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->read_logs().job_id(), job);
  EXPECT_EQ(read->read_logs().rank(), 1);
  EXPECT_EQ(read->read_logs().tail_lines(), 50);
  for (const char* piece : {"step 1 loss 4.1\n", "step 2 loss 3.9\n"}) {
    v1::AgentMessage data;
    data.mutable_log()->set_request_id(read->read_logs().request_id());
    data.mutable_log()->set_rank(1);
    data.mutable_log()->set_data(piece);
    agent_->Send(data);
  }
  v1::AgentMessage done;
  done.mutable_log()->set_request_id(read->read_logs().request_id());
  done.mutable_log()->set_done(true);
  agent_->Send(done);
  client.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(received, "step 1 loss 4.1\nstep 2 loss 3.9\n");

  v1::GetLogsRequest outside;
  outside.set_job_id(job);
  outside.set_rank(7);
  auto context = Deadline(5);
  auto reader = jobs_->GetLogs(context.get(), outside);
  v1::LogChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

// An agent's batch of its ranks' reports: the answers come in one ProgressAnswers, and a batch
// that asks for it is answered only where the answer is not a plain "continue".
TEST_F(ServerApiTest, ABatchIsAnsweredPerReportOrOnlyWhereThereIsSomethingToSay) {
  const std::string job = Submit(SmallSpec("batched"));
  StartAgent(2);
  ExpectStarts(job, 1, 2);
  JoinAll(job, 1, 2);
  const auto send = [&](int64_t batch_id, bool omit_plain) {
    v1::AgentMessage message;
    v1::ProgressBatch* batch = message.mutable_progress();
    batch->set_batch_id(batch_id);
    batch->set_omit_plain_answers(omit_plain);
    for (int rank : {0, 1, 5}) {  // rank 5: not in the attempt's world of 2
      v1::ProgressReport* report = batch->add_reports();
      report->set_job_id(job);
      report->set_attempt_id(1);
      report->set_rank(rank);
      report->set_step(batch_id);
      report->set_total_steps(5);
      report->mutable_step_times()->set_total_ms(20);
    }
    agent_->Send(message);
    std::optional<v1::CoordinatorMessage> answers =
        agent_->NextOf(v1::CoordinatorMessage::kProgressAnswers);
    EXPECT_TRUE(answers.has_value());
    EXPECT_EQ(answers->progress_answers().batch_id(), batch_id);
    return answers->progress_answers();
  };
  const v1::ProgressAnswers every = send(1, false);
  ASSERT_EQ(every.answers_size(), 3);
  for (int i : {0, 1}) {
    EXPECT_EQ(every.answers(i).rank(), i);
    EXPECT_EQ(every.answers(i).code(), 0);
    EXPECT_EQ(every.answers(i).reply().order(), v1::ORDER_CONTINUE);
  }
  EXPECT_NE(every.answers(2).code(), 0);

  const v1::ProgressAnswers some = send(2, true);
  ASSERT_EQ(some.answers_size(), 1) << some.DebugString();
  EXPECT_EQ(some.answers(0).rank(), 5);
  EXPECT_NE(some.answers(0).code(), 0);

  // A heartbeat on a batch that leaves out the workers the batch reports for: a report of a
  // worker of no live attempt stands for that worker, which is ordered stopped.
  v1::AgentMessage message;
  v1::ProgressBatch* batch = message.mutable_progress();
  batch->set_batch_id(3);
  batch->mutable_heartbeat()->set_omits_reported(true);
  v1::ProgressReport* stray = batch->add_reports();
  stray->set_job_id(job);
  stray->set_attempt_id(7);
  stray->set_rank(0);
  stray->set_step(3);
  stray->set_total_steps(5);
  agent_->Send(message);
  std::optional<v1::CoordinatorMessage> stop = agent_->NextOf(v1::CoordinatorMessage::kStop);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->stop().job_id(), job);
  EXPECT_EQ(stop->stop().attempt_id(), 7);
  EXPECT_THAT(stop->stop().ranks(), ElementsAre(0));
}

// An agent that takes start batches gets an attempt's start orders for its node in one message;
// one that does not (every test above) gets one message per rank.
TEST_F(ServerApiTest, AnAttemptsStartOrdersComeInOneMessageToAnAgentThatTakesBatches) {
  const std::string job = Submit(SmallSpec("batched-starts", 3));
  agent_ = std::make_unique<FakeAgent>(server_->channel(), "node-a", 3,
                                       std::vector<v1::RunningWorker>{}, /*start_batches=*/true);
  ASSERT_TRUE(agent_->NextOf(v1::CoordinatorMessage::kRegistered).has_value());
  std::optional<v1::CoordinatorMessage> batch = agent_->NextOf(v1::CoordinatorMessage::kStartBatch);
  ASSERT_TRUE(batch.has_value());
  ASSERT_EQ(batch->start_batch().workers_size(), 3);
  for (int rank = 0; rank < 3; ++rank) {
    const v1::StartWorker& start = batch->start_batch().workers(rank);
    EXPECT_EQ(start.job_id(), job);
    EXPECT_EQ(start.rank(), rank);
    EXPECT_FALSE(start.attempt_secret().empty());
    agent_->Started(job, 1, rank, 7000 + rank);
  }
  JoinAll(job, 1, 3);
}

TEST_F(ServerApiTest, CancelStopsWorkersWithTheGracePeriod) {
  const std::string job = Submit(SmallSpec("cancelled"));
  StartAgent(2);
  ExpectStarts(job, 1, 2);
  JoinAll(job, 1, 2);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  cancel.set_reason("test cancel");
  v1::CancelJobReply reply;
  const grpc::Status status = jobs_->CancelJob(Deadline(5).get(), cancel, &reply);
  ASSERT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  EXPECT_TRUE(reply.job().cancel_requested());
  std::optional<v1::CoordinatorMessage> stop = agent_->NextOf(v1::CoordinatorMessage::kStop);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->stop().job_id(), job);
  EXPECT_THAT(stop->stop().ranks(), ElementsAre(0, 1));
  EXPECT_EQ(stop->stop().grace_period_ms(), 2000);
  EXPECT_EQ(Report(job, 1, 2).order(), v1::ORDER_STOP);
  agent_->Exited(job, 1, 0, 0, SIGTERM);
  agent_->Exited(job, 1, 1, 0, SIGKILL);
  v1::GetJobReply cancelled = WaitForState(job, v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled.job().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled.attempts(0).state(), v1::ATTEMPT_STATE_CANCELLED);
  // Cancelling a finished job that did not end cancelled is refused; cancelling again is fine.
  EXPECT_TRUE(jobs_->CancelJob(Deadline(5).get(), cancel, &reply).ok());
}

TEST_F(ServerApiTest, FailedRankRestartsThenFailsNamingRankNodeAndLog) {
  const std::string job = Submit(SmallSpec("flaky"));  // max_restarts: 1
  StartAgent(2);
  for (int attempt = 1; attempt <= 2; ++attempt) {
    ExpectStarts(job, attempt, 2);
    JoinAll(job, attempt, 2);
    agent_->Exited(job, attempt, 1, 3, 0, {"loading data", "fatal: out of memory"});
    std::optional<v1::CoordinatorMessage> stop = agent_->NextOf(v1::CoordinatorMessage::kStop);
    ASSERT_TRUE(stop.has_value());
    EXPECT_THAT(stop->stop().ranks(), ElementsAre(0));
    agent_->Exited(job, attempt, 0, 0, SIGTERM);
  }
  v1::GetJobReply failed = WaitForState(job, v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.job().state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.job().restarts(), 1);
  EXPECT_THAT(failed.job().message(), HasSubstr("rank 1 on node-a"));
  EXPECT_THAT(failed.job().message(), HasSubstr("exited with code 3"));
  ASSERT_EQ(failed.attempts_size(), 2);
  const v1::Attempt& last = failed.attempts(1);
  bool found = false;
  for (const v1::RankExit& exit : last.exits()) {
    if (exit.rank() != 1) continue;
    found = true;
    EXPECT_EQ(exit.node_id(), "node-a");
    EXPECT_EQ(exit.exit_code(), 3);
    EXPECT_THAT(exit.last_log_lines(), ElementsAre("loading data", "fatal: out of memory"));
  }
  EXPECT_TRUE(found);

  v1::ListNodesReply nodes;
  ASSERT_TRUE(jobs_->ListNodes(Deadline(5).get(), v1::ListNodesRequest(), &nodes).ok());
  ASSERT_EQ(nodes.nodes_size(), 1);
  EXPECT_TRUE(nodes.nodes(0).connected());
  EXPECT_EQ(nodes.nodes(0).free_slots(), 2);
}

TEST_F(ServerApiTest, CheckpointRecordsAreListedAndDrainEndsTheJobDrained) {
  const std::string job =
      Submit(SmallSpec("drained") + "checkpoint: {dir: ckpt/drained, every_steps: auto}\n");
  v1::GetJobReply status = GetJob(job);
  EXPECT_EQ(status.job().checkpoint_policy().dir(), "ckpt/drained");
  EXPECT_EQ(status.job().checkpoint_policy().every_steps(), 0);  // Young–Daly: no step time yet
  EXPECT_TRUE(status.job().checkpoint_policy().interval_auto());
  StartAgent(2);
  ExpectStarts(job, 1, 2);
  JoinAll(job, 1, 2);

  v1::ProgressReport report;
  report.set_job_id(job);
  report.set_attempt_id(1);
  report.set_step(3);
  v1::Checkpoint* saved = report.add_checkpoints();
  saved->set_step(3);
  saved->set_path("ckpt/drained/step-3");
  saved->set_state(v1::CHECKPOINT_STATE_COMMITTED);
  saved->set_bytes(1 << 20);
  saved->set_write_seconds(0.5);
  saved->set_blocked_seconds(0.1);
  v1::ProgressReply reply;
  ASSERT_TRUE(workers_->ReportProgress(Deadline(5).get(), report, &reply).ok());
  EXPECT_EQ(reply.order(), v1::ORDER_CONTINUE);
  ASSERT_TRUE(workers_->ReportProgress(Deadline(5).get(), report, &reply).ok());  // a repeat

  v1::ListCheckpointsRequest list;
  list.set_job_id(job);
  v1::ListCheckpointsReply listed;
  ASSERT_TRUE(jobs_->ListCheckpoints(Deadline(5).get(), list, &listed).ok());
  ASSERT_EQ(listed.checkpoints_size(), 1);
  EXPECT_EQ(listed.checkpoints(0).path(), "ckpt/drained/step-3");
  EXPECT_EQ(listed.checkpoints(0).state(), v1::CHECKPOINT_STATE_COMMITTED);
  EXPECT_EQ(listed.checkpoints(0).attempt_id(), 1);
  EXPECT_GT(listed.checkpoints(0).written_unix_ms(), 0);
  EXPECT_EQ(GetJob(job).job().last_checkpoint().bytes(), 1 << 20);
  const std::string metrics = HttpGet(
      WaitForFileLine(scratch_ + "/state/metrics.addr", std::chrono::seconds(5)), "/metrics");
  const std::string labels = absl::StrCat("{job_id=\"", job, "\",job_name=\"drained\"}");
  EXPECT_THAT(metrics, HasSubstr("trainyard_checkpoint_last_committed_step" + labels + " 3"));
  EXPECT_THAT(metrics, HasSubstr("trainyard_checkpoint_duration_seconds_count" + labels + " 1"));

  v1::DrainJobRequest drain;
  drain.set_job_id(job);
  v1::DrainJobReply drained;
  ASSERT_TRUE(jobs_->DrainJob(Deadline(5).get(), drain, &drained).ok());
  EXPECT_TRUE(drained.job().drain_requested());
  EXPECT_EQ(Report(job, 1, 4).order(), v1::ORDER_DRAIN);
  report.set_rank(1);
  report.clear_checkpoints();
  ASSERT_TRUE(workers_->ReportProgress(Deadline(5).get(), report, &reply).ok());
  EXPECT_EQ(reply.order(), v1::ORDER_DRAIN);
  agent_->Exited(job, 1, 0, 0, 0);
  agent_->Exited(job, 1, 1, 0, 0);
  v1::GetJobReply final_state = WaitForState(job, v1::JOB_STATE_DRAINED);
  EXPECT_EQ(final_state.job().state(), v1::JOB_STATE_DRAINED);
  EXPECT_EQ(final_state.job().message(), "drained at step 3: checkpoint ckpt/drained/step-3");

  // Bad input: an unknown job, an empty id; a finished job cannot be drained (except again).
  drain.set_job_id("j-999999");
  EXPECT_EQ(jobs_->DrainJob(Deadline(5).get(), drain, &drained).error_code(),
            grpc::StatusCode::NOT_FOUND);
  list.set_job_id("j-999999");
  EXPECT_EQ(jobs_->ListCheckpoints(Deadline(5).get(), list, &listed).error_code(),
            grpc::StatusCode::NOT_FOUND);
  list.set_job_id("");
  EXPECT_EQ(jobs_->ListCheckpoints(Deadline(5).get(), list, &listed).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  drain.set_job_id(job);
  EXPECT_TRUE(jobs_->DrainJob(Deadline(5).get(), drain, &drained).ok());
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  v1::CancelJobReply cancelled;
  EXPECT_EQ(jobs_->CancelJob(Deadline(5).get(), cancel, &cancelled).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ServerApiTest, RefusesExposedAddressWithoutTlsAndASecondServerOnTheSameState) {
  const std::string binary = BinaryDir() + "/server/trainyard-server";
  ProcessResult exposed = RunProcess(
      {binary, "--no-local-agent", "--state-dir", scratch_ + "/other", "--listen", "0.0.0.0:0"},
      30);
  EXPECT_EQ(exposed.exit_code, 2) << exposed.err;
  EXPECT_THAT(exposed.err, HasSubstr("TLS"));
  ProcessResult twice =
      RunProcess({binary, "--no-local-agent", "--state-dir", scratch_ + "/state"}, 30);
  EXPECT_EQ(twice.exit_code, 2) << twice.err;
  EXPECT_THAT(twice.err, HasSubstr("another coordinator"));
  ProcessResult bad_flag = RunProcess({binary, "--frobnicate"}, 30);
  EXPECT_EQ(bad_flag.exit_code, 2);
  for (const char* seconds : {"0", "-5", "soon", "90000"}) {
    ProcessResult bad_drain = RunProcess({binary, "--drain-on-stop", seconds}, 30);
    EXPECT_EQ(bad_drain.exit_code, 2) << seconds;
    EXPECT_THAT(bad_drain.err, HasSubstr("--drain-on-stop")) << seconds;
  }
  const std::string agent = BinaryDir() + "/server/agent/trainyard-agent";
  for (const char* seconds : {"-1", "soon", "90000"}) {
    ProcessResult bad_grace =
        RunProcess({agent, "--coordinator", "127.0.0.1:1", "--stop-grace-s", seconds}, 30);
    EXPECT_EQ(bad_grace.exit_code, 2) << seconds;
    EXPECT_THAT(bad_grace.err, HasSubstr("stop-grace-s")) << seconds;
  }
  EXPECT_TRUE(server_->process().running());
}

// The local agent's flags configure nothing without it: each is refused by name, before the
// coordinator starts.
TEST(ServerFlagsTest, TheLocalAgentsFlagsAreRefusedWithoutIt) {
  const std::string binary = BinaryDir() + "/server/trainyard-server";
  const std::string state = MakeScratchDir("server_flags").string() + "/state";
  const std::vector<std::pair<std::string, std::string>> agent_flags = {
      {"--agent-slots", "2"},
      {"--agent-node-id", "n"},
      {"--worker-binary", "/bin/true"},
      {"--agent-pass-env", "HOME"},
      {"--agent-memory-tier-dir", "/tmp"},
      {"--agent-memory-tier-mb", "0"}};
  for (const auto& [flag, value] : agent_flags) {
    for (const char* off : {"--no-local-agent", "--local-agent=false"}) {
      ProcessResult refused = RunProcess({binary, off, flag, value, "--state-dir", state}, 30);
      EXPECT_EQ(refused.exit_code, 2) << flag << ": " << refused.err;
      EXPECT_THAT(refused.err,
                  HasSubstr(flag + " configures the local agent: not used with --no-local-agent"));
    }
  }
  EXPECT_FALSE(std::filesystem::exists(state + "/server.addr"));
  std::error_code ignored;
  std::filesystem::remove_all(std::filesystem::path(state).parent_path(), ignored);
}

// A budget of 0 turns the memory tier off: its folder and port then configure nothing, and are
// refused by name (the agent's, and the coordinator's local agent's), before anything starts.
// With a budget they are accepted as before.
TEST(ServerFlagsTest, TheMemoryTiersFlagsAreRefusedWithoutATier) {
  const std::string scratch = MakeScratchDir("tier_flags").string();
  const std::string agent = BinaryDir() + "/server/agent/trainyard-agent";
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--memory-tier-dir", scratch + "/tier"}, {"--memory-tier-port", "7100"}}) {
    ProcessResult refused = RunProcess(
        {agent, "--coordinator", "127.0.0.1:1", "--memory-tier-mb", "0", flag, value}, 30);
    EXPECT_EQ(refused.exit_code, 2) << flag << ": " << refused.err;
    EXPECT_THAT(refused.err,
                HasSubstr(flag + " configures the memory tier: --memory-tier-mb 0 has none"));
  }
  const std::string server = BinaryDir() + "/server/trainyard-server";
  ProcessResult refused =
      RunProcess({server, "--agent-memory-tier-mb", "0", "--agent-memory-tier-dir",
                  scratch + "/tier", "--state-dir", scratch + "/state"},
                 30);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("--agent-memory-tier-dir configures the memory tier: "
                                     "--agent-memory-tier-mb 0 has none"));
  EXPECT_FALSE(std::filesystem::exists(scratch + "/state/server.addr"));
  // With a budget, the agent reads the tier's flags and goes on to the check after them: the
  // TLS flags, here incomplete, so that it stops before it starts anything.
  ProcessResult accepted = RunProcess(
      {agent, "--coordinator", "127.0.0.1:1", "--memory-tier-mb", "1", "--memory-tier-dir",
       scratch + "/tier", "--memory-tier-port", "7100", "--tls-ca", scratch + "/ca.crt"},
      30);
  EXPECT_EQ(accepted.exit_code, 2) << accepted.err;
  EXPECT_THAT(accepted.err, HasSubstr("mutual TLS needs")) << accepted.err;
  std::error_code ignored;
  std::filesystem::remove_all(scratch, ignored);
}

}  // namespace
}  // namespace trainyard::testenv
