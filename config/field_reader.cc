#include "config/field_reader.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace trainyard::config {
namespace {

absl::string_view AbslView(std::string_view text) { return {text.data(), text.size()}; }

// Optimal-string-alignment distance: insertions, deletions, substitutions and adjacent
// transpositions each cost one.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// Strips one leading '+', which YAML allows on numbers and std::from_chars does not.
std::string_view NumberText(const std::string& text) {
  std::string_view view(text);
  if (view.size() > 1 && view[0] == '+' && view[1] != '-') view.remove_prefix(1);
  return view;
}

template <typename T>
bool ParseWhole(std::string_view text, T* out, std::errc* error) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  *error = ec;
  return ec == std::errc() && ptr == end;
}

bool ParseDoubleText(const std::string& text, double* out) {
  std::errc ec;
  return ParseWhole(NumberText(text), out, &ec);
}

bool IsPlainScalar(const YamlNode& node) {
  return node.kind == YamlNode::Kind::kScalar && !node.quoted;
}

}  // namespace

std::string KeyForPath(const std::string& key) {
  const bool plain =
      !key.empty() && key.size() <= 64 && std::all_of(key.begin(), key.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      });
  return plain ? key : QuoteForMessage(key);
}

YamlMark SpecLocations::Find(std::string_view path) const {
  while (true) {
    auto it = marks_.find(path);
    if (it != marks_.end()) return it->second;
    if (path.empty()) return YamlMark{};
    const size_t dot = path.find_last_of('.');
    path = dot == std::string_view::npos ? std::string_view() : path.substr(0, dot);
  }
}

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = 3;
  for (const std::string& candidate : candidates) {
    const size_t distance = EditDistance(word, candidate);
    if (distance < best_distance && distance < candidate.size()) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

FieldReader::FieldReader(const YamlNode& node, std::string path, std::string source_name,
                         SpecLocations* locations, InertFields* inert)
    : node_(node),
      path_(std::move(path)),
      source_name_(std::move(source_name)),
      locations_(locations),
      inert_(inert) {
  if (!locations_->Has(path_)) locations_->Record(path_, node_.mark);
}

std::string FieldReader::PathOf(std::string_view key) const {
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", AbslView(key));
}

absl::Status FieldReader::ExpectMapWithKeys(std::initializer_list<std::string_view> known) {
  if (node_.kind != YamlNode::Kind::kMap) {
    return Error(absl::StrCat("expected a mapping, got ", DescribeNode(node_)));
  }
  std::vector<std::string> names(known.begin(), known.end());
  for (const YamlEntry& entry : node_.entries) {
    if (std::find(names.begin(), names.end(), entry.key) != names.end()) continue;
    const std::string suggestion = ClosestMatch(entry.key, names);
    const std::string reason =
        suggestion.empty()
            ? absl::StrCat("unknown field (known fields: ", absl::StrJoin(names, ", "), ")")
            : absl::StrCat("unknown field; did you mean '", suggestion, "'?");
    return LocatedError(source_name_, entry.key_mark, PathOf(KeyForPath(entry.key)), reason);
  }
  return absl::OkStatus();
}

absl::Status FieldReader::Require(std::string_view key) const {
  if (Has(key)) return absl::OkStatus();
  return LocatedError(source_name_, node_.mark, PathOf(key), "required field is missing");
}

const YamlNode* FieldReader::Lookup(std::string_view key) {
  const YamlEntry* entry = node_.Find(key);
  if (entry == nullptr) return nullptr;
  locations_->Record(PathOf(key), entry->value.mark);
  return &entry->value;
}

absl::Status FieldReader::Inert(std::string_view key, std::string_view reason) const {
  if (inert_->refuse) return ErrorAt(key, reason);
  inert_->ignored.push_back(absl::StrCat(PathOf(key), ": ", AbslView(reason)));
  return absl::OkStatus();
}

absl::Status FieldReader::ErrorAt(std::string_view key, std::string_view reason) const {
  const YamlEntry* entry = node_.Find(key);
  if (entry == nullptr) return LocatedError(source_name_, node_.mark, PathOf(key), reason);
  return LocatedError(source_name_, entry->value.mark, PathOf(key), reason);
}

absl::Status FieldReader::Error(std::string_view reason) const {
  return LocatedError(source_name_, locations_->Find(path_), path_, reason);
}

absl::Status FieldReader::TypeError(std::string_view key, const YamlNode& value,
                                    std::string_view expected) const {
  return ErrorAt(key, absl::StrCat("expected ", AbslView(expected), ", got ", DescribeNode(value)));
}

absl::StatusOr<int64_t> FieldReader::ParseInteger(std::string_view key, const YamlNode& value,
                                                  int64_t min, int64_t max) {
  if (!IsPlainScalar(value)) return TypeError(key, value, "an integer");
  int64_t parsed = 0;
  std::errc ec;
  if (ParseWhole(NumberText(value.value), &parsed, &ec)) {
    if (parsed < min || parsed > max) {
      return ErrorAt(key, absl::StrCat(parsed, " is out of range [", min, ", ", max, "]"));
    }
    return parsed;
  }
  if (ec == std::errc::result_out_of_range) {
    return ErrorAt(
        key, absl::StrCat(QuoteForMessage(value.value), " is out of range [", min, ", ", max, "]"));
  }
  double as_double = 0;
  if (ParseDoubleText(value.value, &as_double) && std::isfinite(as_double) &&
      as_double == std::floor(as_double) && std::fabs(as_double) < 9e15) {
    return ErrorAt(key, absl::StrCat("expected an integer, got ", QuoteForMessage(value.value),
                                     " (write it as ", static_cast<int64_t>(as_double), ")"));
  }
  return TypeError(key, value, "an integer");
}

absl::Status FieldReader::ReadInt(std::string_view key, int* out) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return absl::OkStatus();
  TY_ASSIGN_OR_RETURN(
      const int64_t parsed,
      ParseInteger(key, *value, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
  *out = static_cast<int>(parsed);
  return absl::OkStatus();
}

absl::Status FieldReader::ReadInt64(std::string_view key, int64_t* out) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return absl::OkStatus();
  TY_ASSIGN_OR_RETURN(*out, ParseInteger(key, *value, std::numeric_limits<int64_t>::min(),
                                         std::numeric_limits<int64_t>::max()));
  return absl::OkStatus();
}

absl::Status FieldReader::ReadUint64(std::string_view key, uint64_t* out) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return absl::OkStatus();
  if (!IsPlainScalar(*value)) return TypeError(key, *value, "a non-negative integer");
  std::errc ec;
  if (ParseWhole(NumberText(value->value), out, &ec)) return absl::OkStatus();
  if (ec == std::errc::result_out_of_range) {
    return ErrorAt(key, absl::StrCat(QuoteForMessage(value->value),
                                     " is out of range for a 64-bit unsigned integer"));
  }
  return TypeError(key, *value, "a non-negative integer");
}

absl::Status FieldReader::ReadDouble(std::string_view key, double* out) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return absl::OkStatus();
  double parsed = 0;
  if (!IsPlainScalar(*value) || !ParseDoubleText(value->value, &parsed)) {
    return TypeError(key, *value, "a number");
  }
  if (!std::isfinite(parsed)) {
    return ErrorAt(key, absl::StrCat("expected a finite number, got ", DescribeNode(*value)));
  }
  *out = parsed;
  return absl::OkStatus();
}

absl::Status FieldReader::ReadFloat(std::string_view key, float* out) {
  double parsed = *out;
  TY_RETURN_IF_ERROR(ReadDouble(key, &parsed));
  if (std::fabs(parsed) > std::numeric_limits<float>::max()) {
    return ErrorAt(key, absl::StrCat(parsed, " is out of range for a 32-bit float"));
  }
  *out = static_cast<float>(parsed);
  return absl::OkStatus();
}

absl::Status FieldReader::ReadBool(std::string_view key, bool* out) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return absl::OkStatus();
  if (IsPlainScalar(*value)) {
    const std::string& v = value->value;
    if (v == "true" || v == "True" || v == "TRUE") {
      *out = true;
      return absl::OkStatus();
    }
    if (v == "false" || v == "False" || v == "FALSE") {
      *out = false;
      return absl::OkStatus();
    }
  }
  return TypeError(key, *value, "true or false");
}

absl::Status FieldReader::ReadString(std::string_view key, std::string* out) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return absl::OkStatus();
  if (value->kind != YamlNode::Kind::kScalar) return TypeError(key, *value, "a string");
  *out = value->value;
  return absl::OkStatus();
}

absl::Status FieldReader::ReadInt32List(std::string_view key, std::vector<int32_t>* out) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return absl::OkStatus();
  if (value->kind != YamlNode::Kind::kSequence) return TypeError(key, *value, "a list of integers");
  std::vector<int32_t> read;
  for (const YamlNode& item : value->items) {
    int32_t n;
    if (item.kind != YamlNode::Kind::kScalar || !absl::SimpleAtoi(item.value, &n)) {
      return LocatedError(source_name_, item.mark, PathOf(key),
                          absl::StrCat("expected an integer, got ", DescribeNode(item)));
    }
    read.push_back(n);
  }
  *out = std::move(read);
  return absl::OkStatus();
}

absl::Status FieldReader::ReadFloatList(std::string_view key, std::vector<float>* out) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return absl::OkStatus();
  if (value->kind != YamlNode::Kind::kSequence) return TypeError(key, *value, "a list of numbers");
  std::vector<float> read;
  for (const YamlNode& item : value->items) {
    double parsed = 0;
    if (!IsPlainScalar(item) || !ParseDoubleText(item.value, &parsed) || !std::isfinite(parsed) ||
        std::fabs(parsed) > std::numeric_limits<float>::max()) {
      return LocatedError(
          source_name_, item.mark, PathOf(key),
          absl::StrCat("expected a finite 32-bit number, got ", DescribeNode(item)));
    }
    read.push_back(static_cast<float>(parsed));
  }
  *out = std::move(read);
  return absl::OkStatus();
}

absl::Status FieldReader::ReadInt64OrAuto(std::string_view key, std::optional<int64_t>* out) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return absl::OkStatus();
  if (value->kind == YamlNode::Kind::kScalar && value->value == "auto") {
    *out = std::nullopt;
    return absl::OkStatus();
  }
  double as_double = 0;
  if (!IsPlainScalar(*value) || !ParseDoubleText(value->value, &as_double)) {
    return TypeError(key, *value, "an integer or auto");
  }
  TY_ASSIGN_OR_RETURN(*out, ParseInteger(key, *value, std::numeric_limits<int64_t>::min(),
                                         std::numeric_limits<int64_t>::max()));
  return absl::OkStatus();
}

absl::Status FieldReader::ReadStringMap(std::string_view key,
                                        std::map<std::string, std::string>* out) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return absl::OkStatus();
  if (value->kind != YamlNode::Kind::kMap) {
    return TypeError(key, *value, "a mapping of strings to strings");
  }
  const std::string map_path = PathOf(key);
  for (const YamlEntry& entry : value->entries) {
    const std::string entry_path = absl::StrCat(map_path, ".", KeyForPath(entry.key));
    locations_->Record(entry_path, entry.value.mark);
    if (entry.value.kind != YamlNode::Kind::kScalar) {
      return LocatedError(source_name_, entry.value.mark, entry_path,
                          absl::StrCat("expected a string, got ", DescribeNode(entry.value)));
    }
    (*out)[entry.key] = entry.value.value;
  }
  return absl::OkStatus();
}

bool FieldReader::IsWord(std::string_view key, std::string_view word) const {
  const YamlEntry* entry = node_.Find(key);
  return entry != nullptr && entry->value.kind == YamlNode::Kind::kScalar &&
         entry->value.value == word;
}

absl::Status FieldReader::WrongType(std::string_view key, std::string_view expected) const {
  const YamlEntry* entry = node_.Find(key);
  if (entry == nullptr) return ErrorAt(key, absl::StrCat("expected ", AbslView(expected)));
  return TypeError(key, entry->value, expected);
}

std::optional<FieldReader> FieldReader::Child(std::string_view key) {
  const YamlNode* value = Lookup(key);
  if (value == nullptr) return std::nullopt;
  return FieldReader(*value, PathOf(key), source_name_, locations_, inert_);
}

}  // namespace trainyard::config
