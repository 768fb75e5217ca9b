// The tensor-core primitives (kernels/cuda/warp_mma.cuh) against the PTX ISA's fragment layouts
// for mma.m16n8k16 and ldmatrix: on a device this checks the hardware, on the CPU emulator the
// emulation, with the same expectations, so the two are held to one reading of the ISA.
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/warp_mma_probe.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using ::trainyard::testing::DeviceMemory;

uint32_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u >> 16;  // exact: the probe's values are small integers
}

TEST(WarpMma, FragmentsFollowThePtxLayout) {
  TY_SKIP_WITHOUT_GPU();
  DeviceMemory frags(32 * 4 * sizeof(uint32_t)), products(32 * 8 * sizeof(float));
  ASSERT_TRUE(WarpMmaProbe(nullptr, frags.as<uint32_t>(), products.as<float>()).ok());
  std::vector<uint32_t> f(32 * 4);
  std::vector<float> p(32 * 8);
  TY_CUDA_ASSERT(cudaMemcpy(f.data(), frags.get(), f.size() * 4, cudaMemcpyDeviceToHost));
  TY_CUDA_ASSERT(cudaMemcpy(p.data(), products.get(), p.size() * 4, cudaMemcpyDeviceToHost));
  const auto b = [](int k, int n) { return static_cast<float>((k + 2 * n) % 7 - 3); };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int reg = 0; reg < 4; ++reg) {  // a[reg] = A(g + 8·(reg % 2), 2t + 8·(reg / 2) + {0, 1})
      const int r = g + 8 * (reg % 2), c = 2 * t + 8 * (reg / 2);
      const uint32_t want = Bf16Bits(static_cast<float>(r * 16 + c)) |
                            Bf16Bits(static_cast<float>(r * 16 + c + 1)) << 16;
      EXPECT_EQ(f[lane * 4 + reg], want) << "lane " << lane << " a[" << reg << "]";
    }
    for (int e = 0; e < 4; ++e) {  // d[e] = D(g + 8·(e / 2), 2t + e % 2)
      const int r = g + 8 * (e / 2), n = 2 * t + e % 2;
      float want = 0;
      for (int k = 0; k < 16; ++k) want += static_cast<float>(r * 16 + k) * b(k, n);
      EXPECT_EQ(p[lane * 8 + e], want) << "lane " << lane << " d[" << e << "] (B from Bᵀ)";
      EXPECT_EQ(p[lane * 8 + 4 + e], want + 1) << "lane " << lane << " d[" << e << "] (B, .trans)";
    }
  }
}

}  // namespace
}  // namespace trainyard::kernels::cuda
