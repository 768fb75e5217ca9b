#include "worker/data/text_documents.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <memory>

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

// Every gzip member of `in`, one after another.
absl::StatusOr<std::string> Gunzip(absl::string_view in, const std::string& path) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) return absl::InternalError("zlib: inflateInit2 failed");
  std::unique_ptr<z_stream, decltype(&inflateEnd)> closer(&z, &inflateEnd);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  size_t fed = std::min<size_t>(in.size(), UINT32_MAX);  // more is fed in parts below
  z.avail_in = static_cast<uInt>(fed);
  std::string out;
  for (;;) {
    const size_t before = out.size();
    out.resize(before + kChunk);
    z.next_out = reinterpret_cast<Bytef*>(out.data() + before);
    z.avail_out = static_cast<uInt>(kChunk);
    const int rc = inflate(&z, Z_NO_FLUSH);
    out.resize(before + kChunk - z.avail_out);
    if (z.avail_in == 0 && fed < in.size()) {
      const size_t more = std::min<size_t>(in.size() - fed, UINT32_MAX);
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + fed));
      z.avail_in = static_cast<uInt>(more);
      fed += more;
    }
    if (rc == Z_STREAM_END) {
      const absl::string_view rest(reinterpret_cast<const char*>(z.next_in), z.avail_in);
      if (fed == in.size() && rest.find_first_not_of('\0') == absl::string_view::npos) {
        return out;  // the end, or zero padding after the last member (as tar pads)
      }
      if (inflateReset(&z) != Z_OK) return Damaged(path, "gzip", "a member after the first");
      continue;  // the next member
    }
    if (rc == Z_BUF_ERROR && z.avail_in == 0) return Damaged(path, "gzip", "it ends early");
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return Damaged(path, "gzip", z.msg != nullptr ? z.msg : "inflate failed");
    }
  }
}

// Every zstd frame of `in`, one after another.
absl::StatusOr<std::string> Unzstd(absl::string_view in, const std::string& path) {
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> ctx(ZSTD_createDCtx(), &ZSTD_freeDCtx);
  if (ctx == nullptr) return absl::InternalError("zstd: ZSTD_createDCtx failed");
  // Frames written with --long have windows past the default limit (2^27 bytes): up to 2^31, the
  // largest a 64-bit zstd writes.
  constexpr int kWindowLogMax = 31;
  ZSTD_DCtx_setParameter(ctx.get(), ZSTD_d_windowLogMax, kWindowLogMax);
  ZSTD_inBuffer input{in.data(), in.size(), 0};
  std::string out;
  size_t last = 0;  // 0 once a frame has ended and all of it is out
  for (;;) {
    const size_t before = out.size();
    out.resize(before + kChunk);
    ZSTD_outBuffer output{out.data() + before, kChunk, 0};
    last = ZSTD_decompressStream(ctx.get(), &output, &input);
    out.resize(before + output.pos);
    if (ZSTD_isError(last)) return Damaged(path, "zstd", ZSTD_getErrorName(last));
    // All input read, and the last frame out (0), or room left over: nothing is held back.
    if (input.pos == input.size && (last == 0 || output.pos < kChunk)) break;
  }
  if (last != 0) return Damaged(path, "zstd", "it ends early");
  return out;
}

}  // namespace

absl::StatusOr<std::string> ReadDecompressed(FileSystem& fs, const std::string& path) {
  absl::StatusOr<std::string> contents = fs.ReadFile(path);
  if (!contents.ok()) return contents.status();
  const absl::string_view head = absl::string_view(*contents).substr(0, 4);
  if (absl::StartsWith(head, kGzipMagic)) return Gunzip(*contents, path);
  if (absl::StartsWith(head, kZstdMagic)) return Unzstd(*contents, path);
  return contents;
}

absl::StatusOr<std::vector<Document>> JsonLinesDocuments(absl::string_view contents,
                                                         const std::string& field,
                                                         const std::string& path) {
  std::vector<Document> documents;
  int64_t number = 0;
  for (size_t at = 0; at < contents.size();) {
    size_t end = contents.find('\n', at);
    if (end == absl::string_view::npos) end = contents.size();
    const absl::string_view line = contents.substr(at, end - at);
    at = end + 1;
    ++number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where = absl::StrCat(path, ":", number);
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
    documents.push_back({where, it->second.string_value()});
  }
  return documents;
}

}  // namespace trainyard::worker::data
