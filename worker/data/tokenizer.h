// A Hugging Face `tokenizer.json` of the BPE kinds most open models publish: text to token ids
// and ids back to bytes, as the `tokenizers` library computes them. Two alphabets:
// - byte-level (GPT-2's, Llama 3's, Qwen's): pieces split by a pattern, their bytes mapped to
//   GPT-2's byte alphabet, merged;
// - SentencePiece's (Llama 2's, Mistral's): spaces become "▁", one is put before the text, and
//   characters the vocabulary lacks fall back to <0xNN> byte tokens.
//
// What a file may hold (anything else is refused when loading, naming the field and step):
// - normalizer: null; NFC (Qwen2's: the text between added tokens in Unicode's Normalization
//   Form C, worker/data/unicode_nfc.h); or, for SentencePiece's alphabet, Prepend("▁") and
//   Replace(" " → "▁") (Llama 2's, which prepends to every stretch between added tokens).
// - pre_tokenizer: ByteLevel (with use_regex, GPT-2's split pattern), Split by a Regex with
//   behavior Isolated, or a Sequence of Splits ending in a ByteLevel; add_prefix_space false. Or
//   Metaspace ("▁", prepend_scheme always, first or never; split or not), or null after Llama
//   2's normalizer.
// - model: BPE, with merges as "a b" strings or [a, b] pairs (both tokens and the one they make
//   in the vocabulary; a pair listed twice keeps its last rank), ignore_merges; byte_fallback,
//   unk_token and fuse_unk for SentencePiece's alphabet; no dropout or subword affixes. Ids are
//   below 2^24.
// - decoder: ByteLevel; for SentencePiece's alphabet Metaspace, or a Sequence of Replace("▁" →
//   " "), ByteFallback, Fuse and Strip(" ", start, 0), in that order. post_processor: null,
//   ByteLevel, TemplateProcessing (its single-sequence template), or a Sequence of those.
// - added_tokens: matched in the text first (the longest at each position; those with
//   normalized false, then those with normalized true between them, as the reference does); the
//   text between them is split and merged as above. With a normalizer, only ones matched in the
//   text as written (normalized false). post_processor: at most one TemplateProcessing.
//
// A text is at most 2^31 − 1 bytes.
//
// A character the vocabulary lacks becomes, before any merge, its UTF-8 bytes' <0xNN> tokens
// (byte_fallback, when all are there), else the unknown token, else nothing, in the order the
// reference gives them (see InitialSymbols in the .cc).
//
// Split patterns run on RE2, which has no look-around. Byte-level patterns hold the idiom
// `\s+(?!\S)|\s+` as two top-level alternatives (a run of whitespace leaves its last character to
// the word that follows it); they are rewritten to a plain `\s+` whose match gives back that
// character. `\s` and `\S` mean Unicode's White_Space, `\d` and `\D` its decimal digits, as in
// the reference's engine (RE2's own are ASCII). Any other look-around, `\w`, `\b` and the like, and
// the anchors `^` and `$` (which the reference reads at each line) are refused.
//
// Threading: a loaded Tokenizer is immutable; Encode and Decode may run concurrently.
#ifndef TRAINYARD_WORKER_DATA_TOKENIZER_H_
#define TRAINYARD_WORKER_DATA_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/filesystem.h"

namespace google::protobuf {
class Struct;
class Value;
}  // namespace google::protobuf

namespace trainyard::worker::data {

class Tokenizer {
 public:
  // The largest tokenizer.json Load reads (published ones are tens of megabytes at most).
  static constexpr uint64_t kMaxFileBytes = uint64_t{64} << 20;

  // Parses a tokenizer.json's text; `source` names it in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Parse(const std::string& json,
                                                          const std::string& source);
  // `path`: a tokenizer.json, or a directory holding one.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(FileSystem& fs, const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of `text` (UTF-8), with the post-processor's special tokens (Llama 3's
  // <|begin_of_text|>) around them. INVALID_ARGUMENT for text that is not UTF-8.
  [[nodiscard]] absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;

  // The bytes `id` adds to running text, as the decoder gives them: an added token's content or
  // a vocabulary entry, in its alphabet ("▁" as a space, <0xNN> as its byte with ByteFallback);
  // `<id N>` for an id with neither (a padded vocabulary's extra rows). A byte sequence that is
  // not UTF-8 is given as it is (the reference puts U+FFFD for it).
  [[nodiscard]] std::string TokenBytes(int32_t id) const;
  // `ids` as text from its start: their bytes, less what the decoder strips there (the "▁"
  // SentencePiece's alphabet put before the text: Strip's leading spaces of the whole, or every
  // "▁" of the first token with the Metaspace decoder).
  [[nodiscard]] std::string Decode(std::span<const int32_t> ids) const;

  // One past the largest id the file names.
  [[nodiscard]] int32_t size() const { return size_; }

 private:
  struct Split;  // one Split step of the pre-tokenizer
  struct AddedToken {
    std::string content;
    int32_t id;
    bool normalized;  // matched in the stretches between the others
  };
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token's
  };
  struct Symbol;  // a token of a word while it merges

  // SentencePiece's alphabet: where a "▁" is put before the text, whether each "▁"-led word
  // merges alone, and what the decoder does.
  struct Metaspace {
    enum class Prepend { kNever, kFirst, kAlways, kEveryStretch };
    Prepend prepend = Prepend::kNever;
    bool split = false;
    bool decodes_bytes = false;      // the decoder's ByteFallback: <0xNN> is its byte
    int strip = 0;                   // the decoder's Strip: leading spaces of the text it drops
    bool drops_first_marks = false;  // the Metaspace decoder: the first token's "▁" are dropped
  };

  Tokenizer();
  absl::Status ParseNormalizer(const google::protobuf::Struct& step, const std::string& source);
  absl::Status ParseMetaspace(const google::protobuf::Struct& step, const std::string& source);
  // Where a Metaspace step puts a "▁" before the text: prepend_scheme, or the older
  // add_prefix_space.
  static absl::StatusOr<Metaspace::Prepend> PrependScheme(const google::protobuf::Struct& step,
                                                          const std::string& source,
                                                          const std::string& field);
  absl::Status ParseDecoder(const google::protobuf::Struct& step, const std::string& source);
  absl::Status ParseModel(const google::protobuf::Struct& model, const std::string& source);
  absl::Status ParseVocab(const google::protobuf::Struct& model, const std::string& source);
  absl::Status ParseMerges(const google::protobuf::Struct& model, const std::string& source);
  absl::Status ParsePreTokenizer(const google::protobuf::Struct& step, const std::string& source);
  absl::Status ParsePostProcessor(const google::protobuf::Struct& step, const std::string& source,
                                  const std::string& field);
  absl::Status ParseAddedTokens(const google::protobuf::Value& list, bool normalizer,
                                const std::string& source);
  // The bytes `token` (a vocabulary entry or an added token's content) stands for, as the
  // decoder gives them; `first`: it is the first token decoded.
  std::string Spell(absl::string_view token, bool first) const;
  // Records `id`'s spelling; an added token's replaces the vocabulary's.
  void SetToken(int32_t id, std::string token);

  // Words merged during one Encode, by their text: running text repeats its words. Cleared when
  // it holds kCachedWords.
  using WordCache = absl::flat_hash_map<std::string, std::vector<int32_t>>;
  static constexpr size_t kCachedWords = size_t{1} << 16;
  static constexpr size_t kLongestCachedWord = 256;  // bytes
  static uint64_t PairKey(int32_t left, int32_t right) {
    return static_cast<uint64_t>(left) << 32 | static_cast<uint32_t>(right);
  }

  // `text` (no added tokens in it; `first`: at the start of the text) split by the
  // pre-tokenizer, then merged, appended to `out`.
  void EncodeSegment(absl::string_view text, bool first, WordCache* cache,
                     std::vector<int32_t>* out) const;
  void EncodeMetaspace(absl::string_view text, bool first, WordCache* cache,
                       std::vector<int32_t>* out) const;
  // One pre-token (its bytes, or its characters in SentencePiece's alphabet), as BPE merges it.
  void EncodeWord(absl::string_view word, WordCache* cache, std::vector<int32_t>* out) const;
  std::vector<int32_t> MergeWord(absl::string_view word) const;
  // The word's characters as tokens before any merge (see the .cc).
  std::vector<Symbol> InitialSymbols(absl::string_view word) const;
  const Merge* MergeOf(int32_t left, int32_t right) const;
  // The added token at the start of `text` among those `normalized` or not, the longest when
  // several are; nullptr for none.
  const AddedToken* AddedTokenAt(absl::string_view text, bool normalized) const;
  void EncodeBetweenAdded(absl::string_view text, size_t offset, bool normalized, WordCache* cache,
                          std::vector<int32_t>* out) const;

  std::vector<std::unique_ptr<Split>> splits_;
  absl::flat_hash_map<std::string, int32_t> vocab_;  // spelling → id
  absl::flat_hash_map<uint64_t, Merge> merges_;      // PairKey(left, right) → rank, merged id
  bool ignore_merges_ = false;
  std::optional<Metaspace> metaspace_;  // unset: the byte-level alphabet
  bool nfc_ = false;                    // the NFC normalizer (byte-level only)
  bool byte_fallback_ = false;
  int32_t unk_ = -1;  // the unknown token; −1: none
  bool fuse_unk_ = false;
  std::array<int32_t, 256> byte_tokens_;  // byte → its <0xNN> token, −1 when absent
  std::array<int32_t, 256> level_ids_;  // byte → its byte-level character's id, −1 when absent
  std::vector<AddedToken> added_;       // longest content first
  std::array<std::vector<int32_t>, 256> added_by_byte_;  // first byte → indices into added_
  std::vector<int32_t> prefix_, suffix_;  // the post-processor's ids around a sequence
  bool template_seen_ = false;
  absl::flat_hash_map<int32_t, std::string> spelling_;  // id → its token, as in the file
  int32_t size_ = 0;
};

// The byte-level alphabet of GPT-2 (and every byte-level BPE since): byte b as one printable
// code point, UTF-8 encoded; and the byte a code point stands for (−1 for none).
const std::string& ByteLevelChar(uint8_t byte);
int ByteOfLevelChar(uint32_t code_point);

}  // namespace trainyard::worker::data

#endif  // TRAINYARD_WORKER_DATA_TOKENIZER_H_
