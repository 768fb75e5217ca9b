#include "server/agent/log_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard::server::agent {
namespace {

constexpr int64_t kTailWindow = 64 << 10;
constexpr int64_t kOffsetWindow = 1 << 20;

absl::Status FileError(const std::string& what, const std::string& path) {
  return ErrnoStatus(errno, absl::StrCat(what, " ", path));
}

absl::StatusOr<int64_t> FileSize(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) return FileError("stat", path);
  return static_cast<int64_t>(st.st_size);
}

absl::StatusOr<std::string> ReadAt(int fd, const std::string& path, int64_t offset,
                                   int64_t length) {
  std::string data(static_cast<size_t>(length), '\0');
  int64_t done = 0;
  while (done < length) {
    const ssize_t got = pread(fd, data.data() + done, length - done, offset + done);
    if (got < 0) {
      if (errno == EINTR) continue;
      return FileError("read", path);
    }
    if (got == 0) break;
    done += got;
  }
  data.resize(done);
  return data;
}

// The last `window` bytes of the file and the offset they start at.
absl::StatusOr<std::pair<int64_t, std::string>> ReadTail(const std::string& path, int64_t window) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError("open", path);
  absl::StatusOr<int64_t> size = FileSize(fd, path);
  absl::StatusOr<std::string> data;
  int64_t start = 0;
  if (size.ok()) {
    start = std::max<int64_t>(0, *size - window);
    data = ReadAt(fd, path, start, *size - start);
  }
  close(fd);
  if (!size.ok()) return size.status();
  if (!data.ok()) return data.status();
  return std::make_pair(start, *std::move(data));
}

// The position in `text` where its last `count` lines begin.
size_t StartOfLastLines(const std::string& text, int count) {
  size_t end = text.size();
  if (end > 0 && text[end - 1] == '\n') --end;  // the final newline ends the last line
  for (int seen = 0; end > 0; --end) {
    if (text[end - 1] == '\n' && ++seen == count) return end;
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> LastLines(const std::string& path, int count) {
  std::vector<std::string> lines;
  if (count <= 0) return lines;
  absl::StatusOr<std::pair<int64_t, std::string>> tail = ReadTail(path, kTailWindow);
  if (!tail.ok()) return tail.status();
  const std::string& text = tail->second;
  size_t pos = StartOfLastLines(text, count);
  if (pos == 0 && tail->first > 0) {  // the window begins inside a line: drop that piece
    const size_t newline = text.find('\n');
    pos = newline == std::string::npos ? text.size() : newline + 1;
  }
  while (pos < text.size()) {
    size_t newline = text.find('\n', pos);
    if (newline == std::string::npos) newline = text.size();
    lines.push_back(text.substr(pos, newline - pos));
    pos = newline + 1;
  }
  return lines;
}

absl::StatusOr<int64_t> OffsetOfLastLines(const std::string& path, int count) {
  absl::StatusOr<std::pair<int64_t, std::string>> tail = ReadTail(path, kOffsetWindow);
  if (!tail.ok()) return tail.status();
  if (count <= 0) return tail->first + static_cast<int64_t>(tail->second.size());
  size_t pos = StartOfLastLines(tail->second, count);
  if (pos == 0 && tail->first > 0) {
    const size_t newline = tail->second.find('\n');
    pos = newline == std::string::npos ? tail->second.size() : newline + 1;
  }
  return tail->first + static_cast<int64_t>(pos);
}

absl::StatusOr<std::string> ReadRange(const std::string& path, int64_t offset, int64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError("open", path);
  absl::StatusOr<int64_t> size = FileSize(fd, path);
  absl::StatusOr<std::string> data = std::string();
  if (size.ok() && offset < *size) {
    data = ReadAt(fd, path, offset, std::min(max_bytes, *size - offset));
  }
  close(fd);
  if (!size.ok()) return size.status();
  return data;
}

}  // namespace trainyard::server::agent
