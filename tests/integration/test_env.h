// Helpers shared by tests that touch the outside world: where the sources are, which Python
// has torch, and a private scratch directory per test.
#ifndef TRAINYARD_TESTS_INTEGRATION_TEST_ENV_H_
#define TRAINYARD_TESTS_INTEGRATION_TEST_ENV_H_

#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace trainyard::testenv {

// The repository root (CTest sets TRAINYARD_SOURCE_DIR).
inline std::string SourceDir() {
  const char* dir = std::getenv("TRAINYARD_SOURCE_DIR");
  return dir ? dir : ".";
}

// The build tree (CTest sets TRAINYARD_BINARY_DIR).
inline std::string BinaryDir() {
  const char* dir = std::getenv("TRAINYARD_BINARY_DIR");
  return dir ? dir : ".";
}

// Debian's interpreter, which has python3-torch; TRAINYARD_PYTHON overrides.
inline std::string PythonInterpreter() {
  const char* py = std::getenv("TRAINYARD_PYTHON");
  return py ? py : "/usr/bin/python3";
}

// A new, empty directory private to the calling test.
inline std::filesystem::path MakeScratchDir(const std::string& prefix) {
  std::string pattern =
      (std::filesystem::path(::testing::TempDir()) / (prefix + ".XXXXXX")).string();
  char* made = mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr) << "mkdtemp " << pattern;
  return pattern;
}

// The kernel's id of the calling thread, for WaitUntilBlocked.
inline int64_t ThisThreadId() { return static_cast<int64_t>(syscall(SYS_gettid)); }

// Waits (at most `limit`) until thread `tid` of this process sleeps in the kernel: it has made a
// call that blocks, such as a receive that waits for its message. True when it did.
inline bool WaitUntilBlocked(int64_t tid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
    std::string line;
    if (std::getline(stat, line)) {
      const size_t paren = line.rfind(')');
      if (paren != std::string::npos && paren + 2 < line.size() &&
          (line[paren + 2] == 'S' || line[paren + 2] == 'D')) {
        return true;
      }
    }
    std::this_thread::yield();
  }
  return false;
}

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_TEST_ENV_H_
