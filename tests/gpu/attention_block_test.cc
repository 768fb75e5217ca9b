// The CUDA attention-block kernels of ring attention against the CPU reference
// (kernels/cpu/attention.h): a block's output and log-sum-exp, the merge of two partial results,
// and the backward's += into existing gradients, bit-identical from run to run; for causal and
// full blocks, grouped-query and multi-head layouts, both storage types, queries inside a packed
// qkv row and keys and values side by side in one row (as the ring passes them) or dense; with
// and without documents (model.document_token).
#include "kernels/cuda/attention_block.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "tests/gpu/device_tensor.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainyard::kernels::cuda {
namespace {

using ::trainyard::testing::DeviceMemory;
using ::trainyard::testing::DeviceTensor;
using ::trainyard::testing::RandomActivation;
using ::trainyard::testing::RandomVector;
using ::trainyard::testing::RelativeError;
using ::trainyard::testing::RoundToBf16;
using ::trainyard::testing::Tolerance;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16};
constexpr DType kF32 = DType::kF32;

struct Case {
  int64_t b, q_len, kv_len, heads, kv_heads, d;
  bool causal;
  // Packed: query rows are packed qkv rows ((heads + 2·kv_heads)·d, the padding a gradient must
  // leave alone) and keys and values share rows of 2·kv_heads·d, as ring attention holds them.
  // Otherwise each tensor is dense, values after all the keys.
  bool packed;
  // Query row i at position i + offset from key row 0; a sliding window of `window` positions.
  int64_t offset = 0, window = 0;
  float scale = 0.0f;    // the scores' factor (0: 1/sqrt(d))
  float softcap = 0.0f;  // the scores' soft cap (0: none)
  // Documents (0: none): about one position in `documents` begins one (DocStarts), key row 0 at
  // position key_position of its sequence.
  int documents = 0;
  int64_t key_position = 0;
};

// Tiny shapes (the emulated test runs every kernel on the CPU, one thread at a time); kernel
// tiles are 64 query or key rows. Rows that are not multiples of 16; a causal block over two
// query and two key tiles (the tiles above the diagonal skipped); full blocks with fewer queries
// than keys (over two key tiles, the second seen by every query) and with more (over two query
// tiles against less than one key tile); head dims 32, 64 and 128 (which takes narrower inner
// tiles).
//
// Sliding windows: a causal block with a window of 5 (keys masked at both ends of a row, most
// tiles skipped) and one of 70 over 130 rows (the first key tile skipped by the last query
// tiles; the last key tiles' queries end inside the block); ring attention's block of a chunk
// against the one before it (offset 24, window 20: the last five queries see no key, their lse
// −∞ and output zero); generation's step (one query after 39 cached keys, a window of 16); a
// window of one position at d 128. Last, ring attention's block with a scale of its own (Gemma 2's
// query_pre_attn_scalar), and soft-capped scores (Gemma 2's, with caps small enough to bend most
// of these scores): a causal packed block with a scale of its own, and ring attention's block of a
// chunk against the one before it. Then documents: a causal packed block, one with a window
// across the tiles, ring attention's block of a chunk against the one before it (the keys at
// positions 48-71: documents that began before them, and rows whose document begins after them
// and see none), and generation's step.
constexpr Case kCases[] = {
    {2, 37, 37, 4, 2, 32, true, true},
    {1, 80, 80, 2, 1, 32, true, false},
    {2, 24, 72, 4, 2, 64, false, true},
    {1, 70, 20, 2, 2, 64, false, false},
    {1, 20, 20, 2, 2, 64, true, false},
    {1, 16, 24, 2, 1, 128, false, true},
    {2, 37, 37, 4, 2, 32, true, true, 0, 5},
    {1, 130, 130, 2, 1, 32, true, false, 0, 70},
    {1, 24, 24, 2, 2, 64, false, true, 24, 20},
    {1, 1, 40, 4, 2, 32, false, true, 39, 16},
    {1, 20, 20, 2, 1, 128, true, false, 0, 1},
    {1, 24, 24, 2, 2, 64, false, true, 24, 30, 0.3f},
    {2, 37, 37, 4, 2, 32, true, true, 0, 0, 0.5f, 1.5f},
    {1, 24, 40, 2, 1, 64, false, true, 40, 0, 0.0f, 1.0f},
    {2, 37, 37, 4, 2, 32, true, true, 0, 0, 0.0f, 0.0f, 5},
    {1, 130, 130, 2, 1, 32, true, false, 0, 70, 0.0f, 0.0f, 30},
    {2, 24, 24, 2, 2, 64, false, true, 24, 0, 0.0f, 0.0f, 10, 48},
    {1, 1, 40, 4, 2, 32, false, true, 39, 16, 0.0f, 0.0f, 8},
};

std::string Label(const Case& c, DType dtype) {
  return absl::StrCat(DTypeName(dtype), " b=", c.b, " q_len=", c.q_len, " kv_len=", c.kv_len,
                      " heads=", c.heads, " kv_heads=", c.kv_heads, " d=", c.d,
                      c.causal ? " causal" : " full", c.packed ? " packed" : " dense",
                      " offset=", c.offset, " window=", c.window, " scale=", c.scale,
                      " softcap=", c.softcap, " documents=", c.documents,
                      " key_position=", c.key_position);
}

// A case's query rows' document starts [b, q_len] (empty without documents): each sequence, up
// to its last query's position, cut at random positions.
std::vector<int32_t> DocStarts(const Case& c) {
  if (c.documents == 0) return {};
  std::mt19937 rng(static_cast<unsigned>(c.documents + 31 * c.q_len));
  std::uniform_int_distribution<int> cut(0, c.documents - 1);
  const int64_t first_query = c.key_position + c.offset;
  std::vector<int32_t> starts(c.b * c.q_len);
  for (int64_t bi = 0; bi < c.b; ++bi) {
    int32_t start = 0;
    for (int64_t p = 1; p < first_query + c.q_len; ++p) {
      if (cut(rng) == 0) start = static_cast<int32_t>(p);
      if (p >= first_query) starts[bi * c.q_len + p - first_query] = start;
    }
  }
  return starts;
}

// A case's document starts on the device (a placeholder without documents).
struct DeviceDocs {
  explicit DeviceDocs(const Case& c)
      : host(DocStarts(c)), device(host.empty() ? std::vector<int32_t>{0} : host) {}
  const int32_t* get() const { return host.empty() ? nullptr : device.get(); }
  std::vector<int32_t> host;
  ::trainyard::testing::DeviceInts device;
};

// Where a case's operands live: q in a buffer of q_count values, keys at the start of a buffer
// of kv_count values and values v_offset further (the gradients likewise).
struct Layout {
  int64_t q_stride, kv_stride, v_offset, q_count, kv_count;
};

Layout LayoutOf(const Case& c) {
  const int64_t kv_width = c.kv_heads * c.d;
  Layout l{};
  l.q_stride = c.packed ? (c.heads + 2 * c.kv_heads) * c.d : c.heads * c.d;
  l.kv_stride = c.packed ? 2 * kv_width : kv_width;
  l.v_offset = c.packed ? kv_width : c.b * c.kv_len * kv_width;
  l.q_count = c.b * c.q_len * l.q_stride;
  l.kv_count = c.b * c.kv_len * 2 * kv_width;
  return l;
}

// doc_start: device memory for the kernels, host memory for the reference (null: none).
AttentionBlockDims GpuDims(const Case& c, const Layout& l, const int32_t* doc_start) {
  return {c.b,      c.q_len,  c.kv_len, c.heads, c.kv_heads, c.d,       l.q_stride,    l.kv_stride,
          c.causal, c.offset, c.window, c.scale, c.softcap,  doc_start, c.key_position};
}
cpu::BlockDims CpuDims(const Case& c, const Layout& l, const int32_t* doc_start) {
  return {c.b,        c.q_len,       c.kv_len, c.heads,  c.kv_heads, c.d,
          l.q_stride, l.kv_stride,   c.causal, c.offset, c.window,   {c.scale, c.softcap},
          doc_start,  c.key_position};
}

// The rows whose log-sum-exp is −∞ (they see no key) in both, then the relative error of the
// others. The reference must have such rows exactly where the device does.
double LseError(std::vector<float> got, std::vector<float> want) {
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (want[i] == -INFINITY) {
      if (got[i] != -INFINITY) return INFINITY;
      got[i] = want[i] = 0.0f;
    }
  }
  return RelativeError(got, want);
}

int64_t OutCount(const Case& c) { return c.b * c.q_len * c.heads * c.d; }
int64_t LseCount(const Case& c) { return c.b * c.heads * c.q_len; }

// `rows` rows of `width` values, the first at m[offset], `stride` apart.
std::vector<float> Rows(const std::vector<float>& m, int64_t offset, int64_t stride, int64_t rows,
                        int64_t width) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    const float* begin = m.data() + offset + r * stride;
    out.insert(out.end(), begin, begin + width);
  }
  return out;
}

// The device address `elements` elements of `dtype` into `t`.
void* At(const DeviceTensor& t, int64_t elements, DType dtype) {
  return static_cast<char*>(t.get()) + elements * DTypeBytes(dtype);
}

unsigned Seed(const Case& c) {
  return static_cast<unsigned>(1000 * c.q_len + 100 * c.kv_len + 10 * c.d + c.heads + c.causal +
                               7 * c.window);
}

// The inputs of a case as the device sees them, and the CPU reference's forward on them.
struct Block {
  std::vector<float> q, kv, out, lse;
};

Block ReferenceBlock(const Case& c, DType dtype, std::mt19937& rng) {
  const Layout l = LayoutOf(c);
  const std::vector<int32_t> docs = DocStarts(c);
  Block x;
  x.q = RandomActivation(l.q_count, dtype, rng);
  x.kv = RandomActivation(l.kv_count, dtype, rng);
  x.out.resize(OutCount(c));
  x.lse.resize(LseCount(c));
  cpu::AttentionBlockForward(x.out.data(), x.lse.data(), x.q.data(), x.kv.data(),
                             x.kv.data() + l.v_offset,
                             CpuDims(c, l, docs.empty() ? nullptr : docs.data()));
  return x;
}

void ExpectForwardMatchesCpu(const Case& c, DType dtype) {
  SCOPED_TRACE(Label(c, dtype));
  std::mt19937 rng(Seed(c));
  const Layout l = LayoutOf(c);
  const Block want = ReferenceBlock(c, dtype, rng);
  const DeviceDocs docs(c);
  DeviceTensor q(want.q, dtype), kv(want.kv, dtype);
  DeviceTensor out(OutCount(c), dtype), lse(LseCount(c), kF32);  // poisoned
  const absl::Status status =
      AttentionBlockForward(nullptr, dtype, out.get(), lse.f32(), q.get(), kv.get(),
                            At(kv, l.v_offset, dtype), GpuDims(c, l, docs.get()));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_LE(RelativeError(out.Read(), want.out), Tolerance(dtype)) << "out";
  EXPECT_LE(LseError(lse.Read(), want.lse), Tolerance(dtype)) << "lse";
}

TEST(AttentionBlock, ForwardMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  for (DType dtype : kDTypes) {
    for (const Case& c : kCases) ExpectForwardMatchesCpu(c, dtype);
  }
}

// The gradient buffers' parts: what the block adds to (q heads, keys, values), and the padding
// of packed query rows, which it must leave bit for bit as it was.
struct GradientParts {
  std::vector<float> dq, dk, dv, q_padding;
};

GradientParts PartsOf(const std::vector<float>& dq, const std::vector<float>& dkv, const Case& c,
                      const Layout& l) {
  const int64_t q_rows = c.b * c.q_len, kv_rows = c.b * c.kv_len, q_width = c.heads * c.d;
  const int64_t kv_width = c.kv_heads * c.d;
  return {Rows(dq, 0, l.q_stride, q_rows, q_width), Rows(dkv, 0, l.kv_stride, kv_rows, kv_width),
          Rows(dkv, l.v_offset, l.kv_stride, kv_rows, kv_width),
          Rows(dq, q_width, l.q_stride, q_rows, l.q_stride - q_width)};
}

// The backward runs on the CPU forward's out and lse (rounded as the device stores them), so
// that both sides differentiate the same function, and adds into gradients that already hold
// values (as the ring's accumulate over key blocks); twice from the same start, bit for bit.
void ExpectBackwardMatchesCpu(const Case& c, DType dtype) {
  SCOPED_TRACE(Label(c, dtype));
  std::mt19937 rng(Seed(c) + 1);
  const Layout l = LayoutOf(c);
  Block x = ReferenceBlock(c, dtype, rng);
  if (dtype == DType::kBF16) RoundToBf16(x.out);
  const std::vector<float> dout = RandomActivation(OutCount(c), dtype, rng);
  const std::vector<float> dq0 = RandomActivation(l.q_count, dtype, rng, 0.5f);
  const std::vector<float> dkv0 = RandomActivation(l.kv_count, dtype, rng, 0.5f);
  std::vector<float> want_dq = dq0, want_dkv = dkv0;
  const DeviceDocs docs(c);
  cpu::AttentionBlockBackward(want_dq.data(), want_dkv.data(), want_dkv.data() + l.v_offset,
                              dout.data(), x.q.data(), x.kv.data(), x.kv.data() + l.v_offset,
                              x.out.data(), x.lse.data(),
                              CpuDims(c, l, docs.host.empty() ? nullptr : docs.host.data()));
  const GradientParts want = PartsOf(want_dq, want_dkv, c, l);

  const AttentionBlockDims dims = GpuDims(c, l, docs.get());
  DeviceTensor q(x.q, dtype), kv(x.kv, dtype), out(x.out, dtype), lse(x.lse, kF32);
  DeviceTensor dy(dout, dtype), dq(l.q_count, dtype), dkv(l.kv_count, dtype);
  DeviceMemory scratch(static_cast<int64_t>(AttentionBlockBackwardScratchBytes(dims)));
  const double tolerance = Tolerance(dtype);
  std::vector<float> first_dq, first_dkv;
  for (int run = 0; run < 2; ++run) {
    dq.Write(dq0);
    dkv.Write(dkv0);
    scratch.Poison();
    const absl::Status status = AttentionBlockBackward(
        nullptr, dtype, dq.get(), dkv.get(), At(dkv, l.v_offset, dtype), dy.get(), q.get(),
        kv.get(), At(kv, l.v_offset, dtype), out.get(), lse.f32(), dims, scratch.get(),
        static_cast<size_t>(scratch.bytes()));
    ASSERT_TRUE(status.ok()) << status;
    std::vector<float> got_dq = dq.Read(), got_dkv = dkv.Read();
    if (run == 0) {
      const GradientParts got = PartsOf(got_dq, got_dkv, c, l);
      EXPECT_LE(RelativeError(got.dq, want.dq), tolerance) << "dq";
      EXPECT_LE(RelativeError(got.dk, want.dk), tolerance) << "dk";
      EXPECT_LE(RelativeError(got.dv, want.dv), tolerance) << "dv";
      EXPECT_EQ(got.q_padding, want.q_padding) << "columns of dq past heads·d were written";
      first_dq = std::move(got_dq);
      first_dkv = std::move(got_dkv);
    } else {
      EXPECT_EQ(std::memcmp(first_dq.data(), got_dq.data(), got_dq.size() * sizeof(float)), 0)
          << "dq is not deterministic";
      EXPECT_EQ(std::memcmp(first_dkv.data(), got_dkv.data(), got_dkv.size() * sizeof(float)), 0)
          << "dk/dv are not deterministic";
    }
  }
}

TEST(AttentionBlock, BackwardAddsTheCpuGradientsDeterministically) {
  TY_SKIP_WITHOUT_GPU();
  for (DType dtype : kDTypes) {
    for (const Case& c : kCases) ExpectBackwardMatchesCpu(c, dtype);
  }
}

// Rows with both log-sum-exps finite merge; a row whose lse is −∞ takes part's row even where
// out holds NaN; a row whose part_lse is −∞ (also with lse −∞) stays as it was. d = 40 leaves
// lanes of the warp idle.
TEST(AttentionBlock, MergeMatchesCpu) {
  TY_SKIP_WITHOUT_GPU();
  const int64_t b = 2, q_len = 5, heads = 3;
  for (DType dtype : kDTypes) {
    for (int64_t d : {16, 40, 64}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " d=", d));
      std::mt19937 rng(static_cast<unsigned>(d));
      std::vector<float> out = RandomActivation(b * q_len * heads * d, dtype, rng);
      const std::vector<float> part = RandomActivation(out.size(), dtype, rng);
      std::vector<float> lse = RandomVector(b * heads * q_len, rng, 1.5f);
      std::vector<float> part_lse = RandomVector(lse.size(), rng, 1.5f);
      // (batch 0, head 1, row 2): no keys yet; (batch 1, head 0, row 4): part saw none;
      // (batch 1, head 2, row 0): neither.
      const auto at = [&](int64_t bi, int64_t h, int64_t i) {
        return (bi * heads + h) * q_len + i;
      };
      lse[at(0, 1, 2)] = -INFINITY;
      for (int64_t c = 0; c < d; ++c) out[((0 * q_len + 2) * heads + 1) * d + c] = NAN;
      part_lse[at(1, 0, 4)] = -INFINITY;
      lse[at(1, 2, 0)] = -INFINITY;
      part_lse[at(1, 2, 0)] = -INFINITY;
      const std::vector<float> untouched_row =
          Rows(out, ((1 * q_len + 4) * heads + 0) * d, d, 1, d);

      std::vector<float> want_out = out, want_lse = lse;
      cpu::AttentionMerge(want_out.data(), want_lse.data(), part.data(), part_lse.data(), b, q_len,
                          heads, d);
      DeviceTensor dev_out(out, dtype), dev_part(part, dtype), dev_lse(lse, kF32),
          dev_part_lse(part_lse, kF32);
      const absl::Status status =
          AttentionMerge(nullptr, dtype, dev_out.get(), dev_lse.f32(), dev_part.get(),
                         dev_part_lse.f32(), b, q_len, heads, d);
      ASSERT_TRUE(status.ok()) << status;
      const std::vector<float> got_out = dev_out.Read(), got_lse = dev_lse.Read();
      // Without the NaN row and the row left alone with lse −∞, both sides are finite.
      std::vector<float> got_finite_lse = got_lse, want_finite_lse = want_lse;
      got_finite_lse[at(1, 2, 0)] = want_finite_lse[at(1, 2, 0)] = 0.0f;
      EXPECT_LE(RelativeError(got_out, want_out), Tolerance(dtype)) << "out";
      EXPECT_LE(RelativeError(got_finite_lse, want_finite_lse), Tolerance(kF32)) << "lse";
      EXPECT_EQ(Rows(got_out, ((0 * q_len + 2) * heads + 1) * d, d, 1, d),
                Rows(part, ((0 * q_len + 2) * heads + 1) * d, d, 1, d))
          << "a row without keys takes part's row";
      EXPECT_EQ(got_lse[at(0, 1, 2)], part_lse[at(0, 1, 2)]);
      EXPECT_EQ(Rows(got_out, ((1 * q_len + 4) * heads + 0) * d, d, 1, d), untouched_row)
          << "a part without keys changes nothing";
      EXPECT_EQ(got_lse[at(1, 0, 4)], lse[at(1, 0, 4)]);
      EXPECT_EQ(got_lse[at(1, 2, 0)], -INFINITY);
    }
  }
}

// What ring attention relies on: the causal block of a chunk against itself merged with the full
// block of the chunk against the one before it is the causal attention of the whole sequence,
// for the chunk's rows. One sequence (b = 1) in a packed qkv, so that a chunk's rows are a
// block's.
TEST(AttentionBlock, TwoBlocksMergedAreTheWholeAttention) {
  TY_SKIP_WITHOUT_GPU();
  const int64_t c = 24, t = 2 * c, heads = 4, kv_heads = 2, d = 32;
  const int64_t row = (heads + 2 * kv_heads) * d, width = heads * d;
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    std::mt19937 rng(7);
    const std::vector<float> qkv = RandomActivation(t * row, dtype, rng);
    std::vector<float> want_out(t * width), want_lse(heads * t);
    cpu::AttentionForward(want_out.data(), want_lse.data(), qkv.data(), 1, t, heads, kv_heads, d);

    DeviceTensor dev_qkv(qkv, dtype), out(c * width, dtype), part(c * width, dtype);
    DeviceTensor lse(heads * c, kF32), part_lse(heads * c, kF32);
    const auto block = [&](bool causal) {
      return AttentionBlockDims{1, c, c, heads, kv_heads, d, row, row, causal};
    };
    void* q1 = At(dev_qkv, c * row, dtype);
    const int64_t k = heads * d, v = (heads + kv_heads) * d;
    ASSERT_TRUE(AttentionBlockForward(nullptr, dtype, out.get(), lse.f32(), q1,
                                      At(dev_qkv, c * row + k, dtype),
                                      At(dev_qkv, c * row + v, dtype), block(true))
                    .ok());
    ASSERT_TRUE(AttentionBlockForward(nullptr, dtype, part.get(), part_lse.f32(), q1,
                                      At(dev_qkv, k, dtype), At(dev_qkv, v, dtype), block(false))
                    .ok());
    ASSERT_TRUE(AttentionMerge(nullptr, dtype, out.get(), lse.f32(), part.get(), part_lse.f32(), 1,
                               c, heads, d)
                    .ok());
    const std::vector<float> chunk_out(want_out.begin() + c * width, want_out.end());
    const std::vector<float> chunk_lse = Rows(want_lse, c, t, heads, c);
    EXPECT_LE(RelativeError(out.Read(), chunk_out), Tolerance(dtype)) << "out";
    EXPECT_LE(RelativeError(lse.Read(), chunk_lse), Tolerance(dtype)) << "lse";
  }
}

// Calls the forward and backward launchers on buffers sized for `dims` (with room for strides
// up to 2·(heads + 2·kv_heads)·d) and returns their statuses.
struct Statuses {
  absl::Status forward, backward;
};
Statuses RunBoth(const AttentionBlockDims& dims, DType dtype, size_t scratch_bytes) {
  const int64_t elem = DTypeBytes(dtype), span = 2 * (dims.heads + 2 * dims.kv_heads) * dims.d;
  DeviceMemory q(dims.b * dims.q_len * span * elem), kv(dims.b * dims.kv_len * span * elem);
  DeviceMemory dq(q.bytes()), dkv(kv.bytes());
  DeviceMemory out(dims.b * dims.q_len * dims.heads * dims.d * elem), dout(out.bytes());
  DeviceMemory lse(dims.b * dims.heads * dims.q_len * static_cast<int64_t>(sizeof(float)));
  DeviceMemory scratch(static_cast<int64_t>(scratch_bytes));
  Statuses s;
  // Values beside the keys, as in a packed row.
  const int64_t v_at = dims.kv_heads * dims.d * elem;
  void* v = static_cast<char*>(kv.get()) + v_at;
  void* dv = static_cast<char*>(dkv.get()) + v_at;
  s.forward =
      AttentionBlockForward(nullptr, dtype, out.get(), lse.as<float>(), q.get(), kv.get(), v, dims);
  s.backward =
      AttentionBlockBackward(nullptr, dtype, dq.get(), dkv.get(), dv, dout.get(), q.get(), kv.get(),
                             v, out.get(), lse.as<float>(), dims, scratch.get(), scratch_bytes);
  return s;
}

TEST(AttentionBlock, RejectsBadShapes) {
  TY_SKIP_WITHOUT_GPU();
  const AttentionBlockDims good{1, 8, 8, 2, 1, 16, 64, 32, true};
  struct Bad {
    const char* what;
    AttentionBlockDims dims;
    DType dtype;
  };
  const Bad bad[] = {
      {"head dim 24", {1, 8, 8, 2, 1, 24, 96, 48, false}, DType::kBF16},
      {"causal with q_len != kv_len", {1, 8, 12, 2, 1, 16, 64, 32, true}, DType::kF32},
      {"heads not a multiple of kv_heads", {1, 8, 8, 3, 2, 16, 112, 64, false}, DType::kF32},
      {"q_stride below heads·d", {1, 8, 8, 2, 1, 16, 16, 32, false}, DType::kF32},
      {"q_stride not a multiple of 16 bytes", {1, 8, 8, 2, 1, 16, 34, 32, false}, DType::kF32},
      {"kv_stride not a multiple of 16 bytes", {1, 8, 8, 2, 1, 16, 64, 20, false}, DType::kBF16},
  };
  for (const Bad& x : bad) {
    SCOPED_TRACE(x.what);
    const Statuses s = RunBoth(x.dims, x.dtype, AttentionBlockBackwardScratchBytes(x.dims));
    EXPECT_EQ(s.forward.code(), absl::StatusCode::kInvalidArgument) << s.forward;
    EXPECT_EQ(s.backward.code(), absl::StatusCode::kInvalidArgument) << s.backward;
  }
  const Statuses head_dim = RunBoth(bad[0].dims, DType::kBF16, 1024);
  EXPECT_NE(head_dim.forward.message().find("24"), std::string::npos) << head_dim.forward;
  EXPECT_NE(head_dim.backward.message().find("24"), std::string::npos) << head_dim.backward;

  const size_t needed = AttentionBlockBackwardScratchBytes(good);
  const Statuses ok = RunBoth(good, DType::kF32, needed);
  EXPECT_TRUE(ok.forward.ok()) << ok.forward;
  EXPECT_TRUE(ok.backward.ok()) << ok.backward;
  const Statuses short_scratch = RunBoth(good, DType::kF32, needed - sizeof(float));
  EXPECT_EQ(short_scratch.backward.code(), absl::StatusCode::kInvalidArgument)
      << short_scratch.backward;

  DeviceMemory tensor(1024);
  EXPECT_EQ(AttentionMerge(nullptr, kF32, tensor.get(), tensor.as<float>(), tensor.get(),
                           tensor.as<float>(), 1, 2, 2, 0)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainyard::kernels::cuda
