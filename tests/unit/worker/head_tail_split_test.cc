// The head-tail split of context parallelism (worker/context_parallel.h) against a direct
// per-token reference: rank r of N holds chunks r and 2N − 1 − r of 2N, half-major, and the ranks'
// shares of causal attention are equal.
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "worker/context_parallel.h"

namespace trainyard::worker {
namespace {

// The global position of local row (half, sequence i, offset j) of rank r, written out from the
// definition rather than through HeadTailChunk.
int64_t PositionOf(int r, int n, int64_t c, int half, int64_t j) {
  const int64_t chunk = half == 0 ? r : 2 * n - 1 - r;
  return chunk * c + j;
}

TEST(HeadTailSplit, EveryTokenOnceInTheDocumentedOrder) {
  const int b = 3;
  for (int n : {1, 2, 3, 4}) {
    const int t = 2 * n * 5;  // chunks of 5: not a power of two
    const int64_t c = t / (2 * n);
    std::vector<int32_t> full(b * t);
    for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<int32_t>(i);
    std::vector<int> seen(full.size(), 0);
    for (int r = 0; r < n; ++r) {
      std::vector<int32_t> local(b * t / n, -1);
      SplitHeadTail(full.data(), b, t, r, n, local.data());
      for (int half = 0; half < 2; ++half) {
        for (int i = 0; i < b; ++i) {
          for (int64_t j = 0; j < c; ++j) {
            const int32_t token = local[(half * b + i) * c + j];
            EXPECT_EQ(token, i * t + PositionOf(r, n, c, half, j))
                << "cp " << n << " rank " << r << " half " << half << " row " << i << " +" << j;
            ++seen[token];
          }
        }
      }
    }
    for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "token " << i << " cp " << n;
  }
}

TEST(HeadTailSplit, BalancesCausalAttention) {
  // Each rank's queries see (position + 1) keys: the head-tail pairs sum to the same work.
  const int n = 4, t = 2 * n * 6;
  const int64_t c = t / (2 * n);
  int64_t first = -1;
  for (int r = 0; r < n; ++r) {
    int64_t pairs = 0;
    for (int half = 0; half < 2; ++half) {
      for (int64_t j = 0; j < c; ++j) pairs += PositionOf(r, n, c, half, j) + 1;
    }
    if (first < 0) first = pairs;
    EXPECT_EQ(pairs, first) << "rank " << r;
  }
}

}  // namespace
}  // namespace trainyard::worker
