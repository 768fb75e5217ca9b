// JSON text for the project's hand-written JSON outputs (the CLI's, the planner's profile file).
//
// Threading: plain functions.
#ifndef TRAINYARD_COMMON_JSON_H_
#define TRAINYARD_COMMON_JSON_H_

#include <string>

namespace trainyard {

// A JSON string literal for `text` (UTF-8 kept; control characters and invalid bytes escaped).
std::string JsonString(const std::string& text);

// A JSON number for `value`: the shortest text that reads back as exactly `value` (a finite
// double; infinities and NaN, which JSON cannot carry, give "null").
std::string JsonNumber(double value);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_JSON_H_
