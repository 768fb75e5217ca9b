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

// Admission asks for the smallest connected nodes at every submission; the answer follows nodes
// connecting, leaving and being lost.
TEST(AgentRegistryTest, SmallestNodesFollowConnectionsAndLosses) {
  FakeClock clock;
  AgentRegistry registry(&clock, absl::Seconds(10));
  auto node = [](const std::string& id, int64_t memory, int64_t gpu_memory) {
    NodeRecord record = Node(id, 2, gpu_memory > 0 ? 1 : 0);
    record.memory_bytes = memory;
    if (gpu_memory > 0) record.gpus[0].memory_bytes = gpu_memory;
    return record;
  };
  auto ids = [&registry] {
    std::vector<std::string> out;
    for (const NodeStatus& status : registry.SmallestNodes()) out.push_back(status.record.node_id);
    return out;
  };
  EXPECT_TRUE(ids().empty());
  const uint64_t big = registry.Connect(node("big", 64, 0), std::make_shared<RecordingChannel>());
  EXPECT_EQ(ids(), std::vector<std::string>{"big"});
  const uint64_t small =
      registry.Connect(node("small", 16, 0), std::make_shared<RecordingChannel>());
  registry.Connect(node("gpu", 32, 80), std::make_shared<RecordingChannel>());
  EXPECT_EQ(ids(), (std::vector<std::string>{"small", "gpu"}));
  EXPECT_TRUE(registry.Disconnect("small", small));
  EXPECT_EQ(ids(), (std::vector<std::string>{"gpu"})) << "the GPU node is now also the smallest";
  clock.Advance(absl::Seconds(11));
  EXPECT_TRUE(registry.Touch("big", big));
  registry.CollectLost();  // the GPU node fell silent
  EXPECT_EQ(ids(), std::vector<std::string>{"big"});
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

TEST(AgentRegistryTest, NodesInFitOrderFollowsHoldsReleasesAndConnections) {
  FakeClock clock;
  AgentRegistry registry(&clock, absl::Seconds(10));
  const uint64_t a = registry.Connect(Node("a", 4), std::make_shared<RecordingChannel>());
  registry.Connect(Node("b", 2), std::make_shared<RecordingChannel>());
  registry.Connect(Node("c", 4), std::make_shared<RecordingChannel>());
  auto ids = [](const std::vector<NodeView>& views) {
    std::vector<std::string> out;
    for (const NodeView& view : views) out.push_back(view.node_id);
    return out;
  };
  auto all = [](const NodeView&) { return true; };
  // Fewest free slots first, then node id.
  EXPECT_EQ(ids(registry.NodesInFitOrder(DeviceKind::kCpu, 1, 10, all)),
            (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_EQ(ids(registry.NodesInFitOrder(DeviceKind::kCpu, 3, 10, all)),
            (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(ids(registry.NodesInFitOrder(DeviceKind::kCpu, 1, 2, all)),
            (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(ids(registry.NodesInFitOrder(DeviceKind::kCpu, 1, 10,
                                         [](const NodeView& v) { return v.node_id != "a"; })),
            (std::vector<std::string>{"b", "c"}));
  EXPECT_TRUE(registry.NodesInFitOrder(DeviceKind::kGpu, 1, 10, all).empty());
  // Holding moves a node up the order; a full node leaves it; releasing brings it back.
  registry.Hold("c", DeviceKind::kCpu, 0);
  registry.Hold("c", DeviceKind::kCpu, 1);
  registry.Hold("c", DeviceKind::kCpu, 2);
  const std::vector<NodeView> fit = registry.NodesInFitOrder(DeviceKind::kCpu, 1, 10, all);
  EXPECT_EQ(ids(fit), (std::vector<std::string>{"c", "b", "a"}));
  EXPECT_EQ(fit[0].free_cpu_slots, (std::vector<int>{3}));
  registry.Hold("c", DeviceKind::kCpu, 3);
  EXPECT_EQ(ids(registry.NodesInFitOrder(DeviceKind::kCpu, 1, 10, all)),
            (std::vector<std::string>{"b", "a"}));
  registry.Release("c", DeviceKind::kCpu, 3);
  EXPECT_EQ(ids(registry.NodesInFitOrder(DeviceKind::kCpu, 1, 10, all)),
            (std::vector<std::string>{"c", "b", "a"}));
  // A disconnected node is not offered; reconnecting offers it again.
  ASSERT_TRUE(registry.Disconnect("a", a));
  EXPECT_EQ(ids(registry.NodesInFitOrder(DeviceKind::kCpu, 1, 10, all)),
            (std::vector<std::string>{"c", "b"}));
  registry.Connect(Node("a", 4), std::make_shared<RecordingChannel>());
  EXPECT_EQ(ids(registry.NodesInFitOrder(DeviceKind::kCpu, 1, 10, all)),
            (std::vector<std::string>{"c", "b", "a"}));
  // The index agrees with the full walk.
  EXPECT_EQ(ids(registry.FreeNodes()), (std::vector<std::string>{"a", "b", "c"}));
}

}  // namespace
}  // namespace trainyard::server
