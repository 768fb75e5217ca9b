// BatchSampler: which token windows make up each training and evaluation batch.
//
// Training: sample i of optimizer step s is the window starting at
//   offset = HashCounter(seed, s, i) mod (size - seq_len)
// with inputs = tokens[offset, offset + seq_len) and targets = tokens[offset + 1, offset + seq_len
// + 1). The window is a pure function of (seed, step, sample index): it does not depend on the
// rank, on how a global batch is split into micro-batches or across ranks, or on what was read
// before, so a resumed or resized job consumes exactly the same global batches.
//
// Evaluation: the validation stream is tiled by eval_windows() consecutive windows starting at
// multiples of seq_len (each token is a target exactly once per pass); window w is tile
// w mod eval_windows(), so batches wrap around.
//
// Threading: immutable after construction; Fill* may be called concurrently. The sampler borrows
// the stream, which must outlive it.
#ifndef TRAINYARD_WORKER_DATA_SAMPLER_H_
#define TRAINYARD_WORKER_DATA_SAMPLER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "worker/data/token_stream.h"

namespace trainyard::worker {

class BatchSampler {
 public:
  // Requires Check(stream, seq_len).ok() (aborts otherwise).
  BatchSampler(const TokenStream& stream, int seq_len, uint64_t seed);

  // OK when seq_len > 0 and the stream holds more than seq_len tokens (one window of inputs plus
  // the shifted target); INVALID_ARGUMENT otherwise, stating both numbers.
  [[nodiscard]] static absl::Status Check(const TokenStream& stream, int seq_len);

  // Samples [first_sample, first_sample + count) of step `step`, row-major: row j of inputs and
  // targets (seq_len tokens each) is sample first_sample + j. Requires step >= 0, first_sample >=
  // 0, count >= 0; the arrays hold count * seq_len entries.
  void FillTrain(int64_t step, int64_t first_sample, int count, int32_t* inputs,
                 int32_t* targets) const;

  // Evaluation batch `batch_index` of `count` windows: row j is window batch_index * count + j.
  // Requires batch_index >= 0 and count >= 0.
  void FillEval(int64_t batch_index, int count, int32_t* inputs, int32_t* targets) const;
  // Evaluation windows [first_window, first_window + count): row j is window first_window + j.
  void FillEvalWindows(int64_t first_window, int count, int32_t* inputs, int32_t* targets) const;

  // Start offsets of the windows above (exposed for tests and diagnostics).
  int64_t TrainOffset(int64_t step, int64_t sample) const;
  int64_t EvalOffset(int64_t window) const;

  // Number of distinct evaluation windows: (size - 1) / seq_len, at least 1.
  int64_t eval_windows() const { return eval_windows_; }
  int seq_len() const { return seq_len_; }

 private:
  void FillWindow(int64_t offset, int32_t* inputs, int32_t* targets) const;

  const TokenStream& stream_;
  int seq_len_;
  uint64_t seed_;
  int64_t train_starts_;  // size - seq_len: number of valid training start offsets
  int64_t eval_windows_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_DATA_SAMPLER_H_
