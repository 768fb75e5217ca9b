// Where each position's document begins under model.document_token: at the last occurrence of
// the token at or before it (the token begins each document). The training model and the
// generator read a sequence's rows through this one rule.
#ifndef TRAINYARD_WORKER_DOCUMENT_STARTS_H_
#define TRAINYARD_WORKER_DOCUMENT_STARTS_H_

#include <cstdint>

namespace trainyard::worker {

// For tokens [0, n) of one sequence, at positions [first_position, first_position + n), writes
// the position of each one's document's first token into starts[0, n); `start` is the document
// start before them (0 at the sequence's beginning). Returns the start after the last token.
inline int32_t DocumentStarts(const int32_t* tokens, int64_t n, int32_t token,
                              int64_t first_position, int32_t start, int32_t* starts) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] == token) start = static_cast<int32_t>(first_position + i);
    starts[i] = start;
  }
  return start;
}

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_DOCUMENT_STARTS_H_
