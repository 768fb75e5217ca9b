// llm.c token shards (".bin"): a header of 256 little-endian int32 — [0] magic 20240520,
// [1] version 1, [2] token count — followed by that many little-endian uint16 tokens. Several
// shards concatenate, in path order, into one stream.
//
// Threading: a BinShardStream is immutable after opening; Read() may be called concurrently.
#ifndef TRAINYARD_WORKER_DATA_BIN_SHARDS_H_
#define TRAINYARD_WORKER_DATA_BIN_SHARDS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "worker/data/token_stream.h"

namespace trainyard::worker {

inline constexpr int32_t kBinShardMagic = 20240520;
inline constexpr int32_t kBinShardVersion = 1;
inline constexpr int kBinShardHeaderInts = 256;
inline constexpr size_t kBinShardHeaderBytes = kBinShardHeaderInts * sizeof(int32_t);

// The concatenation of one or more memory-mapped shards. The mappings live as long as the stream.
class BinShardStream : public TokenStream {
 public:
  // Opens `path_or_glob`: a plain path (through `fs`) or a glob(3) pattern (expanded on the real
  // filesystem, sorted by name; see shard_glob.h), each file mapped with fs.MapReadOnly.
  // Errors: a missing file or a pattern without matches is NOT_FOUND naming it; a malformed shard
  // is INVALID_ARGUMENT naming the file and the defect ("bad magic 12345, expected 20240520",
  // "unsupported version 2, expected 1", "file is 100 bytes, shorter than the 1024-byte header",
  // "truncated: header says 10 tokens, body holds 7", "body longer than the header says: header
  // says 10 tokens, body holds 12", "holds zero tokens").
  // Cost: every token is read once at open to compute vocab_bound().
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BinShardStream>> Open(
      const std::string& path_or_glob, FileSystem& fs);

  int64_t size() const override { return size_; }
  // 1 + the largest token in any shard.
  int32_t vocab_bound() const override { return vocab_bound_; }
  void Read(int64_t offset, int64_t count, int32_t* out) const override;

  // The shard files, in stream order.
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  struct Shard {
    std::unique_ptr<ReadOnlyRegion> region;
    const uint8_t* tokens;  // inside region, after the header
    int64_t count;
  };

  BinShardStream() = default;

  std::vector<std::string> paths_;
  std::vector<Shard> shards_;
  std::vector<int64_t> starts_;  // stream offset of each shard's first token
  int64_t size_ = 0;
  int32_t vocab_bound_ = 0;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_DATA_BIN_SHARDS_H_
