// Whether a text (a spec, a file name) is well-formed UTF-8 without NUL bytes, and where not.
//
// Threading: a plain function.
#ifndef TRAINYARD_COMMON_TEXT_CHECK_H_
#define TRAINYARD_COMMON_TEXT_CHECK_H_

#include <optional>
#include <string>
#include <string_view>

namespace trainyard {

struct TextProblem {
  int line = 1;      // 1-based
  int column = 1;    // 1-based, in bytes
  std::string what;  // "a NUL byte", "invalid UTF-8 (byte 0xff)"
};

// The first NUL byte or malformed UTF-8 sequence (overlong forms, surrogates and code points
// past U+10FFFF included) of `text`; nullopt when there is none.
std::optional<TextProblem> FindTextProblem(std::string_view text);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_TEXT_CHECK_H_
