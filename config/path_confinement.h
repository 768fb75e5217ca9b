// Confinement of the file paths a spec names (data files, checkpoint directories) to directories
// an operator allowed, so that a submitted job cannot read or write elsewhere on the nodes.
//
// First lexically: a relative path is made absolute against the current working directory, "."
// and ".." are normalised away, and the result must equal a root or lie beneath it, compared
// component by component ("/data2" is not under "/data"). Glob patterns are allowed in the last
// components, but a component that starts with '.' may not contain glob metacharacters ('*',
// '?', '['), since glob(3) could match it to "..". Then on this host's filesystem: the path (for
// a pattern, its fixed directory and each of its matches) with its symbolic links resolved must
// lie beneath a root resolved the same way, so a link inside a root that leads out is refused.
// What does not exist here yet passes on the lexical check; the workers confine their own file
// access (common/filesystem.h, NewConfinedFileSystem), which is what holds against a link made
// after this check.
//
// Threading: plain functions; no shared state.
#ifndef TRAINYARD_CONFIG_PATH_CONFINEMENT_H_
#define TRAINYARD_CONFIG_PATH_CONFINEMENT_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard::config {

// `path` made absolute against `working_dir` and lexically normalised, without a trailing '/'
// (except for "/" itself).
std::string NormalizePath(std::string_view path, std::string_view working_dir);

// Why `path` is not allowed under `roots`, or nothing when it is (or when `roots` is empty).
// `working_dir` resolves relative paths and roots; empty means the process's current directory.
std::optional<std::string> FindConfinementProblem(std::string_view path,
                                                  const std::vector<std::string>& roots,
                                                  std::string_view working_dir = "");

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_PATH_CONFINEMENT_H_
