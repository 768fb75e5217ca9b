// TokenStream: the read-only, random-access view of a token sequence that every data source
// (llm.c shards, raw text, generated Markov data) presents to the batch sampler.
//
// Threading: streams are immutable after construction; Read() may be called concurrently from
// any number of threads.
#ifndef TRAINYARD_WORKER_DATA_TOKEN_STREAM_H_
#define TRAINYARD_WORKER_DATA_TOKEN_STREAM_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace trainyard::worker {

class TokenStream {
 public:
  virtual ~TokenStream();

  // Number of tokens.
  virtual int64_t size() const = 0;
  // Strict upper bound on every token: all tokens lie in [0, vocab_bound()).
  virtual int32_t vocab_bound() const = 0;
  // Copies tokens [offset, offset + count) to out[0, count). Requires 0 <= offset, 0 <= count and
  // offset + count <= size(); a violation is a programming error and aborts the process.
  virtual void Read(int64_t offset, int64_t count, int32_t* out) const = 0;
};

// Aborts with a message unless [offset, offset + count) lies inside [0, size). For Read().
void CheckReadRange(int64_t offset, int64_t count, int64_t size);

// Tokens [offset, offset + length) of another stream, renumbered from zero; used for held-out
// splits. Shares ownership of the base stream. vocab_bound() is the base's, so both halves of a
// split agree on the vocabulary. Requires the range to lie inside the base (aborts otherwise).
class SliceStream : public TokenStream {
 public:
  SliceStream(std::shared_ptr<const TokenStream> base, int64_t offset, int64_t length);

  int64_t size() const override { return length_; }
  int32_t vocab_bound() const override { return base_->vocab_bound(); }
  void Read(int64_t offset, int64_t count, int32_t* out) const override;

 private:
  std::shared_ptr<const TokenStream> base_;
  int64_t offset_;
  int64_t length_;
};

// Tokens held in memory. Requires every token < vocab_bound (aborts otherwise).
class MemoryStream : public TokenStream {
 public:
  MemoryStream(std::vector<uint16_t> tokens, int32_t vocab_bound);

  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  int32_t vocab_bound() const override { return vocab_bound_; }
  void Read(int64_t offset, int64_t count, int32_t* out) const override;

 private:
  std::vector<uint16_t> tokens_;
  int32_t vocab_bound_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_DATA_TOKEN_STREAM_H_
