#include "worker/data/sampler.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/data/xoshiro.h"

namespace trainyard::worker {

absl::Status BatchSampler::Check(const TokenStream& stream, int seq_len) {
  if (seq_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence length ", seq_len, " is not positive"));
  }
  if (stream.size() <= seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream holds ", stream.size(), " tokens; sequence length ", seq_len,
                     " needs at least ", static_cast<int64_t>(seq_len) + 1));
  }
  return absl::OkStatus();
}

BatchSampler::BatchSampler(const TokenStream& stream, int seq_len, uint64_t seed)
    : stream_(stream), seq_len_(seq_len), seed_(seed) {
  if (absl::Status status = Check(stream, seq_len); !status.ok()) {
    std::fprintf(stderr, "trainyard data: BatchSampler: %s\n", status.ToString().c_str());
    std::abort();
  }
  train_starts_ = stream.size() - seq_len;
  eval_windows_ = (stream.size() - 1) / seq_len;
}

int64_t BatchSampler::TrainOffset(int64_t step, int64_t sample) const {
  const uint64_t h = HashCounter(seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(sample));
  return static_cast<int64_t>(h % static_cast<uint64_t>(train_starts_));
}

int64_t BatchSampler::EvalOffset(int64_t window) const {
  return (window % eval_windows_) * seq_len_;
}

void BatchSampler::FillWindow(int64_t offset, int32_t* inputs, int32_t* targets) const {
  // Targets are the inputs shifted by one, plus the token after the window.
  stream_.Read(offset, seq_len_, inputs);
  std::memcpy(targets, inputs + 1, sizeof(int32_t) * (seq_len_ - 1));
  stream_.Read(offset + seq_len_, 1, targets + seq_len_ - 1);
}

void BatchSampler::FillTrain(int64_t step, int64_t first_sample, int count, int32_t* inputs,
                             int32_t* targets) const {
  for (int j = 0; j < count; ++j) {
    const int64_t row = static_cast<int64_t>(j) * seq_len_;
    FillWindow(TrainOffset(step, first_sample + j), inputs + row, targets + row);
  }
}

void BatchSampler::FillEval(int64_t batch_index, int count, int32_t* inputs,
                            int32_t* targets) const {
  FillEvalWindows(batch_index * count, count, inputs, targets);
}

void BatchSampler::FillEvalWindows(int64_t first_window, int count, int32_t* inputs,
                                   int32_t* targets) const {
  for (int j = 0; j < count; ++j) {
    const int64_t row = static_cast<int64_t>(j) * seq_len_;
    FillWindow(EvalOffset(first_window + j), inputs + row, targets + row);
  }
}

}  // namespace trainyard::worker
