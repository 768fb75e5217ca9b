// Supervisor: elastic growth. A job that runs on fewer nodes than it may grows when nodes are
// free: one that restarted smaller (after losing nodes, down to fault_tolerance.min_nodes; the
// scheduler picks the size, see PendingJob::smaller) back to resources.nodes, and, while no job
// of its kind waits in the queue, on up to fault_tolerance.max_nodes. Its ranks are ordered to
// checkpoint at a step they agree on and stop, exactly as for a drain, and the job restarts at
// the largest size that fits, from that checkpoint, resharded. A job waiting out a restart's
// backoff, or growing itself, also holds others back from growing past their size. One resize at a
// time, and none within resize_cooldown_s of the last, so a flapping node cannot make the job
// thrash. A job without checkpoints never grows (it would start over).
#include <algorithm>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/supervisor.h"

namespace trainyard::server {

bool Supervisor::OthersWantNodesLocked(DeviceKind kind, const std::string& except) {
  if (scheduler_.Queued(kind) || KindsNotToGrowLocked().contains(kind)) return true;
  // One growing: the free nodes are spoken for.
  return std::any_of(jobs_.begin(), jobs_.end(), [&](const auto& job) {
    return job.first != except && job.second.job.requirements.kind == kind && job.second.resizing;
  });
}

std::set<DeviceKind> Supervisor::KindsNotToGrowLocked() {
  std::set<DeviceKind> held;
  for (const auto& [id, entry] : jobs_) {
    // Waiting out a restart's backoff, or its workers still stopping: it needs nodes soon.
    if (entry.job.state == JobState::kRestarting && !scheduler_.Contains(id)) {
      held.insert(entry.job.requirements.kind);
    }
  }
  return held;
}

void Supervisor::ConsiderGrowLocked(Txn& txn, JobEntry& entry, absl::Time now) {
  JobRecord& job = entry.job;
  if (entry.resizing || job.cancel_requested || job.drain_requested ||
      !job.requirements.checkpoint.enabled() ||
      (entry.smaller_shapes.empty() && entry.larger_shapes.empty())) {
    return;
  }
  AttemptRecord* attempt = LiveAttempt(entry);
  if (attempt == nullptr || attempt->state != AttemptState::kRunning) return;
  std::set<std::string> mine;
  for (const RankSlot& slot : attempt->ranks) mine.insert(slot.node_id);
  const int current = static_cast<int>(mine.size());
  if (current >= std::max(job.requirements.nodes,
                          entry.larger_shapes.empty() ? 0 : entry.larger_shapes.front().nodes)) {
    return;
  }
  if (entry.last_resize != absl::InfinitePast() &&
      now - entry.last_resize <
          absl::Seconds(entry.controller.fault_tolerance().resize_cooldown_s)) {
    return;
  }
  // Past its own size only while no other job of its kind wants nodes.
  const bool grow =
      !entry.larger_shapes.empty() && !OthersWantNodesLocked(job.requirements.kind, job.id);
  if (current >= job.requirements.nodes && !grow) return;
  // Nodes the job could hold: its own, and free ones with room and memory for a node's share of
  // ranks that its placement would not avoid.
  const std::set<std::string>& avoid = entry.controller.avoid_nodes();
  int room = current;
  for (const NodeView& node : SchedulableNodesLocked(now)) {
    if (mine.contains(node.node_id) || avoid.contains(node.node_id)) continue;
    const size_t free = job.requirements.kind == DeviceKind::kGpu ? node.free_gpus.size()
                                                                  : node.free_cpu_slots.size();
    if (static_cast<int>(free) >= job.requirements.ranks_per_node &&
        MemoryFits(node, job.requirements.kind, job.requirements.ranks_per_node,
                   entry.memory_per_rank)) {
      ++room;
    }
  }
  int target = 0;
  for (const JobShape& shape : grow ? entry.larger_shapes : std::vector<JobShape>()) {
    if (target == 0 && shape.nodes <= room) target = shape.nodes;
  }
  if (target == 0 && room >= job.requirements.nodes) target = job.requirements.nodes;
  for (const JobShape& shape : entry.smaller_shapes) {
    if (target == 0 && shape.nodes <= room) target = shape.nodes;
  }
  if (target <= current) return;
  entry.resizing = true;
  entry.last_resize = now;
  AddEvent(txn, entry, attempt->attempt_id, job.state, job.state, "resize_requested",
           absl::StrCat("nodes are free: growing from ", current, " to ", target, " nodes (",
                        job.requirements.nodes, " asked for",
                        grow ? absl::StrCat(", up to ", entry.max_nodes) : "",
                        "); the ranks checkpoint at a step they agree on and stop, then the job "
                        "restarts on the larger mesh"));
}

void Supervisor::FinishResizeLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt) {
  entry.resizing = false;
  entry.resized_by_choice = true;
  absl::StrAppend(&attempt.cause, " to grow");
  Transition(txn, entry, JobState::kRestarting, "resize",
             absl::StrCat(attempt.cause, "; restarting from checkpoint step ",
                          entry.job.last_checkpoint.step, " at the largest size that fits"));
  EnqueueLocked(entry);  // the largest size that fits
}

}  // namespace trainyard::server
