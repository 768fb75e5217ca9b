// The kernels of ring attention (context parallelism) through the CPU backend. Attention blocks
// (the queries of one sequence chunk against the keys and values of one chunk), merged by their
// log-sum-exp, must give the whole sequence's causal attention and its gradients however the
// sequence is cut over ranks; RoPE with a position offset must give a chunk the rotation its rows
// get in the whole sequence.
//
// References, all independent of the block kernels: the backend's whole-sequence Attention,
// AttentionBackward and Rope (themselves checked by finite differences in gradcheck_test), a
// double-precision softmax written out here, and finite differences. With documents
// (model.document_token) the whole-sequence kernels are checked against each document alone.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "gtest/gtest.h"
#include "worker/backend.h"
#include "worker/rope.h"

namespace trainyard::worker {
namespace {

std::vector<float> Random(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The CPU backend's activations are fp32 host memory.
Act* A(float* p) { return reinterpret_cast<Act*>(p); }
const Act* A(const float* p) { return reinterpret_cast<const Act*>(p); }

// Infinite where an element is NaN (outputs start NaN-poisoned: an element never written fails).
double MaxAbsDiff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double diff = std::abs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
    err = std::max(err, diff);
  }
  return err;
}

// max |got − want| relative to the largest |want| (at least 1): gradients summed over many blocks
// differ from the whole-sequence kernel's by rounding in proportion to their size.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 1.0;
  for (float w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  return MaxAbsDiff(got, want) / scale;
}

// A whole batch of sequences and how it is cut: t = chunks · c.
struct Geometry {
  AttentionShape s;  // the whole sequences
  int64_t c;         // chunk length
  int64_t qkv_row() const { return s.qkv_row(); }
  int64_t q_row() const { return s.heads * s.head_dim; }  // where a packed row's keys start
  int64_t kv_row() const { return s.kv_heads * (s.head_dim + s.v_dim()); }
  int64_t out_row() const { return s.heads * s.v_dim(); }
  int64_t chunk_rows() const { return s.batch * c; }
  // The block of one chunk's queries against another's keys, as ring attention runs it; with
  // documents, doc_start holds the query chunk's rows' document starts ([b, c]).
  AttentionBlockShape Block(int query_chunk, int key_chunk, int64_t kv_stride,
                            const int32_t* doc_start = nullptr) const {
    return {.batch = s.batch,
            .q_len = c,
            .kv_len = c,
            .heads = s.heads,
            .kv_heads = s.kv_heads,
            .head_dim = s.head_dim,
            .q_stride = qkv_row(),
            .kv_stride = kv_stride,
            .causal = query_chunk == key_chunk,
            .offset = (query_chunk - key_chunk) * c,
            .window = s.window,
            .doc_start = doc_start,
            .key_position = key_chunk * c,
            .value_dim = s.value_dim};
  }
  // Whether some query of the chunk sees some key of the other (the blocks ring attention runs).
  bool Sees(int query_chunk, int key_chunk) const {
    return key_chunk <= query_chunk &&
           (s.window == 0 || (query_chunk - key_chunk - 1) * c + 1 < s.window);
  }
};

// Which chunks each rank holds, in its local row order: chunk-major, the b sequences' rows of its
// first chunk, then of its second. With separate_kv the keys and values travel as ring attention
// sends them, [rows, 2·kv_heads·d] (keys, then values); otherwise they are read in the packed qkv.
struct Split {
  std::string name;
  std::vector<std::vector<int>> ranks;
  bool separate_kv;
};

Split Contiguous(int chunks) {
  Split split{"contiguous " + std::to_string(chunks), {}, false};
  for (int r = 0; r < chunks; ++r) split.ranks.push_back({r});
  return split;
}

// Rank r of n holds chunks r and 2n − 1 − r of 2n, so every rank has as much causal work.
Split Zigzag(int n) {
  Split split{"zigzag " + std::to_string(n), {}, true};
  for (int r = 0; r < n; ++r) split.ranks.push_back({r, 2 * n - 1 - r});
  return split;
}

// Local rows [chunks][b][c] of `whole` rows [b][t], `width` elements each.
template <typename T>
std::vector<T> GatherRows(const std::vector<T>& whole, const Geometry& g,
                          const std::vector<int>& chunks, int64_t width) {
  std::vector<T> local;
  for (int chunk : chunks) {
    for (int64_t bi = 0; bi < g.s.batch; ++bi) {
      const T* first = whole.data() + (bi * g.s.seq + chunk * g.c) * width;
      local.insert(local.end(), first, first + g.c * width);
    }
  }
  return local;
}

void ScatterRows(const std::vector<float>& local, const Geometry& g, const std::vector<int>& chunks,
                 int64_t width, std::vector<float>& whole) {
  const float* from = local.data();
  for (int chunk : chunks) {
    for (int64_t bi = 0; bi < g.s.batch; ++bi, from += g.c * width) {
      std::copy_n(from, g.c * width, whole.data() + (bi * g.s.seq + chunk * g.c) * width);
    }
  }
}

// Local lse [chunks][b, heads, c] of the whole lse [b, heads, t].
std::vector<float> GatherLse(const std::vector<float>& whole, const Geometry& g,
                             const std::vector<int>& chunks) {
  std::vector<float> local;
  for (int chunk : chunks) {
    for (int64_t bh = 0; bh < g.s.batch * g.s.heads; ++bh) {
      const float* first = whole.data() + bh * g.s.seq + chunk * g.c;
      local.insert(local.end(), first, first + g.c);
    }
  }
  return local;
}

// One emulated rank: its rows of the whole sequences, and what the blocks computed for them.
struct Rank {
  std::vector<float> qkv;          // [chunks, b, c, qkv_row]
  std::vector<float> kv;           // [chunks · b · c, kv_row], when the split has separate_kv
  std::vector<float> out;          // [chunks, b, c, heads · d]
  std::vector<float> lse;          // [chunks, b, heads, c]
  std::vector<int32_t> doc_start;  // with documents: [chunks, b, c]
};

// Document starts [b, t] (Model's, from model.document_token): each sequence cut at random
// positions, about one in `mean_length`, so that documents cross chunk and query-block edges.
std::vector<int32_t> RandomDocStarts(int64_t b, int64_t t, int mean_length, std::mt19937& rng) {
  std::uniform_int_distribution<int> cut(0, mean_length - 1);
  std::vector<int32_t> starts(b * t);
  for (int64_t bi = 0; bi < b; ++bi) {
    int32_t start = 0;
    for (int64_t i = 0; i < t; ++i) {
      if (cut(rng) == 0) start = static_cast<int32_t>(i);
      starts[bi * t + i] = start;
    }
  }
  return starts;
}

class RingAttentionKernels : public ::testing::Test {
 protected:
  struct Case {
    // batch, heads, kv_heads, head_dim and the sliding window; seq follows from the split
    AttentionShape shape;
    Split split;
    int64_t c;
    int documents = 0;  // > 0: documents of about this mean length (RandomDocStarts)
  };

  // Grouped-query (4/2) and multi-head (3/3) layouts; chunk lengths 5 and 7 (sequences that are
  // not powers of two) and 70 (a chunk longer than the kernels' 64-row query blocks). Sliding
  // windows narrower than a chunk (blocks partly and wholly outside it), spanning two or three
  // chunks, and crossing the 64-row query blocks. Value heads narrower than the query and key
  // heads (multi-head latent attention's 12 and 8, grouped 8 and 5).
  static std::vector<Case> Cases() {
    const AttentionShape gqa{2, 0, 4, 2, 8}, mha{1, 0, 3, 3, 4}, latent{1, 0, 3, 3, 12};
    auto windowed = [](AttentionShape s, int64_t window) {
      s.window = window;
      return s;
    };
    auto narrow = [](AttentionShape s, int64_t value_dim) {
      s.value_dim = value_dim;
      return s;
    };
    return {{gqa, Contiguous(2), 5},
            {gqa, Contiguous(4), 7},
            {mha, Contiguous(4), 5},
            {gqa, Zigzag(2), 5},
            {gqa, Zigzag(4), 7},
            {mha, Zigzag(2), 70},
            {mha, Contiguous(2), 70},
            {windowed(gqa, 3), Zigzag(4), 7},
            {windowed(gqa, 12), Zigzag(2), 5},
            {windowed(mha, 9), Contiguous(4), 5},
            {windowed(mha, 100), Zigzag(2), 70},
            {gqa, Zigzag(4), 7, 6},
            {gqa, Contiguous(2), 5, 3},
            {windowed(gqa, 12), Zigzag(2), 5, 4},
            {mha, Zigzag(2), 70, 40},
            {narrow(latent, 8), Zigzag(2), 70},
            {narrow(latent, 8), Contiguous(4), 7},
            {narrow(gqa, 5), Zigzag(4), 7, 6},
            {narrow(windowed(gqa, 12), 5), Contiguous(2), 5}};
  }

  static std::string Label(const Case& test_case) {
    return test_case.split.name + " c=" + std::to_string(test_case.c) + " heads " +
           std::to_string(test_case.shape.heads) + "/" + std::to_string(test_case.shape.kv_heads) +
           " window " + std::to_string(test_case.shape.window) + " documents " +
           std::to_string(test_case.documents) + " value_dim " +
           std::to_string(test_case.shape.value_dim);
  }

  // With documents, `docs` holds the whole sequences' document starts the shape points to.
  Geometry GeometryOf(const Case& test_case, std::vector<int32_t>* docs) {
    AttentionShape s = test_case.shape;
    int64_t chunks = 0;
    for (const std::vector<int>& held : test_case.split.ranks) {
      chunks += static_cast<int64_t>(held.size());
    }
    s.seq = chunks * test_case.c;
    if (test_case.documents > 0) {
      *docs = RandomDocStarts(s.batch, s.seq, test_case.documents, rng_);
      s.doc_start = docs->data();
    }
    return {s, test_case.c};
  }

  // The ranks' local qkv, and their key/value buffers copied out of it with CopyRows.
  std::vector<Rank> MakeRanks(const Geometry& g, const Split& split,
                              const std::vector<float>& qkv) {
    std::vector<Rank> ranks(split.ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) {
      Rank& rank = ranks[r];
      const int64_t rows = g.chunk_rows() * static_cast<int64_t>(split.ranks[r].size());
      rank.qkv = GatherRows(qkv, g, split.ranks[r], g.qkv_row());
      rank.out.assign(rows * g.out_row(), std::nanf(""));  // poisoned: the blocks overwrite them
      rank.lse.assign(rows * g.s.heads, std::nanf(""));
      if (g.s.doc_start != nullptr) {
        const std::vector<int32_t> whole(g.s.doc_start, g.s.doc_start + g.s.batch * g.s.seq);
        rank.doc_start = GatherRows(whole, g, split.ranks[r], 1);
      }
      if (!split.separate_kv) continue;
      rank.kv.assign(rows * g.kv_row(), std::nanf(""));
      be_->CopyRows(A(rank.kv.data()), g.kv_row(), A(rank.qkv.data() + g.q_row()), g.qkv_row(),
                    rows, g.kv_row());
    }
    return ranks;
  }

  // The keys of local chunk `half` of a rank (its values follow at +kv_heads·head_dim).
  struct Keys {
    const float* first;
    int64_t stride;
  };
  static Keys KeysOf(const Rank& rank, const Geometry& g, bool separate_kv, size_t half) {
    if (separate_kv) return {rank.kv.data() + half * g.chunk_rows() * g.kv_row(), g.kv_row()};
    return {rank.qkv.data() + half * g.chunk_rows() * g.qkv_row() + g.q_row(), g.qkv_row()};
  }

  // The document starts of local chunk `half` of a rank's queries (null without documents).
  static const int32_t* DocStarts(const Rank& rank, const Geometry& g, size_t half) {
    return rank.doc_start.empty() ? nullptr : rank.doc_start.data() + half * g.chunk_rows();
  }

  // Every rank's out and lse, block by block: each query chunk against every key chunk at or
  // before it (its own causally), the first block written in place and the others merged in.
  void BlockwiseForward(const Geometry& g, const Split& split, std::vector<Rank>& ranks) {
    const int64_t kv_offset = g.s.kv_heads * g.s.head_dim;
    std::vector<float> part(g.chunk_rows() * g.out_row()), part_lse(g.chunk_rows() * g.s.heads);
    for (size_t r = 0; r < ranks.size(); ++r) {
      for (size_t qh = 0; qh < split.ranks[r].size(); ++qh) {
        const float* q = ranks[r].qkv.data() + qh * g.chunk_rows() * g.qkv_row();
        float* out = ranks[r].out.data() + qh * g.chunk_rows() * g.out_row();
        float* lse = ranks[r].lse.data() + qh * g.chunk_rows() * g.s.heads;
        bool filled = false;
        for (size_t src = 0; src < ranks.size(); ++src) {
          for (size_t kh = 0; kh < split.ranks[src].size(); ++kh) {
            const int query_chunk = split.ranks[r][qh], key_chunk = split.ranks[src][kh];
            if (!g.Sees(query_chunk, key_chunk)) continue;
            const Keys keys = KeysOf(ranks[src], g, split.separate_kv, kh);
            const float* k = keys.first;
            const AttentionBlockShape shape =
                g.Block(query_chunk, key_chunk, keys.stride, DocStarts(ranks[r], g, qh));
            if (!filled) {
              be_->AttentionBlock(A(out), lse, A(q), A(k), A(k + kv_offset), shape);
              filled = true;
              continue;
            }
            be_->AttentionBlock(A(part.data()), part_lse.data(), A(q), A(k), A(k + kv_offset),
                                shape);
            be_->AttentionMerge(A(out), lse, A(part.data()), part_lse.data(), g.s.batch, g.c,
                                g.s.heads, g.s.v_dim());
          }
        }
      }
    }
  }

  // The whole sequences' dqkv from the blocks' backward: query gradients into the querying rank's
  // local dqkv, key/value gradients into the owner's (its key/value buffer with separate_kv,
  // copied back with CopyRows), then every rank's rows put back in the whole layout.
  std::vector<float> BlockwiseBackward(const Geometry& g, const Split& split,
                                       const std::vector<Rank>& ranks,
                                       const std::vector<float>& dout) {
    const int64_t kv_offset = g.s.kv_heads * g.s.head_dim;
    std::vector<std::vector<float>> dqkv(ranks.size()), dkv(ranks.size()), douts(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) {
      dqkv[r].assign(ranks[r].qkv.size(), 0.0f);
      dkv[r].assign(ranks[r].kv.size(), 0.0f);
      douts[r] = GatherRows(dout, g, split.ranks[r], g.out_row());
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
      for (size_t qh = 0; qh < split.ranks[r].size(); ++qh) {
        const int64_t q_at = qh * g.chunk_rows() * g.qkv_row();
        const int64_t o_at = qh * g.chunk_rows() * g.out_row();
        const float* lse = ranks[r].lse.data() + qh * g.chunk_rows() * g.s.heads;
        for (size_t src = 0; src < ranks.size(); ++src) {
          for (size_t kh = 0; kh < split.ranks[src].size(); ++kh) {
            const int query_chunk = split.ranks[r][qh], key_chunk = split.ranks[src][kh];
            if (!g.Sees(query_chunk, key_chunk)) continue;
            const Keys keys = KeysOf(ranks[src], g, split.separate_kv, kh);
            const float* k = keys.first;
            // The gradient of k sits where k sits, in the owner's gradient buffers.
            const int64_t k_at = k - (split.separate_kv ? ranks[src].kv : ranks[src].qkv).data();
            float* dk = (split.separate_kv ? dkv[src] : dqkv[src]).data() + k_at;
            be_->AttentionBlockBackward(
                A(dqkv[r].data() + q_at), A(dk), A(dk + kv_offset), A(douts[r].data() + o_at),
                A(ranks[r].qkv.data() + q_at), A(k), A(k + kv_offset),
                A(ranks[r].out.data() + o_at), lse,
                g.Block(query_chunk, key_chunk, keys.stride, DocStarts(ranks[r], g, qh)));
          }
        }
      }
    }
    std::vector<float> whole(g.s.batch * g.s.seq * g.qkv_row(), std::nanf(""));
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (split.separate_kv) {
        const int64_t rows = static_cast<int64_t>(dkv[r].size()) / g.kv_row();
        be_->CopyRows(A(dqkv[r].data() + g.q_row()), g.qkv_row(), A(dkv[r].data()), g.kv_row(),
                      rows, g.kv_row());
      }
      ScatterRows(dqkv[r], g, split.ranks[r], g.qkv_row(), whole);
    }
    return whole;
  }

  // One thread: these tests make hundreds of small calls, and OpenMP's barriers make them slow
  // when ctest runs other tests beside them. BackwardIsRunToRunDeterministic uses two.
  std::unique_ptr<Backend> be_ = MakeCpuBackend(1);
  std::mt19937 rng_{7};
};

TEST_F(RingAttentionKernels, CausalBlockOverPackedQkvIsAttention) {
  const AttentionShape s{2, 150, 4, 2, 8};  // 150 rows: three query blocks, the last partial
  const Geometry g{s, s.seq};
  const std::vector<float> qkv = Random(s.batch * s.seq * g.qkv_row(), rng_);
  std::vector<float> want_out(s.batch * s.seq * g.out_row()), want_lse(s.batch * s.heads * s.seq);
  be_->Attention(A(want_out.data()), want_lse.data(), A(qkv.data()), s);

  std::vector<float> out(want_out.size(), std::nanf("")), lse(want_lse.size(), std::nanf(""));
  const float* k = qkv.data() + g.q_row();
  be_->AttentionBlock(A(out.data()), lse.data(), A(qkv.data()), A(k),
                      A(k + s.kv_heads * s.head_dim), g.Block(0, 0, g.qkv_row()));
  EXPECT_LE(MaxAbsDiff(out, want_out), 1e-5);
  EXPECT_LE(MaxAbsDiff(lse, want_lse), 1e-5);
}

TEST_F(RingAttentionKernels, MergedBlocksAreTheWholeAttention) {
  for (const Case& test_case : Cases()) {
    std::vector<int32_t> docs;
    const Geometry g = GeometryOf(test_case, &docs);
    SCOPED_TRACE(Label(test_case));
    const std::vector<float> qkv = Random(g.s.batch * g.s.seq * g.qkv_row(), rng_);
    std::vector<float> out(g.s.batch * g.s.seq * g.out_row()), lse(g.s.batch * g.s.heads * g.s.seq);
    be_->Attention(A(out.data()), lse.data(), A(qkv.data()), g.s);

    std::vector<Rank> ranks = MakeRanks(g, test_case.split, qkv);
    BlockwiseForward(g, test_case.split, ranks);
    for (size_t r = 0; r < ranks.size(); ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_LE(MaxAbsDiff(ranks[r].out, GatherRows(out, g, test_case.split.ranks[r], g.out_row())),
                1e-5);
      EXPECT_LE(MaxAbsDiff(ranks[r].lse, GatherLse(lse, g, test_case.split.ranks[r])), 1e-5);
    }
  }
}

TEST_F(RingAttentionKernels, BlockBackwardsSumToTheWholeBackward) {
  for (const Case& test_case : Cases()) {
    std::vector<int32_t> docs;
    const Geometry g = GeometryOf(test_case, &docs);
    SCOPED_TRACE(Label(test_case));
    const std::vector<float> qkv = Random(g.s.batch * g.s.seq * g.qkv_row(), rng_);
    const std::vector<float> dout = Random(g.s.batch * g.s.seq * g.out_row(), rng_);
    std::vector<float> out(dout.size()), lse(g.s.batch * g.s.heads * g.s.seq), want(qkv.size());
    be_->Attention(A(out.data()), lse.data(), A(qkv.data()), g.s);
    be_->AttentionBackward(A(want.data()), A(dout.data()), A(qkv.data()), A(out.data()), lse.data(),
                           g.s);

    std::vector<Rank> ranks = MakeRanks(g, test_case.split, qkv);
    BlockwiseForward(g, test_case.split, ranks);
    const std::vector<float> got = BlockwiseBackward(g, test_case.split, ranks, dout);
    EXPECT_LE(RelativeError(got, want), 1e-4);
  }
}

// Bit for bit with two threads splitting the work: each gradient element has one writer, adding
// in a fixed order (a kernel with atomic or racing adds would differ from run to run).
TEST_F(RingAttentionKernels, BackwardIsRunToRunDeterministic) {
  be_ = MakeCpuBackend(2);
  const Case test_case{{2, 0, 4, 2, 8}, Zigzag(2), 70};
  std::vector<int32_t> docs;
  const Geometry g = GeometryOf(test_case, &docs);
  const std::vector<float> qkv = Random(g.s.batch * g.s.seq * g.qkv_row(), rng_);
  const std::vector<float> dout = Random(g.s.batch * g.s.seq * g.out_row(), rng_);
  std::vector<Rank> ranks = MakeRanks(g, test_case.split, qkv);
  BlockwiseForward(g, test_case.split, ranks);
  const std::vector<float> first = BlockwiseBackward(g, test_case.split, ranks, dout);
  const std::vector<float> second = BlockwiseBackward(g, test_case.split, ranks, dout);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), second.begin()));
}

// One non-causal block with q_len ≠ kv_len and padded rows (strides wider than the heads), GQA:
// the layout ring attention does not use but the contract allows; with Narrow, value heads of 4
// beside query and key heads of 6.
struct StridedBlock {
  AttentionBlockShape s{.batch = 2,
                        .q_len = 5,
                        .kv_len = 9,
                        .heads = 4,
                        .kv_heads = 2,
                        .head_dim = 6,
                        .q_stride = 4 * 6 + 3,
                        .kv_stride = 2 * 2 * 6 + 1,
                        .causal = false};
  int64_t q_size() const { return s.batch * s.q_len * s.q_stride; }
  int64_t kv_size() const { return s.batch * s.kv_len * s.kv_stride; }
  int64_t dv() const { return s.value_dim > 0 ? s.value_dim : s.head_dim; }
  int64_t out_size() const { return s.batch * s.q_len * s.heads * dv(); }
  int64_t lse_size() const { return s.batch * s.heads * s.q_len; }
  int64_t v_offset() const { return s.kv_heads * s.head_dim; }
  static StridedBlock Narrow() {
    StridedBlock b;
    b.s.value_dim = 4;
    b.s.kv_stride = 2 * (6 + 4) + 1;
    return b;
  }
};

// A block's attention written out in double precision over the keys `visible(i, j)` admits (at
// least one per row). q and kv hold the block's operands as s describes them, the values
// v_offset elements after the keys.
void DirectAttention(const AttentionBlockShape& s, const float* q, const float* kv,
                     int64_t v_offset, const std::function<bool(int64_t, int64_t)>& visible,
                     std::vector<float>& out, std::vector<float>& lse) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  const int64_t dv = s.value_dim > 0 ? s.value_dim : s.head_dim;
  for (int64_t bi = 0; bi < s.batch; ++bi) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / (s.heads / s.kv_heads);
      for (int64_t i = 0; i < s.q_len; ++i) {
        const float* qi = q + (bi * s.q_len + i) * s.q_stride + h * s.head_dim;
        std::vector<double> score(s.kv_len, -std::numeric_limits<double>::infinity());
        for (int64_t j = 0; j < s.kv_len; ++j) {
          if (!visible(i, j)) continue;
          const float* kj = kv + (bi * s.kv_len + j) * s.kv_stride + g * s.head_dim;
          score[j] = 0.0;
          for (int64_t c = 0; c < s.head_dim; ++c) score[j] += scale * qi[c] * kj[c];
        }
        const double mx = *std::max_element(score.begin(), score.end());
        double sum = 0.0;
        for (double x : score) sum += std::exp(x - mx);
        lse[(bi * s.heads + h) * s.q_len + i] = static_cast<float>(mx + std::log(sum));
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0.0;
          for (int64_t j = 0; j < s.kv_len; ++j) {
            acc += std::exp(score[j] - mx) / sum *
                   kv[(bi * s.kv_len + j) * s.kv_stride + v_offset + g * dv + c];
          }
          out[((bi * s.q_len + i) * s.heads + h) * dv + c] = static_cast<float>(acc);
        }
      }
    }
  }
}

// The whole sequence's attention with a sliding window of W: query i sees keys i − W < j <= i.
// 150 rows (three 64-row query blocks); windows of one position, within a block, across blocks,
// and wider than the sequence.
TEST_F(RingAttentionKernels, SlidingWindowAttentionIsTheSoftmaxOverTheWindow) {
  for (int64_t window : {1, 5, 64, 70, 500}) {
    SCOPED_TRACE("window " + std::to_string(window));
    const AttentionShape s{2, 150, 4, 2, 8, window};
    const Geometry g{s, s.seq};
    const std::vector<float> qkv = Random(s.batch * s.seq * g.qkv_row(), rng_);
    std::vector<float> out(s.batch * s.seq * g.out_row(), std::nanf(""));
    std::vector<float> lse(s.batch * s.heads * s.seq, std::nanf(""));
    be_->Attention(A(out.data()), lse.data(), A(qkv.data()), s);
    std::vector<float> want_out(out.size()), want_lse(lse.size());
    DirectAttention(
        g.Block(0, 0, g.qkv_row()), qkv.data(), qkv.data() + g.q_row(), s.kv_heads * s.head_dim,
        [&](int64_t i, int64_t j) { return j <= i && j > i - window; }, want_out, want_lse);
    EXPECT_LE(MaxAbsDiff(out, want_out), 1e-5);
    EXPECT_LE(MaxAbsDiff(lse, want_lse), 1e-5);
  }
}

// Documents (model.document_token): a query sees only its own document's keys, so a packed
// sequence's attention, forward and backward, is each document's attending alone. Documents of
// one row, inside a 64-row query block, across two, and one starting at the last row; a
// sequence whose first row begins none; with and without a sliding window.
TEST_F(RingAttentionKernels, DocumentMaskIsEachDocumentAttendingAlone) {
  const std::vector<std::vector<int64_t>> begins = {{0, 3, 4, 70, 149}, {20, 21, 90}};
  for (int64_t window : {0, 6}) {
    SCOPED_TRACE("window " + std::to_string(window));
    AttentionShape s{2, 150, 4, 2, 8, window};
    std::vector<int32_t> starts(s.batch * s.seq);
    for (int64_t bi = 0; bi < s.batch; ++bi) {
      int32_t start = 0;
      for (int64_t i = 0; i < s.seq; ++i) {
        if (std::count(begins[bi].begin(), begins[bi].end(), i) > 0) {
          start = static_cast<int32_t>(i);
        }
        starts[bi * s.seq + i] = start;
      }
    }
    s.doc_start = starts.data();
    const Geometry g{s, s.seq};
    const std::vector<float> qkv = Random(s.batch * s.seq * g.qkv_row(), rng_);
    const std::vector<float> dout = Random(s.batch * s.seq * g.out_row(), rng_);
    std::vector<float> out(dout.size(), std::nanf("")), lse(s.batch * s.heads * s.seq);
    std::vector<float> dqkv(qkv.size(), std::nanf(""));
    be_->Attention(A(out.data()), lse.data(), A(qkv.data()), s);
    be_->AttentionBackward(A(dqkv.data()), A(dout.data()), A(qkv.data()), A(out.data()), lse.data(),
                           s);
    for (int64_t bi = 0; bi < s.batch; ++bi) {
      for (int64_t first = 0; first < s.seq;) {
        int64_t end = first + 1;
        while (end < s.seq && starts[bi * s.seq + end] == first) ++end;
        SCOPED_TRACE("sequence " + std::to_string(bi) + ", document [" + std::to_string(first) +
                     ", " + std::to_string(end) + ")");
        const AttentionShape alone{1, end - first, s.heads, s.kv_heads, s.head_dim, window};
        auto rows = [&](const std::vector<float>& v, int64_t width) {
          const float* at = v.data() + (bi * s.seq + first) * width;
          return std::vector<float>(at, at + alone.seq * width);
        };
        const std::vector<float> doc_qkv = rows(qkv, g.qkv_row());
        const std::vector<float> doc_dout = rows(dout, g.out_row());
        std::vector<float> want_out(doc_dout.size()), want_lse(s.heads * alone.seq);
        std::vector<float> want_dqkv(doc_qkv.size());
        be_->Attention(A(want_out.data()), want_lse.data(), A(doc_qkv.data()), alone);
        be_->AttentionBackward(A(want_dqkv.data()), A(doc_dout.data()), A(doc_qkv.data()),
                               A(want_out.data()), want_lse.data(), alone);
        std::vector<float> got_lse;
        for (int64_t h = 0; h < s.heads; ++h) {
          const float* at = lse.data() + (bi * s.heads + h) * s.seq + first;
          got_lse.insert(got_lse.end(), at, at + alone.seq);
        }
        EXPECT_LE(MaxAbsDiff(rows(out, g.out_row()), want_out), 1e-5);
        EXPECT_LE(MaxAbsDiff(got_lse, want_lse), 1e-5);
        EXPECT_LE(RelativeError(rows(dqkv, g.qkv_row()), want_dqkv), 1e-5);
        first = end;
      }
    }
  }
}

void CheckNonCausalBlock(Backend& be, const StridedBlock& b, std::mt19937& rng) {
  const std::vector<float> q = Random(b.q_size(), rng), kv = Random(b.kv_size(), rng);
  std::vector<float> out(b.out_size(), std::nanf("")), lse(b.lse_size(), std::nanf(""));
  be.AttentionBlock(A(out.data()), lse.data(), A(q.data()), A(kv.data()),
                    A(kv.data() + b.v_offset()), b.s);
  std::vector<float> want_out(out.size()), want_lse(lse.size());
  DirectAttention(
      b.s, q.data(), kv.data(), b.v_offset(), [](int64_t, int64_t) { return true; }, want_out,
      want_lse);
  EXPECT_LE(MaxAbsDiff(out, want_out), 1e-5);
  EXPECT_LE(MaxAbsDiff(lse, want_lse), 1e-5);
}

// For L = Σ r ⊙ out(q, kv), the central difference along a random direction of each input against
// ⟨gradient, direction⟩ from the block's backward (one block: its own out and lse are the merged
// ones). The padding columns must get no gradient, so they are part of the direction too.
void CheckNonCausalBlockBackward(Backend& be, const StridedBlock& b, std::mt19937& rng) {
  const std::vector<float> q = Random(b.q_size(), rng), kv = Random(b.kv_size(), rng);
  const std::vector<float> r = Random(b.out_size(), rng);
  auto loss = [&](const std::vector<float>& q_in, const std::vector<float>& kv_in) {
    std::vector<float> out(b.out_size()), lse(b.lse_size());
    be.AttentionBlock(A(out.data()), lse.data(), A(q_in.data()), A(kv_in.data()),
                      A(kv_in.data() + b.v_offset()), b.s);
    double total = 0.0;
    for (size_t i = 0; i < out.size(); ++i) total += static_cast<double>(r[i]) * out[i];
    return total;
  };
  std::vector<float> out(b.out_size()), lse(b.lse_size()), dq(q.size()), dkv(kv.size());
  be.AttentionBlock(A(out.data()), lse.data(), A(q.data()), A(kv.data()),
                    A(kv.data() + b.v_offset()), b.s);
  be.AttentionBlockBackward(A(dq.data()), A(dkv.data()), A(dkv.data() + b.v_offset()), A(r.data()),
                            A(q.data()), A(kv.data()), A(kv.data() + b.v_offset()), A(out.data()),
                            lse.data(), b.s);

  const double eps = 1e-3;
  for (int which = 0; which < 2; ++which) {
    const std::vector<float>& x = which == 0 ? q : kv;
    const std::vector<float>& grad = which == 0 ? dq : dkv;
    const std::vector<float> dir = Random(static_cast<int64_t>(x.size()), rng);
    std::vector<float> plus = x, minus = x;
    double analytic = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      plus[i] += static_cast<float>(eps) * dir[i];
      minus[i] -= static_cast<float>(eps) * dir[i];
      analytic += static_cast<double>(grad[i]) * dir[i];
    }
    const double numeric = which == 0 ? (loss(plus, kv) - loss(minus, kv)) / (2 * eps)
                                      : (loss(q, plus) - loss(q, minus)) / (2 * eps);
    const double scale = std::max({std::abs(numeric), std::abs(analytic), 1e-2});
    // fp32 central differences with ε = 1e-3 are good to about 1e-4 relative.
    EXPECT_LE(std::abs(numeric - analytic) / scale, 2e-3)
        << (which == 0 ? "dq" : "dkv") << ": numeric " << numeric << " analytic " << analytic;
  }
}

TEST_F(RingAttentionKernels, NonCausalBlockIsTheSoftmaxOverEveryKey) {
  for (const StridedBlock& b : {StridedBlock{}, StridedBlock::Narrow()}) {
    SCOPED_TRACE("value_dim " + std::to_string(b.s.value_dim));
    CheckNonCausalBlock(*be_, b, rng_);
  }
}

TEST_F(RingAttentionKernels, NonCausalBlockBackwardMatchesFiniteDifferences) {
  for (const StridedBlock& b : {StridedBlock{}, StridedBlock::Narrow()}) {
    SCOPED_TRACE("value_dim " + std::to_string(b.s.value_dim));
    CheckNonCausalBlockBackward(*be_, b, rng_);
  }
}

TEST_F(RingAttentionKernels, MergeWithAnEmptySideTakesTheOther) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  // Two query rows, one head of 3: row 0 has no keys yet (its out is garbage), row 1's part is
  // empty.
  std::vector<float> out = {nan, nan, nan, 4, 5, 6}, lse = {-inf, 0.5f};
  const std::vector<float> part = {1, 2, 3, nan, nan, nan}, part_lse = {1.0f, -inf};
  be_->AttentionMerge(A(out.data()), lse.data(), A(part.data()), part_lse.data(), 1, 2, 1, 3);
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(lse, (std::vector<float>{1.0f, 0.5f}));
}

TEST_F(RingAttentionKernels, RopeWithFirstPositionRotatesAChunkAsTheWholeSequence) {
  const AttentionShape whole{2, 20, 4, 2, 8};
  const Geometry g{whole, 7};
  // Llama 3's scaling too: a chunk keeps the scaled frequencies of its positions.
  const kernels::RopeFrequencies theta{.theta = 10000.0, .factor = 8.0, .original_max_seq = 16.0};
  const std::vector<float> x = Random(whole.batch * whole.seq * g.qkv_row(), rng_);
  std::vector<float> forward = x, backward = x;
  be_->Rope(A(forward.data()), whole, theta, 0);
  be_->RopeBackward(A(backward.data()), whole, theta, 0);
  const AttentionShape chunk{whole.batch, g.c, whole.heads, whole.kv_heads, whole.head_dim};
  for (int64_t first : {0, 5, 13}) {
    SCOPED_TRACE("first_position " + std::to_string(first));
    // Rows [first, first + c) of each sequence.
    auto rows_of = [&](const std::vector<float>& v) {
      std::vector<float> rows;
      for (int64_t bi = 0; bi < whole.batch; ++bi) {
        const float* at = v.data() + (bi * whole.seq + first) * g.qkv_row();
        rows.insert(rows.end(), at, at + g.c * g.qkv_row());
      }
      return rows;
    };
    std::vector<float> got = rows_of(x);
    be_->Rope(A(got.data()), chunk, theta, first);
    EXPECT_LE(MaxAbsDiff(got, rows_of(forward)), 1e-6);
    got = rows_of(x);
    be_->RopeBackward(A(got.data()), chunk, theta, first);
    EXPECT_LE(MaxAbsDiff(got, rows_of(backward)), 1e-6);
  }
}

// LongRoPE's factors follow the positions a pass covers, not a chunk's own: a rank of a cp 2 ring
// holding 12 of 24 positions turns with the long factors that 24 positions past an original 16
// call for; a pass of 16 or fewer positions with the short ones. A local block with its own base
// takes neither; the rotated part (model.rope_dim) and the magnitude travel with both.
TEST(RopeOfModel, LongRopeFactorsFollowThePassLength) {
  config::ModelConfig m = *config::Preset("llama-debug");
  m.rope_dim = 4;
  m.rope_scaling = {.original_max_seq = 16,
                    .longrope = true,
                    .short_factor = {1.0f, 2.0f},
                    .long_factor = {3.0f, 50.0f},
                    .attention_factor = 1.25f};
  const absl::Status valid = config::ValidateModelConfig(m, "model");
  ASSERT_TRUE(valid.ok()) << valid;
  for (const int64_t positions : {1, 12, 16, 17, 24}) {
    const kernels::RopeFrequencies f = RopeOf(m, 0, positions);
    SCOPED_TRACE(positions);
    EXPECT_EQ(f.rotary_dim, 4);
    EXPECT_EQ(f.pairs, 2);
    EXPECT_EQ(f.magnitude, 1.25);
    EXPECT_EQ(f.factor, 0.0);
    const std::vector<float>& want =
        positions > 16 ? m.rope_scaling.long_factor : m.rope_scaling.short_factor;
    EXPECT_EQ(f.pair_factor[0], want[0]);
    EXPECT_EQ(f.pair_factor[1], want[1]);
  }
  m.sliding_window = 4;
  m.full_attention_layers = {1};
  m.rope_local_theta = 500.0f;
  const kernels::RopeFrequencies local = RopeOf(m, 0, 24);
  EXPECT_EQ(local.theta, 500.0);
  EXPECT_EQ(local.pairs, 0);
  EXPECT_EQ(local.magnitude, 1.0);
  EXPECT_EQ(local.rotary_dim, 4);
  EXPECT_EQ(RopeOf(m, 1, 24).pairs, 2);
}

TEST_F(RingAttentionKernels, CopyRowsCopiesTheLeadingColumnsOfEachRow) {
  const int64_t rows = 3, cols = 4, src_stride = 7, dst_stride = 5;
  std::vector<float> src(rows * src_stride), dst(rows * dst_stride, -1.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  be_->CopyRows(A(dst.data()), dst_stride, A(src.data()), src_stride, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < dst_stride; ++c) {
      const float want = c < cols ? src[r * src_stride + c] : -1.0f;
      EXPECT_EQ(dst[r * dst_stride + c], want) << "row " << r << " column " << c;
    }
  }
}

}  // namespace
}  // namespace trainyard::worker
