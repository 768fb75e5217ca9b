// The documents `trainyard tokenize` reads (worker/data/text_documents.h): gzip and zstd read
// back to the bytes compressed here with zlib and libzstd, every member and frame of a file,
// damaged streams refused naming the file; JSON Lines' fields with each line's place.
#include "worker/data/text_documents.h"

#include <zlib.h>
#include <zstd.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/filesystem.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"

namespace trainyard::worker::data {
namespace {

using ::testing::HasSubstr;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

// `text` as one gzip member.
std::string Gzip(const std::string& text) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// `text` as one zstd frame.
std::string Zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  EXPECT_FALSE(ZSTD_isError(n));
  out.resize(n);
  return out;
}

// Text of `bytes` bytes that compresses, but not to nothing: several of the reader's 1 MiB chunks.
std::string LongText(size_t bytes) {
  std::string text;
  for (int64_t i = 0; text.size() < bytes; ++i)
    absl::StrAppend(&text, "line ", i * 7919 % 100003, "\n");
  return text;
}

class TextDocumentsTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::string> Read(const std::string& name, const std::string& bytes) {
    WriteBytes(dir_.File(name), bytes);
    return ReadDecompressed(*RealFileSystem(), dir_.File(name));
  }
  ScratchDir dir_;
};

TEST_F(TextDocumentsTest, PlainTextIsReadAsItIs) {
  auto text = Read("a.txt", "caf\xc3\xa9\n");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "caf\xc3\xa9\n");
  auto empty = Read("e.txt", "");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "");
}

TEST_F(TextDocumentsTest, GzipEveryMember) {
  const std::string a = LongText(3 << 20), b = "second member\n";
  auto one = Read("a.gz", Gzip(a));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, a);
  auto two = Read("ab.gz", Gzip(a) + Gzip(b));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, a + b);
  const std::string whole = Gzip(a);
  auto cut = Read("cut.gz", whole.substr(0, whole.size() / 2));
  EXPECT_THAT(cut.status().message(), HasSubstr("cut.gz: a damaged gzip stream (it ends early)"));
  std::string flipped = whole;
  flipped[whole.size() - 3] ^= 0x55;  // the length in the trailer
  auto bad = Read("bad.gz", flipped);
  EXPECT_THAT(bad.status().message(), HasSubstr("bad.gz: a damaged gzip stream ("));
}

TEST_F(TextDocumentsTest, ZstdEveryFrame) {
  const std::string a = LongText(3 << 20), b = "second frame\n";
  auto one = Read("a.zst", Zstd(a));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, a);
  auto two = Read("ab.zst", Zstd(a) + Zstd(b));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, a + b);
  const std::string whole = Zstd(a);
  auto cut = Read("cut.zst", whole.substr(0, whole.size() / 2));
  EXPECT_THAT(cut.status().message(), HasSubstr("cut.zst: a damaged zstd stream (it ends early)"));
  auto junk = Read("junk.zst", whole + "xyz");
  EXPECT_THAT(junk.status().message(), HasSubstr("junk.zst: a damaged zstd stream ("));
}

// A frame whose window is past libzstd's default limit (2^27), as `zstd --long` writes: the
// stream API without a pledged size keeps the window asked for.
TEST_F(TextDocumentsTest, ZstdWithALongWindow) {
  const std::string text = LongText(1 << 20);
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ASSERT_FALSE(ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, 29)));
  std::string out(ZSTD_compressBound(text.size()) + 1024, '\0');
  ZSTD_inBuffer in{text.data(), text.size(), 0};
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  // Continue first, so that the size is not known in advance and the window stays 2^29.
  ASSERT_FALSE(ZSTD_isError(ZSTD_compressStream2(c, &o, &in, ZSTD_e_continue)));
  ASSERT_EQ(ZSTD_compressStream2(c, &o, &in, ZSTD_e_end), 0u);
  ZSTD_freeCCtx(c);
  out.resize(o.pos);
  // libzstd's default limit refuses it: the frame does need the larger window.
  ZSTD_DCtx* d = ZSTD_createDCtx();
  std::string sink(1 << 20, '\0');
  ZSTD_inBuffer from{out.data(), out.size(), 0};
  ZSTD_outBuffer to{sink.data(), sink.size(), 0};
  EXPECT_TRUE(ZSTD_isError(ZSTD_decompressStream(d, &to, &from)));
  ZSTD_freeDCtx(d);
  auto read = Read("long.zst", out);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, text);
}

// Zero bytes after the last gzip member are padding; anything else there is refused.
TEST_F(TextDocumentsTest, GzipPaddingButNotGarbage) {
  const std::string text = "padded\n";
  auto padded = Read("p.gz", Gzip(text) + std::string(512, '\0'));
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(*padded, text);
  auto garbage = Read("g.gz", Gzip(text) + "junk");
  EXPECT_THAT(garbage.status().message(), HasSubstr("g.gz: a damaged gzip stream ("));
}

// The documents of `bytes` written to `name`, as ForEachJsonLine gives them.
absl::StatusOr<std::vector<Document>> JsonLines(const ScratchDir& dir, const std::string& name,
                                                const std::string& bytes) {
  WriteBytes(dir.File(name), bytes);
  std::vector<Document> documents;
  absl::Status status = ForEachJsonLine(*RealFileSystem(), dir.File(name), "text", [&](Document d) {
    documents.push_back(std::move(d));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return documents;
}

TEST_F(TextDocumentsTest, EachJsonLinesFieldIsADocument) {
  auto docs = JsonLines(
      dir_, "d.jsonl",
      "{\"text\": \"one\", \"id\": 1}\n\n  \r\n{\"id\": 2, \"text\": \"two\\nlines \\u00e9\"}\r\n"
      "{\"text\": \"\"}");
  ASSERT_TRUE(docs.ok()) << docs.status();
  ASSERT_EQ(docs->size(), 3u);
  const std::string file = dir_.File("d.jsonl");
  EXPECT_EQ((*docs)[0].source, file + ":1");
  EXPECT_EQ((*docs)[0].text, "one");
  EXPECT_EQ((*docs)[1].source, file + ":4");
  EXPECT_EQ((*docs)[1].text, "two\nlines \xc3\xa9");
  EXPECT_EQ((*docs)[2].source, file + ":5");
  EXPECT_EQ((*docs)[2].text, "");
  EXPECT_THAT(JsonLines(dir_, "e.jsonl", "{\"text\": \"a\"}\n[1, 2]\n").status().message(),
              HasSubstr("e.jsonl:2: not a JSON object"));
  EXPECT_THAT(JsonLines(dir_, "f.jsonl", "{\"text\": \"a\"\n").status().message(),
              HasSubstr("f.jsonl:1: not a JSON object"));
  EXPECT_THAT(JsonLines(dir_, "g.jsonl", "{\"body\": \"a\"}\n").status().message(),
              HasSubstr("g.jsonl:1: no string field \"text\" (--field)"));
  EXPECT_THAT(JsonLines(dir_, "h.jsonl", "{\"text\": 7}\n").status().message(),
              HasSubstr("h.jsonl:1: no string field \"text\""));
}

// Lines streamed across the reader's megabyte chunks, plain, gzip and zstd, come out whole and
// in order; an error from the caller stops the reading.
TEST_F(TextDocumentsTest, JsonLinesStreamAcrossChunks) {
  std::string lines;
  std::vector<std::string> texts;
  for (int i = 0; lines.size() < (3 << 20); ++i) {
    texts.push_back(absl::StrCat("document ", i, " ", std::string(i % 997, 'x')));
    absl::StrAppend(&lines, "{\"text\": \"", texts.back(), "\"}\n");
  }
  for (const auto& [name, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"p.jsonl", lines}, {"g.jsonl.gz", Gzip(lines)}, {"z.jsonl.zst", Zstd(lines)}}) {
    auto docs = JsonLines(dir_, name, bytes);
    ASSERT_TRUE(docs.ok()) << name << ": " << docs.status();
    ASSERT_EQ(docs->size(), texts.size()) << name;
    for (size_t i = 0; i < texts.size(); ++i) ASSERT_EQ((*docs)[i].text, texts[i]) << name;
  }
  int seen = 0;
  const absl::Status stopped = ForEachJsonLine(
      *RealFileSystem(), dir_.File("g.jsonl.gz"), "text",
      [&](Document) { return ++seen == 3 ? absl::CancelledError("enough") : absl::OkStatus(); });
  EXPECT_EQ(stopped.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(seen, 3);
}

}  // namespace
}  // namespace trainyard::worker::data
