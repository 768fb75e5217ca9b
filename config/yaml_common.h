// The common form of a job spec's YAML, read without yaml-cpp.
//
// yaml-cpp's scanner matches every character against regular expressions: about 1,900
// instructions a byte, two thirds of a million for a short spec, a third of what the coordinator
// spends on a submission. Specs are nearly always written in a small part of YAML: block
// mappings, flow mappings and sequences on one line, block sequences of scalars, plain and
// quoted scalars, comments. ParseCommonYaml reads exactly that part, giving the tree (values,
// marks, quoting) yaml-cpp's events build, and gives up (nullopt) on anything else: multi-line
// scalars, block scalars, nulls, escapes, anchors, tags, directives, documents, tabs, non-ASCII
// bytes, duplicate keys, nesting past the limit. ParseYamlTree then reads the text with yaml-cpp,
// so everything outside the common part, and every error, comes from one parser.
//
// Threading: plain functions; no shared state.
#ifndef TRAINYARD_CONFIG_YAML_COMMON_H_
#define TRAINYARD_CONFIG_YAML_COMMON_H_

#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "config/yaml_tree.h"

namespace trainyard::config {

// The tree of `text` when it is in the common form and nests at most `max_depth` collections
// deep; nullopt otherwise (then nothing is said about the text: it may be valid YAML or not).
[[nodiscard]] std::optional<YamlNode> ParseCommonYaml(std::string_view text, int max_depth);

// The same kinds, values, quoting, keys and marks, all the way down.
[[nodiscard]] bool SameYamlTree(const YamlNode& a, const YamlNode& b);

// ParseYamlTree without the common form's reader: every text through yaml-cpp (for tests that
// hold the two readers to the same trees).
[[nodiscard]] absl::StatusOr<YamlNode> ParseYamlTreeWithYamlCpp(std::string_view text,
                                                                std::string_view source_name,
                                                                const YamlLimits& limits);

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_YAML_COMMON_H_
