// UTF-8 one code point at a time, for the tokenizer and its normalizer.
//
// Threading: plain functions.
#ifndef TRAINYARD_WORKER_DATA_UTF8_H_
#define TRAINYARD_WORKER_DATA_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace trainyard::worker::data {

// The code point at s[*pos], advancing past it; false for a malformed sequence.
inline bool NextCodePoint(absl::string_view s, size_t* pos, uint32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t lead = byte(*pos);
  if (lead < 0x80) {
    *cp = lead;
    ++*pos;
    return true;
  }
  int more;
  uint32_t c, least;
  if ((lead & 0xE0) == 0xC0) {
    more = 1, c = lead & 0x1F, least = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    more = 2, c = lead & 0x0F, least = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    more = 3, c = lead & 0x07, least = 0x10000;
  } else {
    return false;
  }
  if (*pos + more >= s.size()) return false;
  for (int i = 1; i <= more; ++i) {
    if ((byte(*pos + i) & 0xC0) != 0x80) return false;
    c = (c << 6) | (byte(*pos + i) & 0x3F);
  }
  if (c < least || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
  *cp = c;
  *pos += more + 1;
  return true;
}

// c as UTF-8, appended to *out.
inline void AppendUtf8(std::string* out, uint32_t c) {
  if (c < 0x80) {
    *out += static_cast<char>(c);
  } else if (c < 0x800) {
    *out += static_cast<char>(0xC0 | (c >> 6));
    *out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    *out += static_cast<char>(0xE0 | (c >> 12));
    *out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (c >> 18));
    *out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

}  // namespace trainyard::worker::data

#endif  // TRAINYARD_WORKER_DATA_UTF8_H_
