// What the GPU kernel benchmark needs around the kernels: device memory, synthetic inputs,
// a cudaEvent timer, and the result table (fixed-width text, or one JSON line per row).
// bench/torch_gpu_kernels.py prints the same rows for PyTorch; keep the two in step.
//
// Threading: single-threaded; everything is queued on the caller's stream.
#ifndef TRAINYARD_BENCH_GPU_BENCH_UTIL_H_
#define TRAINYARD_BENCH_GPU_BENCH_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace trainyard::bench {

// Device memory freed on destruction. Create() is RESOURCE_EXHAUSTED (or INTERNAL) when
// cudaMalloc fails; the memory starts zeroed.
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Create(int64_t bytes);
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  int32_t* i32() const { return static_cast<int32_t*>(ptr_); }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// Fills `n` elements of `dtype` at `dst` with normal(0, scale) values: a fixed host pattern of
// 2^20 values (seeded), tiled over the tensor. The values only need to be realistic in range
// for timing; tiling keeps gigabyte tensors cheap to fill.
absl::Status FillNormal(cudaStream_t stream, DType dtype, void* dst, int64_t n, uint64_t seed,
                        float scale);

// The benchmark's token ids, the same in bench/torch_gpu_kernels.py so that both engines see the
// same ids (and the same number of distinct ones): splitmix64(seed + i) mod vocab.
std::vector<int32_t> BenchTokens(int64_t n, int64_t vocab, uint64_t seed);

struct Timing {
  double median_ms = 0.0;
  double min_ms = 0.0;
  int reps = 0;
};

// Runs `op` `warmup` times, then `reps` times each between a pair of cudaEvents on `stream`,
// and returns the median and the minimum event time. Before every timed rep, outside the
// events: `prepare` (when set; e.g. restoring an input that `op` overwrites in place), then an
// L2 flush (a memset of twice the cache's size), so a kernel cannot profit from the previous
// rep's data still in cache. bench/torch_gpu_kernels.py does the same.
class EventTimer {
 public:
  using Op = std::function<absl::Status()>;
  static absl::StatusOr<EventTimer> Create(int warmup, int reps);
  absl::StatusOr<Timing> Time(cudaStream_t stream, const Op& op, const Op& prepare = nullptr);

 private:
  EventTimer(DeviceBuffer flush, int warmup, int reps)
      : flush_(std::move(flush)), warmup_(warmup), reps_(reps) {}
  DeviceBuffer flush_;
  int warmup_, reps_;
};

// One measured kernel. Exactly one of flop and bytes is positive: compute-bound kernels report
// TFLOP/s, memory-bound ones GB/s.
struct Row {
  std::string model;   // "gpt2-124m" | "llama-1b"
  std::string kernel;  // e.g. "attention fwd+bwd"
  std::string shape;   // human-readable dimensions
  double flop = 0.0;
  double bytes = 0.0;
  Timing timing;
  std::string error;  // set when the kernel failed; the timing is then meaningless
  // The achieved rate over the device's peak for the row's kind (bf16 tensor-core FLOP/s, or
  // memory bytes/s: bench/device_peaks.h), how far the kernel is from its floor; 0: unknown.
  double of_peak = 0.0;
};
// Sets row->of_peak from its timing and the peaks (0 for one not known).
void SetOfPeak(Row* row, double peak_tflops, double peak_bytes_per_s);

// The case's key in JSON ("model/kernel"), which the comparison driver matches rows by.
std::string RowKey(const Row& row);
void PrintTableHeader();
void PrintTableRow(const Row& row);
// {"engine":..., "case":..., "model":..., "kernel":..., "shape":..., "median_ms":...,
//  "min_ms":..., "reps":..., "flop":..., "bytes":..., "of_peak":... (when known),
//  "tflops":... | "gbps":..., "error":...}
void PrintJsonRow(const std::string& engine, const Row& row);

}  // namespace trainyard::bench

#endif  // TRAINYARD_BENCH_GPU_BENCH_UTIL_H_
