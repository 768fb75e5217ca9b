// Flash attention on the GPU against the CPU reference (kernels/cpu/attention.h): the forward's
// output and log-sum-exp and the backward's packed gradients, for both storage types, with and
// without grouped-query heads, at sequence lengths that are and are not multiples of the tiles,
// with and without a sliding window, with the scores' scale 1/sqrt(d) or another, with and without
// a soft cap on the scores, with and without documents (model.document_token).
#include "kernels/cuda/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using ::trainyard::testing::DeviceInts;
using ::trainyard::testing::DeviceMemory;
using ::trainyard::testing::Download;
using ::trainyard::testing::RandomVector;
using ::trainyard::testing::RelativeError;
using ::trainyard::testing::RoundToBf16;
using ::trainyard::testing::Tolerance;
using ::trainyard::testing::Upload;

// The last three have sliding windows: 5 positions (most tiles skipped, most rows masked at both
// ends), 70 across the 64-row tiles (the first key tile of late query tiles skipped), and 1 (each
// query sees itself only) at d 128. Then scales of their own (Gemma 2's query_pre_attn_scalar):
// larger than 1/sqrt(d) with a window, smaller at d 128. Then soft caps (Gemma 2's 50, but small
// enough here that tanh bends most scores of these random inputs): alone at d 16, with a scale of
// its own and a window at d 64, and at d 128 with eight query heads per key/value head.
constexpr AttentionDims kShapes[] = {
    {1, 1, 1, 1, 16},
    {2, 37, 4, 2, 16},
    {1, 64, 2, 2, 64},
    {2, 200, 8, 2, 64},
    {1, 129, 4, 1, 128},
    {1, 1024, 12, 12, 64},
    {2, 37, 4, 2, 16, 5},
    {1, 200, 4, 2, 64, 70},
    {1, 129, 4, 1, 128, 1},
    {2, 100, 4, 2, 64, 30, 0.3f},
    {1, 129, 4, 1, 128, 0, 0.05f},
    {2, 37, 4, 2, 16, 0, 0.0f, 1.0f},
    {2, 100, 4, 2, 64, 30, 0.5f, 1.5f},
    {1, 80, 8, 1, 128, 0, 0.0f, 0.8f},
};

std::string Describe(const AttentionDims& s, DType dtype) {
  return "b=" + std::to_string(s.b) + " t=" + std::to_string(s.t) +
         " heads=" + std::to_string(s.heads) + " kv_heads=" + std::to_string(s.kv_heads) +
         " d=" + std::to_string(s.d) + " window=" + std::to_string(s.window) +
         " scale=" + std::to_string(s.scale) + " softcap=" + std::to_string(s.softcap) + " " +
         DTypeName(dtype);
}

// Columns [offset, offset + width) of every row of a matrix with rows of `row_width` values.
std::vector<float> Columns(const std::vector<float>& m, int64_t row_width, int64_t offset,
                           int64_t width) {
  std::vector<float> out;
  for (size_t row = 0; row < m.size() / row_width; ++row) {
    const float* begin = m.data() + row * row_width + offset;
    out.insert(out.end(), begin, begin + width);
  }
  return out;
}

// The CPU reference's results for one shape, from inputs the device sees exactly.
struct Reference {
  std::vector<float> qkv, dout, out, lse, dqkv;
};

// s.doc_start, when set, is host memory here (the device gets its own copy).
Reference ComputeReference(const AttentionDims& s, DType dtype, std::mt19937& rng) {
  const int64_t row = (s.heads + 2 * s.kv_heads) * s.d;
  Reference ref;
  ref.qkv = RandomVector(s.b * s.t * row, rng);
  ref.dout = RandomVector(s.b * s.t * s.heads * s.d, rng);
  if (dtype == DType::kBF16) {
    RoundToBf16(ref.qkv);
    RoundToBf16(ref.dout);
  }
  ref.out.resize(ref.dout.size());
  ref.lse.resize(s.b * s.heads * s.t);
  ref.dqkv.resize(ref.qkv.size());
  cpu::AttentionForward(ref.out.data(), ref.lse.data(), ref.qkv.data(), s.b, s.t, s.heads,
                        s.kv_heads, s.d, s.window, {s.scale, s.softcap}, s.doc_start);
  cpu::AttentionBackward(ref.dqkv.data(), ref.dout.data(), ref.qkv.data(), ref.out.data(),
                         ref.lse.data(), s.b, s.t, s.heads, s.kv_heads, s.d, s.window,
                         {s.scale, s.softcap}, s.doc_start);
  return ref;
}

// The largest magnitude of `values`.
double MaxMagnitude(const std::vector<float>& values) {
  double m = 0;
  for (float v : values) m = std::max(m, std::fabs(double{v}));
  return m;
}

// Whole packed gradient, then its query, key and value parts on their own (so that a wrong part
// with a smaller magnitude than the others cannot hide behind them). A part whose reference is
// below `tolerance` of the whole's magnitude is a cancellation's rounding residue, not a value:
// with one key (t = 1) the softmax has no gradient and dq and dk are exactly zero, but the CPU
// reference computes dP with OpenBLAS's GEMM and the row sum D with a loop, so its residue
// depends on the GEMM kernel the host CPU selects. Such a part is held to the whole's scale.
void ExpectGradientsMatch(const std::vector<float>& got, const std::vector<float>& want,
                          const AttentionDims& s, double tolerance) {
  EXPECT_LE(RelativeError(got, want), tolerance) << "dqkv";
  const double whole = MaxMagnitude(want);
  const int64_t row = (s.heads + 2 * s.kv_heads) * s.d;
  const int64_t q_width = s.heads * s.d, kv_width = s.kv_heads * s.d;
  const std::pair<const char*, int64_t> parts[] = {
      {"dq", 0}, {"dk", q_width}, {"dv", q_width + kv_width}};
  for (const auto& [name, offset] : parts) {
    const int64_t width = offset == 0 ? q_width : kv_width;
    const std::vector<float> part_got = Columns(got, row, offset, width);
    const std::vector<float> part_want = Columns(want, row, offset, width);
    if (MaxMagnitude(part_want) >= tolerance * whole) {
      EXPECT_LE(RelativeError(part_got, part_want), tolerance) << name;
    } else {
      std::vector<float> diff(part_got.size());
      for (size_t i = 0; i < diff.size(); ++i) diff[i] = part_got[i] - part_want[i];
      EXPECT_LE(MaxMagnitude(diff), tolerance * whole) << name << " (a rounding residue)";
    }
  }
}

// The bf16 forward with 16 and with 32 query rows per warp gives the same bits as the default
// (each row's arithmetic is the same, only the rows sharing a key fragment differ); 32 rows at d
// 128 do not fit and are refused. `out` and `lse` hold the default forward's results.
void ExpectWarpRowsAgree(const AttentionDims& s, DType dtype, const DeviceMemory& qkv,
                         const DeviceMemory& out, const DeviceMemory& lse) {
  if (dtype != DType::kBF16) return;
  DeviceMemory other_out(out.bytes()), other_lse(lse.bytes());
  for (int warp_rows : {16, 32}) {
    SCOPED_TRACE("warp rows " + std::to_string(warp_rows));
    other_out.Poison();
    other_lse.Poison();
    const absl::Status status = FlashAttentionForward(
        nullptr, dtype, other_out.get(), other_lse.as<float>(), qkv.get(), s, warp_rows);
    if (warp_rows == 32 && s.d == 128) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      continue;
    }
    ASSERT_TRUE(status.ok()) << status;
    TY_CUDA_ASSERT(cudaDeviceSynchronize());
    const int64_t n_out = out.bytes() / DTypeBytes(dtype);
    const int64_t n_lse = lse.bytes() / static_cast<int64_t>(sizeof(float));
    EXPECT_EQ(Download(other_out.get(), n_out, dtype), Download(out.get(), n_out, dtype)) << "out";
    EXPECT_EQ(Download(other_lse.get(), n_lse, DType::kF32),
              Download(lse.get(), n_lse, DType::kF32))
        << "lse";
  }
}

// With documents, `host` has s.doc_start in host memory; the device runs with a copy.
void ExpectMatchesCpu(const AttentionDims& host, DType dtype) {
  SCOPED_TRACE(Describe(host, dtype) + (host.doc_start != nullptr ? " with documents" : ""));
  std::mt19937 rng(static_cast<unsigned>(1000 * host.t + 10 * host.d + host.heads));
  const Reference ref = ComputeReference(host, dtype, rng);
  const DeviceInts docs(host.doc_start != nullptr
                            ? std::vector<int32_t>(host.doc_start, host.doc_start + host.b * host.t)
                            : std::vector<int32_t>{0});
  AttentionDims s = host;
  if (host.doc_start != nullptr) s.doc_start = docs.get();
  const int64_t elem = DTypeBytes(dtype);
  const int64_t n_qkv = static_cast<int64_t>(ref.qkv.size());
  const int64_t n_out = static_cast<int64_t>(ref.out.size());
  const int64_t n_lse = static_cast<int64_t>(ref.lse.size());
  DeviceMemory qkv(n_qkv * elem), dout(n_out * elem), out(n_out * elem), dqkv(n_qkv * elem);
  DeviceMemory lse(n_lse * static_cast<int64_t>(sizeof(float)));
  DeviceMemory scratch(static_cast<int64_t>(FlashAttentionBackwardScratchBytes(s, dtype)));
  Upload(ref.qkv, dtype, qkv.get());
  Upload(ref.dout, dtype, dout.get());
  const double tolerance = Tolerance(dtype);

  out.Poison();
  lse.Poison();
  const absl::Status forward =
      FlashAttentionForward(nullptr, dtype, out.get(), lse.as<float>(), qkv.get(), s);
  ASSERT_TRUE(forward.ok()) << forward;
  TY_CUDA_ASSERT(cudaDeviceSynchronize());  // a fault inside the kernel surfaces here
  EXPECT_LE(RelativeError(Download(out.get(), n_out, dtype), ref.out), tolerance) << "out";
  EXPECT_LE(RelativeError(Download(lse.get(), n_lse, DType::kF32), ref.lse), tolerance) << "lse";
  ExpectWarpRowsAgree(s, dtype, qkv, out, lse);

  // The backward runs on the device's own forward results, as in training; a second run must
  // reproduce the first bit for bit.
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    dqkv.Poison();
    scratch.Poison();
    const absl::Status backward =
        FlashAttentionBackward(nullptr, dtype, dqkv.get(), dout.get(), qkv.get(), out.get(),
                               lse.as<float>(), s, scratch.get(), scratch.bytes());
    ASSERT_TRUE(backward.ok()) << backward;
    TY_CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<float> got = Download(dqkv.get(), n_qkv, dtype);
    if (run == 0) {
      ExpectGradientsMatch(got, ref.dqkv, s, tolerance);
      first = std::move(got);
    } else {
      EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * sizeof(float)), 0)
          << "the backward is not deterministic";
    }
  }

  // Atomic dQ sums: dq within the same tolerance (its last bits may differ run to run), dk and dv
  // bit for bit those of the deterministic backward (the same pass computes them).
  const size_t atomic_bytes = FlashAttentionBackwardScratchBytes(s, dtype, AttentionDqSum::kAtomic);
  DeviceMemory atomic_scratch(static_cast<int64_t>(atomic_bytes));
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("atomic dQ sums, run " + std::to_string(run));
    dqkv.Poison();
    atomic_scratch.Poison();
    const absl::Status backward = FlashAttentionBackward(
        nullptr, dtype, dqkv.get(), dout.get(), qkv.get(), out.get(), lse.as<float>(), s,
        atomic_scratch.get(), atomic_bytes, AttentionDqSum::kAtomic);
    ASSERT_TRUE(backward.ok()) << backward;
    TY_CUDA_ASSERT(cudaDeviceSynchronize());
    const std::vector<float> got = Download(dqkv.get(), n_qkv, dtype);
    ExpectGradientsMatch(got, ref.dqkv, s, tolerance);
    const int64_t row = (s.heads + 2 * s.kv_heads) * s.d, q_width = s.heads * s.d;
    EXPECT_EQ(Columns(got, row, q_width, row - q_width),
              Columns(first, row, q_width, row - q_width))
        << "dk and dv differ from the deterministic backward's";
  }
}

TEST(FlashAttention, MatchesCpuF32) {
  TY_SKIP_WITHOUT_GPU();
  for (const AttentionDims& s : kShapes) ExpectMatchesCpu(s, DType::kF32);
}

TEST(FlashAttention, MatchesCpuBf16) {
  TY_SKIP_WITHOUT_GPU();
  for (const AttentionDims& s : kShapes) ExpectMatchesCpu(s, DType::kBF16);
}

// Documents: each sequence cut at random positions (about one in `mean` begins a document), so
// that documents start inside and at the edges of the 64-row tiles; a first row that begins no
// document (its sequence starts mid-document). Alone at d 16 and 64, with a window across the
// tiles, with a soft cap, and at d 128 with eight query heads per key/value head.
TEST(FlashAttention, DocumentsMatchCpu) {
  TY_SKIP_WITHOUT_GPU();
  const std::pair<AttentionDims, int> cases[] = {
      {{2, 37, 4, 2, 16}, 5},       {{2, 200, 8, 2, 64}, 40},
      {{1, 200, 4, 2, 64, 70}, 30}, {{2, 100, 4, 2, 64, 30, 0.5f, 1.5f}, 20},
      {{1, 130, 8, 1, 128}, 64},
  };
  std::mt19937 rng(17);
  for (const auto& [shape, mean] : cases) {
    std::uniform_int_distribution<int> cut(0, mean - 1);
    std::vector<int32_t> starts(shape.b * shape.t);
    for (int64_t bi = 0; bi < shape.b; ++bi) {
      int32_t start = 0;
      for (int64_t i = 1; i < shape.t; ++i) {
        if (cut(rng) == 0) start = static_cast<int32_t>(i);
        starts[bi * shape.t + i] = start;
      }
    }
    AttentionDims s = shape;
    s.doc_start = starts.data();
    for (DType dtype : {DType::kF32, DType::kBF16}) ExpectMatchesCpu(s, dtype);
  }
}

// Calls both launchers on buffers sized for `dims` and returns their statuses.
struct Statuses {
  absl::Status forward, backward;
};
Statuses RunBoth(const AttentionDims& dims, DType dtype, size_t scratch_bytes) {
  const int64_t elem = DTypeBytes(dtype);
  const int64_t rows = dims.b * dims.t;
  DeviceMemory qkv(rows * (dims.heads + 2 * dims.kv_heads) * dims.d * elem);
  DeviceMemory dqkv(qkv.bytes()), out(rows * dims.heads * dims.d * elem), dout(out.bytes());
  DeviceMemory lse(dims.b * dims.heads * dims.t * static_cast<int64_t>(sizeof(float)));
  DeviceMemory scratch(static_cast<int64_t>(scratch_bytes));
  Statuses s;
  s.forward = FlashAttentionForward(nullptr, dtype, out.get(), lse.as<float>(), qkv.get(), dims);
  s.backward = FlashAttentionBackward(nullptr, dtype, dqkv.get(), dout.get(), qkv.get(), out.get(),
                                      lse.as<float>(), dims, scratch.get(), scratch_bytes);
  return s;
}

TEST(FlashAttention, RejectsUnsupportedHeadDim) {
  TY_SKIP_WITHOUT_GPU();
  const AttentionDims dims{1, 8, 2, 2, 24};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Statuses s = RunBoth(dims, dtype, FlashAttentionBackwardScratchBytes(dims, dtype));
    EXPECT_EQ(s.forward.code(), absl::StatusCode::kInvalidArgument) << s.forward;
    EXPECT_NE(s.forward.message().find("24"), std::string::npos) << s.forward;
    EXPECT_EQ(s.backward.code(), absl::StatusCode::kInvalidArgument) << s.backward;
    EXPECT_NE(s.backward.message().find("24"), std::string::npos) << s.backward;
  }
}

// A negative or non-finite soft cap or scale is refused by both passes, launching nothing.
TEST(FlashAttention, RejectsBadScoreRules) {
  TY_SKIP_WITHOUT_GPU();
  for (const auto& [scale, softcap] : {std::pair{0.0f, -1.0f}, std::pair{0.0f, NAN},
                                       std::pair{0.0f, INFINITY}, std::pair{-0.5f, 0.0f}}) {
    const AttentionDims dims{1, 8, 2, 2, 16, 0, scale, softcap};
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(Describe(dims, dtype));
      const Statuses s = RunBoth(dims, dtype, FlashAttentionBackwardScratchBytes(dims, dtype));
      EXPECT_EQ(s.forward.code(), absl::StatusCode::kInvalidArgument) << s.forward;
      EXPECT_EQ(s.backward.code(), absl::StatusCode::kInvalidArgument) << s.backward;
    }
  }
}

TEST(FlashAttention, RejectsPartialGroupsAndShortScratch) {
  TY_SKIP_WITHOUT_GPU();
  const AttentionDims uneven{1, 8, 3, 2, 16};
  const Statuses a =
      RunBoth(uneven, DType::kBF16, FlashAttentionBackwardScratchBytes(uneven, DType::kBF16));
  EXPECT_EQ(a.forward.code(), absl::StatusCode::kInvalidArgument) << a.forward;
  EXPECT_EQ(a.backward.code(), absl::StatusCode::kInvalidArgument) << a.backward;

  const AttentionDims dims{1, 8, 2, 1, 16};
  const size_t needed = FlashAttentionBackwardScratchBytes(dims, DType::kF32);
  ASSERT_GE(needed, sizeof(float));
  const Statuses b = RunBoth(dims, DType::kF32, needed - sizeof(float));
  EXPECT_TRUE(b.forward.ok()) << b.forward;
  EXPECT_EQ(b.backward.code(), absl::StatusCode::kInvalidArgument) << b.backward;
}

// Atomic dQ sums need the fp32 sums' room on top of the deltas (bf16 only; fp32 storage is
// deterministic either way and needs nothing more), and a backward given less refuses.
TEST(FlashAttention, AtomicDqSumsNeedTheirScratch) {
  TY_SKIP_WITHOUT_GPU();
  const AttentionDims dims{2, 40, 4, 2, 32};
  const size_t deltas = FlashAttentionBackwardScratchBytes(dims, DType::kBF16);
  const size_t atomic =
      FlashAttentionBackwardScratchBytes(dims, DType::kBF16, AttentionDqSum::kAtomic);
  EXPECT_EQ(deltas, size_t{2 * 4 * 40} * sizeof(float));
  EXPECT_EQ(atomic, (deltas + 255) / 256 * 256 + size_t{2 * 40 * 4 * 32} * sizeof(float));
  EXPECT_EQ(FlashAttentionBackwardScratchBytes(dims, DType::kF32, AttentionDqSum::kAtomic),
            FlashAttentionBackwardScratchBytes(dims, DType::kF32));

  const int64_t rows = dims.b * dims.t, elem = DTypeBytes(DType::kBF16);
  DeviceMemory qkv(rows * (dims.heads + 2 * dims.kv_heads) * dims.d * elem);
  DeviceMemory dqkv(qkv.bytes()), out(rows * dims.heads * dims.d * elem), dout(out.bytes());
  DeviceMemory lse(dims.b * dims.heads * dims.t * static_cast<int64_t>(sizeof(float)));
  DeviceMemory scratch(static_cast<int64_t>(atomic));
  const absl::Status short_scratch = FlashAttentionBackward(
      nullptr, DType::kBF16, dqkv.get(), dout.get(), qkv.get(), out.get(), lse.as<float>(), dims,
      scratch.get(), atomic - sizeof(float), AttentionDqSum::kAtomic);
  EXPECT_EQ(short_scratch.code(), absl::StatusCode::kInvalidArgument) << short_scratch;
}

}  // namespace
}  // namespace trainyard::kernels::cuda
