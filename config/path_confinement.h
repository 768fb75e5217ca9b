// Confinement of the file paths a spec names (data files, checkpoint directories) to directories
// an operator allowed, so that a submitted job cannot read or write elsewhere on the nodes.
//
// The comparison is lexical: a relative path is made absolute against the current working
// directory, "." and ".." are normalised away, and the result must equal a root or lie beneath
// it, compared component by component ("/data2" is not under "/data"). Glob patterns are allowed
// in the last components, but a component that starts with '.' may not contain glob
// metacharacters ('*', '?', '['), since glob(3) could match it to "..". Symbolic links inside a
// root are trusted: the operator controls what the roots contain.
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
