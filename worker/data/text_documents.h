// The documents `trainyard tokenize` reads (worker/tokenize_command.h): a file's text, gzip- or
// zstd-compressed or not (told by its first bytes, which text that is UTF-8 never starts with),
// as one document; or, with a field name, each line of JSON Lines (the format most published
// corpora ship in: one object per line) as a document, its text the field's string.
//
// Threading: free functions; no shared state.
#ifndef TRAINYARD_WORKER_DATA_TEXT_DOCUMENTS_H_
#define TRAINYARD_WORKER_DATA_TEXT_DOCUMENTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/filesystem.h"

namespace trainyard::worker::data {

// `path`'s contents, decompressed when they are gzip (every member of a multi-member file; zero
// bytes after the last are padding) or zstd (every frame, windows up to 2 GiB as `--long=31`
// writes). INVALID_ARGUMENT naming the file for a damaged or truncated stream, or other bytes
// after the last gzip member.
[[nodiscard]] absl::StatusOr<std::string> ReadDecompressed(FileSystem& fs, const std::string& path);

struct Document {
  std::string source;  // "FILE" or "FILE:LINE", for messages
  std::string text;
};

// Each non-blank line of `contents` (JSON Lines read from `path`) as a document: its object's
// `field`, which must be a string. INVALID_ARGUMENT "FILE:LINE: …" for a line that is not a JSON
// object or lacks the string field.
[[nodiscard]] absl::StatusOr<std::vector<Document>> JsonLinesDocuments(absl::string_view contents,
                                                                       const std::string& field,
                                                                       const std::string& path);

}  // namespace trainyard::worker::data

#endif  // TRAINYARD_WORKER_DATA_TEXT_DOCUMENTS_H_
