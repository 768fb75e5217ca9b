#include "common/staged_appender.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace trainyard {

absl::StatusOr<std::unique_ptr<StagedAppender>> StagedAppender::Create(
    std::unique_ptr<WritableFile> file, size_t buffer_bytes, int buffers) {
  if (buffer_bytes == 0 || buffer_bytes % kDirectIoAlignment != 0 || buffers < 2) {
    return absl::InvalidArgumentError(
        "a staged appender needs at least two buffers of a whole number of 4096-byte blocks");
  }
  std::unique_ptr<StagedAppender> out(new StagedAppender(std::move(file), buffer_bytes, buffers));
  for (auto& buffer : out->buffers_) {
    buffer.reset(static_cast<char*>(std::aligned_alloc(kDirectIoAlignment, buffer_bytes)));
    if (!buffer) return absl::ResourceExhaustedError("no memory for the staging buffers");
  }
  out->thread_ = std::thread([p = out.get()] { p->Run(); });
  return out;
}

StagedAppender::StagedAppender(std::unique_ptr<WritableFile> file, size_t buffer_bytes, int buffers)
    : file_(std::move(file)), buffer_bytes_(buffer_bytes) {
  buffers_.reserve(buffers);
  for (int i = 0; i < buffers; ++i) buffers_.emplace_back(nullptr, &std::free);
  absl::MutexLock lock(&mu_);
  sizes_.assign(buffers, 0);
}

StagedAppender::~StagedAppender() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    changed_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status StagedAppender::Put(const void* bytes, size_t size) {
  const char* from = static_cast<const char*>(bytes);
  while (size > 0) {
    const size_t n = std::min(size, buffer_bytes_ - staged_);
    std::memcpy(buffers_[filling_ % buffers_.size()].get() + staged_, from, n);
    staged_ += n;
    from += n;
    size -= n;
    if (staged_ == buffer_bytes_) TY_RETURN_IF_ERROR(Submit());
  }
  return absl::OkStatus();
}

absl::Status StagedAppender::Finish() {
  if (staged_ > 0) TY_RETURN_IF_ERROR(Submit());
  {
    absl::MutexLock lock(&mu_);
    while (written_ != submitted_) changed_.Wait(&mu_);
    TY_RETURN_IF_ERROR(status_);
  }
  TY_RETURN_IF_ERROR(file_->Sync());
  return file_->Close();
}

bool StagedAppender::HasFreeBuffer() const {
  return submitted_ - written_ < static_cast<int64_t>(buffers_.size());
}

// Queues the buffer in hand and waits until the next one is free (or a write failed).
absl::Status StagedAppender::Submit() {
  absl::MutexLock lock(&mu_);
  sizes_[filling_ % buffers_.size()] = staged_;
  submitted_ = ++filling_;
  staged_ = 0;
  changed_.SignalAll();
  while (!HasFreeBuffer() && status_.ok()) changed_.Wait(&mu_);
  return status_;
}

// The appender's thread: the queued buffers in order; after a failed append it skips the rest.
void StagedAppender::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    while (written_ == submitted_ && !closing_) changed_.Wait(&mu_);
    if (written_ == submitted_) return;  // closing, nothing queued
    const size_t index = static_cast<size_t>(written_ % static_cast<int64_t>(buffers_.size()));
    if (status_.ok()) {
      const std::string_view data(buffers_[index].get(), sizes_[index]);
      mu_.Unlock();
      // The direct-I/O contract holds: only the last append may be short, and the memory after
      // it up to the next aligned size is readable (each buffer is whole blocks).
      absl::Status appended = file_->Append(data);
      mu_.Lock();
      status_.Update(appended);
    }
    ++written_;
    changed_.SignalAll();
  }
}

}  // namespace trainyard
