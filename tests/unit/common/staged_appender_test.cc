// StagedAppender: bytes reach the file in order, in whole aligned buffers but the last, through a
// ring the caller can fill ahead of a slow file; a failed append stops the writes and comes back
// to the caller; an appender dropped without Finish neither hangs nor syncs.
#include "common/staged_appender.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace trainyard {
namespace {

constexpr size_t kBlock = kDirectIoAlignment;

// What the appender's thread did to the file; read by the test once the appender is done.
struct Record {
  std::mutex mu;
  std::vector<std::string> appends;
  int unaligned = 0;  // appends whose memory was not kDirectIoAlignment-aligned
  int syncs = 0, closes = 0;
  bool synced_before_close = false;
};

class RecordingFile : public WritableFile {
 public:
  RecordingFile(Record& record, int fail_at, std::chrono::microseconds delay)
      : record_(record), fail_at_(fail_at), delay_(delay) {}
  absl::Status Append(std::string_view data) override {
    std::this_thread::sleep_for(delay_);
    std::lock_guard<std::mutex> lock(record_.mu);
    if (static_cast<int>(record_.appends.size()) == fail_at_) {
      fail_at_ = -1;
      return absl::ResourceExhaustedError("No space left on device");
    }
    if (reinterpret_cast<uintptr_t>(data.data()) % kDirectIoAlignment != 0) ++record_.unaligned;
    record_.appends.emplace_back(data);
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    std::lock_guard<std::mutex> lock(record_.mu);
    ++record_.syncs;
    return absl::OkStatus();
  }
  absl::Status Close() override {
    std::lock_guard<std::mutex> lock(record_.mu);
    record_.synced_before_close = record_.syncs > 0;
    ++record_.closes;
    return absl::OkStatus();
  }

 private:
  Record& record_;
  int fail_at_;  // the index of the append that fails (-1: none)
  const std::chrono::microseconds delay_;
};

std::unique_ptr<StagedAppender> MakeAppender(Record& record, int buffers, int fail_at = -1,
                                             std::chrono::microseconds delay = {}) {
  absl::StatusOr<std::unique_ptr<StagedAppender>> appender = StagedAppender::Create(
      std::make_unique<RecordingFile>(record, fail_at, delay), kBlock, buffers);
  EXPECT_TRUE(appender.ok()) << appender.status();
  return appender.ok() ? std::move(*appender) : nullptr;
}

// Bytes that differ from position to position (a misplaced or repeated buffer shows).
std::string Pattern(size_t size) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>((i * 131 + i / 4099) & 0xFF);
  return out;
}

TEST(StagedAppender, BytesArriveInOrderInWholeAlignedBuffersButTheLast) {
  const std::string data = Pattern(23 * kBlock + 123);
  // Pieces smaller than, equal to and larger than a buffer, straddling buffer boundaries.
  const std::vector<size_t> pieces = {1, 7, kBlock, kBlock - 8, 5000, 3 * kBlock + 17, 1};
  for (int buffers : {2, 3, 8}) {
    for (auto delay : {std::chrono::microseconds(0), std::chrono::microseconds(300)}) {
      Record record;
      std::unique_ptr<StagedAppender> appender = MakeAppender(record, buffers, -1, delay);
      ASSERT_NE(appender, nullptr);
      size_t at = 0;
      for (size_t i = 0; at < data.size(); ++i) {
        const size_t n = std::min(pieces[i % pieces.size()], data.size() - at);
        ASSERT_TRUE(appender->Put(data.data() + at, n).ok());
        at += n;
      }
      ASSERT_TRUE(appender->Finish().ok());
      std::string written;
      for (size_t i = 0; i < record.appends.size(); ++i) {
        if (i + 1 < record.appends.size()) EXPECT_EQ(record.appends[i].size(), kBlock) << i;
        written += record.appends[i];
      }
      EXPECT_EQ(written, data) << buffers << " buffers, delay " << delay.count() << " us";
      EXPECT_EQ(record.appends.size(), 24u);
      EXPECT_EQ(record.unaligned, 0);
      EXPECT_EQ(record.syncs, 1);
      EXPECT_EQ(record.closes, 1);
      EXPECT_TRUE(record.synced_before_close);
    }
  }
}

TEST(StagedAppender, AFailedAppendComesBackAndNothingAfterItIsWritten) {
  for (int buffers : {2, 4}) {
    Record record;
    std::unique_ptr<StagedAppender> appender =
        MakeAppender(record, buffers, /*fail_at=*/2, std::chrono::microseconds(200));
    ASSERT_NE(appender, nullptr);
    const std::string data = Pattern(40 * kBlock);
    absl::Status status;
    for (size_t at = 0; at < data.size() && status.ok(); at += kBlock / 2) {
      status = appender->Put(data.data() + at, kBlock / 2);
    }
    if (status.ok()) status = appender->Finish();
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_EQ(appender->Finish().code(), absl::StatusCode::kResourceExhausted);  // and again
    appender.reset();
    ASSERT_EQ(record.appends.size(), 2u);  // the two before the failure, none after it
    EXPECT_EQ(record.appends[0] + record.appends[1], data.substr(0, 2 * kBlock));
    EXPECT_EQ(record.syncs, 0);
    EXPECT_EQ(record.closes, 0);
  }
}

TEST(StagedAppender, DroppedWithoutFinishWritesWhatWasQueuedAndDoesNotSync) {
  Record record;
  std::unique_ptr<StagedAppender> appender =
      MakeAppender(record, 3, -1, std::chrono::microseconds(500));
  ASSERT_NE(appender, nullptr);
  const std::string data = Pattern(5 * kBlock + 10);
  ASSERT_TRUE(appender->Put(data.data(), data.size()).ok());
  appender.reset();  // five whole buffers queued or written, ten bytes staged
  EXPECT_EQ(record.appends.size(), 5u);
  EXPECT_EQ(record.syncs, 0);
  EXPECT_EQ(record.closes, 0);
}

TEST(StagedAppender, RefusesSizesThatBreakTheDirectIoContract) {
  for (auto [bytes, buffers] : {std::pair<size_t, int>{0, 2}, {kBlock + 512, 2}, {kBlock, 1}}) {
    Record record;
    absl::StatusOr<std::unique_ptr<StagedAppender>> appender = StagedAppender::Create(
        std::make_unique<RecordingFile>(record, -1, std::chrono::microseconds(0)), bytes, buffers);
    EXPECT_EQ(appender.status().code(), absl::StatusCode::kInvalidArgument) << bytes;
  }
}

}  // namespace
}  // namespace trainyard
