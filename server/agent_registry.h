// AgentRegistry: the node agents the coordinator knows — connected or not — with their slots,
// which slots live attempts hold, heartbeat ages, and the channel each connected agent is
// reached through.
//
// Liveness: a node is lost when its agent has been silent (connected but no message) or
// disconnected for longer than the heartbeat timeout; CollectLost reports each loss once, and a
// later Connect makes the node live again. Nodes known from the store but not yet reconnected
// after a coordinator restart count as disconnected since the registry was created.
//
// Threading: thread-safe (one internal mutex). AgentChannel methods are called with that mutex
// held, so channels must not block nor call back into the registry.
#ifndef TRAINYARD_SERVER_AGENT_REGISTRY_H_
#define TRAINYARD_SERVER_AGENT_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/scheduler.h"
#include "server/types.h"

namespace trainyard::server {

// Orders the coordinator sends to agents (see trainyard.v1.CoordinatorMessage).
struct StartWorkerOrder {
  std::string job_id;
  int attempt_id = 0;
  int rank = 0;
  int local_rank = 0;
  int slot = 0;
  bool gpu = false;
  std::string coordinator_address;
  std::map<std::string, std::string> env;
  std::string memory_peer_address;                 // the job's peer node's memory tier ("": none)
  std::vector<std::string> memory_tier_addresses;  // every node's of the attempt, this one's too
  std::string attempt_secret;  // the worker's credential for WorkerService (auth.h)
};
struct StopWorkersOrder {
  std::string job_id;
  int attempt_id = 0;
  std::vector<int> ranks;  // empty: every rank of the attempt on the node
  absl::Duration grace = absl::Seconds(10);
  std::string reason;
};
struct ReadLogsOrder {
  int64_t request_id = 0;
  std::string job_id;
  int attempt_id = 0;
  int rank = 0;
  int tail_lines = 0;
  bool follow = false;
};
struct CancelReadLogsOrder {
  int64_t request_id = 0;
};
struct ReleaseMemoryOrder {
  std::string job_id;
};
using AgentOrder = std::variant<StartWorkerOrder, StopWorkersOrder, ReadLogsOrder,
                                CancelReadLogsOrder, ReleaseMemoryOrder>;

// How the registry reaches one connected agent (the gRPC edge implements it over the Connect
// stream). Both calls must return promptly without blocking.
class AgentChannel {
 public:
  virtual ~AgentChannel() = default;
  virtual void Send(AgentOrder order) = 0;
  // `orders` in order; a channel may put several in one message.
  virtual void SendAll(std::vector<AgentOrder> orders) {
    for (AgentOrder& order : orders) Send(std::move(order));
  }
  // Ends the connection with `status` (e.g. ABORTED when replaced, UNAVAILABLE when silent).
  virtual void Close(const absl::Status& status) = 0;
};

struct NodeStatus {
  NodeRecord record;
  bool connected = false;
  bool lost = false;
  absl::Duration heartbeat_age;  // since the last message (or since disconnection)
  int free_slots = 0;            // GPUs when the node has any, else CPU slots
  // Quarantine (filled in by the supervisor): no new attempt is placed here until `until`.
  bool cordoned = false;
  std::string cordon_reason;
  absl::Time cordoned_until = absl::InfinitePast();
};

class AgentRegistry {
 public:
  AgentRegistry(Clock* clock, absl::Duration heartbeat_timeout);

  // A node known from the store, not connected yet.
  void AddKnownNode(const NodeRecord& node);

  // ALREADY_EXISTS when `node`'s id belongs to a connected agent that is alive (heard from within
  // the heartbeat timeout) and is another process (another instance id): two agents given the
  // same --node-id would otherwise replace each other forever.
  [[nodiscard]] absl::Status CheckNodeIdFree(const NodeRecord& node) const;
  // Registers a connected agent; returns its session id. A node already connected is replaced:
  // its old channel is closed with ABORTED.
  uint64_t Connect(const NodeRecord& node, std::shared_ptr<AgentChannel> channel);
  // Marks the session disconnected; false when `session` is no longer the node's current one.
  bool Disconnect(const std::string& node_id, uint64_t session);
  // Records a message from the agent; false for a stale session.
  bool Touch(const std::string& node_id, uint64_t session);
  bool IsCurrent(const std::string& node_id, uint64_t session) const;

  // Sends to a connected node; false when it is not connected.
  bool Send(const std::string& node_id, AgentOrder order);
  // Several orders to one node, in order (see AgentChannel::SendAll).
  bool SendAll(const std::string& node_id, std::vector<AgentOrder> orders);

  // Slots held by live attempts. Holding survives disconnection (the workers may still run).
  void Hold(const std::string& node_id, DeviceKind kind, int slot);
  void Release(const std::string& node_id, DeviceKind kind, int slot);

  // Free capacity of connected, non-lost nodes that have a free slot, in node id order.
  std::vector<NodeView> FreeNodes() const;
  // The same, for the nodes offering `kind` with at least `min_free` free slots, in best-fit
  // order (fewest free slots first, then node id), leaving out those `usable` refuses, and at
  // most `limit` of them. From an index kept as slots are held and released, so this costs
  // O(limit · log nodes), not a walk of the cluster.
  std::vector<NodeView> NodesInFitOrder(DeviceKind kind, int min_free, size_t limit,
                                        const std::function<bool(const NodeView&)>& usable) const;

  // Nodes newly lost (silent or disconnected longer than the timeout), each reported once per
  // loss. Silent connected agents have their channel closed with UNAVAILABLE.
  std::vector<std::string> CollectLost();

  std::vector<NodeStatus> Nodes() const;
  // Of the connected nodes, at most two: the one with the least memory reported (its ranks share
  // it) and the one holding the GPU with the least memory. What admission checks a job against
  // (server/mesh_advisor.h), without copying every node at every submission.
  std::vector<NodeStatus> SmallestNodes() const;
  // Time since the last message (or the disconnection) of each known node silent for longer
  // than `longer_than` (the supervisor's tick asks for the few nodes that may be lost, not for
  // every node's age).
  std::map<std::string, absl::Duration> HeartbeatAges(
      absl::Duration longer_than = absl::ZeroDuration()) const;
  bool IsConnected(const std::string& node_id) const;
  // The connected node's memory tier service; "" when it has none or is not connected.
  std::string MemoryTierAddress(const std::string& node_id) const;
  absl::Duration heartbeat_timeout() const { return heartbeat_timeout_; }

  // Closes every channel (coordinator shutdown).
  void CloseAll(const absl::Status& status);

 private:
  struct Entry {
    NodeRecord record;
    std::shared_ptr<AgentChannel> channel;  // null when disconnected
    uint64_t session = 0;
    int64_t last_seen_ns = 0;  // monotonic: last message, or disconnection
    bool lost = false;
    std::set<int> held_cpu;
    std::set<int> held_gpu;
    int indexed_free = 0;  // its key in fit_order_ (0: not there)
  };
  static std::vector<int> Free(int count, const std::set<int>& held);
  static int FreeCount(const Entry& entry);
  static NodeView ViewOf(const std::string& id, const Entry& entry);
  // Puts the node's entry in fit_order_ under its current free count, or takes it out.
  void ReindexLocked(const std::string& id, Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration Age(const Entry& entry) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What Nodes() reports of one node.
  NodeStatus StatusOf(const Entry& entry) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node's connected channel; null when it is unknown or disconnected.
  AgentChannel* ChannelLocked(const std::string& node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration heartbeat_timeout_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> nodes_ ABSL_GUARDED_BY(mu_);
  // Connected, non-lost nodes with a free slot, by the kind they offer (CPU 0, GPU 1), ordered by
  // (free slots, node id): the scheduler's best-fit order.
  std::set<std::pair<int, std::string>> fit_order_[2] ABSL_GUARDED_BY(mu_);
  // SmallestNodes' answer (node ids; "" for none), found again only after a node connected or
  // went away: admission asks at every submission.
  mutable bool smallest_known_ ABSL_GUARDED_BY(mu_) = false;
  mutable std::string smallest_memory_ ABSL_GUARDED_BY(mu_);
  mutable std::string smallest_gpu_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_AGENT_REGISTRY_H_
