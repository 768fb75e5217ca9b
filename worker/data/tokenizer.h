// A Hugging Face `tokenizer.json` of the byte-level BPE kind (GPT-2's, Llama 3's, and those of
// the many models that follow them): text to token ids and ids back to bytes, as the `tokenizers`
// library computes them.
//
// What a file may hold (anything else is refused when loading, naming the field):
// - normalizer: null.
// - pre_tokenizer: ByteLevel (with use_regex, GPT-2's split pattern), Split by a Regex with
//   behavior Isolated, or a Sequence of Splits ending in a ByteLevel; add_prefix_space false.
// - model: BPE, with merges as "a b" strings or [a, b] pairs and ignore_merges; no dropout,
//   unknown token, byte fallback or subword affixes.
// - decoder: ByteLevel. post_processor: null, ByteLevel, TemplateProcessing (its single-sequence
//   template), or a Sequence of those.
// - added_tokens: matched in the text first (the longest at each position); the text between them
//   is split and merged as above.
//
// Split patterns run on RE2, which has no look-around. Byte-level patterns end with the idiom
// `\s+(?!\S)|\s+` (a run of whitespace leaves its last character to the word that follows it);
// it is rewritten to a plain `\s+` whose match gives back that character. `\s` and `\S` mean
// Unicode's White_Space, as in the reference implementation (RE2's own `\s` is ASCII). Any other
// look-around is refused.
//
// Threading: a loaded Tokenizer is immutable; Encode and Decode may run concurrently.
#ifndef TRAINYARD_WORKER_DATA_TOKENIZER_H_
#define TRAINYARD_WORKER_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/strings/string_view.h"
#include "common/filesystem.h"

namespace google::protobuf {
class Struct;
class Value;
}  // namespace google::protobuf

namespace trainyard::worker::data {

class Tokenizer {
 public:
  // Parses a tokenizer.json's text; `source` names it in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Parse(const std::string& json,
                                                          const std::string& source);
  // `path`: a tokenizer.json, or a directory holding one.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(FileSystem& fs, const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of `text` (UTF-8), with the post-processor's special tokens (Llama 3's
  // <|begin_of_text|>) around them. INVALID_ARGUMENT for text that is not UTF-8, or a piece the
  // vocabulary cannot spell.
  [[nodiscard]] absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;

  // The bytes `id` stands for: an added token's content, or its vocabulary entry's bytes;
  // `<id N>` for an id with neither (a padded vocabulary's extra rows).
  [[nodiscard]] std::string TokenBytes(int32_t id) const;
  [[nodiscard]] std::string Decode(std::span<const int32_t> ids) const;

  // One past the largest id the file names.
  [[nodiscard]] int32_t size() const { return static_cast<int32_t>(token_bytes_.size()); }

 private:
  struct Split;  // one Split step of the pre-tokenizer
  struct AddedToken {
    std::string content;
    int32_t id;
  };

  Tokenizer();
  absl::Status ParseModel(const google::protobuf::Struct& model, const std::string& source);
  absl::Status ParsePreTokenizer(const google::protobuf::Struct& step, const std::string& source);
  absl::Status ParsePostProcessor(const google::protobuf::Struct& step, const std::string& source);
  absl::Status ParseAddedTokens(const google::protobuf::Value& list, const std::string& source);
  // Sizes token_bytes_ and known_ to cover `id`, and marks it known with `bytes`.
  void SetToken(int32_t id, std::string bytes);

  // `text` (no added tokens in it) split by the pre-tokenizer, then merged, appended to `out`.
  absl::Status EncodeSegment(absl::string_view text, std::vector<int32_t>* out) const;
  // One pre-token, mapped to the byte-level alphabet, as BPE merges it.
  absl::Status EncodeWord(const std::string& mapped, std::vector<int32_t>* out) const;
  // The added token at the start of `text`, the longest when several are; nullptr for none.
  const AddedToken* AddedTokenAt(absl::string_view text) const;

  std::vector<std::unique_ptr<Split>> splits_;
  absl::flat_hash_map<std::string, int32_t> vocab_;   // byte-level spelling → id
  absl::flat_hash_map<std::string, int32_t> merges_;  // "left right" → rank
  bool ignore_merges_ = false;
  std::vector<AddedToken> added_;         // longest content first
  std::vector<int32_t> prefix_, suffix_;  // the post-processor's ids around a sequence
  std::vector<std::string> token_bytes_;  // id → its bytes
  std::vector<bool> known_;               // id → the file names it
};

// The byte-level alphabet of GPT-2 (and every byte-level BPE since): byte b as one printable
// code point, UTF-8 encoded; and the byte a code point stands for (−1 for none).
const std::string& ByteLevelChar(uint8_t byte);
int ByteOfLevelChar(uint32_t code_point);

}  // namespace trainyard::worker::data

#endif  // TRAINYARD_WORKER_DATA_TOKENIZER_H_
