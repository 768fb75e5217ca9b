#include "worker/data/text_bytes.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard::worker {

absl::StatusOr<std::unique_ptr<TextByteStream>> TextByteStream::Open(const std::string& path,
                                                                     FileSystem& fs) {
  // MapReadOnly's errors already name the path.
  TY_ASSIGN_OR_RETURN(std::unique_ptr<ReadOnlyRegion> region, fs.MapReadOnly(path));
  if (region->size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": text file is empty"));
  }
  return std::unique_ptr<TextByteStream>(new TextByteStream(std::move(region)));
}

void TextByteStream::Read(int64_t offset, int64_t count, int32_t* out) const {
  CheckReadRange(offset, count, size());
  const uint8_t* src = region_->data() + offset;
  for (int64_t i = 0; i < count; ++i) out[i] = src[i];
}

}  // namespace trainyard::worker
