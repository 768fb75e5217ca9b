// A small, bounded YAML document tree for the job-spec parser.
//
// yaml-cpp is driven through its event interface, so that the limits below are enforced while the
// text is read, before any structure is built: a spec larger than `max_bytes`, nesting deeper than
// `max_depth`, anchors and aliases (the "billion laughs" expansion), explicit tags, duplicate
// keys, non-scalar keys and more than one document are all refused. Every error is
// INVALID_ARGUMENT with the single-line form "<source>:<line>:<column>: <path>: <reason>".
//
// Threading: plain functions and values; no shared state.
#ifndef TRAINYARD_CONFIG_YAML_TREE_H_
#define TRAINYARD_CONFIG_YAML_TREE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainyard::config {

// A 1-based position in the source text.
struct YamlMark {
  int line = 1;
  int column = 1;
};

struct YamlEntry;

struct YamlNode {
  enum class Kind { kNull, kScalar, kMap, kSequence };

  Kind kind = Kind::kNull;
  YamlMark mark;
  std::string value;               // kScalar: the text, quotes removed
  bool quoted = false;             // kScalar: written in quotes (so always a string)
  std::vector<YamlEntry> entries;  // kMap: in document order, keys unique
  std::vector<YamlNode> items;     // kSequence

  // The entry with key `key`, or nullptr (also for non-maps).
  const YamlEntry* Find(std::string_view key) const;
};

struct YamlEntry {
  std::string key;
  YamlMark key_mark;
  YamlNode value;
};

struct YamlLimits {
  size_t max_bytes = size_t{1} << 20;
  int max_depth = 32;  // the top-level collection is depth 1
};

// Parses one YAML document. `source_name` prefixes every error message.
[[nodiscard]] absl::StatusOr<YamlNode> ParseYamlTree(std::string_view text,
                                                     std::string_view source_name,
                                                     const YamlLimits& limits = YamlLimits());

// Describes a node's kind for messages: "a mapping", "a sequence", "null", "the string \"x\"".
std::string DescribeNode(const YamlNode& node);

// The INVALID_ARGUMENT status "<source>:<line>:<column>: <path>: <reason>", with any control
// characters in `reason` escaped so that the message is one line.
[[nodiscard]] absl::Status LocatedError(std::string_view source_name, YamlMark mark,
                                        std::string_view path, std::string_view reason);

// Quotes user text for a message: escapes control characters and shortens it past 64 bytes.
std::string QuoteForMessage(std::string_view text);

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_YAML_TREE_H_
