// The one cub algorithm the kernels use, as a host implementation for the CPU emulator: a
// stable sort of (key, value) pairs on key bits [begin_bit, end_bit), like
// cub::DeviceRadixSort::SortPairs (keys' other bits do not take part in the order).
#ifndef TRAINYARD_TOOLS_CUDA_EMU_CUB_H_
#define TRAINYARD_TOOLS_CUDA_EMU_CUB_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace cub {

struct DeviceRadixSort {
  template <typename K, typename V, typename N>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out,
                               const V* values_in, V* values_out, N num_items, int begin_bit = 0,
                               int end_bit = sizeof(K) * 8, cudaStream_t stream = nullptr) {
    if (temp == nullptr) {  // the size query
      temp_bytes = 256 + static_cast<size_t>(num_items) * 0;
      return cudaSuccess;
    }
    const int64_t n = static_cast<int64_t>(num_items);
    const int bits = end_bit - begin_bit;
    const uint64_t mask = bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    auto sort_key = [&](int64_t i) {
      return (static_cast<uint64_t>(keys_in[i]) >> begin_bit) & mask;
    };
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return sort_key(a) < sort_key(b); });
    std::vector<K> keys(n);
    std::vector<V> values(n);
    for (int64_t i = 0; i < n; ++i) {
      keys[i] = keys_in[order[i]];
      values[i] = values_in[order[i]];
    }
    std::copy(keys.begin(), keys.end(), keys_out);
    std::copy(values.begin(), values.end(), values_out);
    return cudaSuccess;
  }
};

}  // namespace cub

#endif  // TRAINYARD_TOOLS_CUDA_EMU_CUB_H_
