#include "config/path_confinement.h"

#include <glob.h>

#include <algorithm>
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

bool HasGlob(const std::string& part) { return part.find_first_of("*?[") != std::string::npos; }

// `normalized` with every symbolic link in its existing part resolved (std::filesystem's
// weakly_canonical: the part that does not exist yet is kept as written).
std::string Resolved(const std::string& normalized) {
  std::error_code error;
  fs::path resolved = fs::weakly_canonical(fs::path(normalized), error);
  return error ? normalized : NormalizePath(resolved.string(), "/");
}

// The paths a pattern reaches on this host: its glob matches, and the directory before its
// first glob component (a link there leads every match out); the path itself when it has no
// glob characters.
std::vector<std::string> Reached(const std::vector<std::string>& components,
                                 const std::string& normalized) {
  size_t fixed = 0;
  while (fixed < components.size() && !HasGlob(components[fixed])) ++fixed;
  if (fixed == components.size()) return {normalized};
  std::string prefix;
  for (size_t i = 0; i < fixed; ++i) prefix += "/" + components[i];
  std::vector<std::string> reached = {prefix.empty() ? "/" : prefix};
  glob_t matches;
  if (glob(normalized.c_str(), 0, nullptr, &matches) == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) reached.emplace_back(matches.gl_pathv[i]);
  }
  globfree(&matches);
  return reached;
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
  bool lexically_inside = false;
  for (const std::string& root : roots) {
    normalized_roots.push_back(NormalizePath(root, cwd));
    lexically_inside = lexically_inside || IsUnder(components, Components(normalized_roots.back()));
  }
  if (!lexically_inside) {
    return absl::StrCat(
        QuoteForMessage(path), " (", QuoteForMessage(normalized),
        ") is outside the allowed directories: ", absl::StrJoin(normalized_roots, ", "));
  }
  // Then what the path reaches here, symbolic links resolved, against the roots resolved the
  // same way (a root may itself be a link).
  std::vector<std::vector<std::string>> resolved_roots;
  for (const std::string& root : normalized_roots) {
    resolved_roots.push_back(Components(Resolved(root)));
  }
  for (const std::string& reached : Reached(components, normalized)) {
    const std::string resolved = Resolved(reached);
    const std::vector<std::string> parts = Components(resolved);
    const bool inside = std::any_of(resolved_roots.begin(), resolved_roots.end(),
                                    [&](const auto& root) { return IsUnder(parts, root); });
    if (!inside) {
      return absl::StrCat(
          QuoteForMessage(path), ": ", QuoteForMessage(reached),
          " leads through a symbolic link to ", QuoteForMessage(resolved),
          ", outside the allowed directories: ", absl::StrJoin(normalized_roots, ", "));
    }
  }
  return std::nullopt;
}

}  // namespace trainyard::config
