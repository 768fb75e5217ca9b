#include "server/agent_registry.h"

#include "gtest/gtest.h"
#include "tests/unit/server/server_test_util.h"

namespace trainyard::server {
namespace {

using testing::RecordingChannel;

NodeRecord Node(const std::string& id, int slots, int gpus = 0) {
  NodeRecord node;
  node.node_id = id;
  node.hostname = id;
  node.cpu_slots = slots;
  for (int i = 0; i < gpus; ++i) node.gpus.push_back(GpuInfo{i, "gpu", 1});
  return node;
}

TEST(AgentRegistryTest, NewConnectionReplacesTheOld) {
  FakeClock clock;
  AgentRegistry registry(&clock, absl::Seconds(10));
  auto first = std::make_shared<RecordingChannel>();
  auto second = std::make_shared<RecordingChannel>();
  const uint64_t s1 = registry.Connect(Node("a", 2), first);
  const uint64_t s2 = registry.Connect(Node("a", 2), second);
  ASSERT_TRUE(first->closed().has_value());
  EXPECT_EQ(first->closed()->code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(second->closed().has_value());
  EXPECT_FALSE(registry.Touch("a", s1));
  EXPECT_TRUE(registry.Touch("a", s2));
  EXPECT_FALSE(registry.Disconnect("a", s1));  // a stale session cannot disconnect the new one
  EXPECT_TRUE(registry.IsConnected("a"));
  EXPECT_TRUE(registry.Send("a", CancelReadLogsOrder{7}));
  EXPECT_EQ(second->Take().size(), 1u);
  EXPECT_TRUE(registry.Disconnect("a", s2));
  EXPECT_FALSE(registry.Send("a", CancelReadLogsOrder{8}));
}

TEST(AgentRegistryTest, ASecondAgentWithTheSameNodeIdIsRefusedWhileTheFirstLives) {
  FakeClock clock;
  AgentRegistry registry(&clock, absl::Seconds(10));
  NodeRecord first = Node("a", 2);
  first.instance_id = "one";
  first.hostname = "host-1";
  registry.Connect(first, std::make_shared<RecordingChannel>());
  NodeRecord same = first;  // the same agent reconnecting (a half-open connection)
  EXPECT_TRUE(registry.CheckNodeIdFree(same).ok());
  NodeRecord other = Node("a", 2);
  other.instance_id = "two";
  const absl::Status refused = registry.CheckNodeIdFree(other);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(refused.message().find("in use by another agent (on host-1"), std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("--node-id"), std::string::npos) << refused;
  EXPECT_TRUE(registry.CheckNodeIdFree(Node("b", 2)).ok());
  // Once the first has been silent for the heartbeat timeout, a new process may take its id.
  clock.Advance(absl::Seconds(11));
  EXPECT_TRUE(registry.CheckNodeIdFree(other).ok());
}

TEST(AgentRegistryTest, SilentAgentsAreLostOnceAndClosed) {
  FakeClock clock;
  AgentRegistry registry(&clock, absl::Seconds(10));
  auto channel = std::make_shared<RecordingChannel>();
  const uint64_t session = registry.Connect(Node("a", 2), channel);
  registry.Connect(Node("b", 2), std::make_shared<RecordingChannel>());
  clock.Advance(absl::Seconds(6));
  EXPECT_TRUE(registry.Touch("a", session));
  clock.Advance(absl::Seconds(6));
  // b has been silent for 12 s, a for 6 s.
  EXPECT_EQ(registry.CollectLost(), std::vector<std::string>{"b"});
  EXPECT_TRUE(registry.CollectLost().empty());
  EXPECT_EQ(registry.HeartbeatAges().at("a"), absl::Seconds(6));
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(registry.CollectLost(), std::vector<std::string>{"a"});
  ASSERT_TRUE(channel->closed().has_value());
  EXPECT_EQ(channel->closed()->code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(registry.FreeNodes().empty());
  registry.Connect(Node("a", 2), std::make_shared<RecordingChannel>());
  EXPECT_EQ(registry.FreeNodes().size(), 1u);
}

TEST(AgentRegistryTest, HeldSlotsAreNotFreeEvenAcrossReconnects) {
  FakeClock clock;
  AgentRegistry registry(&clock, absl::Seconds(10));
  const uint64_t session = registry.Connect(Node("a", 4), std::make_shared<RecordingChannel>());
  registry.Hold("a", DeviceKind::kCpu, 1);
  registry.Hold("a", DeviceKind::kCpu, 2);
  auto nodes = registry.FreeNodes();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].free_cpu_slots, (std::vector<int>{0, 3}));
  registry.Disconnect("a", session);
  EXPECT_TRUE(registry.FreeNodes().empty());
  registry.Connect(Node("a", 4), std::make_shared<RecordingChannel>());
  EXPECT_EQ(registry.FreeNodes()[0].free_cpu_slots, (std::vector<int>{0, 3}));
  registry.Release("a", DeviceKind::kCpu, 1);
  EXPECT_EQ(registry.FreeNodes()[0].free_cpu_slots, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(registry.Nodes()[0].free_slots, 3);
  // A node with nothing free is not offered at all.
  for (int slot : {0, 1, 3}) registry.Hold("a", DeviceKind::kCpu, slot);
  EXPECT_TRUE(registry.FreeNodes().empty());
  EXPECT_EQ(registry.Nodes()[0].free_slots, 0);
}

TEST(AgentRegistryTest, GpuNodesOfferTheirGpusOnly) {
  FakeClock clock;
  AgentRegistry registry(&clock, absl::Seconds(10));
  registry.Connect(Node("g", 16, 2), std::make_shared<RecordingChannel>());
  registry.Hold("g", DeviceKind::kGpu, 0);
  auto nodes = registry.FreeNodes();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_TRUE(nodes[0].free_cpu_slots.empty());
  EXPECT_EQ(nodes[0].free_gpus, (std::vector<int>{1}));
}

TEST(AgentRegistryTest, KnownNodesCountAsDisconnectedSinceStart) {
  FakeClock clock;
  AgentRegistry registry(&clock, absl::Seconds(10));
  registry.AddKnownNode(Node("old", 2));
  EXPECT_FALSE(registry.IsConnected("old"));
  clock.Advance(absl::Seconds(11));
  EXPECT_EQ(registry.CollectLost(), std::vector<std::string>{"old"});
}

}  // namespace
}  // namespace trainyard::server
