#include "server/scheduler.h"

#include <algorithm>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

using ::testing::ElementsAre;

PendingJob Job(const std::string& id, int priority, int64_t seq, int nodes, int per_node,
               DeviceKind kind = DeviceKind::kCpu, int tp = 1) {
  PendingJob job;
  job.job_id = id;
  job.priority = priority;
  job.seq = seq;
  job.requirements.nodes = nodes;
  job.requirements.ranks_per_node = per_node;
  job.requirements.kind = kind;
  job.requirements.mesh.tp = tp;
  job.requirements.mesh.dp = nodes * per_node / tp;
  return job;
}

NodeView Node(const std::string& id, int cpu_slots, std::vector<int> gpus = {}) {
  NodeView node;
  node.node_id = id;
  node.hostname = id + ".local";
  for (int i = 0; i < cpu_slots; ++i) node.free_cpu_slots.push_back(i);
  node.free_gpus = std::move(gpus);
  return node;
}

TEST(SchedulerTest, HigherPriorityFirstThenFifo) {
  Scheduler scheduler;
  scheduler.Enqueue(Job("low-old", 0, 1, 1, 1));
  scheduler.Enqueue(Job("high-new", 5, 3, 1, 1));
  scheduler.Enqueue(Job("low-new", 0, 2, 1, 1));
  scheduler.Enqueue(Job("high-old", 5, 2, 1, 1));
  EXPECT_THAT(scheduler.QueueOrder(), ElementsAre("high-old", "high-new", "low-old", "low-new"));
}

TEST(SchedulerTest, GangAllocationIsAllOrNothing) {
  Scheduler scheduler;
  scheduler.Enqueue(Job("big", 0, 1, 2, 2));
  // Only one node has room for 2 ranks: nothing is placed, nothing is taken.
  auto placements = scheduler.Schedule({Node("a", 2), Node("b", 1)});
  EXPECT_TRUE(placements.empty());
  EXPECT_TRUE(scheduler.Contains("big"));
  placements = scheduler.Schedule({Node("a", 2), Node("b", 2)});
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_FALSE(scheduler.Contains("big"));
  const auto& ranks = placements[0].ranks;
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_EQ(ranks[0].node_id, "a");
  EXPECT_EQ(ranks[1].node_id, "a");
  EXPECT_EQ(ranks[2].node_id, "b");
  EXPECT_EQ(ranks[3].node_id, "b");
  EXPECT_EQ(ranks[2].local_rank, 0);
  EXPECT_EQ(ranks[3].local_rank, 1);
  EXPECT_EQ(ranks[3].slot, 1);
  EXPECT_EQ(ranks[0].hostname, "a.local");
}

TEST(SchedulerTest, TensorParallelGroupsStayInsideANode) {
  Scheduler scheduler;
  scheduler.Enqueue(Job("tp", 0, 1, 2, 4, DeviceKind::kCpu, /*tp=*/4));
  auto placements = scheduler.Schedule({Node("b", 4), Node("a", 6)});
  ASSERT_EQ(placements.size(), 1u);
  const auto& ranks = placements[0].ranks;
  for (int group = 0; group < 2; ++group) {
    for (int i = 1; i < 4; ++i) {
      EXPECT_EQ(ranks[group * 4 + i].node_id, ranks[group * 4].node_id) << "group " << group;
    }
  }
  EXPECT_NE(ranks[0].node_id, ranks[4].node_id);
}

TEST(SchedulerTest, NoBackfillPastABlockedJobOfTheSameKind) {
  Scheduler scheduler;
  scheduler.Enqueue(Job("needs-4", 10, 1, 1, 4));
  scheduler.Enqueue(Job("needs-1", 0, 2, 1, 1));
  scheduler.Enqueue(Job("gpu-1", 0, 3, 1, 1, DeviceKind::kGpu));
  auto placements = scheduler.Schedule({Node("cpu", 2), Node("gpu", 0, {0, 1})});
  // The small CPU job waits behind the big one; the GPU job is not blocked by CPU jobs.
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "gpu-1");
  EXPECT_EQ(placements[0].ranks[0].node_id, "gpu");
  EXPECT_THAT(scheduler.QueueOrder(), ElementsAre("needs-4", "needs-1"));
}

TEST(SchedulerTest, PlacesSeveralJobsOnDisjointSlotsBestFit) {
  Scheduler scheduler;
  scheduler.Enqueue(Job("one", 0, 1, 1, 1));
  scheduler.Enqueue(Job("two", 0, 2, 1, 2));
  scheduler.Enqueue(Job("three", 0, 3, 1, 3));
  auto placements = scheduler.Schedule({Node("big", 4), Node("small", 1)});
  ASSERT_EQ(placements.size(), 2u);
  // Best fit: the 1-rank job takes the 1-slot node, keeping the big node whole.
  EXPECT_EQ(placements[0].job_id, "one");
  EXPECT_EQ(placements[0].ranks[0].node_id, "small");
  EXPECT_EQ(placements[1].job_id, "two");
  EXPECT_EQ(placements[1].ranks[0].slot, 0);
  EXPECT_EQ(placements[1].ranks[1].slot, 1);
  EXPECT_THAT(scheduler.QueueOrder(), ElementsAre("three"));
  EXPECT_TRUE(scheduler.Remove("three"));
  EXPECT_FALSE(scheduler.Remove("three"));
  EXPECT_EQ(scheduler.size(), 0u);
}

TEST(SchedulerTest, AvoidedNodesOnlyMakeUpForAShortageOfOthers) {
  Scheduler scheduler;
  PendingJob job = Job("away", 0, 1, 1, 1);
  job.avoid_nodes = {"a"};
  scheduler.Enqueue(job);
  std::vector<Placement> placed = scheduler.Schedule({Node("a", 4), Node("b", 1)});
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].ranks[0].node_id, "b");  // "a" has more room, but is avoided
  job.job_id = "only-a";
  scheduler.Enqueue(job);
  placed = scheduler.Schedule({Node("a", 4)});
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].ranks[0].node_id, "a");  // rather than wait forever
}

TEST(SchedulerTest, ARestartFallsBackToASmallerShapeOnlyWhenItsOwnSizeDoesNotFit) {
  Scheduler scheduler;
  PendingJob job = Job("elastic", 0, 1, 2, 1);
  job.smaller = {JobShape{1, Mesh{1, 1, 1, 0}, 2}};
  scheduler.Enqueue(job);
  std::vector<Placement> placed = scheduler.Schedule({Node("a", 1), Node("b", 1)});
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].ranks.size(), 2u);
  EXPECT_FALSE(placed[0].shape.has_value());  // its own size fits
  scheduler.Enqueue(job);
  placed = scheduler.Schedule({Node("a", 1)});
  ASSERT_EQ(placed.size(), 1u);
  ASSERT_TRUE(placed[0].shape.has_value());
  EXPECT_EQ(placed[0].ranks.size(), 1u);
  EXPECT_EQ(placed[0].shape->mesh.dp, 1);
  EXPECT_EQ(placed[0].shape->accumulation, 2);
}

// A job with larger sizes takes the largest that fits, but only when no job of its kind is queued
// behind it; then it runs at its own size and leaves the nodes to the next.
TEST(SchedulerTest, AJobGrowsPastItsOwnSizeOnlyWhenNoJobOfItsKindWaitsBehindIt) {
  Scheduler scheduler;
  PendingJob first = Job("first", 0, 1, 1, 1);
  first.larger = {JobShape{3, Mesh{3, 1, 1, 0}, 1}, JobShape{2, Mesh{2, 1, 1, 0}, 1}};
  scheduler.Enqueue(first);
  std::vector<Placement> placed = scheduler.Schedule({Node("a", 1), Node("b", 1)});
  ASSERT_EQ(placed.size(), 1u);
  ASSERT_TRUE(placed[0].shape.has_value());
  EXPECT_EQ(placed[0].shape->nodes, 2) << "three do not fit; the largest that does";
  EXPECT_EQ(placed[0].ranks.size(), 2u);
  scheduler.Enqueue(first);
  scheduler.Enqueue(Job("second", 0, 2, 1, 1));
  placed = scheduler.Schedule({Node("a", 1), Node("b", 1), Node("c", 1)});
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_EQ(placed[0].job_id, "first");
  EXPECT_FALSE(placed[0].shape.has_value()) << "a job waits behind it";
  EXPECT_EQ(placed[1].job_id, "second");
  EXPECT_EQ(placed[1].ranks.size(), 1u);
  // Alone, but jobs outside the queue (restarting after a backoff) want CPU nodes.
  scheduler.Enqueue(first);
  placed = scheduler.Schedule({Node("a", 1), Node("b", 1)}, {DeviceKind::kCpu});
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_FALSE(placed[0].shape.has_value());
  // A larger size is never taken onto a node the job avoids (a straggler's).
  first.avoid_nodes = {"c"};
  scheduler.Enqueue(first);
  placed = scheduler.Schedule({Node("a", 1), Node("b", 1), Node("c", 1)});
  ASSERT_EQ(placed.size(), 1u);
  ASSERT_TRUE(placed[0].shape.has_value());
  EXPECT_EQ(placed[0].shape->nodes, 2);
  for (const RankSlot& slot : placed[0].ranks) EXPECT_NE(slot.node_id, "c");
}

// A queued job says why it waits: it can never fit the connected nodes (and why), a job queued
// before it blocks it, or running jobs hold the slots it needs.
// The coordinator gives a scheduling pass only the first Demand::nodes nodes of each demand in
// best-fit order (AgentRegistry::NodesInFitOrder), not the whole cluster. On random clusters and
// queues (CPU and GPU nodes, partly busy, of several memory sizes; jobs of several sizes, some
// needing memory, some avoiding nodes, some with smaller shapes), that places exactly what a pass
// over every node places.
TEST(SchedulerTest, APassOverTheDemandedNodesPlacesWhatAPassOverAllNodesPlaces) {
  std::mt19937 random(7);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random); };
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<NodeView> all;
    const int node_count = uniform(1, 40);
    for (int n = 0; n < node_count; ++n) {
      NodeView node;
      node.node_id = absl::StrFormat("node-%03d", n);
      node.hostname = node.node_id;
      const bool gpu = uniform(0, 3) == 0;
      const int slots = uniform(1, 8);
      node.memory_bytes = int64_t{uniform(0, 4)} << 30;  // 0: not reported
      if (gpu) node.gpu_memory_bytes = int64_t{uniform(0, 2)} << 30;
      for (int i = 0; i < slots; ++i) {
        if (uniform(0, 2) == 0) continue;  // held by a running job
        (gpu ? node.free_gpus : node.free_cpu_slots).push_back(i);
      }
      if (!node.free_gpus.empty() || !node.free_cpu_slots.empty()) all.push_back(node);
    }
    Scheduler full, reduced;
    const int jobs = uniform(1, 8);
    for (int j = 0; j < jobs; ++j) {
      PendingJob job = Job(absl::StrCat("j", j), uniform(0, 1), j, uniform(1, 4), uniform(1, 4),
                           uniform(0, 3) == 0 ? DeviceKind::kGpu : DeviceKind::kCpu);
      for (int a = uniform(0, 2); a > 0; --a) {
        job.avoid_nodes.insert(absl::StrFormat("node-%03d", uniform(0, node_count - 1)));
      }
      job.memory_per_rank = int64_t{uniform(0, 3)} << 29;  // 0 to 1.5 GiB
      if (uniform(0, 2) == 0 && job.requirements.nodes > 1) {
        job.smaller.push_back(JobShape{.nodes = job.requirements.nodes - 1,
                                       .memory_per_rank = job.memory_per_rank + (1 << 29)});
      }
      if (uniform(0, 2) == 0) {
        job.larger.push_back(JobShape{.nodes = job.requirements.nodes + uniform(1, 3),
                                      .memory_per_rank = job.memory_per_rank / 2});
      }
      full.Enqueue(job);
      reduced.Enqueue(job);
    }
    // What the registry's index hands out: per demand, the first `nodes` in best-fit order.
    std::map<std::string, NodeView> chosen;
    for (const Scheduler::Demand& demand : reduced.Demands()) {
      std::vector<const NodeView*> fit;
      for (const NodeView& node : all) {
        const auto& free = demand.kind == DeviceKind::kGpu ? node.free_gpus : node.free_cpu_slots;
        const bool offers =
            demand.kind == DeviceKind::kGpu ? !node.free_gpus.empty() : node.free_gpus.empty();
        if (offers && static_cast<int>(free.size()) >= demand.ranks_per_node &&
            MemoryFits(node, demand.kind, demand.ranks_per_node, demand.memory_per_rank)) {
          fit.push_back(&node);
        }
      }
      std::sort(fit.begin(), fit.end(), [&](const NodeView* a, const NodeView* b) {
        const auto& fa = demand.kind == DeviceKind::kGpu ? a->free_gpus : a->free_cpu_slots;
        const auto& fb = demand.kind == DeviceKind::kGpu ? b->free_gpus : b->free_cpu_slots;
        return std::make_pair(fa.size(), a->node_id) < std::make_pair(fb.size(), b->node_id);
      });
      for (size_t i = 0; i < fit.size() && i < demand.nodes; ++i) {
        chosen.emplace(fit[i]->node_id, *fit[i]);
      }
    }
    std::vector<NodeView> demanded;
    for (auto& [id, node] : chosen) demanded.push_back(node);
    const std::vector<Placement> expected = full.Schedule(all);
    const std::vector<Placement> got = reduced.Schedule(demanded);
    ASSERT_EQ(got.size(), expected.size()) << "trial " << trial;
    for (size_t p = 0; p < got.size(); ++p) {
      EXPECT_EQ(got[p].job_id, expected[p].job_id) << "trial " << trial;
      ASSERT_EQ(got[p].ranks.size(), expected[p].ranks.size()) << "trial " << trial;
      for (size_t r = 0; r < got[p].ranks.size(); ++r) {
        EXPECT_EQ(got[p].ranks[r].node_id, expected[p].ranks[r].node_id) << "trial " << trial;
        EXPECT_EQ(got[p].ranks[r].slot, expected[p].ranks[r].slot) << "trial " << trial;
      }
    }
    EXPECT_EQ(reduced.QueueOrder(), full.QueueOrder()) << "trial " << trial;
  }
}

// A job whose ranks need more memory than a node holds is not placed there: on a CPU node its
// ranks share the node's memory, on a GPU node each needs it on a GPU. A node that reports no
// memory is not checked; a job that never fits says why.
TEST(SchedulerTest, AJobIsPlacedOnlyOnNodesThatHoldItsMemory) {
  Scheduler scheduler;
  PendingJob cpu = Job("cpu", 0, 1, 1, 2);
  cpu.memory_per_rank = int64_t{3} << 30;  // 6 GiB on a node of two ranks
  scheduler.Enqueue(cpu);
  NodeView small = Node("node-a", 2), large = Node("node-b", 4);
  small.memory_bytes = int64_t{4} << 30;
  large.memory_bytes = int64_t{8} << 30;
  std::vector<Placement> placed = scheduler.Schedule({small, large});
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].ranks[0].node_id, "node-b") << "best fit would take node-a";

  PendingJob gpu = Job("gpu", 0, 2, 1, 1, DeviceKind::kGpu);
  gpu.memory_per_rank = int64_t{50} << 30;
  scheduler.Enqueue(gpu);
  NodeView h100 = Node("node-c", 0), unknown = Node("node-d", 0);
  h100.free_gpus = {0};
  h100.gpu_memory_bytes = int64_t{40} << 30;
  unknown.free_gpus = {0, 1};
  EXPECT_EQ(scheduler.WaitReason("gpu", {h100}, {h100}),
            "it cannot be placed on the connected nodes: it needs 1 node with 1 GPU slot; its "
            "ranks need 50.00 GiB of memory each (the planner's prediction), and only 0 of the 1 "
            "connected nodes with that many slots hold that on their smallest GPU");
  placed = scheduler.Schedule({h100, unknown});
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].ranks[0].node_id, "node-d")
      << "a node without a memory figure is not checked";
}

TEST(SchedulerTest, WaitReasonSaysWhyAJobIsNotPlaced) {
  Scheduler scheduler;
  const std::vector<NodeView> capacity = {Node("node-a", 4), Node("node-b", 2)};
  scheduler.Enqueue(Job("wide", 0, 1, 1, 8));
  EXPECT_EQ(scheduler.WaitReason("wide", capacity, capacity),
            "it cannot be placed on the connected nodes: it needs 1 node with 8 CPU slots; the "
            "largest connected node, node-a, has 4");
  scheduler.Enqueue(Job("gpu", 0, 2, 1, 1, DeviceKind::kGpu));
  EXPECT_EQ(scheduler.WaitReason("gpu", capacity, capacity),
            "it cannot be placed on the connected nodes: it needs 1 node with 1 GPU slot; no "
            "connected node has GPU slots");
  scheduler.Enqueue(Job("three", 0, 3, 3, 2));
  EXPECT_EQ(scheduler.WaitReason("three", capacity, capacity),
            "it cannot be placed on the connected nodes: it needs 3 nodes with 2 CPU slots each; "
            "only 2 connected nodes have that many");
  EXPECT_EQ(scheduler.WaitReason("three", {}, {}),
            "it cannot be placed on the connected nodes: it needs 3 nodes with 2 CPU slots each; "
            "no node is connected");
  ASSERT_TRUE(scheduler.Remove("wide") && scheduler.Remove("gpu") && scheduler.Remove("three"));

  // Fits the cluster, not the free slots; and a later job that would fit waits behind it.
  scheduler.Enqueue(Job("pair", 0, 4, 1, 4));
  scheduler.Enqueue(Job("small", 0, 5, 1, 1));
  const std::vector<NodeView> free = {Node("node-a", 1), Node("node-b", 2)};
  EXPECT_EQ(scheduler.WaitReason("pair", capacity, free),
            "waiting for slots: it needs 1 node with 4 free CPU slots; running jobs hold them");
  EXPECT_EQ(scheduler.WaitReason("small", capacity, free),
            "waiting behind pair, queued before it, which does not fit yet (no backfilling)");
  EXPECT_EQ(scheduler.WaitReason("pair", capacity, capacity), "");  // placed at the next pass
  EXPECT_EQ(scheduler.WaitReason("nobody", capacity, capacity), "");
}

}  // namespace
}  // namespace trainyard::server
