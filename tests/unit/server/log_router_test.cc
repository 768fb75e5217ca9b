#include "server/log_router.h"

#include <optional>

#include "gtest/gtest.h"
#include "tests/unit/server/server_test_util.h"

namespace trainyard::server {
namespace {

using testing::RecordingChannel;

class RecordingSink : public LogSink {
 public:
  void OnData(int attempt_id, int rank, std::string data) override {
    chunks.push_back(absl::StrCat(attempt_id, "/", rank, ":", data));
  }
  void OnDone(const absl::Status& status) override {
    EXPECT_FALSE(done.has_value()) << "OnDone twice";
    done = status;
  }
  std::vector<std::string> chunks;
  std::optional<absl::Status> done;
};

NodeRecord Node(const std::string& id) {
  NodeRecord node;
  node.node_id = id;
  node.cpu_slots = 2;
  return node;
}

LogTargets Targets() {
  LogTargets targets;
  targets.attempt_id = 3;
  targets.ranks = {LogTarget{0, "a", false}, LogTarget{1, "b", true}};
  return targets;
}

class LogRouterTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  AgentRegistry registry_{&clock_, absl::Seconds(10)};
  LogRouter router_{&registry_};
  std::shared_ptr<RecordingChannel> a_ = std::make_shared<RecordingChannel>();
  std::shared_ptr<RecordingChannel> b_ = std::make_shared<RecordingChannel>();
};

TEST_F(LogRouterTest, RoutesEveryRankAndEndsWhenAllAreDone) {
  registry_.Connect(Node("a"), a_);
  registry_.Connect(Node("b"), b_);
  auto sink = std::make_shared<RecordingSink>();
  router_.Start("j-1", Targets(), /*tail_lines=*/5, /*follow=*/true, sink);
  auto on_a = a_->TakeOf<ReadLogsOrder>();
  auto on_b = b_->TakeOf<ReadLogsOrder>();
  ASSERT_EQ(on_a.size(), 1u);
  ASSERT_EQ(on_b.size(), 1u);
  EXPECT_TRUE(on_a[0].follow);
  EXPECT_FALSE(on_b[0].follow);  // rank 1 has exited: nothing more will come
  EXPECT_EQ(on_a[0].tail_lines, 5);
  EXPECT_EQ(on_a[0].attempt_id, 3);
  // Data from the wrong node for a request is ignored.
  router_.OnLogData("b", on_a[0].request_id, 0, "forged", true, "");
  router_.OnLogData("a", on_a[0].request_id, 0, "hello\n", false, "");
  router_.OnLogData("b", on_b[0].request_id, 1, "bye\n", true, "");
  EXPECT_FALSE(sink->done.has_value());
  router_.OnLogData("a", on_a[0].request_id, 0, "", true, "");
  ASSERT_TRUE(sink->done.has_value());
  EXPECT_TRUE(sink->done->ok());
  EXPECT_EQ(sink->chunks, (std::vector<std::string>{"3/0:hello\n", "3/1:bye\n"}));
}

TEST_F(LogRouterTest, MissingOrLostNodesEndTheStreamUnavailable) {
  registry_.Connect(Node("a"), a_);
  auto unreachable = std::make_shared<RecordingSink>();
  router_.Start("j-1", Targets(), 0, false, unreachable);
  ASSERT_TRUE(unreachable->done.has_value());
  EXPECT_EQ(unreachable->done->code(), absl::StatusCode::kUnavailable);
  // The read already sent to `a` is withdrawn.
  auto sent = a_->Take();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_TRUE(std::holds_alternative<CancelReadLogsOrder>(sent[1]));

  registry_.Connect(Node("b"), b_);
  auto sink = std::make_shared<RecordingSink>();
  router_.Start("j-1", Targets(), 0, true, sink);
  router_.OnAgentGone("b");
  ASSERT_TRUE(sink->done.has_value());
  EXPECT_EQ(sink->done->code(), absl::StatusCode::kUnavailable);
}

TEST_F(LogRouterTest, AgentErrorsAndCancellation) {
  registry_.Connect(Node("a"), a_);
  registry_.Connect(Node("b"), b_);
  auto sink = std::make_shared<RecordingSink>();
  router_.Start("j-1", Targets(), 0, false, sink);
  auto request = a_->TakeOf<ReadLogsOrder>()[0].request_id;
  router_.OnLogData("a", request, 0, "", true, "no such log");
  ASSERT_TRUE(sink->done.has_value());
  EXPECT_EQ(sink->done->code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b_->TakeOf<CancelReadLogsOrder>().size(), 1u);

  auto cancelled = std::make_shared<RecordingSink>();
  const uint64_t id = router_.Start("j-1", Targets(), 0, true, cancelled);
  a_->Take();
  b_->Take();
  router_.Cancel(id);
  EXPECT_FALSE(cancelled->done.has_value());  // the client is gone: nobody to tell
  EXPECT_EQ(a_->TakeOf<CancelReadLogsOrder>().size(), 1u);
  EXPECT_EQ(b_->TakeOf<CancelReadLogsOrder>().size(), 1u);
}

}  // namespace
}  // namespace trainyard::server
