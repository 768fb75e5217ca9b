#include "common/text_check.h"

#include <cstdint>
#include <cstdio>

namespace trainyard {

std::optional<TextProblem> FindTextProblem(std::string_view text) {
  int line = 1, column = 1;
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = static_cast<uint8_t>(text[i]);
    auto bad = [&](const char* what) {
      char detail[64];
      std::snprintf(detail, sizeof(detail), "%s (byte 0x%02x)", what, byte);
      return TextProblem{line, column, byte == 0 ? std::string("a NUL byte") : detail};
    };
    if (byte == 0) return bad("");
    int length = 0;
    uint32_t code = 0;
    if (byte < 0x80) {
      length = 1;
    } else if (byte >= 0xc2 && byte <= 0xdf) {
      length = 2;
      code = byte & 0x1f;
    } else if (byte >= 0xe0 && byte <= 0xef) {
      length = 3;
      code = byte & 0x0f;
    } else if (byte >= 0xf0 && byte <= 0xf4) {
      length = 4;
      code = byte & 0x07;
    } else {
      return bad("invalid UTF-8");
    }
    if (i + length > text.size()) return bad("invalid UTF-8: a truncated sequence");
    for (int k = 1; k < length; ++k) {
      const auto next = static_cast<uint8_t>(text[i + k]);
      if ((next & 0xc0) != 0x80) return bad("invalid UTF-8");
      code = (code << 6) | (next & 0x3f);
    }
    if ((length == 3 && (code < 0x800 || (code >= 0xd800 && code <= 0xdfff))) ||
        (length == 4 && (code < 0x10000 || code > 0x10ffff))) {
      return bad("invalid UTF-8");
    }
    if (byte == '\n') {
      ++line;
      column = 1;
    } else {
      column += length;
    }
    i += length;
  }
  return std::nullopt;
}

}  // namespace trainyard
