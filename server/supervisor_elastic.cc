// Supervisor: elastic growth. A job that restarted smaller (after losing nodes, down to
// fault_tolerance.min_nodes; the scheduler picks the size, see PendingJob::smaller) grows back
// when nodes are free again: its ranks are ordered to checkpoint at a step they agree on and
// stop, exactly as for a drain, and the job restarts at the largest size that fits, from that
// checkpoint, resharded. One resize at a time, and none within resize_cooldown_s of the last, so
// a flapping node cannot make the job thrash. A job without checkpoints never grows (it would
// start over).
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/supervisor.h"

namespace trainyard::server {

void Supervisor::ConsiderGrowLocked(Txn& txn, JobEntry& entry, absl::Time now) {
  JobRecord& job = entry.job;
  if (entry.resizing || job.cancel_requested || job.drain_requested ||
      !job.requirements.checkpoint.enabled() || entry.smaller_shapes.empty()) {
    return;
  }
  AttemptRecord* attempt = LiveAttempt(entry);
  if (attempt == nullptr || attempt->state != AttemptState::kRunning) return;
  std::set<std::string> mine;
  for (const RankSlot& slot : attempt->ranks) mine.insert(slot.node_id);
  const int current = static_cast<int>(mine.size());
  if (current >= job.requirements.nodes) return;
  if (entry.last_resize != absl::InfinitePast() &&
      now - entry.last_resize <
          absl::Seconds(entry.controller.fault_tolerance().resize_cooldown_s)) {
    return;
  }
  // Nodes the job could hold: its own, and free ones with room for a node's share of ranks.
  int room = current;
  for (const NodeView& node : SchedulableNodesLocked(now)) {
    if (mine.contains(node.node_id)) continue;
    const size_t free = job.requirements.kind == DeviceKind::kGpu ? node.free_gpus.size()
                                                                  : node.free_cpu_slots.size();
    if (static_cast<int>(free) >= job.requirements.ranks_per_node) ++room;
  }
  int target = room >= job.requirements.nodes ? job.requirements.nodes : 0;
  for (const JobShape& shape : entry.smaller_shapes) {
    if (target == 0 && shape.nodes <= room) target = shape.nodes;
  }
  if (target <= current) return;
  entry.resizing = true;
  entry.last_resize = now;
  AddEvent(txn, entry, attempt->attempt_id, job.state, job.state, "resize_requested",
           absl::StrCat("nodes are free: growing from ", current, " to ", target, " of ",
                        job.requirements.nodes,
                        " nodes; the ranks checkpoint at a step they agree on and stop, then "
                        "the job restarts on the larger mesh"));
}

void Supervisor::FinishResizeLocked(Txn& txn, JobEntry& entry, AttemptRecord& attempt) {
  entry.resizing = false;
  entry.resized_by_choice = true;
  absl::StrAppend(&attempt.cause, " to grow");
  Transition(txn, entry, JobState::kRestarting, "resize",
             absl::StrCat(attempt.cause, "; restarting from checkpoint step ",
                          entry.job.last_checkpoint.step, " at the largest size that fits"));
  EnqueueLocked(entry);  // its own size first, else the largest smaller one that fits
}

}  // namespace trainyard::server
