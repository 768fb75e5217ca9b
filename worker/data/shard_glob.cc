#include "worker/data/shard_glob.h"

#include <glob.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainyard::worker {
namespace {

// Frees a glob_t on every exit path.
class GlobResult {
 public:
  GlobResult() = default;
  GlobResult(const GlobResult&) = delete;
  GlobResult& operator=(const GlobResult&) = delete;
  ~GlobResult() { globfree(&result_); }
  glob_t* get() { return &result_; }

 private:
  glob_t result_{};
};

}  // namespace

bool IsGlobPattern(const std::string& path) {
  return path.find_first_of("*?[") != std::string::npos;
}

absl::StatusOr<std::vector<std::string>> ExpandShardPattern(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty shard path");
  if (!IsGlobPattern(path)) return std::vector<std::string>{path};

  GlobResult result;
  // GLOB_MARK appends '/' to directories so that they can be skipped below.
  const int rc = glob(path.c_str(), GLOB_MARK, /*errfunc=*/nullptr, result.get());
  if (rc == GLOB_NOSPACE) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory matching '", path, "'"));
  }
  if (rc == GLOB_ABORTED) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read a directory while matching '", path, "'"));
  }
  std::vector<std::string> files;
  if (rc == 0) {
    for (size_t i = 0; i < result.get()->gl_pathc; ++i) {
      std::string match = result.get()->gl_pathv[i];
      if (!match.empty() && match.back() != '/') files.push_back(std::move(match));
    }
  }
  if (files.empty()) return absl::NotFoundError(absl::StrCat("no files match '", path, "'"));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace trainyard::worker
