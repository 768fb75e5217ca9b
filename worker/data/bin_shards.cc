#include "worker/data/bin_shards.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/shard_glob.h"

namespace trainyard::worker {
namespace {

// Byte-wise little-endian decoding: independent of host byte order and of alignment (a
// FakeFileSystem region need not be 2- or 4-byte aligned).
int32_t LoadInt32(const uint8_t* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 |
                              static_cast<uint32_t>(p[3]) << 24);
}

uint16_t LoadUint16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

// Checks the header and the body length of one mapped shard; returns its token count.
absl::StatusOr<int64_t> ValidateShard(const ReadOnlyRegion& region) {
  const size_t size = region.size();
  if (size < kBinShardHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("file is ", size, " bytes, shorter than the ",
                                                   kBinShardHeaderBytes, "-byte header"));
  }
  const uint8_t* header = region.data();
  const int32_t magic = LoadInt32(header);
  if (magic != kBinShardMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad magic ", magic, ", expected ", kBinShardMagic));
  }
  const int32_t version = LoadInt32(header + 4);
  if (version != kBinShardVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported version ", version, ", expected ", kBinShardVersion));
  }
  const int64_t count = LoadInt32(header + 8);
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("header says ", count, " tokens"));
  }
  const size_t body_bytes = size - kBinShardHeaderBytes;
  const int64_t body_tokens = static_cast<int64_t>(body_bytes / sizeof(uint16_t));
  const std::string stray = body_bytes % 2 ? " and a stray byte" : "";
  if (body_tokens < count || (body_tokens == count && !stray.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated: header says ", count, " tokens, body holds ", body_tokens, stray));
  }
  if (body_tokens > count) {
    return absl::InvalidArgumentError(absl::StrCat("body longer than the header says: header says ",
                                                   count, " tokens, body holds ", body_tokens,
                                                   stray));
  }
  if (count == 0) return absl::InvalidArgumentError("holds zero tokens");
  return count;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BinShardStream>> BinShardStream::Open(
    const std::string& path_or_glob, FileSystem& fs) {
  TY_ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandShardPattern(path_or_glob));
  std::unique_ptr<BinShardStream> stream(new BinShardStream);
  uint16_t max_token = 0;
  for (const std::string& path : paths) {
    // MapReadOnly's errors already name the path (NOT_FOUND for a missing file).
    TY_ASSIGN_OR_RETURN(std::unique_ptr<ReadOnlyRegion> region, fs.MapReadOnly(path));
    TY_ASSIGN_OR_RETURN_WITH(const int64_t count, ValidateShard(*region), path);
    const uint8_t* tokens = region->data() + kBinShardHeaderBytes;
    for (int64_t i = 0; i < count; ++i) {
      max_token = std::max(max_token, LoadUint16(tokens + 2 * i));
    }
    stream->starts_.push_back(stream->size_);
    stream->size_ += count;
    stream->shards_.push_back(Shard{std::move(region), tokens, count});
  }
  stream->paths_ = std::move(paths);
  stream->vocab_bound_ = static_cast<int32_t>(max_token) + 1;
  return stream;
}

void BinShardStream::Read(int64_t offset, int64_t count, int32_t* out) const {
  CheckReadRange(offset, count, size_);
  // The shard holding `offset`: the last one starting at or before it.
  size_t shard = std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin() - 1;
  while (count > 0) {
    const Shard& s = shards_[shard];
    const int64_t local = offset - starts_[shard];
    const int64_t n = std::min(count, s.count - local);
    const uint8_t* src = s.tokens + 2 * local;
    for (int64_t i = 0; i < n; ++i) out[i] = LoadUint16(src + 2 * i);
    out += n;
    offset += n;
    count -= n;
    ++shard;
  }
}

}  // namespace trainyard::worker
