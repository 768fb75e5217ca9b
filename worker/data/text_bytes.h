// A raw text file read as bytes: byte-level tokens, vocabulary 256. Nothing is decoded, so any
// file (UTF-8 or not) works.
//
// Threading: immutable after opening; Read() may be called concurrently.
#ifndef TRAINYARD_WORKER_DATA_TEXT_BYTES_H_
#define TRAINYARD_WORKER_DATA_TEXT_BYTES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "worker/data/token_stream.h"

namespace trainyard::worker {

class TextByteStream : public TokenStream {
 public:
  // Memory-maps the file at `path` through `fs`. Errors name the path: a missing file is
  // NOT_FOUND, an empty one INVALID_ARGUMENT.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TextByteStream>> Open(const std::string& path,
                                                                            FileSystem& fs);

  int64_t size() const override { return static_cast<int64_t>(region_->size()); }
  // Always 256, whichever bytes occur: the byte-level vocabulary.
  int32_t vocab_bound() const override { return 256; }
  void Read(int64_t offset, int64_t count, int32_t* out) const override;

 private:
  explicit TextByteStream(std::unique_ptr<ReadOnlyRegion> region) : region_(std::move(region)) {}

  std::unique_ptr<ReadOnlyRegion> region_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_DATA_TEXT_BYTES_H_
