#include "server/scheduler.h"

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainyard::server {
namespace {

std::vector<int>& FreeSlots(NodeView& node, DeviceKind kind) {
  return kind == DeviceKind::kGpu ? node.free_gpus : node.free_cpu_slots;
}

size_t SlotCount(const NodeView& node, DeviceKind kind) {
  return (kind == DeviceKind::kGpu ? node.free_gpus : node.free_cpu_slots).size();
}

}  // namespace

bool MemoryFits(const NodeView& node, DeviceKind kind, int ranks_per_node,
                int64_t memory_per_rank) {
  if (memory_per_rank <= 0) return true;
  if (kind == DeviceKind::kGpu) {
    return node.gpu_memory_bytes <= 0 || memory_per_rank <= node.gpu_memory_bytes;
  }
  return node.memory_bytes <= 0 ||
         memory_per_rank <= node.memory_bytes / std::max(1, ranks_per_node);
}

bool Scheduler::Key::operator<(const Key& other) const {
  // Higher priority first, then earlier submission.
  return std::tie(other.priority, seq, job_id) < std::tie(priority, other.seq, other.job_id);
}

void Scheduler::Enqueue(const PendingJob& job) {
  if (Contains(job.job_id)) return;
  queue_.insert(Key{job.priority, job.seq, job.job_id});
  jobs_.push_back(job);
}

bool Scheduler::Remove(const std::string& job_id) {
  auto it = std::find_if(jobs_.begin(), jobs_.end(),
                         [&](const PendingJob& job) { return job.job_id == job_id; });
  if (it == jobs_.end()) return false;
  queue_.erase(Key{it->priority, it->seq, it->job_id});
  jobs_.erase(it);
  return true;
}

bool Scheduler::Contains(const std::string& job_id) const { return Find(job_id) != nullptr; }

bool Scheduler::MayGrow() const {
  return std::any_of(jobs_.begin(), jobs_.end(),
                     [](const PendingJob& job) { return !job.larger.empty(); });
}

bool Scheduler::Queued(DeviceKind kind) const {
  return std::any_of(jobs_.begin(), jobs_.end(),
                     [kind](const PendingJob& job) { return job.requirements.kind == kind; });
}

const PendingJob* Scheduler::Find(const std::string& job_id) const {
  for (const PendingJob& job : jobs_) {
    if (job.job_id == job_id) return &job;
  }
  return nullptr;
}

std::vector<Scheduler::Demand> Scheduler::Demands() const {
  std::set<std::tuple<DeviceKind, int, int64_t>> fits;
  size_t all[2] = {0, 0};
  for (const PendingJob& job : jobs_) {
    const JobRequirements& req = job.requirements;
    fits.insert({req.kind, req.ranks_per_node, job.memory_per_rank});
    int most = req.nodes;  // its largest size, which the pass must be able to see
    for (const std::vector<JobShape>* shapes : {&job.smaller, &job.larger}) {
      for (const JobShape& shape : *shapes) {
        fits.insert({req.kind, req.ranks_per_node, shape.memory_per_rank});
        most = std::max(most, shape.nodes);
      }
    }
    all[static_cast<int>(req.kind)] += static_cast<size_t>(most) + job.avoid_nodes.size();
  }
  // Every fit sees the whole demand of its kind: a job needing fewer slots per node competes
  // for the same nodes as the others of its kind.
  std::vector<Demand> demands;
  for (const auto& [kind, slots, memory] : fits) {
    demands.push_back(Demand{kind, slots, memory, all[static_cast<int>(kind)]});
  }
  return demands;
}

std::vector<std::string> Scheduler::QueueOrder() const {
  std::vector<std::string> order;
  for (const Key& key : queue_) order.push_back(key.job_id);
  return order;
}

namespace {

// `job` (without its other sizes) at `shape`'s size; a larger size only on nodes it does not
// avoid (growing onto a straggler's node is never worth it).
bool PlaceAtShape(PendingJob& resized, const JobShape& shape, std::vector<NodeView>& nodes,
                  Placement& placement) {
  const int own = resized.requirements.nodes;
  resized.requirements.nodes = shape.nodes;
  resized.requirements.mesh = shape.mesh;
  resized.memory_per_rank = shape.memory_per_rank;
  bool placed = true;
  if (shape.nodes > own && !resized.avoid_nodes.empty()) {
    int usable = 0;
    for (const NodeView& node : nodes) {
      usable += !resized.avoid_nodes.contains(node.node_id) &&
                static_cast<int>(SlotCount(node, resized.requirements.kind)) >=
                    resized.requirements.ranks_per_node &&
                MemoryFits(node, resized.requirements.kind, resized.requirements.ranks_per_node,
                           shape.memory_per_rank);
    }
    placed = usable >= shape.nodes;
  }
  placed = placed && PlaceJob(resized, nodes, placement);
  resized.requirements.nodes = own;
  if (placed) placement.shape = shape;
  return placed;
}

}  // namespace

bool PlaceAtSomeSize(const PendingJob& job, std::vector<NodeView>& nodes, Placement& placement,
                     bool grow) {
  PendingJob resized;  // the job at another size: copied once, without its list of sizes
  if ((grow && !job.larger.empty()) || !job.smaller.empty()) {
    resized = PendingJob{.job_id = job.job_id,
                         .priority = job.priority,
                         .seq = job.seq,
                         .requirements = job.requirements,
                         .memory_per_rank = job.memory_per_rank,
                         .avoid_nodes = job.avoid_nodes};
  }
  for (const JobShape& shape : grow ? job.larger : std::vector<JobShape>()) {
    if (PlaceAtShape(resized, shape, nodes, placement)) return true;
  }
  if (PlaceJob(job, nodes, placement)) return true;
  for (const JobShape& shape : job.smaller) {
    if (PlaceAtShape(resized, shape, nodes, placement)) return true;
  }
  return false;
}

namespace {

std::string KindName(DeviceKind kind) { return kind == DeviceKind::kGpu ? "GPU" : "CPU"; }

// What `job` needs, at its smallest size: "2 nodes with 4 CPU slots each".
std::string Needs(const PendingJob& job, const char* adjective) {
  int nodes = job.requirements.nodes;
  for (const JobShape& shape : job.smaller) nodes = std::min(nodes, shape.nodes);
  const int slots = job.requirements.ranks_per_node;
  return absl::StrCat(nodes, nodes == 1 ? " node" : " nodes", " with ", slots, adjective,
                      KindName(job.requirements.kind), slots == 1 ? " slot" : " slots",
                      nodes == 1 ? "" : " each");
}

// Why `job` cannot be placed even on every slot of `capacity`.
std::string NeverFits(const PendingJob& job, const std::vector<NodeView>& capacity) {
  const std::string head =
      absl::StrCat("it cannot be placed on the connected nodes: it needs ", Needs(job, " "), "; ");
  if (capacity.empty()) return head + "no node is connected";
  const JobRequirements& req = job.requirements;
  const NodeView* largest = nullptr;
  int enough = 0, holding = 0;
  for (const NodeView& node : capacity) {
    const size_t slots = SlotCount(node, req.kind);
    if (static_cast<int>(slots) >= req.ranks_per_node) {
      ++enough;
      holding += MemoryFits(node, req.kind, req.ranks_per_node, job.memory_per_rank);
    }
    if (largest == nullptr || slots > SlotCount(*largest, req.kind)) {
      largest = &node;
    }
  }
  const size_t most = SlotCount(*largest, req.kind);
  if (most == 0) return absl::StrCat(head, "no connected node has ", KindName(req.kind), " slots");
  if (enough == 0) {
    return absl::StrCat(head, "the largest connected node, ", largest->node_id, ", has ", most);
  }
  if (enough >= req.nodes && holding < enough) {
    return absl::StrFormat(
        "%sits ranks need %.2f GiB of memory each (the planner's prediction), and only %d of the "
        "%d connected nodes with that many slots hold that %s",
        head, static_cast<double>(job.memory_per_rank) / (1 << 30), holding, enough,
        req.kind == DeviceKind::kGpu ? "on their smallest GPU" : "for its ranks on them");
  }
  return absl::StrCat(head, "only ", enough, " connected ", enough == 1 ? "node has" : "nodes have",
                      " that many");
}

}  // namespace

bool Scheduler::FitsNowhere(const std::string& job_id, std::vector<NodeView> capacity) const {
  const PendingJob* job = Find(job_id);
  Placement ignored;
  return job != nullptr && !PlaceAtSomeSize(*job, capacity, ignored);
}

std::string Scheduler::WaitReason(const std::string& job_id, std::vector<NodeView> capacity,
                                  std::vector<NodeView> free) const {
  const PendingJob* job = Find(job_id);
  if (job == nullptr) return "";
  Placement ignored;
  std::vector<NodeView> all = capacity;
  if (!PlaceAtSomeSize(*job, all, ignored)) return NeverFits(*job, capacity);
  // Replay the queue up to this job, as Schedule would.
  for (const Key& key : queue_) {
    if (key.job_id == job_id) break;
    const PendingJob* ahead = Find(key.job_id);
    if (ahead->requirements.kind != job->requirements.kind) continue;
    if (!PlaceAtSomeSize(*ahead, free, ignored)) {
      return absl::StrCat("waiting behind ", ahead->job_id,
                          ", queued before it, which does not fit yet (no backfilling)");
    }
  }
  if (PlaceAtSomeSize(*job, free, ignored)) return "";  // placed at the next scheduling pass
  return absl::StrCat("waiting for slots: it needs ", Needs(*job, " free "),
                      "; running jobs hold them");
}

std::vector<Placement> Scheduler::Schedule(std::vector<NodeView> nodes,
                                           const std::set<DeviceKind>& no_growth) {
  std::vector<Placement> placements;
  bool blocked[2] = {false, false};  // by device kind
  // A job grows past its own size only when no job of its kind is queued behind it.
  std::string last[2];
  if (MayGrow()) {
    for (const Key& key : queue_) {
      last[static_cast<int>(Find(key.job_id)->requirements.kind)] = key.job_id;
    }
  }
  std::vector<std::string> placed;
  for (const Key& key : queue_) {
    const PendingJob* job = Find(key.job_id);
    const int kind = static_cast<int>(job->requirements.kind);
    if (blocked[kind]) continue;
    Placement placement;
    const bool grow = key.job_id == last[kind] && !no_growth.contains(job->requirements.kind);
    if (PlaceAtSomeSize(*job, nodes, placement, grow)) {
      placements.push_back(std::move(placement));
      placed.push_back(job->job_id);
    } else {
      blocked[kind] = true;
    }
  }
  for (const std::string& id : placed) Remove(id);
  return placements;
}

bool PlaceJob(const PendingJob& job, std::vector<NodeView>& nodes, Placement& placement) {
  const JobRequirements& req = job.requirements;
  std::vector<size_t> candidates, avoided;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (static_cast<int>(FreeSlots(nodes[i], req.kind).size()) >= req.ranks_per_node &&
        MemoryFits(nodes[i], req.kind, req.ranks_per_node, job.memory_per_rank)) {
      (job.avoid_nodes.contains(nodes[i].node_id) ? avoided : candidates).push_back(i);
    }
  }
  // Avoided nodes only make up for a shortage of others.
  for (size_t i = 0; i < avoided.size() && static_cast<int>(candidates.size()) < req.nodes; ++i) {
    candidates.push_back(avoided[i]);
  }
  if (static_cast<int>(candidates.size()) < req.nodes) return false;
  // Best fit: the req.nodes candidates with the fewest free slots (ties by node id). Only those
  // are ordered, so placing a job costs O(nodes · log req.nodes), not a sort of the cluster.
  // (When avoided nodes made up a shortage, every candidate is taken.)
  std::partial_sort(candidates.begin(), candidates.begin() + req.nodes, candidates.end(),
                    [&](size_t a, size_t b) {
                      const size_t free_a = FreeSlots(nodes[a], req.kind).size();
                      const size_t free_b = FreeSlots(nodes[b], req.kind).size();
                      return std::tie(free_a, nodes[a].node_id) <
                             std::tie(free_b, nodes[b].node_id);
                    });
  candidates.resize(req.nodes);
  std::sort(candidates.begin(), candidates.end(),
            [&](size_t a, size_t b) { return nodes[a].node_id < nodes[b].node_id; });

  placement.job_id = job.job_id;
  placement.ranks.clear();
  int rank = 0;
  for (size_t index : candidates) {
    NodeView& node = nodes[index];
    std::vector<int>& free = FreeSlots(node, req.kind);
    for (int local = 0; local < req.ranks_per_node; ++local) {
      RankSlot slot;
      slot.rank = rank++;
      slot.node_id = node.node_id;
      slot.hostname = node.hostname;
      slot.slot = free[local];
      slot.local_rank = local;
      placement.ranks.push_back(std::move(slot));
    }
    free.erase(free.begin(), free.begin() + req.ranks_per_node);
  }
  return true;
}

}  // namespace trainyard::server
