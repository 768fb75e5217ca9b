// The emulator's own contract: barriers and warp exchanges order the threads as the device
// does, launch errors reach cudaGetLastError, and impossible synchronisation aborts.
#include "tools/cuda_emu/emu.h"

#include <vector>

#include "gtest/gtest.h"

namespace trainyard::emu {
namespace {

// out[i] = what thread i + 1 wrote before the barrier (in a ring).
void RotateKernel(int* out) {
  static int smem[256];
  const int n = blockDim.x, i = threadIdx.x;
  smem[i] = i + 1000 * blockIdx.x;
  __syncthreads();
  out[blockIdx.x * n + i] = smem[(i + 1) % n];
}

TEST(CudaEmu, BarrierOrdersSharedMemory) {
  std::vector<int> out(3 * 256, -1);
  Launch(dim3(3), dim3(256), 0, nullptr, RotateKernel, out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int b = 0; b < 3; ++b) {
    for (int i = 0; i < 256; ++i) EXPECT_EQ(out[b * 256 + i], (i + 1) % 256 + 1000 * b);
  }
}

void WarpKernel(int* sums, int* downs, unsigned* ballots) {
  const int lane = threadIdx.x % 32;
  int v = lane;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sums[threadIdx.x] = v;
  downs[threadIdx.x] = __shfl_down_sync(0xffffffffu, lane, 1);
  ballots[threadIdx.x] = __ballot_sync(0xffffffffu, lane % 3 == 0);
}

TEST(CudaEmu, WarpCollectives) {
  std::vector<int> sums(64), downs(64);
  std::vector<unsigned> ballots(64);
  Launch(dim3(1), dim3(64), 0, nullptr, WarpKernel, sums.data(), downs.data(), ballots.data());
  unsigned want_ballot = 0;
  for (int l = 0; l < 32; l += 3) want_ballot |= 1u << l;
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(sums[t], 31 * 32 / 2);
    EXPECT_EQ(downs[t], t % 32 == 31 ? 31 : t % 32 + 1);  // the last lane keeps its own value
    EXPECT_EQ(ballots[t], want_ballot);
  }
}

// Each thread owns its copy of the by-value parameters.
void ParamKernel(int n, int* out) {
  n += static_cast<int>(threadIdx.x);
  out[threadIdx.x] = n;
}

TEST(CudaEmu, ParametersArePerThread) {
  std::vector<int> out(4);
  Launch(dim3(1), dim3(4), 0, nullptr, ParamKernel, 10, out.data());
  EXPECT_EQ(out, (std::vector<int>{10, 11, 12, 13}));
}

void SmemKernel(int* out) { out[threadIdx.x] = DynamicShared()[threadIdx.x]; }

TEST(CudaEmu, LaunchErrorsReachGetLastError) {
  std::vector<int> out(2048);
  Launch(dim3(1), dim3(1025), 0, nullptr, SmemKernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  Launch(dim3(1, 65536), dim3(32), 0, nullptr, SmemKernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  // Above 48 KiB of dynamic shared memory only after raising the kernel's limit.
  Launch(dim3(1), dim3(32), 64 * 1024, nullptr, SmemKernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(
      cudaFuncSetAttribute(SmemKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
      cudaSuccess);
  Launch(dim3(1), dim3(32), 64 * 1024, nullptr, SmemKernel, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out[0], 0xFF);  // dynamic shared memory starts poisoned
}

// The attributes agree with the properties (an H100-like device); unknown ones fail.
TEST(CudaEmu, DeviceAttributesMatchProperties) {
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  int sms = 0, threads = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, 0),
            cudaSuccess);
  EXPECT_EQ(sms, prop.multiProcessorCount);
  EXPECT_EQ(threads, 2048);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 1),
            cudaErrorInvalidDevice);
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrL2CacheSize, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

void DivergentBarrierKernel() {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else {
    __syncwarp();  // waits for lane 0, which waits for everyone at the block barrier
  }
}

void ExitedLaneShuffleKernel() {
  if (threadIdx.x == 0) return;
  __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

TEST(CudaEmuDeathTest, ImpossibleSynchronisationAborts) {
  EXPECT_DEATH(Launch(dim3(1), dim3(64), 0, nullptr, DivergentBarrierKernel), "deadlock");
  EXPECT_DEATH(Launch(dim3(1), dim3(32), 0, nullptr, ExitedLaneShuffleKernel), "exited lanes");
}

}  // namespace
}  // namespace trainyard::emu
