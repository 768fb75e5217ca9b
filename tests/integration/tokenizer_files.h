// tokenizer.json files for tests of what reads them (worker/data/tokenizer.h).
#ifndef TRAINYARD_TESTS_INTEGRATION_TOKENIZER_FILES_H_
#define TRAINYARD_TESTS_INTEGRATION_TOKENIZER_FILES_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "worker/data/tokenizer.h"

namespace trainyard::testenv {

// A byte-level tokenizer.json whose 256 tokens are the bytes in reverse (byte b is id 255 − b),
// and `added` more tokens (<|x0|>, ...) from id 256: text through it and the same text's bytes as
// ids tell apart whether a tokenizer was used.
inline std::string ReversedBytesTokenizer(int added = 0) {
  std::string vocab, extra;
  for (int b = 0; b < 256; ++b) {
    std::string c = worker::data::ByteLevelChar(b);
    if (c == "\"" || c == "\\") c = "\\" + c;
    absl::StrAppend(&vocab, b ? ", " : "", "\"", c, "\": ", 255 - b);
  }
  for (int i = 0; i < added; ++i) {
    absl::StrAppend(&extra, i ? ", " : "", "{\"id\": ", 256 + i, ", \"content\": \"<|x", i,
                    "|>\"}");
  }
  return absl::StrCat(R"({"normalizer": null, "pre_tokenizer": {"type": "ByteLevel"},
    "decoder": {"type": "ByteLevel"}, "added_tokens": [)",
                      extra, R"(], "model": {"type": "BPE", "merges": [], "vocab": {)", vocab,
                      "}}}");
}

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_TOKENIZER_FILES_H_
