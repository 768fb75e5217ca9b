// llm.c token shards (".bin"): a header of 256 little-endian int32 — [0] magic, [1] version,
// [2] token count — followed by that many little-endian tokens. Two formats, as llm.c writes
// them: GPT-2's (magic 20240520, version 1, uint16 tokens) and Llama 3's (magic 20240801,
// version 7, uint32 tokens, for vocabularies beyond 65,536). Several shards, of either format,
// concatenate in path order into one stream.
//
// Threading: a BinShardStream is immutable after opening; Read() may be called concurrently. A
// BinShardWriter is used by one thread.
#ifndef TRAINYARD_WORKER_DATA_BIN_SHARDS_H_
#define TRAINYARD_WORKER_DATA_BIN_SHARDS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "worker/data/token_stream.h"

namespace trainyard::worker {

inline constexpr int32_t kBinShardMagic = 20240520;  // GPT-2's: uint16 tokens
inline constexpr int32_t kBinShardVersion = 1;
inline constexpr int32_t kWideBinShardMagic = 20240801;  // Llama 3's: uint32 tokens
inline constexpr int32_t kWideBinShardVersion = 7;
inline constexpr int kBinShardHeaderInts = 256;
inline constexpr size_t kBinShardHeaderBytes = kBinShardHeaderInts * sizeof(int32_t);

// The concatenation of one or more memory-mapped shards. The mappings live as long as the stream.
class BinShardStream : public TokenStream {
 public:
  // Opens `path_or_glob`: a plain path (through `fs`) or a glob(3) pattern (expanded on the real
  // filesystem, sorted by name; see shard_glob.h), each file mapped with fs.MapReadOnly.
  // Errors: a missing file or a pattern without matches is NOT_FOUND naming it; a malformed shard
  // is INVALID_ARGUMENT naming the file and the defect ("bad magic 12345, expected 20240520
  // (uint16 tokens) or 20240801 (uint32)", "unsupported version 2, expected 1 with magic
  // 20240520", "file is 100 bytes, shorter than the 1024-byte header",
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
    int width;  // bytes per token: 2 or 4
  };

  BinShardStream() = default;

  std::vector<std::string> paths_;
  std::vector<Shard> shards_;
  std::vector<int64_t> starts_;  // stream offset of each shard's first token
  int64_t size_ = 0;
  int32_t vocab_bound_ = 0;
};

// Writes a token stream as numbered shards `PREFIX_000000.bin`, `PREFIX_000001.bin`, … of
// `shard_tokens` tokens each (the last one shorter; INVALID_ARGUMENT past `max_shards` of them), in
// GPT-2's format when every id fits in uint16 (`max_id` below 65,536), else Llama 3's. Each shard
// is written whole and renamed into place, so a reader never sees a partial one.
class BinShardWriter {
 public:
  // Shard numbers have six digits, so that their names sort in order: at most a million.
  static constexpr int64_t kMaxShards = 1000000;

  BinShardWriter(FileSystem& fs, std::string prefix, int64_t shard_tokens, int32_t max_id,
                 int64_t max_shards = kMaxShards);

  // Appends `ids` (each in [0, max_id]), writing every shard that fills.
  [[nodiscard]] absl::Status Append(std::span<const int32_t> ids);
  // Writes the last, partial shard (none when it is empty).
  [[nodiscard]] absl::Status Finish();

  // The shard files written so far, in order.
  const std::vector<std::string>& paths() const { return paths_; }
  int64_t tokens() const { return tokens_; }
  bool wide() const { return wide_; }

 private:
  absl::Status Flush();

  FileSystem& fs_;
  std::string prefix_;
  int64_t shard_tokens_;
  bool wide_;
  int64_t max_shards_;
  std::vector<int32_t> pending_;
  std::vector<std::string> paths_;
  int64_t tokens_ = 0;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_DATA_BIN_SHARDS_H_
