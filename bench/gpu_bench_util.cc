#include "bench/gpu_bench_util.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise.h"

namespace trainyard::bench {
namespace {

constexpr int64_t kPatternElements = int64_t{1} << 20;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// JSON string literal for the short ASCII texts this file prints (names, shapes, messages).
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += (static_cast<unsigned char>(ch) < 0x20) ? ' ' : ch;
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(int64_t bytes) {
  DeviceBuffer buffer;
  if (bytes <= 0) return buffer;
  TY_CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer.ptr_, static_cast<size_t>(bytes)));
  buffer.bytes_ = bytes;
  TY_CUDA_RETURN_IF_ERROR(cudaMemset(buffer.ptr_, 0, static_cast<size_t>(bytes)));
  return buffer;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::Status FillNormal(cudaStream_t stream, DType dtype, void* dst, int64_t n, uint64_t seed,
                        float scale) {
  if (n <= 0) return absl::OkStatus();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> pattern(static_cast<size_t>(std::min(n, kPatternElements)));
  for (float& x : pattern) x = normal(rng);
  TY_ASSIGN_OR_RETURN(DeviceBuffer staging,
                      DeviceBuffer::Create(static_cast<int64_t>(pattern.size() * sizeof(float))));
  TY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging.get(), pattern.data(),
                                          pattern.size() * sizeof(float), cudaMemcpyHostToDevice,
                                          stream));
  // Chunks start at multiples of 2^20 elements, so every piece stays 16-byte aligned.
  for (int64_t offset = 0; offset < n; offset += kPatternElements) {
    const int64_t count = std::min(kPatternElements, n - offset);
    void* piece = static_cast<char*>(dst) + offset * DTypeBytes(dtype);
    TY_RETURN_IF_ERROR(
        kernels::cuda::Convert(stream, dtype, piece, DType::kF32, staging.f32(), count));
  }
  // The staging buffer is freed on return: wait for the copies that read it.
  TY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

std::vector<int32_t> BenchTokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>(SplitMix64(seed + static_cast<uint64_t>(i)) %
                                     static_cast<uint64_t>(vocab));
  }
  return tokens;
}

absl::StatusOr<EventTimer> EventTimer::Create(int warmup, int reps) {
  int device = 0, l2_bytes = 0;
  TY_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TY_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  TY_ASSIGN_OR_RETURN(DeviceBuffer flush,
                      DeviceBuffer::Create(2 * std::max<int64_t>(l2_bytes, 1 << 20)));
  return EventTimer(std::move(flush), warmup, reps);
}

absl::StatusOr<Timing> EventTimer::Time(cudaStream_t stream, const Op& op, const Op& prepare) {
  for (int i = 0; i < warmup_; ++i) {
    if (prepare) TY_RETURN_IF_ERROR(prepare());
    TY_RETURN_IF_ERROR(op());
  }
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(reps_), nullptr);
  auto destroy = [&events] {
    for (cudaEvent_t e : events) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  };
  absl::Status status;
  for (cudaEvent_t& e : events) {
    if (cudaError_t err = cudaEventCreate(&e); err != cudaSuccess) {
      status = kernels::cuda::CudaError(err, "cudaEventCreate", __FILE__, __LINE__);
      break;
    }
  }
  for (int i = 0; status.ok() && i < reps_; ++i) {
    if (prepare) {
      status = prepare();
      if (!status.ok()) break;
    }
    cudaMemsetAsync(flush_.get(), i & 0xFF, static_cast<size_t>(flush_.bytes()), stream);
    cudaEventRecord(events[2 * i], stream);
    status = op();
    cudaEventRecord(events[2 * i + 1], stream);
  }
  if (status.ok()) {
    if (cudaError_t err = cudaStreamSynchronize(stream); err != cudaSuccess) {
      status = kernels::cuda::CudaError(err, "cudaStreamSynchronize", __FILE__, __LINE__);
    }
  }
  std::vector<double> ms;
  for (int i = 0; status.ok() && i < reps_; ++i) {
    float elapsed = 0.0f;
    if (cudaError_t err = cudaEventElapsedTime(&elapsed, events[2 * i], events[2 * i + 1]);
        err != cudaSuccess) {
      status = kernels::cuda::CudaError(err, "cudaEventElapsedTime", __FILE__, __LINE__);
    }
    ms.push_back(elapsed);
  }
  destroy();
  if (!status.ok()) return status;
  std::sort(ms.begin(), ms.end());
  return Timing{.median_ms = ms[ms.size() / 2], .min_ms = ms.front(), .reps = reps_};
}

std::string RowKey(const Row& row) { return absl::StrCat(row.model, "/", row.kernel); }

void SetOfPeak(Row* row, double peak_tflops, double peak_bytes_per_s) {
  row->of_peak = 0.0;
  if (!row->error.empty() || row->timing.median_ms <= 0) return;
  const double seconds = row->timing.median_ms / 1e3;
  if (row->flop > 0 && peak_tflops > 0) row->of_peak = row->flop / seconds / 1e12 / peak_tflops;
  if (row->flop <= 0 && peak_bytes_per_s > 0)
    row->of_peak = row->bytes / seconds / peak_bytes_per_s;
}

void PrintTableHeader() {
  std::printf("%-10s %-22s %-34s %10s %10s %12s %8s\n", "model", "kernel", "shape", "median ms",
              "min ms", "achieved", "of peak");
}

void PrintTableRow(const Row& row) {
  if (!row.error.empty()) {
    std::printf("%-10s %-22s %-34s  error: %s\n", row.model.c_str(), row.kernel.c_str(),
                row.shape.c_str(), row.error.c_str());
    return;
  }
  const double seconds = row.timing.median_ms / 1e3;
  const std::string achieved =
      row.flop > 0 ? absl::StrCat(absl::SixDigits(row.flop / seconds / 1e12), " TFLOP/s")
                   : absl::StrCat(absl::SixDigits(row.bytes / seconds / 1e9), " GB/s");
  const std::string of_peak =
      row.of_peak > 0 ? absl::StrCat(static_cast<int>(row.of_peak * 100 + 0.5), "%") : "";
  std::printf("%-10s %-22s %-34s %10.4f %10.4f %12s %8s\n", row.model.c_str(), row.kernel.c_str(),
              row.shape.c_str(), row.timing.median_ms, row.timing.min_ms, achieved.c_str(),
              of_peak.c_str());
}

void PrintJsonRow(const std::string& engine, const Row& row) {
  std::string line =
      absl::StrCat("{\"engine\":", Quoted(engine), ",\"case\":", Quoted(RowKey(row)),
                   ",\"model\":", Quoted(row.model), ",\"kernel\":", Quoted(row.kernel),
                   ",\"shape\":", Quoted(row.shape));
  if (!row.error.empty()) {
    absl::StrAppend(&line, ",\"error\":", Quoted(row.error), "}");
  } else {
    const double seconds = row.timing.median_ms / 1e3;
    char numbers[256];
    std::snprintf(numbers, sizeof(numbers),
                  ",\"median_ms\":%.6f,\"min_ms\":%.6f,\"reps\":%d,\"flop\":%.17g,\"bytes\":%.17g",
                  row.timing.median_ms, row.timing.min_ms, row.timing.reps, row.flop, row.bytes);
    absl::StrAppend(&line, numbers);
    if (row.of_peak > 0) absl::StrAppend(&line, ",\"of_peak\":", absl::SixDigits(row.of_peak));
    std::snprintf(numbers, sizeof(numbers), row.flop > 0 ? ",\"tflops\":%.3f}" : ",\"gbps\":%.1f}",
                  row.flop > 0 ? row.flop / seconds / 1e12 : row.bytes / seconds / 1e9);
    absl::StrAppend(&line, numbers);
  }
  std::printf("%s\n", line.c_str());
}

}  // namespace trainyard::bench
