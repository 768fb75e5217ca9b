// Helpers shared by tests that touch the outside world: where the sources are, which Python
// has torch, and a private scratch directory per test.
#ifndef TRAINYARD_TESTS_INTEGRATION_TEST_ENV_H_
#define TRAINYARD_TESTS_INTEGRATION_TEST_ENV_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

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

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_TEST_ENV_H_
