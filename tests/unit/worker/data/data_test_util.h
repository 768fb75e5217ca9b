// Helpers shared by the data-layer tests: a scratch directory per test and an llm.c shard writer
// that can also produce malformed shards.
#ifndef TRAINYARD_TESTS_UNIT_WORKER_DATA_DATA_TEST_UTIL_H_
#define TRAINYARD_TESTS_UNIT_WORKER_DATA_DATA_TEST_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace trainyard::worker::testing_util {

// A fresh directory under testing::TempDir(), removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir();

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct ShardOptions {
  int32_t magic = 20240520;
  int32_t version = 1;
  std::optional<int32_t> header_count;  // default: the number of tokens written
  std::string trailing;                 // raw bytes appended after the tokens
};

// The bytes of an llm.c shard holding `tokens`.
std::string ShardBytes(const std::vector<uint16_t>& tokens, const ShardOptions& options = {});

// Writes `bytes` to `path` (aborts the test binary on I/O failure).
void WriteBytes(const std::string& path, const std::string& bytes);

}  // namespace trainyard::worker::testing_util

#endif  // TRAINYARD_TESTS_UNIT_WORKER_DATA_DATA_TEST_UTIL_H_
