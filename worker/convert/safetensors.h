// The safetensors format (Hugging Face's): an 8-byte little-endian header length N, N bytes of
// JSON naming each tensor's dtype, shape and byte range ("data_offsets", relative to the end of
// the header) with an optional "__metadata__" map of strings, then the tensors' bytes, row-major
// and little-endian.
//
// SafetensorsFile reads one strictly: every problem is INVALID_ARGUMENT with one line naming the
// file (and the tensor) — a file shorter than its header, a header over 100 MB or not a JSON
// object, an unknown dtype, a range that does not match its shape, overlaps another or runs past
// the file. SafetensorsWriter writes one tensor at a time in a declared order, so that a caller
// streams a model through it holding one tensor.
//
// Threading: a SafetensorsFile is immutable after Open (concurrent reads are fine); a writer is
// used by one thread.
#ifndef TRAINYARD_WORKER_CONVERT_SAFETENSORS_H_
#define TRAINYARD_WORKER_CONVERT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "common/staged_appender.h"

namespace trainyard::worker::convert {

// kF8E4M3: OCP FP8 E4M3 (torch.float8_e4m3fn), as block-quantized checkpoints store their
// linear layers' weights beside scales (init_from multiplies them back).
enum class TensorDtype { kF32, kBF16, kF16, kF8E4M3 };

// "F32", "BF16", "F16", "F8_E4M3" (safetensors' names).
const char* DtypeName(TensorDtype dtype);
int64_t DtypeBytes(TensorDtype dtype);

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  int64_t numel() const;
  int64_t bytes() const { return numel() * DtypeBytes(dtype); }
};

class SafetensorsFile {
 public:
  // Maps `path` and checks its header and every tensor's range.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      FileSystem& fs, const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when the file has no tensor of that name.
  const TensorInfo* Find(const std::string& name) const;
  // `tensor`'s bytes as fp32 values in the mapping when it is F32 and 4-byte aligned, else
  // nullptr.
  const float* FloatData(const TensorInfo& tensor) const;
  // Elements [begin, begin + count) of `tensor` (one of tensors()) as fp32.
  void ReadFloats(const TensorInfo& tensor, int64_t begin, int64_t count, float* out) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::unique_ptr<ReadOnlyRegion> region_;
  std::vector<TensorInfo> tensors_;
  std::vector<const uint8_t*> data_;  // per tensor, in tensors_ order
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Writes `path` (via a temporary name, renamed into place by Finish): the header for `tensors`
// first, then each tensor's bytes by Write in the declared order, staged through an aligned
// buffers so that the file goes to the device without a copy into the page cache where the
// filesystem allows (FileSystem::NewDirectWritableFile), while the caller converts the next ones.
class SafetensorsWriter {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      FileSystem& fs, const std::string& path, std::vector<TensorInfo> tensors,
      const std::map<std::string, std::string>& metadata);

  ~SafetensorsWriter();

  // The next declared tensor's values (numel floats), stored in its dtype (bf16 and f16 rounded
  // to nearest even). FAILED_PRECONDITION when `name` is not the next one.
  [[nodiscard]] absl::Status Write(const std::string& name, const float* values);
  // The same, its values given as consecutive parts whose sizes add up to numel.
  [[nodiscard]] absl::Status Write(const std::string& name,
                                   std::span<const std::span<const float>> parts);
  // Syncs and renames the file into place; FAILED_PRECONDITION when a tensor was not written.
  [[nodiscard]] absl::Status Finish();

  // The header's bytes (length prefix included) for `tensors` in order; exposed for tests.
  static std::string Header(const std::vector<TensorInfo>& tensors,
                            const std::map<std::string, std::string>& metadata);

 private:
  SafetensorsWriter(FileSystem& fs, std::string path, std::vector<TensorInfo> tensors);

  // Appends `bytes` through the staging ring: the file is written with O_DIRECT where the
  // filesystem allows it, on the appender's thread.
  [[nodiscard]] absl::Status Put(const void* bytes, size_t size);

  FileSystem& fs_;
  const std::string path_;
  const std::vector<TensorInfo> tensors_;
  size_t next_ = 0;
  std::unique_ptr<StagedAppender> out_;
};

}  // namespace trainyard::worker::convert

#endif  // TRAINYARD_WORKER_CONVERT_SAFETENSORS_H_
