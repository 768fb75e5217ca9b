// The byte-level BPE tokenizer (worker/data/tokenizer.h): its alphabet, splits, merges, added
// and template tokens by hand; every text of two trained tokenizers (GPT-2's and Llama 3's
// styles) against the independent oracle (tests/oracle/bpe_oracle.py); and what it refuses.
#include "worker/data/tokenizer.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_env.h"

namespace trainyard::worker::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Quoted(const std::string& s) {
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"\"", "\\\""}}), "\"");
}

// A GPT-2-style tokenizer.json: the 256 bytes as ids 0–255 (in byte order), then `extra`
// tokens (byte-level spellings) from 256 on, `merges` in rank order, and `rest` (more fields).
std::string Json(const std::vector<std::string>& extra, const std::vector<std::string>& merges,
                 const std::string& rest = "",
                 const std::string& pre = R"({"type": "ByteLevel", "add_prefix_space": false})") {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    absl::StrAppend(&vocab, b ? ", " : "", Quoted(ByteLevelChar(b)), ": ", b);
  }
  for (size_t i = 0; i < extra.size(); ++i) {
    absl::StrAppend(&vocab, ", ", Quoted(extra[i]), ": ", 256 + i);
  }
  std::string merge_list;
  for (size_t i = 0; i < merges.size(); ++i) {
    absl::StrAppend(&merge_list, i ? ", " : "", Quoted(merges[i]));
  }
  return absl::StrCat(R"({"normalizer": null, "pre_tokenizer": )", pre,
                      R"(, "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {)",
                      vocab, "}, \"merges\": [", merge_list, "]", rest, "}}");
}

std::unique_ptr<Tokenizer> Make(const std::string& json) {
  auto t = Tokenizer::Parse(json, "tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<int32_t> Ids(const Tokenizer& t, const std::string& text) {
  auto ids = t.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(Tokenizer, TheByteLevelAlphabetIsGpt2s) {
  std::set<std::string> chars;
  for (int b = 0; b < 256; ++b) {
    chars.insert(ByteLevelChar(b));
    uint32_t cp = 0;  // the single code point, decoded by hand
    const std::string& s = ByteLevelChar(b);
    cp = s.size() == 1 ? s[0] : ((s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    EXPECT_EQ(ByteOfLevelChar(cp), b);
  }
  EXPECT_EQ(chars.size(), 256u);
  EXPECT_EQ(ByteLevelChar(' '), "\u0120");   // Ġ
  EXPECT_EQ(ByteLevelChar('\n'), "\u010A");  // Ċ
  EXPECT_EQ(ByteLevelChar('A'), "A");
  EXPECT_EQ(ByteLevelChar(0xAD), "\u0143");  // the soft hyphen, the last byte moved
  EXPECT_EQ(ByteLevelChar(0xE9), "\u00E9");  // é stands for itself
  EXPECT_EQ(ByteOfLevelChar(0x4E00), -1);
}

// GPT-2's pattern: a run of spaces leaves its last one to the word after it, and merges never
// cross a piece.
TEST(Tokenizer, WhitespaceRunsLeaveTheirLastSpaceToTheNextWord) {
  const std::string sp = ByteLevelChar(' ');
  auto t = Make(Json({sp + sp, sp + "b"}, {sp + " " + sp, sp + " b"}));
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Ids(*t, "a   b"), ElementsAre('a', 256, 257));         // "a" "  " " b"
  EXPECT_THAT(Ids(*t, "a    "), ElementsAre('a', 256, 256));         // at the end: the whole run
  EXPECT_THAT(Ids(*t, "a \n b"), ElementsAre('a', ' ', '\n', 257));  // " \n" then " b"
  EXPECT_THAT(Ids(*t, "ab"), ElementsAre('a', 'b'));                 // one piece, no merge for it
}

TEST(Tokenizer, TheLowestRankedPairMergesFirst) {
  auto ab_first = Make(Json({"ab", "bc"}, {"a b", "b c"}));
  auto bc_first = Make(Json({"ab", "bc"}, {"b c", "a b"}));
  ASSERT_NE(ab_first, nullptr);
  ASSERT_NE(bc_first, nullptr);
  EXPECT_THAT(Ids(*ab_first, "abc"), ElementsAre(256, 'c'));
  EXPECT_THAT(Ids(*bc_first, "abc"), ElementsAre('a', 257));
  // Every occurrence, left to right: "aaa" is "aa" "a".
  auto aa = Make(Json({"aa"}, {"a a"}));
  ASSERT_NE(aa, nullptr);
  EXPECT_THAT(Ids(*aa, "aaaaa"), ElementsAre(256, 256, 'a'));
  // Merges as [left, right] pairs read the same.
  auto pairs = Make(absl::StrReplaceAll(Json({"ab"}, {"a b"}), {{"\"a b\"", "[\"a\", \"b\"]"}}));
  ASSERT_NE(pairs, nullptr);
  EXPECT_THAT(Ids(*pairs, "ab"), ElementsAre(256));
}

TEST(Tokenizer, IgnoreMergesTakesAWholeWordFromTheVocabulary) {
  const std::string json = Json({"abc"}, {}, ", \"ignore_merges\": true");
  auto t = Make(json);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Ids(*t, "abc"), ElementsAre(256));
  auto without = Make(Json({"abc"}, {}));
  ASSERT_NE(without, nullptr);
  EXPECT_THAT(Ids(*without, "abc"), ElementsAre('a', 'b', 'c'));
}

TEST(Tokenizer, AddedTokensSplitTheTextAndTheTemplateAddsTheBeginning) {
  const std::string added = R"(, "added_tokens": [
      {"id": 300, "content": "<|eot|>", "special": true},
      {"id": 301, "content": "<|eot_id|>", "special": true},
      {"id": 302, "content": "<|begin|>", "special": true},
      {"id": 303, "content": "<|eot|>!", "special": false, "normalized": false}],
    "post_processor": {"type": "Sequence", "processors": [{"type": "ByteLevel"},
      {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|begin|>"}},
       {"Sequence": {"id": "A"}}], "special_tokens": {"<|begin|>": {"ids": [302]}}}]})";
  std::string json = Json({"xy"}, {"x y"});
  json.insert(json.size() - 1, added);
  auto t = Make(json);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->size(), 304);
  // The longest added token at each position; pieces do not merge across one.
  EXPECT_THAT(Ids(*t, "x<|eot_id|>y<|eot|>xy<|eot|>!"),
              ElementsAre(302, 'x', 301, 'y', 300, 256, 303));
  EXPECT_EQ(t->Decode(Ids(*t, "x<|eot_id|>y")), "<|begin|>x<|eot_id|>y");
  EXPECT_EQ(t->TokenBytes(290), "<id 290>");  // no token has it
  EXPECT_EQ(t->TokenBytes(-1), "<id -1>");
}

TEST(Tokenizer, EveryTextDecodesBackToItself) {
  auto t = Make(Json({}, {}));
  ASSERT_NE(t, nullptr);
  constexpr char kText[] = "tabs\t, NUL \0, DEL \x7f, é, 日本, 🙂, \u00a0, \u3000 and \r\n";
  const std::string text(kText, sizeof(kText) - 1);
  EXPECT_EQ(t->Decode(Ids(*t, text)), text);
  EXPECT_EQ(Ids(*t, "").size(), 0u);
}

void ExpectRefused(const std::string& json, const std::string& message) {
  auto t = Tokenizer::Parse(json, "tok.json");
  ASSERT_FALSE(t.ok()) << "accepted, expected: " << message;
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(message));
}

// Added tokens with normalized false are cut out first, those with normalized true only from the
// stretches between them (a special token's default is false, another's true), as the reference
// does; one template at most.
TEST(Tokenizer, AddedTokensMatchInTheReferencesTwoPasses) {
  std::string json = Json({}, {});
  json.insert(json.size() - 1, R"(, "added_tokens": [
      {"id": 300, "content": "ab", "normalized": false},
      {"id": 301, "content": "xa", "normalized": true},
      {"id": 302, "content": "yb", "special": false},
      {"id": 303, "content": "by", "special": true}])");
  auto t = Make(json);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Ids(*t, "xab"), ElementsAre('x', 300));  // one pass would give "xa" "b"
  EXPECT_THAT(Ids(*t, "xaxa"), ElementsAre(301, 301));
  EXPECT_THAT(Ids(*t, "yby"), ElementsAre('y', 303));  // "by" is special: the first pass
  std::string two = Json({}, {});
  two.insert(two.size() - 1, R"(, "added_tokens": [{"id": 300, "content": "<s>"}],
    "post_processor": {"type": "Sequence", "processors": [
      {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
       {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [300]}}},
      {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
       {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [300]}}}]})");
  ExpectRefused(two, "tok.json: post_processor.processors[1] is a second TemplateProcessing");
}

// `json` with the first `from` in it replaced by `to`.
std::string Replaced(std::string json, const std::string& from, const std::string& to) {
  const size_t at = json.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? json : json.replace(at, from.size(), to);
}

TEST(Tokenizer, WhatItCannotComputeIsRefusedNamingTheField) {
  const std::string good = Json({}, {});
  auto with = [&](const std::string& from, const std::string& to) {
    return Replaced(good, from, to);
  };
  ExpectRefused("[1, 2]", "tok.json: not a JSON object");
  ExpectRefused(with(R"("normalizer": null)", R"("normalizer": {"type": "NFKC"})"),
                "tok.json: normalizer is of type \"NFKC\"");
  ExpectRefused(with(R"("type": "BPE")", R"("type": "WordPiece")"),
                "tok.json: model.type is \"WordPiece\"; Trainyard reads BPE");
  ExpectRefused(with(R"("type": "BPE")", R"("type": "BPE", "byte_fallback": true)"),
                "tok.json: model.byte_fallback is for SentencePiece's alphabet");
  ExpectRefused(with(R"("type": "BPE")", R"("type": "BPE", "dropout": 0.1)"),
                "tok.json: model.dropout must be null");
  ExpectRefused(with(R"("add_prefix_space": false)", R"("add_prefix_space": true)"),
                "tok.json: pre_tokenizer.add_prefix_space must be false");
  ExpectRefused(
      with(R"({"type": "ByteLevel", "add_prefix_space": false})", R"({"type": "Whitespace"})"),
      "tok.json: pre_tokenizer is of type \"Whitespace\"");
  const std::string split = R"({"type": "Sequence", "pretokenizers": [{"type": "Split",
      "pattern": {"Regex": "(?<=a)b"}, "behavior": "Isolated"}, {"type": "ByteLevel"}]})";
  ExpectRefused(with(R"({"type": "ByteLevel", "add_prefix_space": false})", split),
                "tok.json: pre_tokenizer.pretokenizers[0].pattern has the look-around (?<=");
  ExpectRefused(with(R"("decoder": {"type": "ByteLevel"})", R"("decoder": null)"),
                "tok.json: decoder is missing");
  ExpectRefused(with(R"("merges": [)", R"("merges": ["abc", )"),
                "tok.json: model.merges[0] is \"abc\", not \"left right\"");
  auto t = Make(good);
  ASSERT_NE(t, nullptr);
  auto bad_text = t->Encode("caf\xe9");
  ASSERT_FALSE(bad_text.ok());
  EXPECT_EQ(bad_text.status().message(), "the text is not UTF-8 (at byte 3)");
}

// Each text of the oracle's, encoded by both.
void CheckAgainstTheOracle(const std::string& style) {
  const std::filesystem::path dir = testenv::MakeScratchDir("bpe_" + style);
  const std::string cmd =
      absl::StrCat(testenv::PythonInterpreter(), " ", testenv::SourceDir(),
                   "/tests/oracle/bpe_oracle.py cases ", style, " ", dir.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto read = [&](const char* name) {
    std::ifstream in(dir / name);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  auto t = Tokenizer::Parse(read("tokenizer.json"), style);
  ASSERT_TRUE(t.ok()) << t.status();
  google::protobuf::ListValue texts, ids;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(read("texts.json"), &texts).ok());
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(read("ids.json"), &ids).ok());
  ASSERT_EQ(texts.values_size(), ids.values_size());
  ASSERT_GT(texts.values_size(), 300);
  int64_t tokens = 0;
  for (int i = 0; i < texts.values_size(); ++i) {
    const std::string& text = texts.values(i).string_value();
    std::vector<int32_t> expected;
    for (const auto& v : ids.values(i).list_value().values()) {
      expected.push_back(static_cast<int32_t>(v.number_value()));
    }
    tokens += expected.size();
    auto ours = (*t)->Encode(text);
    ASSERT_TRUE(ours.ok()) << ours.status();
    EXPECT_EQ(*ours, expected) << "text " << i << ": " << text;
  }
  std::printf("%s: %d texts, %lld tokens, each as the oracle's\n", style.c_str(),
              texts.values_size(), static_cast<long long>(tokens));
  std::filesystem::remove_all(dir);
}

TEST(Tokenizer, Gpt2StyleMatchesTheOracle) { CheckAgainstTheOracle("gpt2"); }
TEST(Tokenizer, Llama3StyleMatchesTheOracle) { CheckAgainstTheOracle("llama3"); }
TEST(Tokenizer, Llama2StyleMatchesTheOracle) { CheckAgainstTheOracle("llama2"); }
TEST(Tokenizer, MistralStyleMatchesTheOracle) { CheckAgainstTheOracle("mistral"); }

// Qwen2's: single digits, its added tokens, and the NFC normalizer between them (the oracle's
// texts hold decomposed letters, marks out of canonical order, Hangul jamo, a singleton and a
// composition exclusion).
TEST(Tokenizer, Qwen2StyleMatchesTheOracle) { CheckAgainstTheOracle("qwen2"); }

// A long prompt in SentencePiece's alphabet without split (Mistral's, Llama 2's) is one word of
// BPE: 24,000 characters merge and decode back to the text.
TEST(Tokenizer, ALongUnsplitTextMergesAndDecodesBack) {
  const std::filesystem::path dir = testenv::MakeScratchDir("bpe_long");
  const std::string cmd = absl::StrCat(testenv::PythonInterpreter(), " ", testenv::SourceDir(),
                                       "/tests/oracle/bpe_oracle.py cases mistral ", dir.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(dir / "tokenizer.json");
  std::stringstream json;
  json << in.rdbuf();
  auto t = Tokenizer::Parse(json.str(), "mistral");
  ASSERT_TRUE(t.ok()) << t.status();
  std::string text;
  while (text.size() < 24000) text += "The quick brown fox jumps over the lazy dog. Caf\u00e9 12 ";
  const auto start = std::chrono::steady_clock::now();
  auto ids = (*t)->Encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(ids.ok()) << ids.status();
  std::printf("%zu characters: %zu tokens in %.3f s\n", text.size(), ids->size(), seconds);
  EXPECT_EQ((*t)->Decode(std::span<const int32_t>(*ids).subspan(1)), text);  // after <s>
  std::filesystem::remove_all(dir);
}

constexpr char kMeta[] = "\u2581";
// Llama 2's decoder, and the Metaspace decoder newer conversions write instead.
constexpr char kStripDecoder[] = R"({"type": "Sequence", "decoders": [{"type": "Replace",
    "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})";
constexpr char kMetaspaceDecoder[] =
    R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false})";

// A tokenizer.json in SentencePiece's alphabet: <unk> 0, <s> 1, the byte tokens <0x00>–<0xEF>
// from 2 (<0xF0> and above missing), then ▁ 300, h 301, i 302, ▁h 303, ▁hi 304, ▁▁ 305; merges
// "▁ h", "h i"... `model` holds the model's other fields.
std::string SentencePieceJson(
    const std::string& decoder = kStripDecoder,
    const std::string& model = R"("unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true)") {
  std::string vocab = R"("<unk>": 0, "<s>": 1)";
  for (int b = 0; b < 0xF0; ++b)
    absl::StrAppend(&vocab, ", \"", absl::StrFormat("<0x%02X>", b), "\": ", 2 + b);
  absl::StrAppend(&vocab, R"(, "▁": 300, "h": 301, "i": 302, "▁h": 303, "▁hi": 304, "▁▁": 305)");
  return absl::StrCat(
      R"({"normalizer": null, "pre_tokenizer": {"type": "Metaspace", "replacement": "▁",
      "prepend_scheme": "first", "split": false}, "decoder": )",
      decoder, R"(, "model": {"type": "BPE", )", model, R"(, "vocab": {)", vocab,
      R"(}, "merges": ["▁ h", "▁h i", "▁ ▁"]}})");
}

// SentencePiece's alphabet by hand: "▁" for spaces and one before the text, characters the
// vocabulary lacks as <0xNN> bytes (or <unk>, fused, when one is missing), and decoding back.
TEST(Tokenizer, SentencePieceAlphabetFallsBackToBytes) {
  auto t = Make(SentencePieceJson());
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Ids(*t, "hi hi"), ElementsAre(304, 304));  // "▁hi▁hi"
  EXPECT_THAT(Ids(*t, "hi\n"), ElementsAre(304, 2 + '\n'));
  EXPECT_THAT(Ids(*t, "h\u00e9"), ElementsAre(303, 2 + 0xC3, 2 + 0xA9));          // é as two bytes
  EXPECT_THAT(Ids(*t, "i\U0001F642\U0001F680i"), ElementsAre(300, 302, 0, 302));  // fused
  EXPECT_EQ(t->Decode(Ids(*t, "hi hi\n")), "hi hi\n");
  EXPECT_EQ(t->TokenBytes(304), " hi");  // in running text, its space kept
}

// As the reference's BPE model: the unknown token waits for the next character the vocabulary
// has, so byte tokens after it come out first; without fuse_unk each is its own; with neither
// an unknown token nor byte_fallback the character is dropped.
TEST(Tokenizer, UnknownCharactersComeOutInTheReferencesOrder) {
  auto t = Make(SentencePieceJson());
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Ids(*t, "\U0001F642\u00e9"), ElementsAre(300, 2 + 0xC3, 2 + 0xA9, 0));
  EXPECT_THAT(Ids(*t, "\U0001F642\u00e9\U0001F680h"), ElementsAre(300, 2 + 0xC3, 2 + 0xA9, 0, 301));
  auto unfused = Make(SentencePieceJson(kStripDecoder, R"("unk_token": "<unk>")"));
  ASSERT_NE(unfused, nullptr);
  EXPECT_THAT(Ids(*unfused, "h\u00e9\U0001F642"), ElementsAre(303, 0, 0));
  auto bare = Make(SentencePieceJson(kStripDecoder, R"("fuse_unk": false)"));
  ASSERT_NE(bare, nullptr);
  EXPECT_THAT(Ids(*bare, "h\u00e9i"), ElementsAre(304));  // é dropped before merging: "▁hi"
}

// The decoders as the reference runs them: Strip drops the fused text's first space; Metaspace
// drops every "▁" of the first token. ByteLevel maps a token whose every character is in its
// alphabet, and leaves any other as written; added tokens go through the decoder too.
TEST(Tokenizer, DecodersDoWhatTheReferencesDo) {
  auto strip = Make(SentencePieceJson());
  auto metaspace = Make(SentencePieceJson(kMetaspaceDecoder, R"("unk_token": "<unk>")"));
  ASSERT_NE(strip, nullptr);
  ASSERT_NE(metaspace, nullptr);
  const std::vector<int32_t> ids = {305, 301, 304};  // "▁▁" "h" "▁hi"
  EXPECT_EQ(strip->Decode(ids), " h hi");
  EXPECT_EQ(metaspace->Decode(ids), "h hi");
  EXPECT_EQ(metaspace->TokenBytes(305), "  ");
  EXPECT_EQ(metaspace->TokenBytes(2 + 'A'), "<0x41>");  // no ByteFallback in this decoder
  EXPECT_EQ(strip->TokenBytes(2 + 'A'), "A");
  std::string json = Json({"\u0120\u65e5"}, {});
  json.insert(json.size() - 1, R"(, "added_tokens": [{"id": 300, "content": "\u010a!"}])");
  auto byte_level = Make(json);
  ASSERT_NE(byte_level, nullptr);
  EXPECT_EQ(byte_level->TokenBytes(256), "\u0120\u65e5");  // 日 is not in the alphabet
  EXPECT_EQ(byte_level->TokenBytes(300), "\n!");
}

// A Split step with its own pre-tokenizer before a ByteLevel without the built-in pattern.
std::string SplitBy(const std::string& pattern) {
  return absl::StrCat(R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern":
      {"Regex": )",
                      Quoted(pattern), R"(}, "behavior": "Isolated"}, {"type": "ByteLevel",
      "add_prefix_space": false, "use_regex": false}]})");
}

// Patterns mean what they mean to the reference's engine: the whitespace idiom only as two
// top-level alternatives (with any group, named or not, before it), \d as every decimal digit;
// what RE2 would read otherwise is refused, naming the step.
TEST(Tokenizer, PatternsReadAsTheReferenceReadsThem) {
  const std::string sp = ByteLevelChar(' ');
  auto named =
      Make(Json({sp + sp}, {sp + " " + sp}, "", SplitBy(R"((?P<w>\p{L}+)|\s+(?!\S)|\s+)")));
  ASSERT_NE(named, nullptr);
  EXPECT_THAT(Ids(*named, "a    b"), ElementsAre('a', 256, ' ', ' ', 'b'));  // "   " " " "b"
  // ١ (U+0661, bytes D9 A1) is a digit: its own piece, so "b" does not merge with its first byte.
  const std::string b_d9 = "b" + ByteLevelChar(0xD9);
  auto digits = Make(Json({b_d9}, {"b " + ByteLevelChar(0xD9)}, "", SplitBy(R"(\d+)")));
  ASSERT_NE(digits, nullptr);
  EXPECT_THAT(Ids(*digits, "ab\u0661c"), ElementsAre('a', 'b', 0xD9, 0xA1, 'c'));
  auto plain = Make(Json({b_d9}, {"b " + ByteLevelChar(0xD9)}, "", SplitBy(R"(x)")));
  ASSERT_NE(plain, nullptr);
  EXPECT_THAT(Ids(*plain, "ab\u0661c"), ElementsAre('a', 256, 0xA1, 'c'));
  const std::string field = "tok.json: pre_tokenizer.pretokenizers[0].pattern ";
  ExpectRefused(Json({}, {}, "", SplitBy(R"(x\s+(?!\S)|\s+)")), field + "has the look-around (?!");
  ExpectRefused(Json({}, {}, "", SplitBy(R"((?:\s+(?!\S)|\s+))")), field + "has the look-around");
  for (const char* escape : {R"(\w+)", R"(\bx)", R"(\W)"}) {
    ExpectRefused(Json({}, {}, "", SplitBy(escape)),
                  field + "has \\" + std::string(1, escape[1]) + ", which Trainyard's splitter");
  }
  ExpectRefused(Json({}, {}, "", SplitBy(R"(^x)")), field + "has the anchor ^");
  ExpectRefused(Json({}, {}, "", SplitBy(R"(x$)")), field + "has the anchor $");
  EXPECT_NE(Make(Json({}, {}, "", SplitBy(R"([$^]\d|[^x])"))), nullptr);  // in a class: literal
}

// Merges as the reference builds them: every part and product in the vocabulary, the last rank
// of a pair listed twice.
TEST(Tokenizer, MergesAreReadAsTheReferenceReadsThem) {
  auto twice = Make(Json({"ab", "bc"}, {"a b", "b c", "a b"}));
  ASSERT_NE(twice, nullptr);
  EXPECT_THAT(Ids(*twice, "abc"), ElementsAre('a', 257));
  ExpectRefused(Json({}, {"a b"}),
                "tok.json: model.merges[0] makes \"ab\" of \"a\" and \"b\", "
                "not all of which are in the vocabulary");
  ExpectRefused(Json({"a\u65e5"}, {"a \u65e5"}), "model.merges[0] makes");
  ExpectRefused(
      absl::StrReplaceAll(Json({"ab"}, {"a b"}), {{"\"a b\"", "[\"a\", 2]"}}),
      "tok.json: model.merges[0] must be a \"left right\" string or a [left, right] pair");
}

// Each field Trainyard cannot read as the reference does is refused, naming it; ids out of
// range too, without reading them as numbers they are not.
TEST(Tokenizer, BadFieldsAreRefusedNamingThem) {
  const std::string good = Json({}, {});
  auto with = [&](const std::string& from, const std::string& to) {
    return Replaced(good, from, to);
  };
  for (const char* id : {"1e300", "-1", "2.5", "16777216", "\"7\""}) {
    ExpectRefused(with(R"("a": 97)", absl::StrCat(R"("a": )", id)),
                  "tok.json: model.vocab[\"a\"] must be a token id");
  }
  auto high = Make(with(R"("a": 97)", R"("a": 16777215)"));  // a sparse table: one entry
  ASSERT_NE(high, nullptr);
  EXPECT_EQ(high->size(), 16777216);
  EXPECT_EQ(high->TokenBytes(16777215), "a");
  const std::string template_at = R"(, "post_processor": {"type": "TemplateProcessing", "single": [
      {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "</s>"}}], "special_tokens": {"</s>":
      {"ids": [9999]}}})";
  std::string suffixed = good;
  suffixed.insert(suffixed.size() - 1, template_at);
  ExpectRefused(suffixed, "tok.json: post_processor adds id 9999, which no token has");
  std::string normalized = SentencePieceJson();
  normalized.replace(normalized.find(R"("normalizer": null)"), 18,
                     R"("normalizer": {"type": "Replace", "pattern": {"String": " "},
                        "content": "▁"})");
  normalized = absl::StrReplaceAll(
      normalized, {{R"("pre_tokenizer": {)", R"("pre_tokenizer": null, "unused": {)"}});
  normalized.insert(normalized.size() - 1,
                    R"(, "added_tokens": [{"id": 1, "content": "<s>", "normalized": true}])");
  ExpectRefused(normalized, "tok.json: added_tokens[0].normalized is true for <s>");
  auto decoder = [](const std::string& steps) {
    return SentencePieceJson(absl::StrCat(R"({"type": "Sequence", "decoders": [)", steps, "]}"));
  };
  const std::string replace = R"({"type": "Replace", "pattern": {"String": "▁"}, "content": " "})";
  ExpectRefused(
      decoder(absl::StrCat(R"({"type": "Fuse"}, )", replace, R"(, {"type": "ByteFallback"})")),
      "tok.json: decoder.decoders[1] is of type \"Replace\" there");
  ExpectRefused(decoder(absl::StrCat(replace, R"(, {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1e300, "stop": 0})")),
                "tok.json: decoder.decoders[3] is of type \"Strip\" there");
}

// What the coordinator reads at submit is bounded: a file over the limit is refused before it
// is read.
TEST(Tokenizer, AFileOverTheLimitIsNotRead) {
  const std::filesystem::path dir = testenv::MakeScratchDir("bpe_big");
  const std::filesystem::path file = dir / "tokenizer.json";
  { std::ofstream(file) << Json({}, {}); }
  std::filesystem::resize_file(file, Tokenizer::kMaxFileBytes + 1);  // sparse
  auto t = Tokenizer::Load(*RealFileSystem(), dir.string());
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr(absl::StrCat(": ", Tokenizer::kMaxFileBytes + 1,
                                     " bytes; Trainyard reads a tokenizer.json of at most ")));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainyard::worker::data
