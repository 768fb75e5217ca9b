#include "config/path_confinement.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/yaml_tree.h"

namespace trainyard::config {
namespace {

namespace fs = std::filesystem;

std::string CurrentDirectory() {
  std::error_code error;
  fs::path cwd = fs::current_path(error);
  return error ? std::string("/") : cwd.string();
}

// The non-empty components of a normalised absolute path.
std::vector<std::string> Components(const std::string& normalized) {
  std::vector<std::string> parts;
  for (const fs::path& part : fs::path(normalized).relative_path()) {
    if (!part.empty()) parts.push_back(part.string());
  }
  return parts;
}

bool IsUnder(const std::vector<std::string>& path, const std::vector<std::string>& root) {
  if (path.size() < root.size()) return false;
  for (size_t i = 0; i < root.size(); ++i) {
    if (path[i] != root[i]) return false;
  }
  return true;
}

bool MayGlobToParent(const std::vector<std::string>& components) {
  for (const std::string& part : components) {
    if (!part.empty() && part[0] == '.' && part.find_first_of("*?[") != std::string::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::string NormalizePath(std::string_view path, std::string_view working_dir) {
  fs::path p{std::string(path)};
  if (p.is_relative()) p = fs::path(std::string(working_dir)) / p;
  std::string normal = p.lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

std::optional<std::string> FindConfinementProblem(std::string_view path,
                                                  const std::vector<std::string>& roots,
                                                  std::string_view working_dir) {
  if (roots.empty()) return std::nullopt;
  const std::string cwd = working_dir.empty() ? CurrentDirectory() : std::string(working_dir);
  const std::string normalized = NormalizePath(path, cwd);
  const std::vector<std::string> components = Components(normalized);
  if (MayGlobToParent(components)) {
    return absl::StrCat(QuoteForMessage(path),
                        ": a path component starting with '.' may not contain glob characters");
  }
  std::vector<std::string> normalized_roots;
  for (const std::string& root : roots) {
    normalized_roots.push_back(NormalizePath(root, cwd));
    if (IsUnder(components, Components(normalized_roots.back()))) return std::nullopt;
  }
  return absl::StrCat(
      QuoteForMessage(path), " (", QuoteForMessage(normalized),
      ") is outside the allowed directories: ", absl::StrJoin(normalized_roots, ", "));
}

}  // namespace trainyard::config
