#include "worker/data/token_stream.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace trainyard::worker {
namespace {

[[noreturn]] void Die(const char* what, long long a, long long b, long long c) {
  std::fprintf(stderr, "trainyard data: %s (%lld, %lld, %lld)\n", what, a, b, c);
  std::abort();
}

}  // namespace

TokenStream::~TokenStream() = default;

void CheckReadRange(int64_t offset, int64_t count, int64_t size) {
  if (offset < 0 || count < 0 || offset > size || count > size - offset) {
    Die("token read out of range (offset, count, size)", offset, count, size);
  }
}

SliceStream::SliceStream(std::shared_ptr<const TokenStream> base, int64_t offset, int64_t length)
    : base_(std::move(base)), offset_(offset), length_(length) {
  CheckReadRange(offset, length, base_->size());
}

void SliceStream::Read(int64_t offset, int64_t count, int32_t* out) const {
  CheckReadRange(offset, count, length_);
  base_->Read(offset_ + offset, count, out);
}

MemoryStream::MemoryStream(std::vector<uint16_t> tokens, int32_t vocab_bound)
    : tokens_(std::move(tokens)), vocab_bound_(vocab_bound) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i] >= vocab_bound_) {
      Die("token outside vocabulary (index, token, vocab_bound)", static_cast<long long>(i),
          tokens_[i], vocab_bound_);
    }
  }
}

void MemoryStream::Read(int64_t offset, int64_t count, int32_t* out) const {
  CheckReadRange(offset, count, size());
  const uint16_t* src = tokens_.data() + offset;
  for (int64_t i = 0; i < count; ++i) out[i] = src[i];
}

}  // namespace trainyard::worker
