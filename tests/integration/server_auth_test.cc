// Authentication and authorization of a real trainyard-server over gRPC: every refusal the
// security model promises (no, wrong, expired or revoked token; another user's job; an agent's
// credential used as a user's and the reverse; a worker secret of another attempt), the admin's
// reach, the per-user limits, and the CLI's one-line refusal with exit code 2.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "gtest/gtest.h"
#include "tests/integration/server_harness.h"
#include "tests/integration/subprocess.h"

namespace trainyard::testenv {
namespace {

class AuthTest : public ::testing::Test {
 protected:
  void StartServer(const std::vector<std::string>& flags = {}) {
    scratch_ = MakeScratchDir("server_auth").string();
    server_ = std::make_unique<ServerProcess>(state_dir(), flags);
    ASSERT_TRUE(server_->ok()) << server_->log();
  }
  void TearDown() override {
    agent_.reset();
    server_.reset();
    std::error_code ignored;
    if (!scratch_.empty()) std::filesystem::remove_all(scratch_, ignored);
  }
  std::string state_dir() const { return scratch_ + "/state"; }

  // `trainyard-server token ARGS --state-dir STATE`: its stdout, trimmed.
  std::string Token(std::vector<std::string> args) {
    args.insert(args.begin(), {BinaryDir() + "/server/trainyard-server", "token"});
    args.insert(args.end(), {"--state-dir", state_dir()});
    const ProcessResult result = RunProcess(args, 30);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    return std::string(absl::StripAsciiWhitespace(result.out));
  }

  std::unique_ptr<v1::JobService::Stub> Jobs(const std::string& token) {
    return v1::JobService::NewStub(server_->Channel(token));
  }

  grpc::Status Submit(const std::string& token, const std::string& name, std::string* id = nullptr,
                      const std::string& claimed_user = "") {
    v1::SubmitJobRequest request;
    request.set_spec_yaml(SmallSpec(name));
    request.set_user(claimed_user);
    v1::SubmitJobReply reply;
    grpc::Status status = Jobs(token)->SubmitJob(Deadline(10).get(), request, &reply);
    if (id != nullptr) *id = reply.job().id();
    return status;
  }
  grpc::StatusCode GetJob(const std::string& token, const std::string& id,
                          v1::GetJobReply* reply = nullptr) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    request.set_max_events(20);
    v1::GetJobReply ignored;
    return Jobs(token)
        ->GetJob(Deadline(10).get(), request, reply == nullptr ? &ignored : reply)
        .error_code();
  }
  grpc::StatusCode Cancel(const std::string& token, const std::string& id) {
    v1::CancelJobRequest request;
    request.set_job_id(id);
    v1::CancelJobReply reply;
    return Jobs(token)->CancelJob(Deadline(10).get(), request, &reply).error_code();
  }
  std::vector<std::string> ListJobIds(const std::string& token) {
    v1::ListJobsReply reply;
    grpc::Status status = Jobs(token)->ListJobs(Deadline(10).get(), v1::ListJobsRequest(), &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::string> ids;
    for (const v1::Job& job : reply.jobs()) ids.push_back(job.id());
    return ids;
  }
  // How a WatchJob stream starts: OK when it opens (it is then closed), else its refusal.
  grpc::StatusCode FirstOfWatch(const std::string& token, const std::string& id) {
    auto stub = Jobs(token);
    v1::WatchJobRequest request;
    request.set_job_id(id);
    auto context = Deadline(5);
    auto reader = stub->WatchJob(context.get(), request);
    v1::JobUpdate update;
    while (reader->Read(&update)) {
      context->TryCancel();  // it is open: that is all this asks
    }
    grpc::Status status = reader->Finish();
    return status.error_code() == grpc::StatusCode::CANCELLED ? grpc::StatusCode::OK
                                                              : status.error_code();
  }
  grpc::StatusCode FirstOfLogs(const std::string& token, const std::string& id) {
    auto stub = Jobs(token);
    v1::GetLogsRequest request;
    request.set_job_id(id);
    auto context = Deadline(5);
    auto reader = stub->GetLogs(context.get(), request);
    v1::LogChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish().error_code();
  }

  std::string scratch_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<FakeAgent> agent_;
};

TEST_F(AuthTest, CallsWithoutAValidTokenAreRefused) {
  StartServer();
  struct stat info {};
  ASSERT_EQ(stat((state_dir() + "/admin.token").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u) << "only the coordinator's user may read the admin token";
  ASSERT_EQ(stat((state_dir() + "/attempt.key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);

  EXPECT_EQ(Submit("", "none").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Submit("ty_0123", "wrong").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Submit(server_->admin_token(), "admin").ok());

  const std::string bob = Token({"add", "bob"});
  ASSERT_TRUE(absl::StartsWith(bob, "ty_")) << bob;
  EXPECT_TRUE(Submit(bob, "bob").ok()) << "a new token works at once";
  Token({"revoke", "bob"});
  grpc::Status revoked = Submit(bob, "revoked");
  EXPECT_EQ(revoked.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(revoked.error_message(), "revoked")) << revoked.error_message();

  const std::string carol = Token({"add", "carol", "--expires-in", "1s"});
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  grpc::Status expired = Submit(carol, "expired");
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(expired.error_message(), "expired")) << expired.error_message();
  EXPECT_TRUE(server_->process().running());
}

TEST_F(AuthTest, UsersSeeAndActOnTheirOwnJobsOnlyAndTheAdminOnAll) {
  StartServer();
  const std::string alice = Token({"add", "alice"});
  const std::string bob = Token({"add", "bob"});
  std::string job;
  // The job is alice's whoever the request claims to be.
  ASSERT_TRUE(Submit(alice, "alices", &job, /*claimed_user=*/"bob").ok());
  v1::GetJobReply reply;
  ASSERT_EQ(GetJob(alice, job, &reply), grpc::StatusCode::OK);
  EXPECT_EQ(reply.job().user(), "alice");

  EXPECT_EQ(GetJob(bob, job), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Cancel(bob, job), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(FirstOfWatch(bob, job), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(FirstOfLogs(bob, job), grpc::StatusCode::PERMISSION_DENIED);
  v1::ListCheckpointsRequest checkpoints;
  checkpoints.set_job_id(job);
  v1::ListCheckpointsReply checkpoints_reply;
  EXPECT_EQ(
      Jobs(bob)->ListCheckpoints(Deadline(5).get(), checkpoints, &checkpoints_reply).error_code(),
      grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(ListJobIds(bob).empty());
  EXPECT_EQ(ListJobIds(alice), std::vector<std::string>{job});
  EXPECT_EQ(FirstOfWatch(alice, job), grpc::StatusCode::OK);

  // Nodes: anyone may look, only the admin manages them.
  v1::UncordonNodeRequest uncordon;
  uncordon.set_node_id("node-a");
  v1::UncordonNodeReply uncordoned;
  EXPECT_EQ(Jobs(alice)->UncordonNode(Deadline(5).get(), uncordon, &uncordoned).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(Jobs(server_->admin_token())
                ->UncordonNode(Deadline(5).get(), uncordon, &uncordoned)
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // The admin sees and cancels anyone's job; the event names who did it.
  EXPECT_EQ(ListJobIds(server_->admin_token()), std::vector<std::string>{job});
  EXPECT_EQ(Cancel(server_->admin_token(), job), grpc::StatusCode::OK);
  ASSERT_EQ(GetJob(alice, job, &reply), grpc::StatusCode::OK);
  EXPECT_EQ(reply.job().state(), v1::JOB_STATE_CANCELLED);
  bool submitted_by_alice = false;
  bool cancelled_by_admin = false;
  for (const v1::Event& event : reply.events()) {
    submitted_by_alice |= absl::StrContains(event.cause(), "submitted by alice");
    cancelled_by_admin |= absl::StrContains(event.cause(), "cancelled by ") &&
                          !absl::StrContains(event.cause(), "alice");
  }
  EXPECT_TRUE(submitted_by_alice);
  EXPECT_TRUE(cancelled_by_admin);
}

TEST_F(AuthTest, AgentAndUserCredentialsAreNotInterchangeable) {
  StartServer();
  const std::string agent = Token({"add", "rack-1", "--role", "agent", "--nodes", "node-*"});
  const std::string alice = Token({"add", "alice"});
  grpc::Status as_user = Submit(agent, "agent");
  EXPECT_EQ(as_user.error_code(), grpc::StatusCode::PERMISSION_DENIED) << as_user.error_message();

  FakeAgent impostor(server_->Channel(alice), "node-x", 2);
  EXPECT_FALSE(impostor.NextOf(v1::CoordinatorMessage::kRegistered, absl::Seconds(5)).has_value());
  EXPECT_TRUE(impostor.stream_ended());

  agent_ = std::make_unique<FakeAgent>(server_->Channel(agent), "node-a", 2);
  EXPECT_TRUE(agent_->NextOf(v1::CoordinatorMessage::kRegistered).has_value());
}

// An agent's token registers only the nodes it was made for: its own name by default, or the
// glob an admin gave with --nodes; another node id is refused and the stream ends.
TEST_F(AuthTest, AnAgentTokenRegistersOnlyItsOwnNodes) {
  StartServer();
  const std::string own = Token({"add", "node-b", "--role", "agent"});
  FakeAgent impostor(server_->Channel(own), "node-c", 2);
  EXPECT_FALSE(impostor.NextOf(v1::CoordinatorMessage::kRegistered, absl::Seconds(5)).has_value());
  EXPECT_TRUE(impostor.stream_ended());
  agent_ = std::make_unique<FakeAgent>(server_->Channel(own), "node-b", 2);
  EXPECT_TRUE(agent_->NextOf(v1::CoordinatorMessage::kRegistered).has_value());
  const ProcessResult refused =
      RunProcess({BinaryDir() + "/server/trainyard-server", "token", "add", "alice", "--nodes", "x",
                  "--state-dir", state_dir()},
                 30);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(refused.err, "--nodes binds an agent's token")) << refused.err;
}

TEST_F(AuthTest, AWorkerSecretActsForItsOwnAttemptOnly) {
  StartServer();
  agent_ = std::make_unique<FakeAgent>(server_->channel(), "node-a", 4);
  ASSERT_TRUE(agent_->NextOf(v1::CoordinatorMessage::kRegistered).has_value());
  std::string first, second;
  ASSERT_TRUE(Submit(server_->admin_token(), "first", &first).ok());
  ASSERT_TRUE(Submit(server_->admin_token(), "second", &second).ok());
  std::map<std::string, std::string> secret;  // job -> its attempt's secret
  for (int i = 0; i < 4; ++i) {
    std::optional<v1::CoordinatorMessage> start = agent_->NextOf(v1::CoordinatorMessage::kStart);
    ASSERT_TRUE(start.has_value());
    ASSERT_FALSE(start->start().attempt_secret().empty());
    secret[start->start().job_id()] = start->start().attempt_secret();
    agent_->Started(start->start().job_id(), start->start().attempt_id(), start->start().rank(),
                    7000 + i);
  }
  ASSERT_EQ(secret.size(), 2u);

  auto kv_set = [&](const std::string& token, const std::string& job) {
    v1::KvSetRequest request;
    request.set_key(absl::StrCat("jobs/", job, "/attempts/1/probe"));
    request.set_value("x");
    v1::KvSetReply reply;
    return v1::WorkerService::NewStub(server_->Channel(token))
        ->KvSet(Deadline(5).get(), request, &reply);
  };
  auto report = [&](const std::string& token, const std::string& job) {
    v1::ProgressReport request;
    request.set_job_id(job);
    request.set_attempt_id(1);
    request.set_step(1);
    v1::ProgressReply reply;
    return v1::WorkerService::NewStub(server_->Channel(token))
        ->ReportProgress(Deadline(5).get(), request, &reply)
        .error_code();
  };
  EXPECT_TRUE(kv_set(secret[first], first).ok());
  EXPECT_NE(report(secret[first], first), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(report(secret[first], first), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status other = kv_set(secret[second], first);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED) << other.error_message();
  EXPECT_EQ(report(secret[second], first), grpc::StatusCode::PERMISSION_DENIED);
  std::string forged = secret[first];
  forged.back() = forged.back() == '0' ? '1' : '0';
  EXPECT_EQ(kv_set(forged, first).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(kv_set("", first).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(kv_set(Token({"add", "alice"}), first).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(kv_set(server_->admin_token(), first).ok());
}

TEST_F(AuthTest, PerUserLimitsOnQueuedJobsAndOpenStreams) {
  StartServer({"--max-queued-jobs-per-user", "2", "--max-streams-per-user", "1"});
  const std::string alice = Token({"add", "alice"});
  const std::string bob = Token({"add", "bob"});
  std::string job;
  ASSERT_TRUE(Submit(alice, "a1", &job).ok());
  ASSERT_TRUE(Submit(alice, "a2").ok());
  grpc::Status third = Submit(alice, "a3");
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  EXPECT_TRUE(Submit(bob, "b1").ok()) << "one user's queue does not limit another's";

  auto stub = Jobs(alice);
  v1::WatchJobRequest request;
  request.set_job_id(job);
  grpc::ClientContext open_context;
  auto open = stub->WatchJob(&open_context, request);
  v1::JobUpdate update;
  ASSERT_TRUE(open->Read(&update)) << "the first stream is open";
  EXPECT_EQ(FirstOfWatch(alice, job), grpc::StatusCode::RESOURCE_EXHAUSTED);
  open_context.TryCancel();
  while (open->Read(&update)) {
  }
  open->Finish();
  grpc::StatusCode again = grpc::StatusCode::RESOURCE_EXHAUSTED;
  for (int i = 0; i < 50 && again != grpc::StatusCode::OK; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the slot frees as it closes
    again = FirstOfWatch(alice, job);
  }
  EXPECT_EQ(again, grpc::StatusCode::OK);
}

TEST_F(AuthTest, TheCliSaysWhyInOneLineAndExitsTwo) {
  StartServer();
  const std::string cli = BinaryDir() + "/tools/cli/trainyard";
  const std::string alice_file = scratch_ + "/alice.token";
  std::ofstream(alice_file) << Token({"add", "alice"}) << "\n";
  std::string job;
  ASSERT_TRUE(Submit(server_->admin_token(), "admins", &job).ok());

  // No token anywhere: run from a directory without trainyard-state, with an empty HOME.
  const std::string nowhere = scratch_ + "/nowhere";
  std::filesystem::create_directories(nowhere);
  ProcessResult none = RunProcess(
      {"/usr/bin/env", "-u", "TRAINYARD_TOKEN_FILE", "HOME=" + nowhere,
       "XDG_CONFIG_HOME=" + nowhere, "/bin/sh", "-c",
       "cd \"$0\" && exec \"$1\" --server \"$2\" list", nowhere, cli, server_->address()},
      30);
  EXPECT_EQ(none.exit_code, 2) << none.err;
  EXPECT_TRUE(absl::StrContains(none.err, "no credentials")) << none.err;
  EXPECT_EQ(std::count(none.err.begin(), none.err.end(), '\n'), 1) << none.err;

  ProcessResult theirs = RunProcess(
      {cli, "--server", server_->address(), "--token-file", alice_file, "cancel", job}, 30);
  EXPECT_EQ(theirs.exit_code, 2) << theirs.err;
  EXPECT_TRUE(absl::StrContains(theirs.err, "belongs to another user")) << theirs.err;

  ProcessResult missing = RunProcess(
      {cli, "--server", server_->address(), "--token-file", scratch_ + "/absent", "list"}, 30);
  EXPECT_EQ(missing.exit_code, 2) << missing.err;

  ProcessResult admin = RunProcess({cli, "--server", server_->address(), "--token-file",
                                    state_dir() + "/admin.token", "cancel", job},
                                   30);
  EXPECT_EQ(admin.exit_code, 0) << admin.err;
}

// The peak resident memory of process `pid` (VmHWM), in bytes; -1 when unknown.
int64_t PeakResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    int64_t kib = 0;
    if (absl::StartsWith(line, "VmHWM:") &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(6, line.size() - 9)), &kib)) {
      return kib << 10;
    }
  }
  return -1;
}

// A request over the size limit is refused before it costs memory: a 100 MB spec raises the
// coordinator's peak by at most 48 MiB (gRPC buffers a whole message before its size check; the
// clients' listener has a bounded resource quota), and the coordinator serves on.
TEST_F(AuthTest, AHugeRequestIsRefusedWithoutCostingItsSize) {
  StartServer();
  ASSERT_TRUE(Submit(server_->admin_token(), "warm").ok());
  const int64_t before = PeakResidentBytes(server_->process().pid());
  ASSERT_GT(before, 0);
  v1::SubmitJobRequest request;
  request.set_spec_yaml(std::string(100 << 20, '#'));
  v1::SubmitJobReply reply;
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto stub = v1::JobService::NewStub(
      *rpc::MakeChannel(server_->address(), rpc::TlsFiles(), args, server_->admin_token()));
  const grpc::Status refused = stub->SubmitJob(Deadline(60).get(), request, &reply);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  const int64_t grown = PeakResidentBytes(server_->process().pid()) - before;
  EXPECT_LE(grown, int64_t{48} << 20)
      << "the coordinator's peak grew by " << (grown >> 20) << " MiB";
  EXPECT_TRUE(Submit(server_->admin_token(), "after").ok());
  EXPECT_TRUE(server_->process().running());
}

TEST(AuthTokenFileTest, AServerWithAnUnusableTokenFileRefusesToStart) {
  const std::string dir = MakeScratchDir("server_auth_file").string();
  std::ofstream(dir + "/tokens") << "alice user sha256:nothex\n";
  ProcessResult bad = RunProcess({BinaryDir() + "/server/trainyard-server", "--no-local-agent",
                                  "--state-dir", dir + "/state", "--tokens", dir + "/tokens"},
                                 30);
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_TRUE(absl::StrContains(bad.err, "line 1")) << bad.err;
  ProcessResult absent = RunProcess({BinaryDir() + "/server/trainyard-server", "--no-local-agent",
                                     "--state-dir", dir + "/state", "--tokens", dir + "/absent"},
                                    30);
  EXPECT_EQ(absent.exit_code, 2) << absent.err;
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

// The flags that describe a new credential are refused by the commands that make none.
TEST(AuthTokenFileTest, RevokeAndListRefuseTheFlagsOfAdd) {
  const std::string dir = MakeScratchDir("server_auth_token_flags").string();
  const std::string server = BinaryDir() + "/server/trainyard-server";
  const std::vector<std::pair<std::string, std::string>> add_flags = {
      {"--role", "admin"}, {"--nodes", "gpu-*"}, {"--expires-in", "30d"}, {"--certificate", "cn"}};
  for (const auto& [flag, value] : add_flags) {
    ProcessResult revoke = RunProcess(
        {server, "token", "revoke", "alice", flag, value, "--tokens", dir + "/tokens"}, 30);
    EXPECT_EQ(revoke.exit_code, 2) << flag << ": " << revoke.err;
    EXPECT_TRUE(absl::StrContains(revoke.err, flag + " is for token add: not used by token revoke"))
        << revoke.err;
    ProcessResult list =
        RunProcess({server, "token", "list", flag, value, "--tokens", dir + "/tokens"}, 30);
    EXPECT_EQ(list.exit_code, 2) << flag << ": " << list.err;
    EXPECT_TRUE(absl::StrContains(list.err, flag + " is for token add: not used by token list"))
        << list.err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/tokens"));
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace trainyard::testenv
