#include "server/scheduler.h"

#include <algorithm>
#include <tuple>

namespace trainyard::server {
namespace {

std::vector<int>& FreeSlots(NodeView& node, DeviceKind kind) {
  return kind == DeviceKind::kGpu ? node.free_gpus : node.free_cpu_slots;
}

}  // namespace

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

const PendingJob* Scheduler::Find(const std::string& job_id) const {
  for (const PendingJob& job : jobs_) {
    if (job.job_id == job_id) return &job;
  }
  return nullptr;
}

std::vector<std::string> Scheduler::QueueOrder() const {
  std::vector<std::string> order;
  for (const Key& key : queue_) order.push_back(key.job_id);
  return order;
}

std::vector<Placement> Scheduler::Schedule(std::vector<NodeView> nodes) {
  std::vector<Placement> placements;
  bool blocked[2] = {false, false};  // by device kind
  std::vector<std::string> placed;
  for (const Key& key : queue_) {
    const PendingJob* job = Find(key.job_id);
    const int kind = static_cast<int>(job->requirements.kind);
    if (blocked[kind]) continue;
    Placement placement;
    bool fits = PlaceJob(*job, nodes, placement);
    for (size_t i = 0; !fits && i < job->smaller.size(); ++i) {
      PendingJob smaller = *job;
      smaller.requirements.nodes = job->smaller[i].nodes;
      smaller.requirements.mesh = job->smaller[i].mesh;
      fits = PlaceJob(smaller, nodes, placement);
      if (fits) placement.shape = job->smaller[i];
    }
    if (fits) {
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
    if (static_cast<int>(FreeSlots(nodes[i], req.kind).size()) >= req.ranks_per_node) {
      (job.avoid_nodes.contains(nodes[i].node_id) ? avoided : candidates).push_back(i);
    }
  }
  // Avoided nodes only make up for a shortage of others.
  for (size_t i = 0; i < avoided.size() && static_cast<int>(candidates.size()) < req.nodes; ++i) {
    candidates.push_back(avoided[i]);
  }
  if (static_cast<int>(candidates.size()) < req.nodes) return false;
  std::sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
    const size_t free_a = FreeSlots(nodes[a], req.kind).size();
    const size_t free_b = FreeSlots(nodes[b], req.kind).size();
    return std::tie(free_a, nodes[a].node_id) < std::tie(free_b, nodes[b].node_id);
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
