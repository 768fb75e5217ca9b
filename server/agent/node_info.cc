#include "server/agent/node_info.h"

#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/process.h"

extern char** environ;

namespace trainyard::server::agent {
namespace {

namespace fs = std::filesystem;

bool IsExecutableFile(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error) && access(path.c_str(), X_OK) == 0;
}

fs::path Absolute(const fs::path& path) {
  std::error_code error;
  fs::path absolute = fs::absolute(path, error);
  return error ? path : absolute.lexically_normal();
}

}  // namespace

std::string LocalHostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

int LocalCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

int64_t LocalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t{pages} * page : int64_t{1} << 30;
}

std::vector<trainyard::v1::GpuInfo> LocalGpus(const DeviceProbe& probe) {
  std::vector<trainyard::v1::GpuInfo> gpus;
  const DeviceInfo info = probe.Probe();
  for (int i = 0; i < info.count; ++i) {
    trainyard::v1::GpuInfo gpu;
    gpu.set_index(i);
    gpu.set_name(info.name);  // the probe names device 0; nodes hold one GPU model
    gpu.set_memory_bytes(info.memory_bytes);
    gpus.push_back(gpu);
  }
  return gpus;
}

std::map<std::string, std::string> CurrentEnvironment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const size_t equals = text.find('=');
    if (equals == std::string::npos || equals == 0) continue;
    env.emplace(text.substr(0, equals), text.substr(equals + 1));
  }
  return env;
}

absl::StatusOr<std::string> FindWorkerBinary(const std::string& flag) {
  if (!flag.empty()) {
    if (IsExecutableFile(flag)) return Absolute(flag).string();
    return absl::NotFoundError(
        absl::StrCat("--worker-binary ", flag, " is not an executable file"));
  }
  absl::StatusOr<std::string> found = LocateWorkerBinary();
  if (!found.ok()) {
    return absl::NotFoundError(
        absl::StrCat(found.status().message(), "; pass --worker-binary PATH"));
  }
  return found;
}

}  // namespace trainyard::server::agent
