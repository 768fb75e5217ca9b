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
      {"id": 303, "content": "<|eot|>!", "special": false}],
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

TEST(Tokenizer, WhatItCannotComputeIsRefusedNamingTheField) {
  const std::string good = Json({}, {});
  auto with = [&](const std::string& from, const std::string& to) {
    std::string json = good;
    const size_t at = json.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return json.replace(at, from.size(), to);
  };
  ExpectRefused("[1, 2]", "tok.json: not a JSON object");
  ExpectRefused(with(R"("normalizer": null)", R"("normalizer": {"type": "NFC"})"),
                "tok.json: normalizer has a step of type \"NFC\"");
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
      "tok.json: pre_tokenizer has a step of type \"Whitespace\"");
  const std::string split = R"({"type": "Sequence", "pretokenizers": [{"type": "Split",
      "pattern": {"Regex": "(?<=a)b"}, "behavior": "Isolated"}, {"type": "ByteLevel"}]})";
  ExpectRefused(with(R"({"type": "ByteLevel", "add_prefix_space": false})", split),
                "tok.json: pattern has the look-around (?<=");
  ExpectRefused(with(R"("decoder": {"type": "ByteLevel"})", R"("decoder": null)"),
                "tok.json: decoder is missing");
  ExpectRefused(with(R"("merges": [)", R"("merges": ["abc", )"),
                "tok.json: model.merges has \"abc\", not \"left right\"");
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

// SentencePiece's alphabet by hand: "▁" for spaces and one before the text, characters the
// vocabulary lacks as <0xNN> bytes (or <unk>, fused, when one is missing), and decoding back.
TEST(Tokenizer, SentencePieceAlphabetFallsBackToBytes) {
  const std::string meta = "\u2581";
  std::string vocab = R"("<unk>": 0, "<s>": 1)";
  for (int b = 0; b < 0xF0; ++b)
    absl::StrAppend(&vocab, ", \"", absl::StrFormat("<0x%02X>", b), "\": ", 2 + b);
  absl::StrAppend(&vocab, ", \"", meta, "\": 300, \"h\": 301, \"i\": 302, \"", meta, "h\": 303, \"",
                  meta, "hi\": 304");
  const std::string json = absl::StrCat(
      R"({"normalizer": null, "pre_tokenizer": {"type": "Metaspace", "replacement": ")", meta,
      R"(", "prepend_scheme": "first", "split": false}, "decoder": {"type": "Sequence",
      "decoders": [{"type": "Replace", "pattern": {"String": ")",
      meta, R"("}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
      "vocab": {)",
      vocab, "}, \"merges\": [\"", meta, " h\", \"", meta, "h i\"]}}");
  auto t = Make(json);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(Ids(*t, "hi hi"), ElementsAre(304, 304));  // "▁hi▁hi"
  EXPECT_THAT(Ids(*t, "hi\n"), ElementsAre(304, 2 + '\n'));
  EXPECT_THAT(Ids(*t, "h\u00e9"), ElementsAre(303, 2 + 0xC3, 2 + 0xA9));          // é as two bytes
  EXPECT_THAT(Ids(*t, "i\U0001F642\U0001F680i"), ElementsAre(300, 302, 0, 302));  // fused
  EXPECT_EQ(t->Decode(Ids(*t, "hi hi\n")), "hi hi\n");
  EXPECT_EQ(t->TokenBytes(304), " hi");  // in running text, its space kept
}

}  // namespace
}  // namespace trainyard::worker::data
