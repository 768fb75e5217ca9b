// The emulator's own contract: barriers and warp exchanges order the threads as the device
// does, launch errors reach cudaGetLastError, and impossible synchronisation aborts.
#include "tools/cuda_emu/emu.h"

#include <cstring>
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

// A (16×16) and B (16×8) of small integers (exact in bf16) in shared memory, loaded into
// fragments as the attention kernels load them (A with ldmatrix, B as rows of Bᵀ with ldmatrix
// and as rows of B with its transposed form) and multiplied with mma.sync. `frags` gets each
// lane's four A registers; `products` the two products as each lane's four accumulators.
void MmaKernel(uint32_t* frags, float* products) {
  static __nv_bfloat16 a[16 * 24], bt[8 * 24], b[16 * 24];  // rows padded to 48 bytes
  const int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) {
    const int r = i / 16, c = i % 16;
    a[r * 24 + c] = __float2bfloat16(static_cast<float>(r * 16 + c));
    if (c < 8) {
      b[r * 24 + c] = __float2bfloat16(static_cast<float>((r + 2 * c) % 7 - 3));
      bt[c * 24 + r] = b[r * 24 + c];
    }
  }
  __syncthreads();
  using namespace ::trainyard::kernels::cuda::warp;  // NOLINT(build/namespaces)
  uint32_t af[4], b_from_t[4], b_from_b[4];
  LdMatrixX4(af, a + (lane % 16) * 24 + lane / 16 * 8);
  // Matrices 0 and 1: keys 0-7 × k 0-7 and k 8-15 (matrices 2 and 3 repeat them).
  LdMatrixX4(b_from_t, bt + (lane % 8) * 24 + (lane / 8) % 2 * 8);
  LdMatrixX4Trans(b_from_b, b + ((lane / 8) % 2 * 8 + lane % 8) * 24);
  float d1[4] = {0, 0, 0, 0}, d2[4] = {1, 1, 1, 1};
  MmaBf16(d1, af, b_from_t[0], b_from_t[1]);
  MmaBf16(d2, af, b_from_b[0], b_from_b[1]);
  for (int i = 0; i < 4; ++i) {
    frags[lane * 4 + i] = af[i];
    products[lane * 8 + i] = d1[i];
    products[lane * 8 + 4 + i] = d2[i];
  }
}

// The fragment layouts of the PTX ISA's mma.m16n8k16 and what ldmatrix gives each lane.
TEST(CudaEmu, WarpMmaFragmentsFollowThePtxLayout) {
  std::vector<uint32_t> frags(32 * 4);
  std::vector<float> products(32 * 8);
  Launch(dim3(1), dim3(32), 0, nullptr, MmaKernel, frags.data(), products.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  auto bf16_bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u >> 16;
  };
  auto b = [](int k, int n) { return static_cast<float>((k + 2 * n) % 7 - 3); };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int reg = 0; reg < 4; ++reg) {  // a[reg] = A(g + 8·(reg % 2), 2t + 8·(reg / 2) + {0, 1})
      const int r = g + 8 * (reg % 2), c = 2 * t + 8 * (reg / 2);
      const uint32_t want = bf16_bits(static_cast<float>(r * 16 + c)) |
                            bf16_bits(static_cast<float>(r * 16 + c + 1)) << 16;
      EXPECT_EQ(frags[lane * 4 + reg], want) << "lane " << lane << " a[" << reg << "]";
    }
    for (int e = 0; e < 4; ++e) {  // d[e] = D(g + 8·(e / 2), 2t + e % 2)
      const int r = g + 8 * (e / 2), n = 2 * t + e % 2;
      float want = 0;
      for (int k = 0; k < 16; ++k) want += static_cast<float>(r * 16 + k) * b(k, n);
      EXPECT_EQ(products[lane * 8 + e], want) << "lane " << lane << " d[" << e << "]";
      EXPECT_EQ(products[lane * 8 + 4 + e], want + 1) << "lane " << lane << " d[" << e << "]";
    }
  }
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

TEST(CudaEmuDeathTest, ImpossibleSynchronisationAborts) {
  EXPECT_DEATH(Launch(dim3(1), dim3(64), 0, nullptr, DivergentBarrierKernel), "deadlock");
  EXPECT_DEATH(Launch(dim3(1), dim3(32), 0, nullptr, ExitedLaneShuffleKernel), "exited lanes");
}

}  // namespace
}  // namespace trainyard::emu
