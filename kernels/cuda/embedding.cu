#include <cub/cub.cuh>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/embedding.h"

namespace trainyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Regions of the scratch buffer start on this boundary (cub's own alignment for temporaries).
constexpr size_t kAlign = 256;

size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Sort keys need only the bits that can hold `vocab` (the key of an ignored row), which makes
// the radix sort take fewer passes than a 32-bit sort.
int SortKeyBits(int64_t vocab) {
  int bits = 1;
  while ((int64_t{1} << bits) <= vocab) ++bits;
  return bits;
}

// The scratch buffer: four int arrays of `n` (keys and row indices, before and after sorting),
// then cub's temporaries; plus kAlign bytes so that a buffer of any alignment can be used.
struct ScratchLayout {
  size_t keys_in = 0, keys_out = 0, rows_in = 0, rows_out = 0, cub_temp = 0;
  size_t cub_temp_bytes = 0;
  size_t total = 0;
};

absl::Status PlanScratch(int64_t n, int64_t vocab, ScratchLayout* layout) {
  size_t cub_bytes = 0;
  TY_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      nullptr, cub_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(n), 0,
      SortKeyBits(vocab)));
  const size_t array = AlignUp(static_cast<size_t>(n) * sizeof(int32_t));
  layout->keys_in = 0;
  layout->keys_out = array;
  layout->rows_in = 2 * array;
  layout->rows_out = 3 * array;
  layout->cub_temp = 4 * array;
  layout->cub_temp_bytes = cub_bytes;
  layout->total = kAlign + 4 * array + AlignUp(cub_bytes);
  return absl::OkStatus();
}

template <typename T>
__global__ void EmbeddingForwardKernel(T* out, const int32_t* tokens, const float* wte,
                                       const float* wpe, int64_t t, int64_t c, int64_t total,
                                       float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / c, col = i % c;
    const int32_t token = tokens[row];
    // A negative token belongs to another vocabulary shard: no token embedding.
    float v = token >= 0 ? scale * wte[token * c + col] : 0.0f;
    if (wpe != nullptr) v += wpe[(row % t) * c + col];
    out[i] = FromFloat<T>(v);
  }
}

// Sort keys: the token, or `vocab` for rows that get no token gradient (negative tokens, and
// out-of-range ones, which the host cannot see; ignoring them keeps every write in bounds).
__global__ void MakeSortKeysKernel(uint32_t* keys, int32_t* rows, const int32_t* tokens, int64_t n,
                                   int64_t vocab) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t token = tokens[i];
    keys[i] =
        token >= 0 && token < vocab ? static_cast<uint32_t>(token) : static_cast<uint32_t>(vocab);
    rows[i] = static_cast<int32_t>(i);
  }
}

// Block x looks at sorted position x; if it starts a run of equal tokens, it adds the run's dout
// rows to that token's dwte row. The sort is stable, so rows are added in row order: the same
// order as the CPU reference, and the same on every run.
template <typename T>
__global__ void TokenGradKernel(float* dwte, const T* dout, const uint32_t* keys,
                                const int32_t* rows, int64_t n, int64_t c, uint32_t ignored,
                                float scale) {
  const int64_t start = blockIdx.x;
  const uint32_t token = keys[start];
  if (token == ignored || (start > 0 && keys[start - 1] == token)) return;
  int64_t end = start + 1;
  while (end < n && keys[end] == token) ++end;
  float* de = dwte + int64_t{token} * c;
  for (int64_t col = threadIdx.x; col < c; col += blockDim.x) {
    float acc = de[col];
    for (int64_t k = start; k < end; ++k) {
      acc += scale * ToFloat(dout[int64_t{rows[k]} * c + col]);
    }
    de[col] = acc;
  }
}

// dwpe[i, col] += Σ_b dout[b·t + i, col], summed in batch order.
template <typename T>
__global__ void PositionGradKernel(float* dwpe, const T* dout, int64_t b, int64_t t, int64_t c) {
  const int64_t plane = t * c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < plane;
       i += int64_t{gridDim.x} * blockDim.x) {
    float acc = dwpe[i];
    for (int64_t k = 0; k < b; ++k) acc += ToFloat(dout[k * plane + i]);
    dwpe[i] = acc;
  }
}

unsigned int GridFor(int64_t n) {
  // Grid-stride loops: enough blocks to fill the device, never more than a launch allows.
  const unsigned int blocks = BlocksFor(n, kThreads);
  return blocks < (1u << 20) ? blocks : (1u << 20);
}

}  // namespace

absl::Status EmbeddingForward(cudaStream_t stream, DType dtype, void* out, const int32_t* tokens,
                              const float* wte, const float* wpe, int64_t b, int64_t t, int64_t c,
                              float scale) {
  TY_REQUIRE(b > 0 && t > 0 && c > 0);
  TY_REQUIRE(out != nullptr && tokens != nullptr && wte != nullptr);
  const int64_t total = b * t * c;
  TY_DISPATCH_DTYPE(dtype, T, {
    EmbeddingForwardKernel<T><<<GridFor(total), kThreads, 0, stream>>>(
        static_cast<T*>(out), tokens, wte, wpe, t, c, total, scale);
  });
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("EmbeddingForwardKernel");
  return absl::OkStatus();
}

size_t EmbeddingBackwardScratchBytes(int64_t tokens, int64_t vocab) {
  if (tokens <= 0 || tokens > INT32_MAX || vocab <= 0 || vocab >= INT32_MAX) return 0;
  ScratchLayout layout;
  if (!PlanScratch(tokens, vocab, &layout).ok()) return 0;
  return layout.total;
}

absl::Status EmbeddingBackward(cudaStream_t stream, DType dtype, float* dwte, float* dwpe,
                               const void* dout, const int32_t* tokens, int64_t b, int64_t t,
                               int64_t c, int64_t vocab, float scale, void* scratch,
                               size_t scratch_bytes) {
  TY_REQUIRE(b > 0 && t > 0 && c > 0);
  TY_REQUIRE(vocab > 0 && vocab < INT32_MAX);
  TY_REQUIRE(b * t <= INT32_MAX);  // row indices are sorted as int32
  TY_REQUIRE(dwte != nullptr && dout != nullptr && tokens != nullptr && scratch != nullptr);
  const int64_t n = b * t;
  ScratchLayout layout;
  TY_RETURN_IF_ERROR(PlanScratch(n, vocab, &layout));
  if (scratch_bytes < layout.total) {
    return absl::InvalidArgumentError(absl::StrCat("EmbeddingBackward: scratch holds ",
                                                   scratch_bytes, " bytes, needs ", layout.total,
                                                   " (EmbeddingBackwardScratchBytes)"));
  }
  char* base = reinterpret_cast<char*>(AlignUp(reinterpret_cast<uintptr_t>(scratch)));
  auto* keys_in = reinterpret_cast<uint32_t*>(base + layout.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(base + layout.keys_out);
  auto* rows_in = reinterpret_cast<int32_t*>(base + layout.rows_in);
  auto* rows_out = reinterpret_cast<int32_t*>(base + layout.rows_out);
  void* cub_temp = base + layout.cub_temp;
  size_t cub_bytes = layout.cub_temp_bytes;

  MakeSortKeysKernel<<<GridFor(n), kThreads, 0, stream>>>(keys_in, rows_in, tokens, n, vocab);
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("MakeSortKeysKernel");
  TY_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(cub_temp, cub_bytes, keys_in, keys_out,
                                                          rows_in, rows_out, static_cast<int>(n), 0,
                                                          SortKeyBits(vocab), stream));
  TY_DISPATCH_DTYPE(dtype, T, {
    const T* dy = static_cast<const T*>(dout);
    TokenGradKernel<T><<<static_cast<unsigned int>(n), kThreads, 0, stream>>>(
        dwte, dy, keys_out, rows_out, n, c, static_cast<uint32_t>(vocab), scale);
    if (dwpe != nullptr) {
      PositionGradKernel<T><<<GridFor(t * c), kThreads, 0, stream>>>(dwpe, dy, b, t, c);
    }
  });
  TY_CUDA_RETURN_IF_LAUNCH_FAILED("EmbeddingBackward kernels");
  return absl::OkStatus();
}

}  // namespace trainyard::kernels::cuda
