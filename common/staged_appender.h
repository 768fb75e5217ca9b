// StagedAppender: appends to a WritableFile through a ring of staging buffers that a thread of
// its own writes, in order, so that a caller producing the bytes (converting, checksumming) and
// the device writing them overlap, and a slow stretch on either side is absorbed by the buffers
// instead of stalling the other.
//
// Every append the file sees is one whole buffer but the last, and buffers are aligned to
// kDirectIoAlignment: with a buffer size that is a multiple of it, the file may be one from
// FileSystem::NewDirectWritableFile (O_DIRECT). After a failed append the thread writes nothing
// more, and the next Put or Finish returns that error.
//
// Threading: Put and Finish are called from one thread; the file is used only by the appender's
// thread until Finish returns. Destroying an appender without Finish writes the buffers already
// handed over (not the one being filled) and leaves the file unsynced.
#ifndef TRAINYARD_COMMON_STAGED_APPENDER_H_
#define TRAINYARD_COMMON_STAGED_APPENDER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/filesystem.h"

namespace trainyard {

class StagedAppender {
 public:
  // `buffers` (at least 2) of `buffer_bytes` (a positive multiple of kDirectIoAlignment) each.
  // INVALID_ARGUMENT for other sizes; RESOURCE_EXHAUSTED when the buffers cannot be allocated.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StagedAppender>> Create(
      std::unique_ptr<WritableFile> file, size_t buffer_bytes, int buffers);
  ~StagedAppender();
  StagedAppender(const StagedAppender&) = delete;
  StagedAppender& operator=(const StagedAppender&) = delete;

  // Copies `size` bytes into the ring, handing each buffer that fills to the thread; waits while
  // every buffer is queued or being written.
  [[nodiscard]] absl::Status Put(const void* bytes, size_t size);
  // Hands over what is staged, waits for every write, then syncs and closes the file.
  [[nodiscard]] absl::Status Finish();

 private:
  StagedAppender(std::unique_ptr<WritableFile> file, size_t buffer_bytes, int buffers);
  absl::Status Submit();
  void Run();
  // Called with mu_ held: whether a buffer is free to fill.
  bool HasFreeBuffer() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<WritableFile> file_;
  const size_t buffer_bytes_;
  std::vector<std::unique_ptr<char, void (*)(void*)>> buffers_;
  int64_t filling_ = 0;  // the caller's: buffers submitted, so it fills filling_ % buffers
  size_t staged_ = 0;    // the caller's: bytes in that buffer
  absl::Mutex mu_;
  absl::CondVar changed_;                           // submitted_, written_ or closing_ changed
  std::vector<size_t> sizes_ ABSL_GUARDED_BY(mu_);  // each queued buffer's bytes
  int64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;      // buffers handed to the thread, ever
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;        // of those, written (or skipped after an error)
  absl::Status status_ ABSL_GUARDED_BY(mu_);        // the first failed append's
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once everything it uses exists
};

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_STAGED_APPENDER_H_
