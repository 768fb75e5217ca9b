#include "worker/data/tokenizer.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <re2/re2.h>

#include <algorithm>
#include <array>
#include <climits>
#include <functional>
#include <queue>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/status.h"
#include "worker/data/unicode_nfc.h"
#include "worker/data/utf8.h"

namespace trainyard::worker::data {

using google::protobuf::Struct;
using google::protobuf::Value;

namespace {

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr absl::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The look-ahead idiom of byte-level patterns, which RE2 lacks (see the header): these two
// alternatives, one after the other.
constexpr absl::string_view kIdiomLookAhead = R"(\s+(?!\S))";
constexpr absl::string_view kIdiomRun = R"(\s+)";
// Ids a tokenizer may use: published vocabularies hold at most a few hundred thousand tokens,
// and every id below the largest costs a table entry.
constexpr int32_t kMaxTokens = 1 << 24;

// SentencePiece's stand-in for a space, U+2581.
constexpr absl::string_view kMetaspace = "\u2581";

// The byte-fallback token of byte `b`: <0x0A>.
std::string ByteToken(int b) { return absl::StrFormat("<0x%02X>", b); }

// Unicode's White_Space as the inside of an RE2 character class.
constexpr absl::string_view kWhiteSpaceClass = R"(\t\n\x0B\f\r\p{Z}\x{85})";

// Unicode's White_Space property.
bool IsWhiteSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The byte-level alphabet: the printable bytes of Latin-1 stand for themselves; the other 68
// (controls, space, DEL, NBSP, soft hyphen) for U+0100 onwards, in byte order.
struct ByteLevelAlphabet {
  std::array<std::string, 256> chars;
  std::array<uint32_t, 256> code_points{};
};

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet* alphabet = [] {
    auto* a = new ByteLevelAlphabet();
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      a->code_points[b] = printable ? b : next++;
      AppendUtf8(&a->chars[b], a->code_points[b]);
    }
    return a;
  }();
  return *alphabet;
}

absl::Status Bad(const std::string& source, absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", field, " ", why));
}

// The field `key` of `s`; nullptr when it is missing or null.
const Value* Field(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() || it->second.kind_case() == Value::kNullValue ? nullptr
                                                                               : &it->second;
}

bool Flag(const Struct& s, const std::string& key, bool otherwise = false) {
  const Value* v = Field(s, key);
  return v != nullptr && v->kind_case() == Value::kBoolValue ? v->bool_value() : otherwise;
}

std::string TypeOf(const Struct& s) {
  const Value* v = Field(s, "type");
  return v != nullptr ? v->string_value() : "";
}

// An id: a whole number in [0, kMaxTokens).
absl::StatusOr<int32_t> IdOf(const Value& v, const std::string& source, absl::string_view field) {
  const double d = v.number_value();
  if (v.kind_case() != Value::kNumberValue || !(d >= 0 && d < kMaxTokens) ||
      d != static_cast<int32_t>(d)) {
    return Bad(source, field,
               absl::StrCat("must be a token id (a whole number from 0 below ", kMaxTokens, ")"));
  }
  return static_cast<int32_t>(d);
}

// Escapes the reference's regex engine (Oniguruma, Unicode-aware) and RE2 (ASCII) read
// differently, beyond \s, \S, \d and \D, which are rewritten.
constexpr absl::string_view kUnsharedEscapes = "wWbBhHAzZGRXK";

// `pattern` in RE2's syntax: `\s` and `\S` as Unicode's White_Space, `\d` and `\D` as Unicode's
// decimal digits, capturing groups (named ones too) made non-capturing. Look-around, anchors and
// escapes whose meaning differs are refused.
absl::StatusOr<std::string> ToRe2Syntax(absl::string_view p, const std::string& source,
                                        const std::string& field) {
  std::string out;
  bool in_class = false, class_start = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        absl::StrAppend(&out, in_class ? "" : "[", kWhiteSpaceClass, in_class ? "" : "]");
      } else if (e == 'S') {
        if (in_class) return Bad(source, field, "has \\S inside a character class");
        absl::StrAppend(&out, "[^", kWhiteSpaceClass, "]");
      } else if (e == 'd' || e == 'D') {
        out += e == 'd' ? "\\p{Nd}" : "\\P{Nd}";
      } else if (absl::StrContains(kUnsharedEscapes, e)) {
        return Bad(source, field,
                   absl::StrCat("has \\", std::string(1, e),
                                ", which Trainyard's splitter (RE2) reads differently from the "
                                "reference (Oniguruma)"));
      } else {
        out += '\\', out += e;
      }
      class_start = false;
    } else if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:] whole
        const size_t close = p.find(":]", i + 2);
        if (close == absl::string_view::npos) return Bad(source, field, "has an open [:");
        absl::StrAppend(&out, p.substr(i, close + 2 - i));
        i = close + 1;
      } else {
        if (c == ']' && !class_start) in_class = false;
        out += c;
      }
      class_start = false;
    } else if (c == '[') {
      in_class = class_start = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
    } else if (c == '^' || c == '$') {
      return Bad(source, field,
                 absl::StrCat("has the anchor ", std::string(1, c),
                              ", which the reference reads at every line and RE2 at the text's "
                              "ends"));
    } else if (c == '(' && i + 1 < p.size() && p[i + 1] == '?') {
      const absl::string_view rest = p.substr(i + 1);
      for (absl::string_view look : {"?=", "?!", "?<=", "?<!"}) {
        if (absl::StartsWith(rest, look)) {
          return Bad(source, field,
                     absl::StrCat("has the look-around (", look,
                                  " …), which Trainyard's splitter (RE2) lacks beyond the "
                                  "whitespace idiom \\s+(?!\\S)|\\s+"));
        }
      }
      const bool named = absl::StartsWith(rest, "?P<") || absl::StartsWith(rest, "?<") ||
                         absl::StartsWith(rest, "?'");
      if (named) {  // (?P<name>…), (?<name>…), (?'name'…): a group like any other
        const size_t close = p.find_first_of(">'", i + 3);
        if (close == absl::string_view::npos) return Bad(source, field, "has an open group");
        out += "(?:";
        i = close;
      } else {
        out += c;
      }
    } else {
      out += c == '(' ? "(?:" : std::string(1, c);
    }
  }
  return out;
}

// `pattern`'s alternatives at its top level: split at each `|` outside groups and classes.
std::vector<absl::string_view> TopLevelAlternatives(absl::string_view p) {
  std::vector<absl::string_view> out;
  int depth = 0;
  bool in_class = false, class_start = false;
  size_t begin = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      ++i;
    } else if (in_class) {
      if (c == ']' && !class_start) in_class = false;
    } else if (c == '[') {
      in_class = true;
      if (i + 1 < p.size() && p[i + 1] == '^') ++i;
      class_start = true;
      continue;
    } else if (c == '(' || c == ')') {
      depth += c == '(' ? 1 : -1;
    } else if (c == '|' && depth == 0) {
      out.push_back(p.substr(begin, i - begin));
      begin = i + 1;
    }
    class_start = false;
  }
  out.push_back(p.substr(begin));
  return out;
}

}  // namespace

const std::string& ByteLevelChar(uint8_t byte) { return Alphabet().chars[byte]; }

int ByteOfLevelChar(uint32_t code_point) {
  static const auto* bytes = [] {
    auto* m = new absl::flat_hash_map<uint32_t, int>();
    for (int b = 0; b < 256; ++b) (*m)[Alphabet().code_points[b]] = b;
    return m;
  }();
  auto it = bytes->find(code_point);
  return it == bytes->end() ? -1 : it->second;
}

// One Split step: a pattern whose matches (and the text between them) become pieces. With the
// whitespace idiom (two consecutive top-level alternatives), group 1 is its run of whitespace.
struct Tokenizer::Split {
  std::unique_ptr<RE2> re;
  bool whitespace_group = false;

  static absl::StatusOr<std::unique_ptr<Split>> Compile(absl::string_view pattern,
                                                        const std::string& source,
                                                        const std::string& field) {
    auto split = std::make_unique<Split>();
    const std::vector<absl::string_view> alternatives = TopLevelAlternatives(pattern);
    std::string re2_pattern;
    for (size_t i = 0; i < alternatives.size(); ++i) {
      if (i > 0) re2_pattern += '|';
      if (!split->whitespace_group && i + 1 < alternatives.size() &&
          alternatives[i] == kIdiomLookAhead && alternatives[i + 1] == kIdiomRun) {
        absl::StrAppend(&re2_pattern, "([", kWhiteSpaceClass, "]+)");
        split->whitespace_group = true;
        ++i;
        continue;
      }
      TY_ASSIGN_OR_RETURN(const std::string re2, ToRe2Syntax(alternatives[i], source, field));
      re2_pattern += re2;
    }
    RE2::Options options;
    options.set_log_errors(false);
    split->re = std::make_unique<RE2>(re2_pattern, options);
    if (!split->re->ok()) {
      return Bad(source, field, absl::StrCat("does not compile: ", split->re->error()));
    }
    return split;
  }

  // `piece` cut at the matches: each match a piece, and each stretch between them.
  void Apply(absl::string_view piece, std::vector<absl::string_view>* out) const {
    re2::StringPiece match;
    const re2::StringPiece text(piece.data(), piece.size());
    size_t gap = 0, from = 0;
    // Only the whole match is asked for, which RE2 finds with its DFA; which alternative matched
    // is asked only of a run that the idiom could have matched.
    while (from < piece.size() && re->Match(text, from, piece.size(), RE2::UNANCHORED, &match, 1)) {
      const size_t start = match.data() - piece.data();
      size_t end = start + match.size();
      if (whitespace_group && end < piece.size()) end = GiveBack(piece, start, end);
      if (end == start) {  // an empty match splits nothing; look on from the next character
        if (start >= piece.size()) break;
        uint32_t skipped;
        from = start;
        if (!NextCodePoint(piece, &from, &skipped)) ++from;
        continue;
      }
      if (start > gap) out->push_back(piece.substr(gap, start - gap));
      out->push_back(piece.substr(start, end - start));
      gap = from = end;
    }
    if (gap < piece.size()) out->push_back(piece.substr(gap));
  }

  // (?!\S): where the idiom matched a run of more than one whitespace character that a
  // non-space follows, the run gives its last character back to it; the end of the match.
  size_t GiveBack(absl::string_view piece, size_t start, size_t end) const {
    size_t after = end;
    uint32_t next = 0;
    if (!NextCodePoint(piece, &after, &next) || IsWhiteSpace(next)) return end;
    size_t last = end - 1;
    while (last > start && (static_cast<uint8_t>(piece[last]) & 0xC0) == 0x80) --last;
    if (last == start) return end;  // one character: \s+ keeps it
    for (size_t at = start; at < end;) {
      uint32_t c;
      if (!NextCodePoint(piece, &at, &c) || !IsWhiteSpace(c)) return end;
    }
    re2::StringPiece groups[2];
    const re2::StringPiece text(piece.data(), piece.size());
    re->Match(text, start, end, RE2::ANCHOR_BOTH, groups, 2);
    return groups[1].data() != nullptr ? last : end;
  }
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

namespace {

// The step `i` of a Sequence's list `field`.`key`, or `field` itself when it is not a Sequence;
// for messages.
std::string StepName(const std::string& field, const std::string& key, size_t i, bool sequence) {
  return sequence ? absl::StrCat(field, ".", key, "[", i, "]") : field;
}

// `token` is <0xNN>: the byte it stands for, else −1.
int ByteOfToken(absl::string_view token) {
  int byte = 0;
  if (token.size() == 6 && absl::StartsWith(token, "<0x") && token[5] == '>' &&
      absl::SimpleHexAtoi(token.substr(3, 2), &byte) && token == ByteToken(byte)) {
    return byte;
  }
  return -1;
}

}  // namespace

std::string Tokenizer::Spell(absl::string_view token, bool first) const {
  if (metaspace_) {
    if (const int byte = ByteOfToken(token); metaspace_->decodes_bytes && byte >= 0) {
      return std::string(1, static_cast<char>(byte));
    }
    const bool drop = first && metaspace_->drops_first_marks;
    return absl::StrReplaceAll(token, {{kMetaspace, drop ? "" : " "}});
  }
  // ByteLevel: a token all of whose characters are in the alphabet is their bytes; any other
  // (an added token's content, say) stands for itself.
  std::string bytes;
  for (size_t at = 0; at < token.size();) {
    uint32_t c;
    const int b = NextCodePoint(token, &at, &c) ? ByteOfLevelChar(c) : -1;
    if (b < 0) return std::string(token);
    bytes += static_cast<char>(b);
  }
  return bytes;
}

void Tokenizer::SetToken(int32_t id, std::string token) {
  spelling_[id] = std::move(token);
  size_ = std::max(size_, id + 1);
}

absl::Status Tokenizer::ParseModel(const Struct& model, const std::string& source) {
  const std::string type = TypeOf(model);
  if (!type.empty() && type != "BPE") {
    return Bad(source, "model.type", absl::StrCat("is \"", type, "\"; Trainyard reads BPE"));
  }
  for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    const Value* v = Field(model, key);
    if (v != nullptr && !(v->kind_case() == Value::kStringValue && v->string_value().empty())) {
      return Bad(source, absl::StrCat("model.", key), "must be null");
    }
  }
  byte_fallback_ = Flag(model, "byte_fallback");
  fuse_unk_ = Flag(model, "fuse_unk");
  const Value* unk = Field(model, "unk_token");
  if (!metaspace_ && (byte_fallback_ || unk != nullptr)) {
    return Bad(source, byte_fallback_ ? "model.byte_fallback" : "model.unk_token",
               "is for SentencePiece's alphabet (\"▁\"), not with byte-level BPE");
  }
  if (byte_fallback_ && !metaspace_->decodes_bytes) {
    return Bad(source, "decoder", "has no ByteFallback, which model.byte_fallback needs");
  }
  ignore_merges_ = Flag(model, "ignore_merges");
  TY_RETURN_IF_ERROR(ParseVocab(model, source));
  level_ids_.fill(-1);
  for (int b = 0; !metaspace_ && b < 256; ++b) {
    if (auto it = vocab_.find(ByteLevelChar(b)); it != vocab_.end()) level_ids_[b] = it->second;
  }
  byte_tokens_.fill(-1);
  for (int b = 0; byte_fallback_ && b < 256; ++b) {
    if (auto it = vocab_.find(ByteToken(b)); it != vocab_.end()) byte_tokens_[b] = it->second;
  }
  if (unk != nullptr) {
    auto it = vocab_.find(unk->string_value());
    if (it == vocab_.end()) {
      return Bad(source, "model.unk_token",
                 absl::StrCat("(\"", unk->string_value(), "\") is not in the vocabulary"));
    }
    unk_ = it->second;
  }
  return ParseMerges(model, source);
}

absl::Status Tokenizer::ParseVocab(const Struct& model, const std::string& source) {
  const Value* vocab = Field(model, "vocab");
  if (vocab == nullptr || vocab->kind_case() != Value::kStructValue) {
    return Bad(source, "model.vocab", "must be an object of token → id");
  }
  for (const auto& [token, id_value] : vocab->struct_value().fields()) {
    const std::string field = absl::StrCat("model.vocab[\"", absl::CEscape(token), "\"]");
    TY_ASSIGN_OR_RETURN(const int32_t id, IdOf(id_value, source, field));
    for (size_t at = 0; at < token.size();) {
      uint32_t c;
      if (!NextCodePoint(token, &at, &c)) return Bad(source, field, "is not UTF-8");
    }
    vocab_[token] = id;
    SetToken(id, token);
  }
  return absl::OkStatus();
}

// Merges as the reference reads them: both tokens and the one they make are in the vocabulary,
// and a pair listed twice keeps its last rank.
absl::Status Tokenizer::ParseMerges(const Struct& model, const std::string& source) {
  const Value* merges = Field(model, "merges");
  if (merges == nullptr || merges->kind_case() != Value::kListValue) {
    return Bad(source, "model.merges", "must be a list");
  }
  int32_t rank = 0;
  for (const Value& merge : merges->list_value().values()) {
    const std::string field = absl::StrCat("model.merges[", rank, "]");
    std::string left, right;
    if (merge.kind_case() == Value::kStringValue) {
      const std::string& text = merge.string_value();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        return Bad(source, field, absl::StrCat("is \"", text, "\", not \"left right\""));
      }
      left = text.substr(0, space), right = text.substr(space + 1);
    } else if (merge.kind_case() == Value::kListValue && merge.list_value().values_size() == 2 &&
               merge.list_value().values(0).kind_case() == Value::kStringValue &&
               merge.list_value().values(1).kind_case() == Value::kStringValue) {
      left = merge.list_value().values(0).string_value();
      right = merge.list_value().values(1).string_value();
    } else {
      return Bad(source, field, "must be a \"left right\" string or a [left, right] pair");
    }
    auto merged = vocab_.find(left + right);
    if (merged == vocab_.end() || !vocab_.contains(left) || !vocab_.contains(right)) {
      return Bad(source, field,
                 absl::StrCat("makes \"", left, right, "\" of \"", left, "\" and \"", right,
                              "\", not all of which are in the vocabulary"));
    }
    merges_[PairKey(vocab_[left], vocab_[right])] = Merge{.rank = rank++, .id = merged->second};
  }
  return absl::OkStatus();
}

// The steps of a Sequence (their list under `key`), or `step` itself.
absl::StatusOr<std::vector<const Struct*>> Steps(const Struct& step, const std::string& key,
                                                 const std::string& source,
                                                 const std::string& field) {
  if (TypeOf(step) != "Sequence") return std::vector<const Struct*>{&step};
  const Value* list = Field(step, key);
  if (list == nullptr || list->kind_case() != Value::kListValue) {
    return Bad(source, absl::StrCat(field, ".", key), "must be a list");
  }
  std::vector<const Struct*> steps;
  for (const Value& v : list->list_value().values()) steps.push_back(&v.struct_value());
  return steps;
}

// A Replace step of `from` (a String pattern) to `to`.
bool Replaces(const Struct& step, absl::string_view from, absl::string_view to) {
  const Value* pattern = Field(step, "pattern");
  const Value* content = Field(step, "content");
  const Value* literal = pattern != nullptr && pattern->kind_case() == Value::kStructValue
                             ? Field(pattern->struct_value(), "String")
                             : nullptr;
  return TypeOf(step) == "Replace" && literal != nullptr && literal->string_value() == from &&
         content != nullptr && content->string_value() == to;
}

// Qwen2's normalizer, NFC; or Llama 2's: spaces become "▁", and one is put before each stretch
// of text.
absl::Status Tokenizer::ParseNormalizer(const Struct& step, const std::string& source) {
  if (TypeOf(step) == "NFC") {
    nfc_ = true;
    return absl::OkStatus();
  }
  TY_ASSIGN_OR_RETURN(const auto steps, Steps(step, "normalizers", source, "normalizer"));
  bool prepend = false, replace = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Struct& s = *steps[i];
    const Value* text = Field(s, "prepend");
    if (TypeOf(s) == "Prepend" && text != nullptr && text->string_value() == kMetaspace) {
      prepend = true;
    } else if (Replaces(s, " ", kMetaspace)) {
      replace = true;
    } else {
      return Bad(source, StepName("normalizer", "normalizers", i, steps[i] != &step),
                 absl::StrCat("is of type \"", TypeOf(s),
                              "\" (Trainyard reads none, NFC, or Llama 2's Prepend(\"▁\") and "
                              "Replace(\" \" → \"▁\"))"));
    }
  }
  if (!replace) return Bad(source, "normalizer", "does not replace \" \" with \"▁\"");
  metaspace_ = Metaspace{.prepend = prepend ? Metaspace::Prepend::kEveryStretch
                                            : Metaspace::Prepend::kNever};
  return absl::OkStatus();
}

absl::StatusOr<Tokenizer::Metaspace::Prepend> Tokenizer::PrependScheme(const Struct& step,
                                                                       const std::string& source,
                                                                       const std::string& field) {
  using Prepend = Metaspace::Prepend;
  const Value* scheme = Field(step, "prepend_scheme");
  if (scheme == nullptr) {
    return Flag(step, "add_prefix_space", /*otherwise=*/true) ? Prepend::kAlways : Prepend::kNever;
  }
  const std::string& name = scheme->string_value();
  if (name == "always") return Prepend::kAlways;
  if (name == "first") return Prepend::kFirst;
  if (name == "never") return Prepend::kNever;
  return Bad(source, field + ".prepend_scheme", "must be always, first or never");
}

absl::Status CheckReplacement(const Struct& step, const std::string& source,
                              const std::string& field) {
  const Value* replacement = Field(step, "replacement");
  if (replacement != nullptr && replacement->string_value() != kMetaspace) {
    return Bad(source, field + ".replacement", "must be \"▁\"");
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::ParseMetaspace(const Struct& step, const std::string& source) {
  TY_RETURN_IF_ERROR(CheckReplacement(step, source, "pre_tokenizer"));
  TY_ASSIGN_OR_RETURN(const Metaspace::Prepend prepend,
                      PrependScheme(step, source, "pre_tokenizer"));
  metaspace_ = Metaspace{.prepend = prepend, .split = Flag(step, "split", /*otherwise=*/true)};
  return absl::OkStatus();
}

// The leading spaces a Strip(" ", start, 0) step drops; −1 for any other Strip.
int StripStart(const Struct& step) {
  const Value* content = Field(step, "content");
  const Value* start = Field(step, "start");
  const Value* stop = Field(step, "stop");
  if (content == nullptr || content->string_value() != " " || start == nullptr ||
      start->kind_case() != Value::kNumberValue || (stop != nullptr && stop->number_value() != 0)) {
    return -1;
  }
  const double n = start->number_value();
  return n >= 0 && n <= 64 && n == static_cast<int>(n) ? static_cast<int>(n) : -1;
}

absl::Status Tokenizer::ParseDecoder(const Struct& step, const std::string& source) {
  const std::string type = TypeOf(step);
  if (!metaspace_) {
    if (type != "ByteLevel") return Bad(source, "decoder", "must be ByteLevel");
    return absl::OkStatus();
  }
  if (type == "Metaspace") {  // "▁" as a space; the first token's dropped unless never put in
    TY_RETURN_IF_ERROR(CheckReplacement(step, source, "decoder"));
    TY_ASSIGN_OR_RETURN(const Metaspace::Prepend prepend, PrependScheme(step, source, "decoder"));
    metaspace_->drops_first_marks = prepend != Metaspace::Prepend::kNever;
    return absl::OkStatus();
  }
  // Replace("▁" → " "), ByteFallback, Fuse, Strip(" ", start, 0): each once, in this order;
  // all but Replace may be left out.
  TY_ASSIGN_OR_RETURN(const auto steps, Steps(step, "decoders", source, "decoder"));
  int next = 0;  // the earliest kind the next step may be
  for (size_t i = 0; i < steps.size(); ++i) {
    const Struct& s = *steps[i];
    const int kind = Replaces(s, kMetaspace, " ")  ? 0
                     : TypeOf(s) == "ByteFallback" ? 1
                     : TypeOf(s) == "Fuse"         ? 2
                     : TypeOf(s) == "Strip"        ? 3
                                                   : -1;
    const int strip = kind == 3 ? StripStart(s) : 0;
    if (kind < next || strip < 0 || (kind == 3 && next < 3)) {
      return Bad(source, StepName("decoder", "decoders", i, steps[i] != &step),
                 absl::StrCat("is of type \"", TypeOf(s),
                              "\" there (Trainyard reads Replace(\"▁\" → \" \"), ByteFallback, "
                              "Fuse, then Strip(\" \", start, 0), in this order)"));
    }
    if (kind == 1) metaspace_->decodes_bytes = true;
    if (kind == 3) metaspace_->strip = strip;  // of the fused text
    next = kind + 1;
  }
  if (next == 0) return Bad(source, "decoder", "does not replace \"▁\" with \" \"");
  return absl::OkStatus();
}

absl::Status Tokenizer::ParsePreTokenizer(const Struct& step, const std::string& source) {
  TY_ASSIGN_OR_RETURN(const auto steps, Steps(step, "pretokenizers", source, "pre_tokenizer"));
  const std::string supported =
      "(Trainyard reads byte-level BPE: Split steps by a Regex, Isolated, then one ByteLevel)";
  for (size_t i = 0; i < steps.size(); ++i) {
    const Struct& s = *steps[i];
    const std::string name = StepName("pre_tokenizer", "pretokenizers", i, steps[i] != &step);
    const std::string type = TypeOf(s);
    if (type == "ByteLevel" && i + 1 == steps.size()) {
      if (Flag(s, "add_prefix_space"))
        return Bad(source, name + ".add_prefix_space", "must be false");
      if (Flag(s, "use_regex", /*otherwise=*/true)) {
        TY_ASSIGN_OR_RETURN(auto split, Split::Compile(kGpt2Pattern, source, name));
        splits_.push_back(std::move(split));
      }
      return absl::OkStatus();
    }
    const Value* pattern = Field(s, "pattern");
    const Value* regex = pattern != nullptr && pattern->kind_case() == Value::kStructValue
                             ? Field(pattern->struct_value(), "Regex")
                             : nullptr;
    const Value* behavior = Field(s, "behavior");
    if (type != "Split" || regex == nullptr || behavior == nullptr ||
        behavior->string_value() != "Isolated" || Flag(s, "invert")) {
      return Bad(source, name, absl::StrCat("is of type \"", type, "\" ", supported));
    }
    TY_ASSIGN_OR_RETURN(auto split,
                        Split::Compile(regex->string_value(), source, name + ".pattern"));
    splits_.push_back(std::move(split));
  }
  return Bad(source, "pre_tokenizer", absl::StrCat("does not end with ByteLevel ", supported));
}

absl::Status Tokenizer::ParsePostProcessor(const Struct& step, const std::string& source,
                                           const std::string& field) {
  const std::string type = TypeOf(step);
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "Sequence") {
    TY_ASSIGN_OR_RETURN(const auto steps, Steps(step, "processors", source, field));
    for (size_t i = 0; i < steps.size(); ++i) {
      TY_RETURN_IF_ERROR(
          ParsePostProcessor(*steps[i], source, absl::StrCat(field, ".processors[", i, "]")));
    }
    return absl::OkStatus();
  }
  if (type == "TemplateProcessing" && template_seen_) {
    return Bad(source, field,
               "is a second TemplateProcessing (Trainyard reads one template, single sequence)");
  }
  template_seen_ = true;
  if (type != "TemplateProcessing") {
    return Bad(source, field,
               absl::StrCat("is of type \"", type,
                            "\" (Trainyard reads TemplateProcessing, ByteLevel and Sequence)"));
  }
  const Value* single = Field(step, "single");
  const Value* specials = Field(step, "special_tokens");
  if (single == nullptr || single->kind_case() != Value::kListValue) {
    return Bad(source, field + ".single", "must be a list");
  }
  bool sequence = false;
  for (const Value& item : single->list_value().values()) {
    const Struct& s = item.struct_value();
    if (Field(s, "Sequence") != nullptr) {
      if (sequence) return Bad(source, field + ".single", "holds two sequences");
      sequence = true;
      continue;
    }
    const Value* special = Field(s, "SpecialToken");
    const Value* name = special != nullptr ? Field(special->struct_value(), "id") : nullptr;
    const Value* entry = name != nullptr && specials != nullptr
                             ? Field(specials->struct_value(), name->string_value())
                             : nullptr;
    const Value* ids = entry != nullptr ? Field(entry->struct_value(), "ids") : nullptr;
    if (ids == nullptr || ids->kind_case() != Value::kListValue) {
      return Bad(source, field + ".single",
                 "names a special token that special_tokens does not give ids for");
    }
    for (const Value& id : ids->list_value().values()) {
      TY_ASSIGN_OR_RETURN(const int32_t value, IdOf(id, source, field + ".special_tokens"));
      (sequence ? suffix_ : prefix_).push_back(value);
    }
  }
  if (!sequence) return Bad(source, field + ".single", "holds no sequence");
  return absl::OkStatus();
}

absl::Status Tokenizer::ParseAddedTokens(const Value& list, bool normalizer,
                                         const std::string& source) {
  if (list.kind_case() != Value::kListValue) return Bad(source, "added_tokens", "must be a list");
  for (int i = 0; i < list.list_value().values_size(); ++i) {
    const Struct& s = list.list_value().values(i).struct_value();
    const std::string field = absl::StrCat("added_tokens[", i, "]");
    const Value* content = Field(s, "content");
    const Value* id = Field(s, "id");
    if (content == nullptr || id == nullptr || content->string_value().empty()) {
      return Bad(source, field, "must have an id and a content");
    }
    const std::string& text = content->string_value();
    for (const char* key : {"single_word", "lstrip", "rstrip"}) {
      if (Flag(s, key)) {
        return Bad(source, absl::StrCat(field, ".", key),
                   absl::StrCat("is true for ", text, " (false only)"));
      }
    }
    if (normalizer && Flag(s, "normalized")) {  // found in the normalized text
      return Bad(source, field + ".normalized",
                 absl::StrCat("is true for ", text,
                              "; with a normalizer Trainyard matches added tokens in the text as "
                              "written only (false)"));
    }
    TY_ASSIGN_OR_RETURN(const int32_t value, IdOf(*id, source, field + ".id"));
    added_.push_back({text, value, Flag(s, "normalized", /*otherwise=*/!Flag(s, "special"))});
    SetToken(value, text);
  }
  std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  for (size_t i = 0; i < added_.size(); ++i) {
    added_by_byte_[static_cast<uint8_t>(added_[i].content[0])].push_back(static_cast<int32_t>(i));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Parse(const std::string& json,
                                                            const std::string& source) {
  Struct root;
  if (!google::protobuf::util::JsonStringToMessage(json, &root).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const Value* normalizer = Field(root, "normalizer");
  if (normalizer != nullptr) {
    TY_RETURN_IF_ERROR(t->ParseNormalizer(normalizer->struct_value(), source));
  }
  const Value* pre = Field(root, "pre_tokenizer");
  if (pre != nullptr && TypeOf(pre->struct_value()) == "Metaspace" && !t->metaspace_) {
    TY_RETURN_IF_ERROR(t->ParseMetaspace(pre->struct_value(), source));
  } else if (pre != nullptr && !t->metaspace_) {
    TY_RETURN_IF_ERROR(t->ParsePreTokenizer(pre->struct_value(), source));
  } else if (pre != nullptr || !t->metaspace_) {
    return Bad(source, "pre_tokenizer",
               t->metaspace_ ? "must be null after a normalizer that puts in \"▁\""
                             : "is missing (byte-level BPE ends it with ByteLevel)");
  }
  const Value* decoder = Field(root, "decoder");
  if (decoder == nullptr) return Bad(source, "decoder", "is missing");
  TY_RETURN_IF_ERROR(t->ParseDecoder(decoder->struct_value(), source));
  const Value* model = Field(root, "model");
  if (model == nullptr || model->kind_case() != Value::kStructValue) {
    return Bad(source, "model", "is missing");
  }
  TY_RETURN_IF_ERROR(t->ParseModel(model->struct_value(), source));
  if (const Value* post = Field(root, "post_processor"); post != nullptr) {
    TY_RETURN_IF_ERROR(t->ParsePostProcessor(post->struct_value(), source, "post_processor"));
  }
  if (const Value* added = Field(root, "added_tokens"); added != nullptr) {
    TY_RETURN_IF_ERROR(t->ParseAddedTokens(*added, normalizer != nullptr, source));
  }
  for (const auto* ids : {&t->prefix_, &t->suffix_}) {
    for (int32_t id : *ids) {
      if (!t->spelling_.contains(id)) {
        return Bad(source, "post_processor", absl::StrCat("adds id ", id, ", which no token has"));
      }
    }
  }
  return t;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(FileSystem& fs,
                                                           const std::string& path) {
  const std::string file = fs.IsDirectory(path) ? ChildPath(path, "tokenizer.json") : path;
  if (!fs.Exists(file)) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": no such file"));
  }
  TY_ASSIGN_OR_RETURN(const uint64_t bytes, fs.FileSize(file));
  if (bytes > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", bytes, " bytes; Trainyard reads a ",
                                                   "tokenizer.json of at most ", kMaxFileBytes,
                                                   " bytes"));
  }
  TY_ASSIGN_OR_RETURN(const std::string json, fs.ReadFile(file));
  return Parse(json, file);
}

const Tokenizer::AddedToken* Tokenizer::AddedTokenAt(absl::string_view text,
                                                     bool normalized) const {
  for (int32_t i : added_by_byte_[static_cast<uint8_t>(text[0])]) {  // longest first
    const AddedToken& a = added_[i];
    if (a.normalized == normalized && absl::StartsWith(text, a.content)) return &a;
  }
  return nullptr;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text) const {
  if (text.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the text is ", text.size(), " bytes; Trainyard encodes at most ", INT32_MAX, " at once"));
  }
  for (size_t at = 0; at < text.size();) {
    uint32_t c;
    if (!NextCodePoint(text, &at, &c)) {
      return absl::InvalidArgumentError(absl::StrCat("the text is not UTF-8 (at byte ", at, ")"));
    }
  }
  std::vector<int32_t> ids = prefix_;
  WordCache cache;
  EncodeBetweenAdded(text, 0, /*normalized=*/false, &cache, &ids);
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

// As the reference matches added tokens: those with normalized false in the text (the longest
// at each position), then those with normalized true in the stretches between them; what is
// left is split and merged. `offset`: where `text` starts in the whole.
void Tokenizer::EncodeBetweenAdded(absl::string_view text, size_t offset, bool normalized,
                                   WordCache* cache, std::vector<int32_t>* out) const {
  auto stretch = [&](size_t from, size_t to) {
    const absl::string_view piece = text.substr(from, to - from);
    if (normalized) {
      EncodeSegment(piece, offset + from == 0, cache, out);
    } else if (nfc_ && MayChangeUnderNfc(piece)) {
      // The normalizer's text is what the pre-tokenizer splits.
      EncodeBetweenAdded(ToNfc(piece), offset + from, /*normalized=*/true, cache, out);
    } else {
      EncodeBetweenAdded(piece, offset + from, /*normalized=*/true, cache, out);
    }
  };
  size_t segment = 0;
  for (size_t at = 0; at < text.size();) {
    const AddedToken* added = AddedTokenAt(text.substr(at), normalized);
    if (added == nullptr) {
      ++at;
      continue;
    }
    stretch(segment, at);
    out->push_back(added->id);
    segment = at += added->content.size();
  }
  stretch(segment, text.size());
}

void Tokenizer::EncodeSegment(absl::string_view text, bool first, WordCache* cache,
                              std::vector<int32_t>* out) const {
  if (metaspace_) return EncodeMetaspace(text, first, cache, out);
  std::vector<absl::string_view> pieces;
  if (!text.empty()) pieces.push_back(text);
  for (const auto& split : splits_) {
    std::vector<absl::string_view> next;
    for (absl::string_view piece : pieces) split->Apply(piece, &next);
    pieces = std::move(next);
  }
  for (absl::string_view piece : pieces) EncodeWord(piece, cache, out);
}

void Tokenizer::EncodeMetaspace(absl::string_view text, bool first, WordCache* cache,
                                std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::string s = absl::StrReplaceAll(text, {{" ", kMetaspace}});
  using Prepend = Metaspace::Prepend;
  const Prepend prepend = metaspace_->prepend;
  if (prepend == Prepend::kEveryStretch ||
      ((prepend == Prepend::kAlways || (prepend == Prepend::kFirst && first)) &&
       !absl::StartsWith(s, kMetaspace))) {
    s = absl::StrCat(kMetaspace, s);
  }
  if (!metaspace_->split) return EncodeWord(s, cache, out);
  // Each word from one "▁" to the next merges alone.
  const absl::string_view all(s);
  size_t start = 0;
  for (size_t at = all.find(kMetaspace, 1); at != absl::string_view::npos;
       at = all.find(kMetaspace, at + 1)) {
    EncodeWord(all.substr(start, at - start), cache, out);
    start = at;
  }
  EncodeWord(all.substr(start), cache, out);
}

struct Tokenizer::Symbol {
  int32_t id;
  int prev, next;
};

// As the reference's BPE model does, before any merge: each character the vocabulary has is its
// token; one it lacks is its UTF-8 bytes' <0xNN> tokens with byte_fallback when all are there,
// else the unknown token, else (no unknown token) nothing. An unknown token waits for the next
// character the vocabulary has, or the word's end, fusing with the next unknown one when
// fuse_unk; byte tokens do not end its wait, so they come out before it. In the byte-level
// alphabet each byte is a character.
std::vector<Tokenizer::Symbol> Tokenizer::InitialSymbols(absl::string_view word) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id) {
    const int i = static_cast<int>(symbols.size());
    symbols.push_back({id, i - 1, i + 1});
  };
  if (!metaspace_) {
    for (char b : word) {
      if (const int32_t id = level_ids_[static_cast<uint8_t>(b)]; id >= 0) add(id);
    }
  }
  bool unk_waits = false;
  for (size_t at = 0; metaspace_ && at < word.size();) {
    const size_t begin = at;
    uint32_t c;
    NextCodePoint(word, &at, &c);  // the word is UTF-8 by construction
    const absl::string_view character = word.substr(begin, at - begin);
    if (auto it = vocab_.find(character); it != vocab_.end()) {
      if (std::exchange(unk_waits, false)) add(unk_);
      add(it->second);
    } else if (byte_fallback_ && std::all_of(character.begin(), character.end(), [&](char b) {
                 return byte_tokens_[static_cast<uint8_t>(b)] >= 0;
               })) {
      for (char b : character) add(byte_tokens_[static_cast<uint8_t>(b)]);
    } else if (unk_ >= 0) {
      if (unk_waits && !fuse_unk_) add(unk_);
      unk_waits = true;
    }
  }
  if (unk_waits) add(unk_);
  if (!symbols.empty()) symbols.back().next = -1;
  return symbols;
}

const Tokenizer::Merge* Tokenizer::MergeOf(int32_t left, int32_t right) const {
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void Tokenizer::EncodeWord(absl::string_view word, WordCache* cache,
                           std::vector<int32_t>* out) const {
  if (auto hit = cache->find(word); hit != cache->end()) {
    out->insert(out->end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int32_t> ids = MergeWord(word);
  out->insert(out->end(), ids.begin(), ids.end());
  if (word.size() > kLongestCachedWord) return;  // an unsplit text, say: it will not repeat
  if (cache->size() >= kCachedWords) cache->clear();
  cache->emplace(word, std::move(ids));
}

std::vector<int32_t> Tokenizer::MergeWord(absl::string_view word) const {
  if (ignore_merges_) {
    std::string spelled;  // in the alphabet, as the vocabulary spells it
    if (metaspace_) {
      spelled = std::string(word);
    } else {
      for (char b : word) spelled += ByteLevelChar(static_cast<uint8_t>(b));
    }
    if (auto it = vocab_.find(spelled); it != vocab_.end()) return {it->second};
  }
  std::vector<Symbol> symbols = InitialSymbols(word);
  if (symbols.empty()) return {};
  // The symbols as a linked list, and their adjacent pairs that merge on a heap by (rank, left
  // symbol's position): the lowest rank merges first, the leftmost of equal ones first, as the
  // reference does. An entry whose pair has since changed is skipped.
  using Candidate = std::pair<int32_t, int>;  // (rank, left symbol)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto merge_of = [&](int left) -> const Merge* {
    const int right = left < 0 ? -1 : symbols[left].next;
    return right < 0 ? nullptr : MergeOf(symbols[left].id, symbols[right].id);
  };
  auto offer = [&](int left) {
    if (const Merge* m = merge_of(left); m != nullptr) heap.push({m->rank, left});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) offer(i);
  std::vector<bool> merged_away(symbols.size(), false);
  while (!heap.empty()) {
    const auto [rank, left] = heap.top();
    heap.pop();
    const Merge* m = merged_away[left] ? nullptr : merge_of(left);
    if (m == nullptr || m->rank != rank) continue;
    const int right = symbols[left].next;
    symbols[left].id = m->id;
    merged_away[right] = true;
    symbols[left].next = symbols[right].next;
    if (symbols[left].next >= 0) symbols[symbols[left].next].prev = left;
    offer(symbols[left].prev);
    offer(left);
  }
  std::vector<int32_t> ids;
  for (int i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
  return ids;
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  auto it = spelling_.find(id);
  return it == spelling_.end() ? absl::StrCat("<id ", id, ">") : Spell(it->second, false);
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = spelling_.find(ids[i]);
    text += it == spelling_.end() ? absl::StrCat("<id ", ids[i], ">") : Spell(it->second, i == 0);
  }
  const int strip = metaspace_ ? metaspace_->strip : 0;
  int spaces = 0;
  while (spaces < strip && spaces < static_cast<int>(text.size()) && text[spaces] == ' ') {
    ++spaces;
  }
  return text.substr(spaces);
}

}  // namespace trainyard::worker::data
