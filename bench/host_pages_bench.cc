// What a buffer's pages cost a read(2) into it: pread of a cached file into a buffer that was
// zero-filled (every page touched from user space) on 4 KiB pages, and into one on huge pages
// (common/host_memory.h's AllocateHostMemory), the first pass and the next ones. In some
// virtual machines the kernel's first write into each 4 KiB page of a process traps even after
// the process touched it, which made a checkpoint restore by pread 15x slower on 4 KiB pages.
//
// Usage: trainyard-bench-host-pages [--mib N] [--passes P] [--dir DIR]
// Writes an N MiB file in DIR (default /tmp), reads it into each buffer P times, prints a table
// of GB/s per pass, and removes the file.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/host_memory.h"

namespace {

using Clock = std::chrono::steady_clock;

// Reads `bytes` of `fd` into `dst` in 4 MiB preads; seconds taken, or -1 on an error.
double ReadInto(int fd, char* dst, size_t bytes) {
  constexpr size_t kChunk = size_t{4} << 20;
  const auto start = Clock::now();
  for (size_t at = 0; at < bytes;) {
    const ssize_t n = ::pread(fd, dst + at, std::min(kChunk, bytes - at), static_cast<off_t>(at));
    if (n <= 0) return -1;
    at += static_cast<size_t>(n);
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "trainyard-bench-host-pages: %s\nusage: [--mib N] [--passes P] [--dir DIR]\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long mib = 1024, passes = 3;
  std::string dir = "/tmp";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return Usage(("missing value after " + arg).c_str());
    const char* value = argv[++i];
    if (arg == "--mib") {
      mib = std::strtol(value, nullptr, 10);
    } else if (arg == "--passes") {
      passes = std::strtol(value, nullptr, 10);
    } else if (arg == "--dir") {
      dir = value;
    } else {
      return Usage(("unknown flag " + arg).c_str());
    }
  }
  if (mib < 4 || passes < 1) return Usage("--mib must be at least 4 and --passes at least 1");
  const size_t bytes = static_cast<size_t>(mib) << 20;
  std::string path = dir + "/trainyard-host-pages.XXXXXX";
  const int fd = ::mkstemp(path.data());
  if (fd < 0) return Usage(("cannot create a file in " + dir).c_str());
  {  // the file, written through the page cache so that every read below is a cached one
    std::vector<char> block(size_t{4} << 20);
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i * 131);
    for (size_t at = 0; at < bytes; at += block.size()) {
      if (::write(fd, block.data(), std::min(block.size(), bytes - at)) < 0) {
        std::fprintf(stderr, "trainyard-bench-host-pages: writing %s failed\n", path.c_str());
        ::close(fd);
        ::unlink(path.c_str());
        return 1;
      }
    }
  }
  std::printf("pread of a cached %ld MiB file into a zero-filled buffer, GB/s per pass\n\n", mib);
  std::printf("| buffer | pass 1 |");
  for (long p = 2; p <= passes; ++p) std::printf(" pass %ld |", p);
  std::printf("\n|---|---:|");
  for (long p = 2; p <= passes; ++p) std::printf("---:|");
  std::printf("\n");
  int rc = 0;
  for (const bool huge : {false, true}) {
    std::unique_ptr<void, trainyard::FreeHostMemory> owned;
    if (huge) {
      owned = trainyard::AllocateHostMemory(bytes, 64);
    } else {
      owned.reset(std::aligned_alloc(4096, bytes));
      if (owned == nullptr) {
        std::fprintf(stderr, "trainyard-bench-host-pages: out of memory\n");
        rc = 1;
        break;
      }
      std::memset(owned.get(), 0, bytes);
    }
    std::printf("| %s |", huge ? "huge pages (AllocateHostMemory)" : "4 KiB pages (memset)");
    for (long p = 0; p < passes; ++p) {
      const double s = ReadInto(fd, static_cast<char*>(owned.get()), bytes);
      if (s < 0) rc = 1;
      std::printf(" %.2f |", s > 0 ? bytes / s / 1e9 : 0.0);
    }
    std::printf("\n");
  }
  ::close(fd);
  ::unlink(path.c_str());
  return rc;
}
