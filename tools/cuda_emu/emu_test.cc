// The emulator's own contract: barriers and warp exchanges order the threads as the device
// does, launch errors reach cudaGetLastError, and impossible synchronisation aborts.
#include "tools/cuda_emu/emu.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tools/cuda_emu/warp_mma.h"

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

// The host waits only where a device would hold it: for queued work it has not waited for yet.
TEST(CudaEmu, HostWaitsCountWhatADeviceWouldMakeTheHostWaitFor) {
  int* device = nullptr;
  int* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device), 256 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 256 * sizeof(int)), cudaSuccess);
  std::vector<int> pageable(256);
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreate(&event), cudaSuccess);
  const int64_t start = HostWaits();
  Launch(dim3(1), dim3(256), 0, nullptr, RotateKernel, device);
  cudaEventRecord(event, nullptr);
  cudaMemcpyAsync(pinned, device, 256 * sizeof(int), cudaMemcpyDeviceToHost, nullptr);
  EXPECT_EQ(HostWaits(), start) << "queuing work, an event and a copy into pinned memory";
  cudaStreamSynchronize(nullptr);
  EXPECT_EQ(HostWaits(), start + 1);
  cudaEventSynchronize(event);
  cudaStreamSynchronize(nullptr);
  EXPECT_EQ(HostWaits(), start + 1) << "nothing queued since the last wait";
  Launch(dim3(1), dim3(256), 0, nullptr, RotateKernel, device);
  cudaMemcpyAsync(pageable.data(), device, 256 * sizeof(int), cudaMemcpyDeviceToHost, nullptr);
  EXPECT_EQ(HostWaits(), start + 2) << "a copy into pageable memory returns when it is done";
  EXPECT_EQ(pageable[0], 1);  // thread 0 read what thread 1 wrote
  Launch(dim3(1), dim3(256), 0, nullptr, RotateKernel, device);
  cudaFree(device);
  EXPECT_EQ(HostWaits(), start + 3) << "cudaFree waits for the device";
  cudaFreeHost(pinned);
  cudaEventDestroy(event);
}

// What translate.py makes of a `__shared__` array: a static of the host thread, so that ranks
// on their own host threads can run one kernel at once. Each block sums its own values through
// the array, with a barrier between each thread's write and the reads of every other.
void BlockSumKernel(int seed, int* out) {
  static thread_local int smem[128];
  const int n = blockDim.x, i = threadIdx.x;
  smem[i] = seed + i;
  __syncthreads();
  int sum = 0;
  for (int j = 0; j < n; ++j) sum += smem[j];
  __syncthreads();
  out[blockIdx.x * n + i] = sum;
}

TEST(CudaEmu, HostThreadsRunOneKernelAtOnce) {
  constexpr int kThreads = 4, kBlocks = 64, kBlock = 128;
  std::vector<std::vector<int>> out(kThreads, std::vector<int>(kBlocks * kBlock, -1));
  std::vector<std::thread> hosts;
  for (int t = 0; t < kThreads; ++t) {
    hosts.emplace_back([&out, t] {
      Launch(dim3(kBlocks), dim3(kBlock), 0, nullptr, BlockSumKernel, 1000 * t, out[t].data());
    });
  }
  for (std::thread& h : hosts) h.join();
  for (int t = 0; t < kThreads; ++t) {
    const int want = kBlock * 1000 * t + kBlock * (kBlock - 1) / 2;
    for (int v : out[t]) ASSERT_EQ(v, want) << "host thread " << t;
  }
}

// As CUDA 11 and later answer: device and pinned memory by their kind, anything else as
// unregistered host memory (not an error), inside an allocation as well as at its start.
TEST(CudaEmu, PointerAttributesTellDeviceFromHostMemory) {
  void* device = nullptr;
  void* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 1024), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 1024), cudaSuccess);
  std::vector<char> pageable(1024);
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(device) + 1000), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  ASSERT_EQ(cudaPointerGetAttributes(&a, pinned), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaPointerGetAttributes(&a, pageable.data()), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(device) + 1024), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);  // one past the end is not the allocation's
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// cp.async in two groups per thread: nothing lands before a wait (the destination reads as
// poison, -1), wait<1> lands the older group only, wait<0> the zero-filled newer one, and a
// barrier after every thread's wait shows each thread the others' copies.
void AsyncCopyKernel(const int* src, int* out) {
  using trainyard::kernels::cuda::warp::CpAsync16;
  using trainyard::kernels::cuda::warp::CpAsyncCommit;
  using trainyard::kernels::cuda::warp::CpAsyncWait;
  int* smem = reinterpret_cast<int*>(DynamicShared());
  const int i = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  CpAsync16(smem + 4 * i, src + 4 * i, true);
  CpAsyncCommit();
  CpAsync16(smem + 4 * (n + i), src, false);
  CpAsyncCommit();
  int* mine = out + 5 * i;
  mine[0] = smem[4 * i];
  CpAsyncWait<1>();
  mine[1] = smem[4 * i + 3];
  mine[2] = smem[4 * (n + i)];
  CpAsyncWait<0>();
  mine[3] = smem[4 * (n + i)];
  __syncthreads();
  mine[4] = smem[4 * ((i + 1) % n)];
}

TEST(CudaEmu, AsyncCopiesLandAtTheWaitThatCoversTheirGroup) {
  constexpr int kThreads = 64;
  std::vector<int> src(4 * kThreads), out(5 * kThreads, 7);
  for (int k = 0; k < 4 * kThreads; ++k) src[k] = 10 * k;
  Launch(dim3(1), dim3(kThreads), 2 * kThreads * 16, nullptr, AsyncCopyKernel, src.data(),
         out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int i = 0; i < kThreads; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(out[5 * i], -1) << "read before any wait";
    EXPECT_EQ(out[5 * i + 1], 10 * (4 * i + 3));
    EXPECT_EQ(out[5 * i + 2], -1) << "the newer group is still in flight";
    EXPECT_EQ(out[5 * i + 3], 0) << "zero fill";
    EXPECT_EQ(out[5 * i + 4], 10 * 4 * ((i + 1) % kThreads));
  }
}

void CopyToGlobalKernel(const int* src, int* dst) {
  trainyard::kernels::cuda::warp::CpAsync16(dst, src, true);
}

alignas(16) int g_not_shared[4];

TEST(CudaEmuDeathTest, AsyncCopiesAndLdmatrixNeedSharedMemory) {
  alignas(16) static const int src[4] = {1, 2, 3, 4};
  EXPECT_DEATH(Launch(dim3(1), dim3(1), 0, nullptr, CopyToGlobalKernel, src, g_not_shared),
               "not in the block's shared memory");
}

TEST(CudaEmuDeathTest, ImpossibleSynchronisationAborts) {
  EXPECT_DEATH(Launch(dim3(1), dim3(64), 0, nullptr, DivergentBarrierKernel), "deadlock");
  EXPECT_DEATH(Launch(dim3(1), dim3(32), 0, nullptr, ExitedLaneShuffleKernel), "exited lanes");
}

}  // namespace
}  // namespace trainyard::emu
