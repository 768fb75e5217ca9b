// The documents `trainyard tokenize` reads (worker/tokenize_command.h): a file's text, gzip- or
// zstd-compressed or not (told by its first bytes, which text that is UTF-8 never starts with),
// as one document; or, with a field name, each line of JSON Lines (the format most published
// corpora ship in: one object per line) as a document, its text the field's string. JSON Lines
// stream: a file is mapped and decompressed a megabyte at a time, so a corpus file may be larger
// than memory.
//
// Threading: a ByteStream is used by one thread; the free functions share no state.
#ifndef TRAINYARD_WORKER_DATA_TEXT_DOCUMENTS_H_
#define TRAINYARD_WORKER_DATA_TEXT_DOCUMENTS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/filesystem.h"

namespace trainyard::worker::data {

// A file's bytes, decompressed as they are read when they are gzip (every member of a
// multi-member file; zero bytes after the last are padding) or zstd (every frame, windows up to
// 2 GiB as `zstd --long=31` writes).
class ByteStream {
 public:
  // Maps `path` (through `fs`) and tells its format by its first bytes.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ByteStream>> Open(FileSystem& fs,
                                                                        const std::string& path);
  virtual ~ByteStream() = default;

  // Appends the next bytes (about a megabyte at most) to `out`; false once every byte is out.
  // INVALID_ARGUMENT naming the file for a damaged or truncated stream, or other bytes after the
  // last gzip member.
  [[nodiscard]] virtual absl::StatusOr<bool> Next(std::string* out) = 0;
};

// The whole of `path`'s bytes, decompressed (ByteStream).
[[nodiscard]] absl::StatusOr<std::string> ReadDecompressed(FileSystem& fs, const std::string& path);

struct Document {
  std::string source;  // "FILE" or "FILE:LINE", for messages
  std::string text;
};

// Calls `each` with every non-blank line of `path` (JSON Lines, decompressed as it streams) as a
// document: its object's `field`, which must be a string. INVALID_ARGUMENT "FILE:LINE: …" for a
// line that is not a JSON object or lacks the string field; `each`'s error stops the reading and
// is returned.
[[nodiscard]] absl::Status ForEachJsonLine(FileSystem& fs, const std::string& path,
                                           const std::string& field,
                                           const std::function<absl::Status(Document)>& each);

}  // namespace trainyard::worker::data

#endif  // TRAINYARD_WORKER_DATA_TEXT_DOCUMENTS_H_
