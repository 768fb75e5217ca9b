#include "server/agent_registry.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace trainyard::server {

AgentRegistry::AgentRegistry(Clock* clock, absl::Duration heartbeat_timeout)
    : clock_(clock), heartbeat_timeout_(heartbeat_timeout) {}

void AgentRegistry::AddKnownNode(const NodeRecord& node) {
  absl::MutexLock lock(&mu_);
  Entry& entry = nodes_[node.node_id];
  if (entry.channel != nullptr) return;
  entry.record = node;
  entry.last_seen_ns = clock_->NowNanosMonotonic();
  ReindexLocked(node.node_id, entry);
  smallest_known_ = false;
}

uint64_t AgentRegistry::Connect(const NodeRecord& node, std::shared_ptr<AgentChannel> channel) {
  absl::MutexLock lock(&mu_);
  Entry& entry = nodes_[node.node_id];
  if (entry.channel != nullptr) {
    entry.channel->Close(
        absl::AbortedError("replaced by a newer connection of the same node id " + node.node_id));
  }
  entry.record = node;
  entry.channel = std::move(channel);
  entry.session = next_session_++;
  entry.last_seen_ns = clock_->NowNanosMonotonic();
  entry.lost = false;
  ReindexLocked(node.node_id, entry);
  smallest_known_ = false;
  return entry.session;
}

absl::Status AgentRegistry::CheckNodeIdFree(const NodeRecord& node) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node.node_id);
  if (it == nodes_.end() || it->second.channel == nullptr) return absl::OkStatus();
  const NodeRecord& held = it->second.record;
  if (held.instance_id.empty() || node.instance_id.empty() ||
      held.instance_id == node.instance_id || Age(it->second) >= heartbeat_timeout_) {
    return absl::OkStatus();  // the same agent reconnecting, or a silent one: replace it
  }
  return absl::AlreadyExistsError(absl::StrCat(
      "node id ", node.node_id, " is in use by another agent (on ", held.hostname, ", heard from ",
      absl::FormatDuration(absl::Trunc(Age(it->second), absl::Milliseconds(1))),
      " ago); give every agent its own --node-id"));
}

bool AgentRegistry::Disconnect(const std::string& node_id, uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.session != session || it->second.channel == nullptr) {
    return false;
  }
  it->second.channel = nullptr;
  it->second.last_seen_ns = clock_->NowNanosMonotonic();
  ReindexLocked(it->first, it->second);
  smallest_known_ = false;
  return true;
}

bool AgentRegistry::Touch(const std::string& node_id, uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.session != session || it->second.channel == nullptr) {
    return false;
  }
  it->second.last_seen_ns = clock_->NowNanosMonotonic();
  return true;
}

bool AgentRegistry::IsCurrent(const std::string& node_id, uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  return it != nodes_.end() && it->second.session == session && it->second.channel != nullptr;
}

AgentChannel* AgentRegistry::ChannelLocked(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? nullptr : it->second.channel.get();
}

bool AgentRegistry::Send(const std::string& node_id, AgentOrder order) {
  absl::MutexLock lock(&mu_);
  AgentChannel* channel = ChannelLocked(node_id);
  if (channel != nullptr) channel->Send(std::move(order));
  return channel != nullptr;
}

bool AgentRegistry::SendAll(const std::string& node_id, std::vector<AgentOrder> orders) {
  absl::MutexLock lock(&mu_);
  AgentChannel* channel = ChannelLocked(node_id);
  if (channel != nullptr) channel->SendAll(std::move(orders));
  return channel != nullptr;
}

void AgentRegistry::Hold(const std::string& node_id, DeviceKind kind, int slot) {
  absl::MutexLock lock(&mu_);
  Entry& entry = nodes_[node_id];
  if (entry.record.node_id.empty()) {
    entry.record.node_id = node_id;
    entry.last_seen_ns = clock_->NowNanosMonotonic();
  }
  (kind == DeviceKind::kGpu ? entry.held_gpu : entry.held_cpu).insert(slot);
  ReindexLocked(node_id, entry);
}

void AgentRegistry::Release(const std::string& node_id, DeviceKind kind, int slot) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  (kind == DeviceKind::kGpu ? it->second.held_gpu : it->second.held_cpu).erase(slot);
  ReindexLocked(node_id, it->second);
}

std::vector<int> AgentRegistry::Free(int count, const std::set<int>& held) {
  std::vector<int> free;
  for (int slot = 0; slot < count; ++slot) {
    if (held.count(slot) == 0) free.push_back(slot);
  }
  return free;
}

int AgentRegistry::FreeCount(const Entry& entry) {
  if (entry.record.gpus.empty()) {
    const auto held =
        std::distance(entry.held_cpu.begin(), entry.held_cpu.lower_bound(entry.record.cpu_slots));
    return std::max(0, entry.record.cpu_slots - static_cast<int>(held));
  }
  int free = 0;
  for (const GpuInfo& gpu : entry.record.gpus) free += entry.held_gpu.count(gpu.index) == 0;
  return free;
}

NodeView AgentRegistry::ViewOf(const std::string& id, const Entry& entry) {
  NodeView view;
  view.node_id = id;
  view.hostname = entry.record.hostname;
  // A node offers its GPUs when it has any, else its CPU slots.
  if (entry.record.gpus.empty()) {
    view.free_cpu_slots = Free(entry.record.cpu_slots, entry.held_cpu);
  }
  std::set<int> gpu_indices;
  for (const GpuInfo& gpu : entry.record.gpus) {
    if (entry.held_gpu.count(gpu.index) == 0) gpu_indices.insert(gpu.index);
  }
  view.free_gpus.assign(gpu_indices.begin(), gpu_indices.end());
  view.memory_bytes = entry.record.memory_bytes;
  view.gpu_memory_bytes = SmallestGpuMemory(entry.record);
  return view;
}

void AgentRegistry::ReindexLocked(const std::string& id, Entry& entry) {
  for (auto& index : fit_order_) index.erase({entry.indexed_free, id});
  entry.indexed_free = 0;
  if (entry.channel == nullptr || entry.lost) return;
  const int free = FreeCount(entry);
  if (free == 0) return;
  fit_order_[entry.record.gpus.empty() ? 0 : 1].insert({free, id});
  entry.indexed_free = free;
}

std::vector<NodeView> AgentRegistry::FreeNodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<NodeView> views;
  for (const auto& [id, entry] : nodes_) {
    // A node with nothing free cannot take a rank: left out (most of a busy cluster).
    if (entry.indexed_free > 0) views.push_back(ViewOf(id, entry));
  }
  return views;
}

std::vector<NodeView> AgentRegistry::NodesInFitOrder(
    DeviceKind kind, int min_free, size_t limit,
    const std::function<bool(const NodeView&)>& usable) const {
  absl::MutexLock lock(&mu_);
  std::vector<NodeView> views;
  const auto& index = fit_order_[kind == DeviceKind::kGpu ? 1 : 0];
  for (auto it = index.lower_bound({min_free, std::string()});
       it != index.end() && views.size() < limit; ++it) {
    NodeView view = ViewOf(it->second, nodes_.at(it->second));
    if (usable(view)) views.push_back(std::move(view));
  }
  return views;
}

absl::Duration AgentRegistry::Age(const Entry& entry) const {
  return absl::Nanoseconds(clock_->NowNanosMonotonic() - entry.last_seen_ns);
}

std::vector<std::string> AgentRegistry::CollectLost() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> lost;
  for (auto& [id, entry] : nodes_) {
    if (entry.lost || Age(entry) <= heartbeat_timeout_) continue;
    entry.lost = true;
    if (entry.channel != nullptr) {
      entry.channel->Close(absl::UnavailableError(
          "no heartbeat for " + absl::FormatDuration(Age(entry)) + "; reconnect"));
      entry.channel = nullptr;
    }
    ReindexLocked(id, entry);
    smallest_known_ = false;
    lost.push_back(id);
  }
  return lost;
}

NodeStatus AgentRegistry::StatusOf(const Entry& entry) const {
  NodeStatus status;
  status.record = entry.record;
  status.connected = entry.channel != nullptr;
  status.lost = entry.lost;
  status.heartbeat_age = Age(entry);
  status.free_slots = FreeCount(entry);
  return status;
}

std::vector<NodeStatus> AgentRegistry::Nodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<NodeStatus> out;
  for (const auto& [id, entry] : nodes_) out.push_back(StatusOf(entry));
  return out;
}

std::vector<NodeStatus> AgentRegistry::SmallestNodes() const {
  absl::MutexLock lock(&mu_);
  if (!smallest_known_) {
    const Entry* least_memory = nullptr;
    const std::string* least_memory_id = nullptr;
    const std::string* least_gpu_id = nullptr;
    int64_t least_gpu = 0;
    for (const auto& [id, entry] : nodes_) {
      if (entry.channel == nullptr) continue;
      const int64_t memory = entry.record.memory_bytes;
      if (memory > 0 && (least_memory == nullptr || memory < least_memory->record.memory_bytes)) {
        least_memory = &entry;
        least_memory_id = &id;
      }
      const int64_t gpu = SmallestGpuMemory(entry.record);
      if (gpu > 0 && (least_gpu_id == nullptr || gpu < least_gpu)) {
        least_gpu_id = &id;
        least_gpu = gpu;
      }
    }
    smallest_memory_ = least_memory_id != nullptr ? *least_memory_id : "";
    smallest_gpu_ = least_gpu_id != nullptr ? *least_gpu_id : "";
    smallest_known_ = true;
  }
  std::vector<NodeStatus> out;
  if (!smallest_memory_.empty()) out.push_back(StatusOf(nodes_.at(smallest_memory_)));
  if (!smallest_gpu_.empty() && smallest_gpu_ != smallest_memory_) {
    out.push_back(StatusOf(nodes_.at(smallest_gpu_)));
  }
  return out;
}

std::map<std::string, absl::Duration> AgentRegistry::HeartbeatAges(
    absl::Duration longer_than) const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, absl::Duration> ages;
  for (const auto& [id, entry] : nodes_) {
    const absl::Duration age = Age(entry);
    if (age > longer_than) ages[id] = age;
  }
  return ages;
}

bool AgentRegistry::IsConnected(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  return it != nodes_.end() && it->second.channel != nullptr;
}

std::string AgentRegistry::MemoryTierAddress(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.channel == nullptr) return "";
  return it->second.record.memory_tier_address;
}

void AgentRegistry::CloseAll(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, entry] : nodes_) {
    if (entry.channel != nullptr) {
      entry.channel->Close(status);
      entry.channel = nullptr;
    }
    ReindexLocked(id, entry);
    smallest_known_ = false;
  }
}

}  // namespace trainyard::server
