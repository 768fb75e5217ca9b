#include "worker/data/text_documents.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard::worker::data {
namespace {

constexpr size_t kChunk = size_t{1} << 20;

// The first bytes of a gzip member and of a zstd frame: neither starts valid UTF-8.
constexpr absl::string_view kGzipMagic("\x1f\x8b", 2);
constexpr absl::string_view kZstdMagic("\x28\xb5\x2f\xfd", 4);

absl::Status Damaged(const std::string& path, absl::string_view format, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": a damaged ", format, " stream (", why, ")"));
}

absl::string_view Bytes(const ReadOnlyRegion& region) {
  return {reinterpret_cast<const char*>(region.data()), region.size()};
}

class PlainStream : public ByteStream {
 public:
  explicit PlainStream(std::unique_ptr<ReadOnlyRegion> region) : region_(std::move(region)) {}

  absl::StatusOr<bool> Next(std::string* out) override {
    const absl::string_view all = Bytes(*region_);
    if (at_ >= all.size()) return false;
    const absl::string_view part = all.substr(at_, kChunk);
    out->append(part.data(), part.size());
    at_ += part.size();
    return true;
  }

 private:
  std::unique_ptr<ReadOnlyRegion> region_;
  size_t at_ = 0;
};

// Every member, one after another.
class GzipStream : public ByteStream {
 public:
  GzipStream(std::unique_ptr<ReadOnlyRegion> region, std::string path)
      : region_(std::move(region)), path_(std::move(path)) {}
  ~GzipStream() override {
    if (started_) inflateEnd(&z_);
  }

  absl::StatusOr<bool> Next(std::string* out) override {
    if (done_) return false;
    if (!started_) {
      if (inflateInit2(&z_, 15 + 16) != Z_OK) return absl::InternalError("zlib: inflateInit2");
      started_ = true;
    }
    const size_t before = out->size();
    out->resize(before + kChunk);
    z_.next_out = reinterpret_cast<Bytef*>(out->data() + before);
    z_.avail_out = static_cast<uInt>(kChunk);
    while (z_.avail_out > 0) {
      Feed();
      const int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        Feed();
        const absl::string_view rest = Bytes(*region_).substr(fed_ - z_.avail_in);
        if (rest.find_first_not_of('\0') == absl::string_view::npos) {
          done_ = true;  // the end, or zero padding after the last member (as tar pads)
          break;
        }
        if (inflateReset(&z_) != Z_OK) return Damaged(path_, "gzip", "a member after the first");
        continue;  // the next member
      }
      if (rc == Z_BUF_ERROR && z_.avail_in == 0) return Damaged(path_, "gzip", "it ends early");
      if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return Damaged(path_, "gzip", z_.msg != nullptr ? z_.msg : "inflate failed");
      }
    }
    out->resize(before + kChunk - z_.avail_out);
    return true;
  }

 private:
  // More of the mapped input once zlib has read what it was given (at most 4 GiB at a time).
  void Feed() {
    const absl::string_view all = Bytes(*region_);
    if (z_.avail_in > 0 || fed_ == all.size()) return;
    const size_t more = std::min<size_t>(all.size() - fed_, UINT32_MAX);
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(all.data() + fed_));
    z_.avail_in = static_cast<uInt>(more);
    fed_ += more;
  }

  std::unique_ptr<ReadOnlyRegion> region_;
  std::string path_;
  z_stream z_{};
  bool started_ = false, done_ = false;
  size_t fed_ = 0;
};

// Every frame, one after another.
class ZstdStream : public ByteStream {
 public:
  ZstdStream(std::unique_ptr<ReadOnlyRegion> region, std::string path)
      : region_(std::move(region)),
        path_(std::move(path)),
        ctx_(ZSTD_createDCtx(), &ZSTD_freeDCtx),
        input_{region_->data(), region_->size(), 0} {
    // Frames written with --long have windows past the default limit (2^27 bytes): up to 2^31,
    // the largest a 64-bit zstd writes.
    constexpr int kWindowLogMax = 31;
    if (ctx_ != nullptr) ZSTD_DCtx_setParameter(ctx_.get(), ZSTD_d_windowLogMax, kWindowLogMax);
  }

  absl::StatusOr<bool> Next(std::string* out) override {
    if (ctx_ == nullptr) return absl::InternalError("zstd: ZSTD_createDCtx failed");
    if (done_) return false;
    const size_t before = out->size();
    out->resize(before + kChunk);
    ZSTD_outBuffer output{out->data() + before, kChunk, 0};
    while (output.pos < output.size) {
      last_ = ZSTD_decompressStream(ctx_.get(), &output, &input_);
      if (ZSTD_isError(last_)) return Damaged(path_, "zstd", ZSTD_getErrorName(last_));
      // All input read, and the last frame out (0), or room left over: nothing is held back.
      if (input_.pos == input_.size && (last_ == 0 || output.pos < output.size)) {
        if (last_ != 0) return Damaged(path_, "zstd", "it ends early");
        done_ = true;
        break;
      }
    }
    out->resize(before + output.pos);
    return true;
  }

 private:
  std::unique_ptr<ReadOnlyRegion> region_;
  std::string path_;
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx_;
  ZSTD_inBuffer input_;
  size_t last_ = 0;  // 0 once a frame has ended and all of it is out
  bool done_ = false;
};

// One line of JSON Lines as a document: its object's `field`.
absl::StatusOr<Document> JsonLineDocument(absl::string_view line, const std::string& field,
                                          std::string where) {
  google::protobuf::Struct object;
  if (!google::protobuf::util::JsonStringToMessage(std::string(line), &object).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  }
  auto it = object.fields().find(field);
  if (it == object.fields().end() ||
      it->second.kind_case() != google::protobuf::Value::kStringValue) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no string field \"", field, "\" (--field)"));
  }
  return Document{std::move(where), it->second.string_value()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<ByteStream>> ByteStream::Open(FileSystem& fs,
                                                             const std::string& path) {
  TY_ASSIGN_OR_RETURN(std::unique_ptr<ReadOnlyRegion> region, fs.MapReadOnly(path));
  const absl::string_view head = Bytes(*region).substr(0, 4);
  if (absl::StartsWith(head, kGzipMagic)) {
    return std::make_unique<GzipStream>(std::move(region), path);
  }
  if (absl::StartsWith(head, kZstdMagic)) {
    return std::make_unique<ZstdStream>(std::move(region), path);
  }
  return std::make_unique<PlainStream>(std::move(region));
}

absl::StatusOr<std::string> ReadDecompressed(FileSystem& fs, const std::string& path) {
  TY_ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, ByteStream::Open(fs, path));
  std::string out;
  for (;;) {
    TY_ASSIGN_OR_RETURN(const bool more, stream->Next(&out));
    if (!more) return out;
  }
}

absl::Status ForEachJsonLine(FileSystem& fs, const std::string& path, const std::string& field,
                             const std::function<absl::Status(Document)>& each) {
  TY_ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, ByteStream::Open(fs, path));
  std::string pending;  // bytes after the last complete line
  int64_t number = 0;
  auto line = [&](absl::string_view text) -> absl::Status {
    ++number;
    if (absl::StripAsciiWhitespace(text).empty()) return absl::OkStatus();
    TY_ASSIGN_OR_RETURN(Document document,
                        JsonLineDocument(text, field, absl::StrCat(path, ":", number)));
    return each(std::move(document));
  };
  for (bool more = true; more;) {
    TY_ASSIGN_OR_RETURN(more, stream->Next(&pending));
    size_t start = 0;
    for (size_t end; (end = pending.find('\n', start)) != std::string::npos; start = end + 1) {
      TY_RETURN_IF_ERROR(line(absl::string_view(pending).substr(start, end - start)));
    }
    pending.erase(0, start);
  }
  return pending.empty() ? absl::OkStatus() : line(pending);
}

}  // namespace trainyard::worker::data
