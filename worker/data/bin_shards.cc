#include "worker/data/bin_shards.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

uint32_t LoadToken(const uint8_t* p, int width) {
  return width == 2 ? static_cast<uint32_t>(p[0] | p[1] << 8) : static_cast<uint32_t>(LoadInt32(p));
}

struct ShardHeader {
  int64_t count;
  int width;  // bytes per token
};

// Checks the header and the body length of one mapped shard.
absl::StatusOr<ShardHeader> ValidateShard(const ReadOnlyRegion& region) {
  const size_t size = region.size();
  if (size < kBinShardHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("file is ", size, " bytes, shorter than the ",
                                                   kBinShardHeaderBytes, "-byte header"));
  }
  const uint8_t* header = region.data();
  const int32_t magic = LoadInt32(header);
  if (magic != kBinShardMagic && magic != kWideBinShardMagic) {
    return absl::InvalidArgumentError(absl::StrCat("bad magic ", magic, ", expected ",
                                                   kBinShardMagic, " (uint16 tokens) or ",
                                                   kWideBinShardMagic, " (uint32)"));
  }
  const bool wide = magic == kWideBinShardMagic;
  const int32_t version = LoadInt32(header + 4);
  const int32_t expected = wide ? kWideBinShardVersion : kBinShardVersion;
  if (version != expected) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported version ", version, ", expected ",
                                                   expected, " with magic ", magic));
  }
  const int width = wide ? 4 : 2;
  const int64_t count = LoadInt32(header + 8);
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("header says ", count, " tokens"));
  }
  const size_t body_bytes = size - kBinShardHeaderBytes;
  const int64_t body_tokens = static_cast<int64_t>(body_bytes / width);
  const size_t stray_bytes = body_bytes % width;
  const std::string stray = stray_bytes == 0   ? ""
                            : stray_bytes == 1 ? " and a stray byte"
                                               : absl::StrCat(" and ", stray_bytes, " stray bytes");
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
  return ShardHeader{count, width};
}

void AppendInt32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) *out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BinShardStream>> BinShardStream::Open(
    const std::string& path_or_glob, FileSystem& fs) {
  TY_ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandShardPattern(path_or_glob));
  std::unique_ptr<BinShardStream> stream(new BinShardStream);
  uint32_t max_token = 0;
  for (const std::string& path : paths) {
    // MapReadOnly's errors already name the path (NOT_FOUND for a missing file).
    TY_ASSIGN_OR_RETURN(std::unique_ptr<ReadOnlyRegion> region, fs.MapReadOnly(path));
    TY_ASSIGN_OR_RETURN_WITH(const ShardHeader header, ValidateShard(*region), path);
    const uint8_t* tokens = region->data() + kBinShardHeaderBytes;
    for (int64_t i = 0; i < header.count; ++i) {
      max_token = std::max(max_token, LoadToken(tokens + header.width * i, header.width));
    }
    if (max_token > static_cast<uint32_t>(INT32_MAX - 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": holds token ", max_token, ", beyond any vocabulary"));
    }
    stream->starts_.push_back(stream->size_);
    stream->size_ += header.count;
    stream->shards_.push_back(Shard{std::move(region), tokens, header.count, header.width});
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
    const uint8_t* src = s.tokens + s.width * local;
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<int32_t>(LoadToken(src + s.width * i, s.width));
    }
    out += n;
    offset += n;
    count -= n;
    ++shard;
  }
}

BinShardWriter::BinShardWriter(FileSystem& fs, std::string prefix, int64_t shard_tokens,
                               int32_t max_id, int64_t max_shards)
    : fs_(fs),
      prefix_(std::move(prefix)),
      shard_tokens_(shard_tokens),
      wide_(max_id > 0xFFFF),
      max_shards_(max_shards) {}

absl::Status BinShardWriter::Append(std::span<const int32_t> ids) {
  for (size_t at = 0; at < ids.size();) {
    const size_t n = std::min<size_t>(ids.size() - at, shard_tokens_ - pending_.size());
    pending_.insert(pending_.end(), ids.begin() + at, ids.begin() + at + n);
    at += n;
    if (static_cast<int64_t>(pending_.size()) == shard_tokens_) TY_RETURN_IF_ERROR(Flush());
  }
  return absl::OkStatus();
}

absl::Status BinShardWriter::Finish() { return pending_.empty() ? absl::OkStatus() : Flush(); }

absl::Status BinShardWriter::Flush() {
  if (static_cast<int64_t>(paths_.size()) >= max_shards_) {
    return absl::InvalidArgumentError(absl::StrCat("more than ", max_shards_, " shards of ",
                                                   shard_tokens_,
                                                   " tokens: give a larger shard size"));
  }
  const int width = wide_ ? 4 : 2;
  std::string bytes;
  AppendInt32(&bytes, wide_ ? kWideBinShardMagic : kBinShardMagic);
  AppendInt32(&bytes, wide_ ? kWideBinShardVersion : kBinShardVersion);
  AppendInt32(&bytes, static_cast<uint32_t>(pending_.size()));
  bytes.resize(kBinShardHeaderBytes + width * pending_.size(), '\0');
  char* body = bytes.data() + kBinShardHeaderBytes;
  for (size_t t = 0; t < pending_.size(); ++t) {  // little-endian, whatever the host's order
    for (int i = 0; i < width; ++i) body[t * width + i] = static_cast<char>(pending_[t] >> (8 * i));
  }
  const std::string path = absl::StrFormat("%s_%06d.bin", prefix_, paths_.size());
  TY_RETURN_IF_ERROR(fs_.WriteFileAtomic(path, bytes));
  paths_.push_back(path);
  tokens_ += static_cast<int64_t>(pending_.size());
  pending_.clear();
  return absl::OkStatus();
}

}  // namespace trainyard::worker
