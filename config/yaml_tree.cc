#include "config/yaml_tree.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/parser.h>

#include <new>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "config/yaml_common.h"

namespace trainyard::config {
namespace {

absl::string_view AbslView(std::string_view text) { return {text.data(), text.size()}; }

YamlMark ToMark(const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0 || mark.column < 0) return YamlMark{};
  return YamlMark{mark.line + 1, mark.column + 1};
}

// Thrown by the event handler to stop yaml-cpp at the first refused construct; caught in
// ParseYamlTree and never let out of this file.
struct TreeError {
  YamlMark mark;
  std::string path;
  std::string reason;
};

std::string JoinPath(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : absl::StrCat(parent, ".", AbslView(key));
}

// Builds a YamlNode tree from yaml-cpp events, refusing what the spec format does not allow.
class TreeBuilder : public YAML::EventHandler {
 public:
  explicit TreeBuilder(int max_depth) : max_depth_(max_depth) {}

  std::optional<YamlNode>& root() { return root_; }

  // Where the next node goes, for messages: "training.steps", "model", "" for the top.
  std::string CurrentPath() const {
    if (stack_.empty()) return "";
    const Frame& top = stack_.back();
    if (top.node.kind == YamlNode::Kind::kSequence) {
      return absl::StrCat(top.path, "[", top.node.items.size(), "]");
    }
    return top.has_key ? JoinPath(top.path, top.key) : top.path;
  }

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (documents_++ > 0) throw TreeError{ToMark(mark), "", "only one YAML document is allowed"};
  }
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override {
    YamlNode node;
    node.kind = YamlNode::Kind::kNull;
    node.mark = ToMark(mark);
    Add(std::move(node));
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    throw TreeError{ToMark(mark), CurrentPath(), "YAML aliases (*name) are not allowed"};
  }

  void OnAnchor(const YAML::Mark& mark, const std::string& name) override {
    throw TreeError{
        ToMark(mark), CurrentPath(),
        absl::StrCat("YAML anchors are not allowed (found &", QuoteForMessage(name), ")")};
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t,
                const std::string& value) override {
    CheckTag(mark, tag);
    YamlNode node;
    node.kind = YamlNode::Kind::kScalar;
    node.mark = ToMark(mark);
    node.value = value;
    node.quoted = tag == "!";
    Add(std::move(node));
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Open(YamlNode::Kind::kSequence, mark, tag);
  }
  void OnSequenceEnd() override { Close(); }

  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Open(YamlNode::Kind::kMap, mark, tag);
  }
  void OnMapEnd() override { Close(); }

 private:
  struct Frame {
    YamlNode node;
    std::string path;
    bool has_key = false;  // maps: a key has been read and waits for its value
    std::string key;
    YamlMark key_mark;
    std::unordered_map<std::string, int> key_lines;  // maps: keys seen, for duplicates
  };

  void CheckTag(const YAML::Mark& mark, const std::string& tag) const {
    if (tag.empty() || tag == "?" || tag == "!") return;
    throw TreeError{ToMark(mark), CurrentPath(),
                    absl::StrCat("YAML tags are not allowed (found ", QuoteForMessage(tag), ")")};
  }

  void Open(YamlNode::Kind kind, const YAML::Mark& mark, const std::string& tag) {
    CheckTag(mark, tag);
    if (!stack_.empty() && stack_.back().node.kind == YamlNode::Kind::kMap &&
        !stack_.back().has_key) {
      throw TreeError{ToMark(mark), stack_.back().path,
                      "mapping keys must be plain strings, not mappings or sequences"};
    }
    if (static_cast<int>(stack_.size()) >= max_depth_) {
      throw TreeError{ToMark(mark), CurrentPath(),
                      absl::StrCat("nesting is deeper than ", max_depth_, " levels")};
    }
    Frame frame;
    frame.path = CurrentPath();
    frame.node.kind = kind;
    frame.node.mark = ToMark(mark);
    stack_.push_back(std::move(frame));
  }

  void Close() {
    YamlNode node = std::move(stack_.back().node);
    stack_.pop_back();
    Add(std::move(node));
  }

  void Add(YamlNode node) {
    if (stack_.empty()) {
      root_ = std::move(node);
      return;
    }
    Frame& top = stack_.back();
    if (top.node.kind == YamlNode::Kind::kSequence) {
      top.node.items.push_back(std::move(node));
    } else if (!top.has_key) {
      AddKey(top, node);
    } else {
      // An empty value's own mark is the next token; the key is where the user looks.
      if (node.kind == YamlNode::Kind::kNull) node.mark = top.key_mark;
      top.node.entries.push_back(YamlEntry{std::move(top.key), top.key_mark, std::move(node)});
      top.has_key = false;
    }
  }

  static void AddKey(Frame& map, const YamlNode& key) {
    if (key.kind != YamlNode::Kind::kScalar) {
      throw TreeError{key.mark, map.path, "mapping keys must be strings"};
    }
    auto [it, inserted] = map.key_lines.emplace(key.value, key.mark.line);
    if (!inserted) {
      throw TreeError{key.mark, JoinPath(map.path, key.value),
                      absl::StrCat("duplicate key (first given on line ", it->second, ")")};
    }
    map.has_key = true;
    map.key = key.value;
    map.key_mark = key.mark;
  }

  const int max_depth_;
  int documents_ = 0;
  std::vector<Frame> stack_;
  std::optional<YamlNode> root_;
};

}  // namespace

const YamlEntry* YamlNode::Find(std::string_view key) const {
  for (const YamlEntry& entry : entries) {
    if (entry.key == key) return &entry;
  }
  return nullptr;
}

absl::StatusOr<YamlNode> ParseYamlTree(std::string_view text, std::string_view source_name,
                                       const YamlLimits& limits) {
  if (text.size() <= limits.max_bytes) {
    if (std::optional<YamlNode> common = ParseCommonYaml(text, limits.max_depth)) {
      return std::move(*common);
    }
  }
  return ParseYamlTreeWithYamlCpp(text, source_name, limits);
}

absl::StatusOr<YamlNode> ParseYamlTreeWithYamlCpp(std::string_view text,
                                                  std::string_view source_name,
                                                  const YamlLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return LocatedError(
        source_name, YamlMark{}, "",
        absl::StrCat("the spec is ", text.size(), " bytes; the limit is ", limits.max_bytes));
  }
  std::istringstream in{std::string(text)};
  TreeBuilder builder(limits.max_depth);
  try {
    YAML::Parser parser(in);
    if (!parser.HandleNextDocument(builder) || !builder.root().has_value()) {
      return LocatedError(source_name, YamlMark{}, "", "the spec is empty");
    }
    parser.HandleNextDocument(builder);  // a second document throws from OnDocumentStart
  } catch (const TreeError& e) {
    return LocatedError(source_name, e.mark, e.path, e.reason);
  } catch (const YAML::Exception& e) {
    return LocatedError(source_name, ToMark(e.mark), builder.CurrentPath(),
                        absl::StrCat("invalid YAML: ", e.msg));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(AbslView(source_name), ": out of memory while reading the spec"));
  } catch (const std::exception& e) {
    return LocatedError(source_name, YamlMark{}, builder.CurrentPath(),
                        absl::StrCat("invalid YAML: ", e.what()));
  }
  return std::move(*builder.root());
}

std::string DescribeNode(const YamlNode& node) {
  switch (node.kind) {
    case YamlNode::Kind::kNull:
      return "null (no value)";
    case YamlNode::Kind::kMap:
      return "a mapping";
    case YamlNode::Kind::kSequence:
      return "a sequence";
    case YamlNode::Kind::kScalar:
      break;
  }
  return node.quoted ? absl::StrCat("the quoted string ", QuoteForMessage(node.value))
                     : QuoteForMessage(node.value);
}

absl::Status LocatedError(std::string_view source_name, YamlMark mark, std::string_view path,
                          std::string_view reason) {
  std::string one_line(reason);
  for (char& c : one_line) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return absl::InvalidArgumentError(
      absl::StrCat(AbslView(source_name), ":", mark.line, ":", mark.column, ": ",
                   path.empty() ? "spec" : AbslView(path), ": ", one_line));
}

std::string QuoteForMessage(std::string_view text) {
  constexpr size_t kMaxShown = 64;
  const bool shortened = text.size() > kMaxShown;
  if (shortened) text = text.substr(0, kMaxShown);
  return absl::StrCat("'", absl::CHexEscape(AbslView(text)), shortened ? "...'" : "'");
}

}  // namespace trainyard::config
