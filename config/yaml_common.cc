#include "config/yaml_common.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace trainyard::config {
namespace {

// Thrown inside this file when the text leaves the common form; caught in ParseCommonYaml.
struct NotCommon {};

bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.' || c == '/';
}

// Plain scalars in the common form are spelled from these (so no quoting rule, indicator or
// comment can be in doubt) and start with a letter, a digit, '.', '/', '_' or '-' before a digit.
bool IsPlainChar(char c) {
  return IsKeyChar(c) || c == ' ' || c == '+' || c == '=' || c == '~' || c == '@' || c == '(' ||
         c == ')' || c == '<' || c == '>' || c == '^' || c == '$' || c == ';' || c == '*';
}

bool IsNullWord(std::string_view word) {
  return word == "~" || word == "null" || word == "Null" || word == "NULL";
}

struct Line {
  int number = 0;  // 1-based
  int indent = 0;  // leading spaces
  std::string_view content;
};

class CommonReader {
 public:
  CommonReader(std::string_view text, int max_depth) : max_depth_(max_depth) { Split(text); }

  YamlNode Read() {
    if (lines_.empty() || lines_[0].indent != 0) throw NotCommon{};
    YamlNode root = BlockMap(0, 1);
    if (next_ != lines_.size()) throw NotCommon{};  // an indentation yaml-cpp must judge
    return root;
  }

 private:
  void Split(std::string_view text) {
    for (char c : text) {
      const auto byte = static_cast<unsigned char>(c);
      if (byte >= 0x7f || (byte < 0x20 && c != '\n')) throw NotCommon{};  // tabs, CR, UTF-8
    }
    int number = 0;
    while (!text.empty()) {
      ++number;
      const size_t end = text.find('\n');
      std::string_view line = text.substr(0, end);
      text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
      const size_t indent = line.find_first_not_of(' ');
      if (indent == std::string_view::npos || line[indent] == '#') continue;
      std::string_view content = line.substr(indent);
      if (content[0] == '%' || content.substr(0, 3) == "---" || content.substr(0, 3) == "...") {
        throw NotCommon{};
      }
      content = content.substr(0, content.find_last_not_of(' ') + 1);
      lines_.push_back(Line{number, static_cast<int>(indent), content});
    }
  }

  void Nest(int level) const {
    if (level > max_depth_) throw NotCommon{};
  }

  static bool IsItem(std::string_view content) {
    return content == "-" || content.substr(0, 2) == "- ";
  }

  YamlNode Block(int indent, int level) {
    return IsItem(lines_[next_].content) ? BlockSequence(indent, level) : BlockMap(indent, level);
  }

  YamlNode BlockMap(int indent, int level) {
    Nest(level);
    YamlNode map;
    map.kind = YamlNode::Kind::kMap;
    map.mark = YamlMark{lines_[next_].number, indent + 1};
    std::set<std::string, std::less<>> keys;
    while (next_ < lines_.size() && lines_[next_].indent == indent) {
      const Line& line = lines_[next_];
      std::string_view text = line.content;
      size_t pos = 0;
      while (pos < text.size() && IsKeyChar(text[pos])) ++pos;
      if (pos == 0 || text[0] == '-' || pos == text.size() || text[pos] != ':' ||
          (pos + 1 < text.size() && text[pos + 1] != ' ')) {
        throw NotCommon{};
      }
      YamlEntry entry;
      entry.key = std::string(text.substr(0, pos));
      entry.key_mark = YamlMark{line.number, indent + 1};
      if (IsNullWord(entry.key) || !keys.insert(entry.key).second) throw NotCommon{};
      pos = text.find_first_not_of(' ', pos + 1);
      ++next_;
      if (pos == std::string_view::npos || text[pos] == '#') {
        // A value on the lines below; none (a null) is left to yaml-cpp.
        if (next_ == lines_.size() || lines_[next_].indent <= indent) throw NotCommon{};
        entry.value = Block(lines_[next_].indent, level + 1);
      } else {
        entry.value = InlineValue(line, pos, level + 1);
        if (next_ < lines_.size() && lines_[next_].indent > indent) throw NotCommon{};
      }
      map.entries.push_back(std::move(entry));
    }
    return map;
  }

  YamlNode BlockSequence(int indent, int level) {
    Nest(level);
    YamlNode sequence;
    sequence.kind = YamlNode::Kind::kSequence;
    sequence.mark = YamlMark{lines_[next_].number, indent + 1};
    while (next_ < lines_.size() && lines_[next_].indent == indent &&
           IsItem(lines_[next_].content)) {
      const Line& line = lines_[next_];
      const size_t pos = line.content.find_first_not_of(' ', 1);
      if (pos == std::string_view::npos || line.content[pos] == '#') throw NotCommon{};
      ++next_;
      sequence.items.push_back(InlineValue(line, pos, level + 1));
      if (next_ < lines_.size() && lines_[next_].indent > indent) throw NotCommon{};
    }
    return sequence;
  }

  // The value that starts at content[pos] and ends the line (but for a comment).
  YamlNode InlineValue(const Line& line, size_t pos, int level) {
    const std::string_view text = line.content;
    const char c = text[pos];
    YamlNode value;
    if (c == '{' || c == '[') {
      value = Flow(line, pos, level);
    } else if (c == '\'' || c == '"') {
      value = Quoted(line, pos);
    } else {
      size_t end = text.find(" #", pos);
      if (end == std::string_view::npos) end = text.size();
      value = Plain(line, pos, end);
      pos = end;
    }
    // Only a comment may follow.
    const size_t rest = text.find_first_not_of(' ', pos);
    if (rest != std::string_view::npos && (text[rest] != '#' || rest == pos)) throw NotCommon{};
    return value;
  }

  static YamlNode Plain(const Line& line, size_t begin, size_t end) {
    std::string_view word = line.content.substr(begin, end - begin);
    word = word.substr(0, word.find_last_not_of(' ') + 1);
    const char first = word.empty() ? ' ' : word[0];
    const bool starts_well =
        IsKeyChar(first) && (first != '-' || (word.size() > 1 && word[1] >= '0' && word[1] <= '9'));
    if (!starts_well || IsNullWord(word)) throw NotCommon{};
    for (char c : word) {
      if (!IsPlainChar(c)) throw NotCommon{};
    }
    YamlNode node;
    node.kind = YamlNode::Kind::kScalar;
    node.mark = YamlMark{line.number, line.indent + static_cast<int>(begin) + 1};
    node.value = std::string(word);
    return node;
  }

  // A quoted scalar on one line, without escapes; `pos` moves past its closing quote.
  static YamlNode Quoted(const Line& line, size_t& pos) {
    const std::string_view text = line.content;
    const char quote = text[pos];
    YamlNode node;
    node.kind = YamlNode::Kind::kScalar;
    node.quoted = true;
    node.mark = YamlMark{line.number, line.indent + static_cast<int>(pos) + 1};
    for (size_t i = pos + 1;; ++i) {
      if (i == text.size() || text[i] == '\\') throw NotCommon{};
      if (text[i] != quote) {
        node.value.push_back(text[i]);
      } else if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
        node.value.push_back('\'');
        ++i;
      } else {
        pos = i + 1;
        return node;
      }
    }
  }

  // A flow mapping or sequence, closed on its line; `pos` moves past its closing bracket.
  YamlNode Flow(const Line& line, size_t& pos, int level) {
    Nest(level);
    const std::string_view text = line.content;
    const bool is_map = text[pos] == '{';
    YamlNode node;
    node.kind = is_map ? YamlNode::Kind::kMap : YamlNode::Kind::kSequence;
    node.mark = YamlMark{line.number, line.indent + static_cast<int>(pos) + 1};
    const char close = is_map ? '}' : ']';
    std::set<std::string, std::less<>> keys;
    pos = SkipSpaces(text, pos + 1);
    if (pos < text.size() && text[pos] == close) {
      ++pos;
      return node;
    }
    while (true) {
      if (is_map) {
        const size_t begin = pos;
        while (pos < text.size() && IsKeyChar(text[pos])) ++pos;
        if (pos == begin || text[begin] == '-' || pos + 1 >= text.size() || text[pos] != ':' ||
            text[pos + 1] != ' ') {
          throw NotCommon{};
        }
        YamlEntry entry;
        entry.key = std::string(text.substr(begin, pos - begin));
        entry.key_mark = YamlMark{line.number, line.indent + static_cast<int>(begin) + 1};
        if (IsNullWord(entry.key) || !keys.insert(entry.key).second) throw NotCommon{};
        pos = SkipSpaces(text, pos + 1);
        entry.value = FlowValue(line, pos, level + 1);
        node.entries.push_back(std::move(entry));
      } else {
        node.items.push_back(FlowValue(line, pos, level + 1));
      }
      pos = SkipSpaces(text, pos);
      if (pos == text.size()) throw NotCommon{};
      if (text[pos] == close) {
        ++pos;
        return node;
      }
      if (text[pos] != ',') throw NotCommon{};
      pos = SkipSpaces(text, pos + 1);
      if (pos == text.size() || text[pos] == close) throw NotCommon{};  // a trailing comma
    }
  }

  YamlNode FlowValue(const Line& line, size_t& pos, int level) {
    const std::string_view text = line.content;
    if (pos == text.size()) throw NotCommon{};
    const char c = text[pos];
    if (c == '{' || c == '[') return Flow(line, pos, level);
    if (c == '\'' || c == '"') return Quoted(line, pos);
    const size_t end = text.find_first_of(",]}", pos);
    if (end == std::string_view::npos) throw NotCommon{};
    YamlNode node = Plain(line, pos, end);
    pos = end;
    return node;
  }

  static size_t SkipSpaces(std::string_view text, size_t pos) {
    while (pos < text.size() && text[pos] == ' ') ++pos;
    return pos;
  }

  const int max_depth_;
  std::vector<Line> lines_;
  size_t next_ = 0;
};

}  // namespace

bool SameYamlTree(const YamlNode& a, const YamlNode& b) {
  if (a.kind != b.kind || a.mark.line != b.mark.line || a.mark.column != b.mark.column ||
      a.value != b.value || a.quoted != b.quoted || a.entries.size() != b.entries.size() ||
      a.items.size() != b.items.size()) {
    return false;
  }
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const YamlEntry& x = a.entries[i];
    const YamlEntry& y = b.entries[i];
    if (x.key != y.key || x.key_mark.line != y.key_mark.line ||
        x.key_mark.column != y.key_mark.column || !SameYamlTree(x.value, y.value)) {
      return false;
    }
  }
  for (size_t i = 0; i < a.items.size(); ++i) {
    if (!SameYamlTree(a.items[i], b.items[i])) return false;
  }
  return true;
}

std::optional<YamlNode> ParseCommonYaml(std::string_view text, int max_depth) {
  try {
    return CommonReader(text, max_depth).Read();
  } catch (const NotCommon&) {
    return std::nullopt;
  }
}

}  // namespace trainyard::config
