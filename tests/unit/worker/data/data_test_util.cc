#include "tests/unit/worker/data/data_test_util.h"

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace trainyard::worker::testing_util {
namespace {

void AppendLe(std::string& out, uint32_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

}  // namespace

ScratchDir::ScratchDir() {
  std::string pattern = testing::TempDir() + "/trainyard_data_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  path_ = pattern;
}

ScratchDir::~ScratchDir() { std::filesystem::remove_all(path_); }

std::string ShardBytes(const std::vector<uint16_t>& tokens, const ShardOptions& options) {
  std::string out;
  AppendLe(out, static_cast<uint32_t>(options.magic), 4);
  AppendLe(out, static_cast<uint32_t>(options.version), 4);
  AppendLe(out, static_cast<uint32_t>(options.header_count.value_or(tokens.size())), 4);
  out.resize(1024, '\0');
  for (uint16_t token : tokens) AppendLe(out, token, 2);
  return out + options.trailing;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace trainyard::worker::testing_util
