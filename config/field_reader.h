// Strict, typed reading of the fields of one YAML mapping in a job spec.
//
// Each reader covers one mapping ("training", "data.markov", ...). It first checks that the node
// is a mapping whose keys are all known (an unknown key is an error that suggests the closest
// known one), then reads fields one by one: an absent field leaves the caller's default alone; a
// present one must have the right type exactly (no quoted numbers, no floats for integers, only
// true/false for booleans). Every error is INVALID_ARGUMENT, one line,
// "<source>:<line>:<column>: <field.path>: <reason>".
//
// Every field read is recorded in a SpecLocations table, so that checks made later on the typed
// structs (cross-field validation) can still point at the line the user wrote.
//
// Threading: not thread-safe; used by one parse at a time.
#ifndef TRAINYARD_CONFIG_FIELD_READER_H_
#define TRAINYARD_CONFIG_FIELD_READER_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/yaml_tree.h"

namespace trainyard::config {

// Where each field path ("training.steps") was written.
class SpecLocations {
 public:
  void Record(const std::string& path, YamlMark mark) { marks_[path] = mark; }
  bool Has(const std::string& path) const { return marks_.count(path) > 0; }
  // The mark of `path`, else of its nearest recorded ancestor ("training.seq_len" falls back to
  // "training"), else line 1 column 1.
  YamlMark Find(std::string_view path) const;

 private:
  std::map<std::string, YamlMark, std::less<>> marks_;
};

// A key as it appears in a field path: as written when it is a plain identifier (letters, digits,
// '_' and '-', at most 64 characters), else quoted ("labels.'team name'").
std::string KeyForPath(const std::string& key);

// The closest of `candidates` to `word` by edit distance (a transposition counts once), if it is
// at most 2 edits away and shorter than the candidate itself; otherwise "".
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);

// What one parse does with a field written where it has no effect (a sampling knob in a job that
// draws no samples, say). A spec being submitted is refused for it: it is a mistake. A spec read
// back (from the job store, or by a worker from its coordinator) was accepted when it was
// submitted, perhaps by a build that did not refuse such fields yet: it keeps parsing, and the
// fields are listed here instead.
struct InertFields {
  bool refuse = true;
  std::vector<std::string> ignored;  // "<field.path>: <reason>", in the order met
};

class FieldReader {
 public:
  // `node`, `locations` and `inert` must outlive the reader. `path` is the mapping's own path (""
  // for the top of the spec).
  FieldReader(const YamlNode& node, std::string path, std::string source_name,
              SpecLocations* locations, InertFields* inert);

  // Fails unless the node is a mapping whose keys are all in `known`.
  [[nodiscard]] absl::Status ExpectMapWithKeys(std::initializer_list<std::string_view> known);

  bool Has(std::string_view key) const { return node_.Find(key) != nullptr; }
  bool IsMapping() const { return node_.kind == YamlNode::Kind::kMap; }
  // Fails, pointing at this mapping, when `key` is absent.
  [[nodiscard]] absl::Status Require(std::string_view key) const;
  const std::string& path() const { return path_; }
  std::string PathOf(std::string_view key) const;

  // Each reads `key` into `*out` when present and leaves `*out` alone when absent.
  [[nodiscard]] absl::Status ReadInt(std::string_view key, int* out);
  [[nodiscard]] absl::Status ReadInt64(std::string_view key, int64_t* out);
  [[nodiscard]] absl::Status ReadUint64(std::string_view key, uint64_t* out);
  [[nodiscard]] absl::Status ReadDouble(std::string_view key, double* out);
  [[nodiscard]] absl::Status ReadFloat(std::string_view key, float* out);
  [[nodiscard]] absl::Status ReadBool(std::string_view key, bool* out);
  [[nodiscard]] absl::Status ReadString(std::string_view key, std::string* out);
  // A sequence of integers (`[1, 2, 3]`), each in int32's range.
  [[nodiscard]] absl::Status ReadInt32List(std::string_view key, std::vector<int32_t>* out);
  // A sequence of numbers (`[1.0, 1.5]`), each finite and in a 32-bit float's range.
  [[nodiscard]] absl::Status ReadFloatList(std::string_view key, std::vector<float>* out);
  // An integer, or the word `auto`, which is read as nullopt.
  [[nodiscard]] absl::Status ReadInt64OrAuto(std::string_view key, std::optional<int64_t>* out);
  // A mapping of strings to strings (numbers and booleans are kept as written). Each entry's
  // position is recorded under "<path>.<key>.<entry key>".
  [[nodiscard]] absl::Status ReadStringMap(std::string_view key,
                                           std::map<std::string, std::string>* out);

  // True when `key` is present and its value is the scalar `word` (quoted or not).
  bool IsWord(std::string_view key, std::string_view word) const;

  // A reader for the nested mapping at `key`, or nothing when the key is absent. The child's
  // ExpectMapWithKeys checks that it is a mapping.
  std::optional<FieldReader> Child(std::string_view key);

  // An error located at `key`'s value when present, else at this mapping.
  [[nodiscard]] absl::Status ErrorAt(std::string_view key, std::string_view reason) const;
  // For `key` written where it has no effect: an error as ErrorAt's when the parse refuses such
  // fields, else OK with the field recorded as ignored.
  [[nodiscard]] absl::Status Inert(std::string_view key, std::string_view reason) const;
  // An error located at this mapping (or at its key), for the mapping as a whole.
  [[nodiscard]] absl::Status Error(std::string_view reason) const;
  // "expected <expected>, got <what key holds>", located at `key`'s value (which must exist).
  [[nodiscard]] absl::Status WrongType(std::string_view key, std::string_view expected) const;

 private:
  // The value at `key`, recorded in the locations table, or nullptr when absent.
  const YamlNode* Lookup(std::string_view key);
  [[nodiscard]] absl::StatusOr<int64_t> ParseInteger(std::string_view key, const YamlNode& value,
                                                     int64_t min, int64_t max);
  [[nodiscard]] absl::Status TypeError(std::string_view key, const YamlNode& value,
                                       std::string_view expected) const;

  const YamlNode& node_;
  std::string path_;
  std::string source_name_;
  SpecLocations* locations_;
  InertFields* inert_;
};

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_FIELD_READER_H_
