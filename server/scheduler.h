// Scheduler: the queue of jobs waiting for slots, and gang placement.
//
// Order: higher priority first, FIFO (submission order) within a priority. A job is placed only
// whole (all-or-nothing): `nodes` distinct connected nodes, each with `ranks_per_node` free slots
// of the job's device kind (CPU slots or GPUs). A job that does not fit blocks every queued job
// behind it that needs the same device kind — no backfilling — so a large job is never starved
// by a stream of small ones.
//
// Memory: a job whose ranks need a known amount of memory (the planner's prediction,
// `memory_per_rank`) is placed only on nodes that hold it: a CPU node's memory shared by the job's
// ranks on it, or the smallest GPU of a GPU node; a node that reports no memory is not checked.
//
// Rank placement: ranks are dealt to the chosen nodes (ordered by node id) in blocks of
// ranks_per_node consecutive ranks, so a tensor-parallel group (tp consecutive ranks, tp dividing
// ranks_per_node) never spans nodes. Nodes are chosen best-fit (fewest free slots that suffice,
// then node id) to keep large holes for large jobs; each node's lowest free slots are used.
//
// Threading: not thread-safe; owned by the Supervisor and used under its lock.
#ifndef TRAINYARD_SERVER_SCHEDULER_H_
#define TRAINYARD_SERVER_SCHEDULER_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "server/types.h"

namespace trainyard::server {

// Another size an elastic job may run at (config::ResizedSpec): its node count, mesh, and
// micro-batches accumulated per step.
struct JobShape {
  int nodes = 0;
  Mesh mesh;
  int accumulation = 1;
  int micro_batch = 0;          // per rank and pass at this size
  int64_t memory_per_rank = 0;  // the planner's prediction at this size; 0: not checked
};

struct PendingJob {
  std::string job_id;
  int priority = 0;
  int64_t seq = 0;
  JobRequirements requirements;
  // The memory one rank needs (the planner's prediction for the job's mesh); 0: not checked.
  int64_t memory_per_rank = 0;
  // Nodes to leave out when enough others fit (the nodes of stragglers, with
  // fault_tolerance.exclude_stragglers).
  std::set<std::string> avoid_nodes;
  // Sizes to fall back to, largest first, when the job does not fit at its own (a restart of a
  // job with fault_tolerance.min_nodes below resources.nodes).
  std::vector<JobShape> smaller;
  // Sizes above its own, largest first, taken when one fits and no job of its kind is queued
  // behind it (fault_tolerance.max_nodes above resources.nodes).
  std::vector<JobShape> larger;
};

// The free capacity of one connected node.
struct NodeView {
  std::string node_id;
  std::string hostname;
  std::vector<int> free_cpu_slots;  // ascending
  std::vector<int> free_gpus;       // ascending GPU indices
  int64_t memory_bytes = 0;         // the node's physical memory; 0: not reported
  int64_t gpu_memory_bytes = 0;     // its smallest GPU's memory; 0: none reported
};

// Whether `node` holds ranks needing `memory_per_rank` each (0: not checked), `ranks_per_node`
// of them sharing a CPU node's memory, or one per GPU.
bool MemoryFits(const NodeView& node, DeviceKind kind, int ranks_per_node, int64_t memory_per_rank);

struct Placement {
  std::string job_id;
  std::vector<RankSlot> ranks;    // indexed by rank; pid 0, no exit
  std::optional<JobShape> shape;  // set when placed at another size than its own
};

class Scheduler {
 public:
  // Adds a job (a second Enqueue of the same id is ignored).
  void Enqueue(const PendingJob& job);
  // Removes a job; false when it was not queued.
  bool Remove(const std::string& job_id);
  bool Contains(const std::string& job_id) const;
  // Whether a job of `kind` waits in the queue.
  bool Queued(DeviceKind kind) const;
  // Whether a queued job has sizes above its own.
  bool MayGrow() const;
  size_t size() const { return queue_.size(); }

  // Places as many queued jobs as fit on `nodes`, in queue order, and removes them from the
  // queue. The returned placements use disjoint slots. The last queued job of each kind may take
  // one of its larger sizes, unless its kind is in `no_growth` (jobs outside the queue want
  // nodes of it).
  std::vector<Placement> Schedule(std::vector<NodeView> nodes,
                                  const std::set<DeviceKind>& no_growth = {});

  // How many nodes of each (device kind, slots per node) a scheduling pass can look at: the
  // nodes the queued jobs of that kind ask for at their largest sizes, plus the nodes they
  // avoid. A pass given, for
  // each of these, the first `nodes` usable nodes in best-fit order (fewest free slots of the
  // kind that suffice, then node id) places exactly what it would place given every node: a job
  // takes the first nodes of that order among those with room, and the jobs before it in the
  // pass can have touched fewer than `nodes` minus its own share (see scheduler_test).
  // Jobs that need memory per rank ask for nodes that hold it (MemoryFits), a demand of their
  // own.
  struct Demand {
    DeviceKind kind = DeviceKind::kCpu;
    int ranks_per_node = 1;
    int64_t memory_per_rank = 0;
    size_t nodes = 0;
  };
  std::vector<Demand> Demands() const;

  // Job ids in the order they would be considered.
  std::vector<std::string> QueueOrder() const;

  // Why queued job `job_id` is not placed, in one line: it cannot fit on `capacity` (every slot
  // of the usable nodes) at any size; a job queued before it blocks it; or it waits for slots of
  // `free`. "" when it is not queued, or would be placed now.
  std::string WaitReason(const std::string& job_id, std::vector<NodeView> capacity,
                         std::vector<NodeView> free) const;
  // Whether queued job `job_id` fits on `capacity` at no size it may take (false when it is not
  // queued).
  bool FitsNowhere(const std::string& job_id, std::vector<NodeView> capacity) const;

 private:
  struct Key {
    int priority;
    int64_t seq;
    std::string job_id;
    bool operator<(const Key& other) const;
  };
  std::set<Key> queue_;
  std::vector<PendingJob> jobs_;  // parallel storage, looked up by id
  const PendingJob* Find(const std::string& job_id) const;
};

// Places one job on `nodes` (consuming the slots it takes from them), or returns false and leaves
// `nodes` untouched.
bool PlaceJob(const PendingJob& job, std::vector<NodeView>& nodes, Placement& placement);
// PlaceJob at the first of the job's larger sizes that fits when `grow`, else at its own size,
// else at the first of its smaller sizes that fits.
bool PlaceAtSomeSize(const PendingJob& job, std::vector<NodeView>& nodes, Placement& placement,
                     bool grow = false);

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_SCHEDULER_H_
