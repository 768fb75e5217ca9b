// Killing the coordinator at any moment loses nothing: after a SIGKILL mid-run, a new
// coordinator on the same state directory reloads the job, re-adopts the workers its agent still
// runs (starting nothing twice), stops workers nobody owns, and sees the job through.
#include <signal.h>
#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/stored.pb.h"
#include "tests/integration/child_process.h"
#include "tests/integration/server_harness.h"

namespace trainyard::testenv {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

v1::RunningWorker Worker(const std::string& job, int attempt, int rank, int64_t pid) {
  v1::RunningWorker worker;
  worker.set_job_id(job);
  worker.set_attempt_id(attempt);
  worker.set_rank(rank);
  worker.set_pid(pid);
  return worker;
}

v1::GetJobReply GetJob(const ServerProcess& server, const std::string& id) {
  v1::GetJobRequest request;
  request.set_job_id(id);
  v1::GetJobReply reply;
  grpc::Status status = server.JobStub()->GetJob(Deadline(5).get(), request, &reply);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return reply;
}

std::string Submit(const ServerProcess& server, const std::string& spec) {
  v1::SubmitJobRequest request;
  request.set_spec_yaml(spec);
  v1::SubmitJobReply reply;
  grpc::Status status = server.JobStub()->SubmitJob(Deadline(10).get(), request, &reply);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return reply.job().id();
}

// Joins every rank concurrently, as real workers do.
std::vector<v1::JoinReply> JoinAll(const ServerProcess& server, const std::string& job, int attempt,
                                   int world) {
  std::vector<v1::JoinReply> replies(world);
  std::vector<grpc::Status> statuses(world);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      v1::JoinRequest request;
      request.set_job_id(job);
      request.set_attempt_id(attempt);
      request.set_rank(rank);
      statuses[rank] = server.WorkerStub()->Join(Deadline(20).get(), request, &replies[rank]);
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank].error_message();
  }
  return replies;
}

v1::ProgressReply Report(const ServerProcess& server, const std::string& job, int attempt,
                         int64_t step, grpc::Status* status_out = nullptr) {
  v1::ProgressReport report;
  report.set_job_id(job);
  report.set_attempt_id(attempt);
  report.set_rank(0);
  report.set_step(step);
  report.set_total_steps(5);
  report.set_loss(5.0 - step * 0.5);
  v1::ProgressReply reply;
  grpc::Status status = server.WorkerStub()->ReportProgress(Deadline(5).get(), report, &reply);
  if (status_out != nullptr) *status_out = status;
  EXPECT_TRUE(status_out != nullptr || status.ok()) << status.error_message();
  return reply;
}

// Polls the coordinator's database (read-only, as another process would) until `job`'s stored
// step reaches `step`, for at most `limit`.
bool StoredStepReaches(const std::string& state_dir, const std::string& job, int64_t step,
                       std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  const std::string path = state_dir + "/coordinator.db";
  while (std::chrono::steady_clock::now() < deadline) {
    sqlite3* db = nullptr;
    int64_t stored = -1;
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
      sqlite3_stmt* select = nullptr;
      // The job's progress row (schema 10): stored.proto's Progress.
      if (sqlite3_prepare_v2(db, "SELECT progress FROM job_progress WHERE job_id = ?", -1, &select,
                             nullptr) == SQLITE_OK) {
        sqlite3_bind_text(select, 1, job.c_str(), -1, SQLITE_TRANSIENT);
        trainyard::stored::Progress progress;
        if (sqlite3_step(select) == SQLITE_ROW &&
            progress.ParseFromArray(sqlite3_column_blob(select, 0),
                                    sqlite3_column_bytes(select, 0))) {
          stored = progress.step();
        }
      }
      sqlite3_finalize(select);
    }
    sqlite3_close(db);
    if (stored >= step) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(ServerRestartTest, SigkilledCoordinatorComesBackAndAdoptsRunningWorkers) {
  const std::string scratch = MakeScratchDir("server_restart").string();
  const std::string state = scratch + "/state";
  std::string job;
  std::string queued;
  {
    ServerProcess first(state);
    ASSERT_TRUE(first.ok()) << first.log();
    job = Submit(first, SmallSpec("survivor", 2, /*priority=*/5));
    queued = Submit(first, SmallSpec("next", 2, /*priority=*/0));
    FakeAgent agent(first.channel(), "node-a", 2);
    ASSERT_TRUE(agent.NextOf(v1::CoordinatorMessage::kRegistered).has_value());
    for (int rank = 0; rank < 2; ++rank) {
      std::optional<v1::CoordinatorMessage> start = agent.Next();
      ASSERT_TRUE(start.has_value() && start->has_start());
      EXPECT_EQ(start->start().job_id(), job);
      EXPECT_EQ(start->start().rank(), rank);
      EXPECT_EQ(start->start().coordinator_address(), first.cluster_address());
      agent.Started(job, 1, rank, 4100 + rank);
    }
    std::vector<v1::JoinReply> joins = JoinAll(first, job, 1, 2);
    EXPECT_EQ(joins[1].world_size(), 2);
    EXPECT_EQ(joins[1].dp_rank(), 1);
    EXPECT_EQ(Report(first, job, 1, 2).order(), v1::ORDER_CONTINUE);
    EXPECT_EQ(GetJob(first, job).job().state(), v1::JOB_STATE_RUNNING);

    // Progress (soft state, re-reported every step) is persisted within a second; transitions
    // are persisted before they are acted on. Kill once the database has step 2.
    EXPECT_TRUE(StoredStepReaches(state, job, 2, std::chrono::seconds(10)));
    first.process().KillGroup();  // SIGKILL, no chance to clean up
    for (int i = 0; i < 200 && !agent.stream_ended(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(agent.stream_ended());
  }

  ServerProcess second(state);
  ASSERT_TRUE(second.ok()) << second.log();
  v1::GetJobReply reloaded = GetJob(second, job);
  EXPECT_EQ(reloaded.job().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(reloaded.job().progress().step(), 2);
  ASSERT_EQ(reloaded.attempts_size(), 1);
  EXPECT_EQ(reloaded.attempts(0).placement(1).pid(), 4101);
  EXPECT_EQ(GetJob(second, queued).job().state(), v1::JOB_STATE_QUEUED);

  // The agent reconnects listing its live workers plus one that no attempt owns.
  FakeAgent agent(second.channel(), "node-a", 2,
                  {Worker(job, 1, 0, 4100), Worker(job, 1, 1, 4101), Worker("j-999999", 1, 0, 99)});
  ASSERT_TRUE(agent.NextOf(v1::CoordinatorMessage::kRegistered).has_value());
  std::vector<v1::CoordinatorMessage> orders = agent.Drain(absl::Seconds(1));
  ASSERT_EQ(orders.size(), 1u);
  ASSERT_TRUE(orders[0].has_stop());
  EXPECT_EQ(orders[0].stop().job_id(), "j-999999");

  v1::GetJobReply adopted = GetJob(second, job);
  std::vector<std::string> kinds;
  for (const v1::Event& event : adopted.events()) kinds.push_back(event.kind());
  EXPECT_THAT(kinds, Contains("adopted"));
  EXPECT_EQ(adopted.job().attempts(), 1);

  // The same attempt carries on and finishes; only then does the queued job get the slots.
  EXPECT_EQ(Report(second, job, 1, 5).order(), v1::ORDER_CONTINUE);
  agent.Exited(job, 1, 0, 0, 0);
  agent.Exited(job, 1, 1, 0, 0);
  std::optional<v1::CoordinatorMessage> next = agent.NextOf(v1::CoordinatorMessage::kStart);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->start().job_id(), queued);
  v1::GetJobReply done = GetJob(second, job);
  EXPECT_EQ(done.job().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.job().attempts(), 1);
  EXPECT_EQ(done.job().progress().step(), 5);

  second.process().Signal(SIGTERM);
  std::optional<int> status = second.process().Wait(std::chrono::seconds(20));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  std::error_code ignored;
  std::filesystem::remove_all(scratch, ignored);
}

// Prometheus scrapes a fixed target and agents know one address: a restarted coordinator that was
// asked for any free port listens where it did before, after a crash and after a graceful stop,
// for gRPC and /metrics alike; when that port is taken, it takes a new one and says so.
//
// The ports come from the ephemeral range, where the suite's other tests draw their connections'
// ports too: one of them may take a port between two starts. A moved address therefore passes
// when the coordinator's log names it as taken, but at most one of the four may move.
TEST(ServerRestartTest, RestartKeepsTheGrpcAndMetricsPorts) {
  const std::string scratch = MakeScratchDir("server_ports").string();
  const std::string state = scratch + "/state";
  auto metrics_address = [&] {
    return WaitForFileLine(state + "/metrics.addr", std::chrono::seconds(10));
  };
  int moved = 0;
  auto expect_kept = [&](const ServerProcess& server, const std::string& kind,
                         const std::string& now, const std::string& before) {
    if (now == before) return;
    ++moved;
    EXPECT_THAT(server.log(),
                HasSubstr(absl::StrCat("the previous ", kind, " address ", before, " is taken")))
        << kind << " moved from " << before << " to " << now;
  };
  std::string grpc_address, metrics;
  {
    ServerProcess first(state);
    ASSERT_TRUE(first.ok()) << first.log();
    grpc_address = first.address();
    metrics = metrics_address();
    ASSERT_FALSE(metrics.empty());
    first.process().KillGroup();
  }
  {
    ServerProcess crashed(state);
    ASSERT_TRUE(crashed.ok()) << crashed.log();
    expect_kept(crashed, "grpc", crashed.address(), grpc_address);
    expect_kept(crashed, "metrics", metrics_address(), metrics);
    crashed.process().Signal(SIGTERM);
    ASSERT_TRUE(crashed.process().Wait(std::chrono::seconds(20)).has_value());
  }
  {
    ServerProcess stopped(state);
    ASSERT_TRUE(stopped.ok()) << stopped.log();
    expect_kept(stopped, "grpc", stopped.address(), grpc_address);
    expect_kept(stopped, "metrics", metrics_address(), metrics);
    // While it runs, a second coordinator on another state directory that remembers the same
    // ports cannot have them: it listens elsewhere.
    const std::string other = scratch + "/other";
    std::filesystem::create_directories(other);
    std::filesystem::copy_file(state + "/last-addresses", other + "/last-addresses");
    ServerProcess second(other);
    ASSERT_TRUE(second.ok()) << second.log();
    EXPECT_NE(second.address(), stopped.address());
    EXPECT_THAT(second.log(), HasSubstr(absl::StrCat("the previous grpc address ",
                                                     stopped.address(), " is taken")));
  }
  EXPECT_LE(moved, 1);
  std::error_code ignored;
  std::filesystem::remove_all(scratch, ignored);
}

}  // namespace
}  // namespace trainyard::testenv
