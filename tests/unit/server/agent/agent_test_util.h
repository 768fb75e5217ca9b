// A scratch directory for the agent's unit tests, removed on destruction.
#ifndef TRAINYARD_TESTS_UNIT_SERVER_AGENT_AGENT_TEST_UTIL_H_
#define TRAINYARD_TESTS_UNIT_SERVER_AGENT_AGENT_TEST_UTIL_H_

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace trainyard::server::agent::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = ::testing::TempDir() + "/trainyard_agent_XXXXXX";
    char* made = mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, const std::string& text, bool append = false) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, append ? std::ios::app : std::ios::trunc);
  out << text;
}

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace trainyard::server::agent::testing

#endif  // TRAINYARD_TESTS_UNIT_SERVER_AGENT_AGENT_TEST_UTIL_H_
