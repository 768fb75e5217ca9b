// Helpers shared by the coordinator's unit tests: a scratch directory, job specs, and an
// AgentChannel that records what the coordinator sends.
#ifndef TRAINYARD_TESTS_UNIT_SERVER_SERVER_TEST_UTIL_H_
#define TRAINYARD_TESTS_UNIT_SERVER_SERVER_TEST_UTIL_H_

#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/agent_registry.h"

namespace trainyard::server::testing {

// A fresh directory under the test temp dir, removed on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = ::testing::TempDir() + "/trainyard_server_XXXXXX";
    char* made = mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr);
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A valid spec: `ranks` CPU ranks of data parallelism over `nodes` nodes.
inline std::string TinySpec(const std::string& name, int nodes = 1, int ranks_per_node = 2,
                            int priority = 0, int max_restarts = 1) {
  const int world = nodes * ranks_per_node;
  return absl::StrCat("name: ", name, R"(
model: {preset: gpt2-debug}
data: {source: markov}
training: {steps: 5, warmup_steps: 1, batch: )",
                      2 * world, R"(, seq_len: 16}
parallelism: {dp: )",
                      world, R"(}
resources: {nodes: )",
                      nodes, ", devices_per_node: ", ranks_per_node, R"(}
fault_tolerance: {max_restarts: )",
                      max_restarts, R"(, heartbeat_timeout_s: 5, backoff_initial_s: 0}
priority: )",
                      priority, R"(
labels: {team: research}
)");
}

// Records every order; Close is remembered.
class RecordingChannel : public AgentChannel {
 public:
  void Send(AgentOrder order) override {
    absl::MutexLock lock(&mu_);
    orders_.push_back(std::move(order));
  }
  void Close(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    closed_ = status;
  }
  // Takes the orders received so far.
  std::vector<AgentOrder> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<AgentOrder> out = std::move(orders_);
    orders_.clear();
    return out;
  }
  template <typename T>
  std::vector<T> TakeOf() {
    std::vector<T> out;
    for (AgentOrder& order : Take()) {
      if (auto* typed = std::get_if<T>(&order)) out.push_back(std::move(*typed));
    }
    return out;
  }
  // The status the channel was closed with; nullopt while open.
  std::optional<absl::Status> closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<AgentOrder> orders_;
  std::optional<absl::Status> closed_;
};

}  // namespace trainyard::server::testing

#endif  // TRAINYARD_TESTS_UNIT_SERVER_SERVER_TEST_UTIL_H_
