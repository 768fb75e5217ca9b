#include "worker/context_parallel.h"

#include <algorithm>
#include <chrono>

#include "common/status.h"

namespace trainyard::worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Point-to-point tags of the ring's two streams (the group is the context-parallel one alone).
constexpr uint32_t kKeysTag = 1;
constexpr uint32_t kGradsTag = 2;

}  // namespace

// The ring's buffers for one shape of the local rows.
struct ContextParallelOps::Scratch {
  AttentionShape shape{};
  Buffer<Act> kv[2];   // keys and values in hand and arriving: [2·b·c, 2·kv_heads·d]
  Buffer<Act> dkv[2];  // this rank's gradient contribution: being computed, being sent
  Buffer<Act> dkv_in;  // the gradient arriving from the previous rank
  Buffer<Act> part;    // one block's output [b·c, heads·d] before it is merged
  Buffer<float> part_lse;
};

// One exchange around the ring, started now and finished by Wait: send to the next rank, receive
// from the previous one. An engine that cannot start exchanges does it at once. The seconds
// counted are the caller's waits: on a GPU rank they include the device finishing the work
// queued before them (the engine's copies and waits are stream-ordered), so they bound the
// exposed transfer time from above.
class ContextParallelOps::Ring {
 public:
  Ring(parallel::Communicator& group, DType dtype, double* seconds)
      : group_(group), dtype_(dtype), seconds_(seconds) {}

  [[nodiscard]] absl::Status Start(const Act* send, Act* recv, int64_t count, uint32_t tag) {
    const int n = group_.size(), next = (group_.rank() + 1) % n, prev = (group_.rank() + n - 1) % n;
    const auto start = std::chrono::steady_clock::now();
    TY_ASSIGN_OR_RETURN(
        pending_, group_.StartExchange(send, count, next, tag, recv, count, prev, tag, dtype_));
    if (!group_.StartsExchanges()) *seconds_ += SecondsSince(start);
    return absl::OkStatus();
  }

  [[nodiscard]] absl::Status Wait() {
    if (pending_ == nullptr) return absl::OkStatus();
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = pending_->Wait();
    pending_.reset();
    TY_RETURN_IF_ERROR(status);
    *seconds_ += SecondsSince(start);
    return absl::OkStatus();
  }

 private:
  parallel::Communicator& group_;
  DType dtype_;
  double* seconds_;
  std::unique_ptr<parallel::PendingTransfer> pending_;
};

ContextParallelOps::ContextParallelOps(parallel::Communicator* group, Backend* backend)
    : group_(group), backend_(backend) {}

ContextParallelOps::~ContextParallelOps() = default;

void SplitHeadTail(const int32_t* full, int b, int t, int rank, int size, int32_t* local) {
  const int64_t c = t / (2 * size);
  for (int half = 0; half < 2; ++half) {
    const int64_t first = HeadTailChunk(rank, size, half) * c;
    for (int64_t i = 0; i < b; ++i) {
      std::copy_n(full + i * t + first, c, local + (half * b + i) * c);
    }
  }
}

void ContextParallelOps::EnsureScratch(const AttentionShape& s) {
  if (scratch_ != nullptr && scratch_->shape.batch == s.batch && scratch_->shape.seq == s.seq &&
      scratch_->shape.heads == s.heads && scratch_->shape.kv_heads == s.kv_heads &&
      scratch_->shape.head_dim == s.head_dim && scratch_->shape.v_dim() == s.v_dim()) {
    return;
  }
  scratch_.reset();  // the old shape's memory first
  auto sc = std::make_unique<Scratch>();
  Backend& be = *backend_;
  const int64_t rows = s.batch * s.seq, kv = rows * s.kv_heads * (s.head_dim + s.v_dim());
  sc->shape = s;
  for (Buffer<Act>* b : {&sc->kv[0], &sc->kv[1], &sc->dkv[0], &sc->dkv[1], &sc->dkv_in}) {
    *b = be.AllocAct(kv);
  }
  sc->part = be.AllocAct(rows / 2 * s.heads * s.v_dim());
  sc->part_lse = be.AllocFloat(rows / 2 * s.heads);
  scratch_ = std::move(sc);
}

int64_t ContextParallelOps::scratch_bytes() const {
  if (scratch_ == nullptr) return 0;
  const Scratch& s = *scratch_;
  int64_t acts = s.part.size();
  for (const Buffer<Act>* b : {&s.kv[0], &s.kv[1], &s.dkv[0], &s.dkv[1], &s.dkv_in}) {
    acts += b->size();
  }
  return acts * backend_->act_bytes() + s.part_lse.size() * static_cast<int64_t>(sizeof(float));
}

namespace {

// Where the blocks of one (query half, key half) pair live in the local buffers.
struct BlockGeometry {
  const AttentionShape& s;
  int64_t c() const { return s.seq / 2; }
  int64_t qkv_width() const { return s.qkv_row(); }
  int64_t q_width() const { return s.heads * s.head_dim; }  // where a packed row's keys start
  int64_t kv_width() const { return s.kv_heads * (s.head_dim + s.v_dim()); }
  int64_t out_width() const { return s.heads * s.v_dim(); }
  // Row offset of a half's first row.
  int64_t half_rows(int half) const { return half * s.batch * c(); }
  // The block of a query chunk (local half query_half) against a key chunk: causal on the
  // diagonal, the queries (query_chunk − key_chunk)·c positions after the keys.
  AttentionBlockShape Shape(int query_half, int query_chunk, int key_chunk) const {
    return AttentionBlockShape{
        .batch = s.batch,
        .q_len = c(),
        .kv_len = c(),
        .heads = s.heads,
        .kv_heads = s.kv_heads,
        .head_dim = s.head_dim,
        .q_stride = qkv_width(),
        .kv_stride = kv_width(),
        .causal = key_chunk == query_chunk,
        .offset = (query_chunk - key_chunk) * c(),
        .window = s.window,
        .scale = s.scale,
        .softcap = s.softcap,
        .doc_start = s.doc_start == nullptr ? nullptr : s.doc_start + half_rows(query_half),
        .key_position = key_chunk * c(),
        .value_dim = s.value_dim};
  }
  // Whether any query of query_chunk sees a key of key_chunk: none of a later chunk, nor of one
  // that ends before the sliding window of the chunk's first query begins (that query, at
  // query_chunk·c, reaches back to key_chunk's last key, key_chunk·c + c − 1, when
  // (query_chunk − key_chunk − 1)·c + 1 < window).
  bool Sees(int query_chunk, int key_chunk) const {
    if (key_chunk > query_chunk) return false;
    return s.window == 0 || (query_chunk - key_chunk - 1) * c() + 1 < s.window;
  }
};

}  // namespace

void ContextParallelOps::ForwardBlocks(int src, const Act* kv, Act* out, float* lse, const Act* qkv,
                                       const AttentionShape& local, bool filled[2]) {
  Backend& be = *backend_;
  const BlockGeometry g{local};
  for (int qh = 0; qh < 2; ++qh) {
    const int query_chunk = ChunkOf(qh);
    const Act* q = be.At(qkv, g.half_rows(qh) * g.qkv_width());
    Act* o = be.At(out, g.half_rows(qh) * g.out_width());
    float* l = lse + g.half_rows(qh) * local.heads;
    for (int kh = 0; kh < 2; ++kh) {
      const int key_chunk = ChunkOf(src, kh);
      if (!g.Sees(query_chunk, key_chunk)) continue;
      const AttentionBlockShape shape = g.Shape(qh, query_chunk, key_chunk);
      const Act* k = be.At(kv, g.half_rows(kh) * g.kv_width());
      const Act* v = be.At(k, local.kv_heads * local.head_dim);
      if (!filled[qh]) {
        be.AttentionBlock(o, l, q, k, v, shape);
        filled[qh] = true;
        continue;
      }
      be.AttentionBlock(scratch_->part.data(), scratch_->part_lse.data(), q, k, v, shape);
      be.AttentionMerge(o, l, scratch_->part.data(), scratch_->part_lse.data(), local.batch, g.c(),
                        local.heads, local.v_dim());
    }
  }
}

void ContextParallelOps::BackwardBlocks(int src, const Act* kv, Act* dkv, Act* dqkv,
                                        const Act* dout, const Act* qkv, const Act* out,
                                        const float* lse, const AttentionShape& local) {
  Backend& be = *backend_;
  const BlockGeometry g{local};
  for (int qh = 0; qh < 2; ++qh) {
    const int query_chunk = ChunkOf(qh);
    const int64_t q_at = g.half_rows(qh) * g.qkv_width(), o_at = g.half_rows(qh) * g.out_width();
    const float* l = lse + g.half_rows(qh) * local.heads;
    for (int kh = 0; kh < 2; ++kh) {
      const int key_chunk = ChunkOf(src, kh);
      if (!g.Sees(query_chunk, key_chunk)) continue;
      const int64_t k_at = g.half_rows(kh) * g.kv_width(), v_at = local.kv_heads * local.head_dim;
      Act* dk = be.At(dkv, k_at);
      const Act* k = be.At(kv, k_at);
      be.AttentionBlockBackward(be.At(dqkv, q_at), dk, be.At(dk, v_at), be.At(dout, o_at),
                                be.At(qkv, q_at), k, be.At(k, v_at), be.At(out, o_at), l,
                                g.Shape(qh, query_chunk, key_chunk));
    }
  }
}

absl::Status ContextParallelOps::Attention(Act* out, float* lse, const Act* qkv,
                                           const AttentionShape& local) {
  EnsureScratch(local);
  Backend& be = *backend_;
  const BlockGeometry g{local};
  const int n = size();
  const int64_t rows = local.batch * local.seq, count = rows * g.kv_width();
  // The key and value heads, side by side in a packed row, are what travels.
  be.CopyRows(scratch_->kv[0].data(), g.kv_width(), be.At(qkv, g.q_width()), g.qkv_width(), rows,
              g.kv_width());
  Ring ring(*group_, be.act_dtype(), &seconds_);
  bool filled[2] = {false, false};
  int in_hand = 0;
  for (int step = 0; step < n; ++step) {
    Act* kv = scratch_->kv[in_hand].data();
    if (step + 1 < n) {
      TY_RETURN_IF_ERROR(ring.Start(kv, scratch_->kv[1 - in_hand].data(), count, kKeysTag));
    }
    ForwardBlocks((rank() + n - step) % n, kv, out, lse, qkv, local, filled);
    if (step + 1 < n) {
      TY_RETURN_IF_ERROR(ring.Wait());
      in_hand = 1 - in_hand;
    }
  }
  return absl::OkStatus();
}

absl::Status ContextParallelOps::AttentionBackward(Act* dqkv, const Act* dout, const Act* qkv,
                                                   const Act* out, const float* lse,
                                                   const AttentionShape& local) {
  EnsureScratch(local);
  Backend& be = *backend_;
  Scratch& s = *scratch_;
  const BlockGeometry g{local};
  const int n = size();
  const int64_t rows = local.batch * local.seq, count = rows * g.kv_width();
  be.Fill(dqkv, 0.0f, rows * g.qkv_width());
  be.CopyRows(s.kv[0].data(), g.kv_width(), be.At(qkv, g.q_width()), g.qkv_width(), rows,
              g.kv_width());
  Ring keys(*group_, be.act_dtype(), &seconds_), grads(*group_, be.act_dtype(), &seconds_);
  int in_hand = 0, mine = 0;
  for (int step = 0; step < n; ++step) {
    Act* kv = s.kv[in_hand].data();
    if (step + 1 < n) TY_RETURN_IF_ERROR(keys.Start(kv, s.kv[1 - in_hand].data(), count, kKeysTag));
    // This rank's share of the gradient of the keys in hand...
    Act* dkv = s.dkv[mine].data();
    be.Fill(dkv, 0.0f, count);
    BackwardBlocks((rank() + n - step) % n, kv, dkv, dqkv, dout, qkv, out, lse, local);
    // ...added to the shares of the ranks they passed before, and sent on behind them; after the
    // last step it reaches the keys' owner.
    if (step > 0) {
      TY_RETURN_IF_ERROR(grads.Wait());
      be.Add(dkv, s.dkv_in.data(), dkv, count);
    }
    TY_RETURN_IF_ERROR(grads.Start(dkv, s.dkv_in.data(), count, kGradsTag));
    mine = 1 - mine;
    if (step + 1 < n) {
      TY_RETURN_IF_ERROR(keys.Wait());
      in_hand = 1 - in_hand;
    }
  }
  TY_RETURN_IF_ERROR(grads.Wait());
  be.CopyRows(be.At(dqkv, g.q_width()), g.qkv_width(), s.dkv_in.data(), g.kv_width(), rows,
              g.kv_width());
  return absl::OkStatus();
}

}  // namespace trainyard::worker
