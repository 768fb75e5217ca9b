#include "worker/parallel/sharded_params.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <future>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace trainyard::worker::parallel {
namespace {

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct ShardedParams::Group {
  Communicator* comm = nullptr;    // the data-parallel group, or an expert group's edp
  int64_t begin = 0, size = 0;     // in the model's flat layout
  int64_t chunk = 0;               // per-rank share, ⌈size / dp⌉
  int64_t padded_begin = 0;        // in the padded full layout (chunk · dp per group)
  int64_t shard_begin = 0;         // in the owned-chunk layout (chunk per group)
  int64_t own_lo = 0, own_hi = 0;  // owned elements, group-local, clipped to size
  // Stage 3: the gathered full group while held or prefetched.
  Buffer<float> gathered;
  int holds = 0;
  bool gather_pending = false;
  AsyncRunner::Work gather;
  // Stages 2–3: this micro-batch's full-size gradient, until it is reduce-scattered.
  std::shared_ptr<Buffer<float>> staging;
};

ShardedParams::ShardedParams(const ParameterLayout& layout, Backend* backend, Communicator* dp,
                             Communicator* tp, Communicator* pp, const ShardingOptions& sharding,
                             ExpertGroups experts)
    : layout_(layout),
      backend_(backend),
      dp_(dp),
      tp_(tp),
      pp_(pp),
      experts_(experts),
      options_(sharding),
      squares_(backend->NewDeviceSum()),
      expert_squares_(backend->NewDeviceSum()) {}

ShardedParams::~ShardedParams() {
  // Let queued collectives finish before the buffers they use go away.
  for (auto& w : in_flight_) w.wait();
  for (auto& g : groups_) {
    if (g.gather_pending) g.gather.wait();
  }
  comm_.reset();
}

absl::StatusOr<std::unique_ptr<ShardedParams>> ShardedParams::Create(
    const ParameterLayout& layout, Backend* backend, Communicator* dp, Communicator* tp,
    Communicator* pp, const ShardingOptions& sharding, ExpertGroups experts) {
  if (sharding.zero_stage < 0 || sharding.zero_stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallelism.zero: stage must be 0..3, got ", sharding.zero_stage));
  }
  if (sharding.bucket_bytes < 1) {
    return absl::InvalidArgumentError("gradient bucket size must be positive");
  }
  if ((experts.ep == nullptr) != (experts.edp == nullptr)) {
    return absl::InvalidArgumentError("expert parallelism needs both its groups");
  }
  std::unique_ptr<ShardedParams> p(
      new ShardedParams(layout, backend, dp, tp, pp, sharding, experts));
  p->Allocate();
  return p;
}

void ShardedParams::Allocate() {
  const int stage = options_.zero_stage;
  int64_t padded = 0, shard = 0;
  groups_.resize(layout_.groups().size());
  for (size_t i = 0; i < groups_.size(); ++i) {
    Group& g = groups_[i];
    g.comm = layout_.groups()[i].experts && experts_.edp != nullptr ? experts_.edp : dp_;
    const int n = g.comm->size(), r = g.comm->rank();
    g.begin = layout_.groups()[i].begin;
    g.size = layout_.groups()[i].size();
    g.chunk = (g.size + n - 1) / n;
    g.padded_begin = padded;
    g.shard_begin = shard;
    padded += g.chunk * n;
    shard += g.chunk;
    if (stage == 0) {
      g.own_lo = 0;
      g.own_hi = g.size;
    } else {
      g.own_lo = std::min(g.size, r * g.chunk);
      g.own_hi = std::min(g.size, (r + 1) * g.chunk);
    }
  }
  if (stage < 3) params_ = backend_->AllocFloat(padded);
  if (stage < 2) grads_ = backend_->AllocFloat(padded);
  if (stage == 3) shard_params_ = backend_->AllocFloat(shard);
  if (stage >= 2) shard_grads_ = backend_->AllocFloat(shard);
  const int64_t state = stage == 0 ? padded : shard;
  m_ = backend_->AllocFloat(state);
  v_ = backend_->AllocFloat(state);
  memory_.params = 4 * (stage < 3 ? padded : shard);
  memory_.grads = 4 * (stage < 2 ? padded : shard);
  memory_.optimizer = 2 * 4 * state;

  // Buckets for stages 0–1: groups in backward order (last group first), packed up to the
  // bucket size. A bucket is a contiguous range of the padded layout, reduced over one group.
  bucket_of_.assign(groups_.size(), -1);
  int64_t filled = 0;
  for (int i = static_cast<int>(groups_.size()) - 1; i >= 0; --i) {
    const bool other_group =
        !buckets_.empty() && groups_[buckets_.back().back()].comm != groups_[i].comm;
    if (buckets_.empty() || filled >= options_.bucket_bytes || other_group) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().push_back(i);
    bucket_of_[i] = static_cast<int>(buckets_.size()) - 1;
    filled += 4 * groups_[i].chunk * groups_[i].comm->size();
  }
  bucket_pending_.assign(buckets_.size(), 0);
  comm_ = std::make_unique<AsyncRunner>();
}

void ShardedParams::UpdateTransient(int64_t delta) {
  const int64_t now = transient_.fetch_add(delta) + delta;
  int64_t peak = peak_transient_.load();
  while (now > peak && !peak_transient_.compare_exchange_weak(peak, now)) {
  }
}

MemoryAccount ShardedParams::memory() const {
  MemoryAccount m = memory_;
  m.peak_transient = peak_transient_.load();
  return m;
}

OverlapTimeline ShardedParams::timeline() const {
  absl::MutexLock lock(&timeline_mu_);
  return timeline_;
}

size_t ShardedParams::NewTimelineSlot() {
  absl::MutexLock lock(&timeline_mu_);
  timeline_.bucket_done_ns.push_back(0);
  return timeline_.bucket_done_ns.size() - 1;
}

void ShardedParams::MarkDone(size_t slot) {
  absl::MutexLock lock(&timeline_mu_);
  timeline_.bucket_done_ns[slot] = NowNanos();
}

void ShardedParams::Initialize(uint64_t seed) {
  if (options_.zero_stage < 3) {
    std::vector<float> host(layout_.total());
    layout_.Initialize(seed, host.data());
    LoadParameters(host.data());
    return;
  }
  // ZeRO-3: each group's own shard only, drawn without the rest of the model.
  std::vector<float> shard;
  for (const Group& g : groups_) {
    if (g.own_hi <= g.own_lo) continue;
    shard.resize(g.own_hi - g.own_lo);
    layout_.InitializeRange(seed, g.begin + g.own_lo, g.begin + g.own_hi, shard.data());
    backend_->CopyFromHost(shard_params_.data() + g.shard_begin, shard.data(), shard.size());
  }
}

void ShardedParams::LoadParameters(const float* host) {
  for (const Group& g : groups_) {
    if (options_.zero_stage < 3) {
      backend_->CopyFromHost(params_.data() + g.padded_begin, host + g.begin, g.size);
    } else if (g.own_hi > g.own_lo) {
      backend_->CopyFromHost(shard_params_.data() + g.shard_begin, host + g.begin + g.own_lo,
                             g.own_hi - g.own_lo);
    }
  }
}

absl::Status ShardedParams::GatherParameters(float* host) {
  TY_RETURN_IF_ERROR(WaitAll());
  for (Group& g : groups_) {
    if (options_.zero_stage < 3) {
      backend_->CopyToHost(host + g.begin, params_.data() + g.padded_begin, g.size);
      continue;
    }
    Buffer<float> full = backend_->AllocFloat(g.chunk * g.comm->size());
    TY_RETURN_IF_ERROR(comm_->Run([&] {
      return g.comm->AllGather(shard_params_.data() + g.shard_begin, full.data(), g.chunk);
    }));
    backend_->CopyToHost(host + g.begin, full.data(), g.size);
  }
  return absl::OkStatus();
}

const ShardedParams::Group& ShardedParams::GroupOf(const ParamTensor& t) const {
  return *(std::upper_bound(groups_.begin(), groups_.end(), t.offset,
                            [](int64_t off, const Group& g) { return off < g.begin; }) -
           1);
}

std::vector<ShardedParams::SavedRange> ShardedParams::CheckpointRanges() const {
  const bool tp_first = tp_ == nullptr || tp_->rank() == 0;
  std::vector<SavedRange> ranges;
  for (int i = 0; i < static_cast<int>(layout_.tensors().size()); ++i) {
    const ParamTensor& t = layout_.tensors()[i];
    if (t.shard == ShardKind::kReplicated && !tp_first) continue;
    if (!layout_.first() && t.name == "wte") continue;  // the tied copy
    const Group& g = GroupOf(t);
    const int r = g.comm->rank();
    const int64_t chunk_lo = std::min(g.size, r * g.chunk);
    const int64_t chunk_hi = std::min(g.size, (r + 1) * g.chunk);
    const int64_t lo = std::max(t.offset - g.begin, chunk_lo);
    const int64_t hi = std::min(t.offset + t.numel - g.begin, chunk_hi);
    if (hi > lo) ranges.push_back({i, lo - (t.offset - g.begin), hi - (t.offset - g.begin)});
  }
  return ranges;
}

absl::Status ShardedParams::Snapshot(const std::vector<SavedRange>& ranges, float* host) {
  TY_RETURN_IF_ERROR(WaitAll());
  const int stage = options_.zero_stage;
  int64_t total = 0;
  for (const SavedRange& range : ranges) total += range.hi - range.lo;
  float* out_param = host;
  float* out_m = host + total;
  float* out_v = host + 2 * total;
  std::vector<Backend::HostCopy> copies;
  for (const SavedRange& range : ranges) {
    const ParamTensor& t = layout_.tensors()[range.tensor];
    const Group& g = GroupOf(t);
    const int64_t local = t.offset - g.begin + range.lo;  // group-local
    const int64_t n = range.hi - range.lo;
    const float* param = stage < 3 ? params_.data() + g.padded_begin + local
                                   : shard_params_.data() + g.shard_begin + (local - g.own_lo);
    const int64_t state = stage == 0 ? g.padded_begin + local : g.shard_begin + (local - g.own_lo);
    copies.push_back({out_param, param, n});
    copies.push_back({out_m, m_.data() + state, n});
    copies.push_back({out_v, v_.data() + state, n});
    out_param += n;
    out_m += n;
    out_v += n;
  }
  backend_->CopyToHostMulti(copies);
  return backend_->Synchronize();
}

absl::Status ShardedParams::RestoreState(const float* params, const float* first_moment,
                                         const float* second_moment) {
  TY_RETURN_IF_ERROR(WaitAll());
  LoadParameters(params);
  for (const Group& g : groups_) {
    const int64_t lo = g.own_lo, n = g.own_hi - g.own_lo;
    if (n <= 0) continue;
    const int64_t state = options_.zero_stage == 0 ? g.padded_begin : g.shard_begin;
    backend_->CopyFromHost(m_.data() + state, first_moment + g.begin + lo, n);
    backend_->CopyFromHost(v_.data() + state, second_moment + g.begin + lo, n);
  }
  return backend_->Synchronize();
}

// The part of tensor `t` (group-local [lo, hi)) this rank keeps of `kind`.
bool ShardedParams::WantsState(int kind, const ParamTensor& t) const {
  if (kind == 0 && options_.zero_stage < 3) return true;
  const Group& g = GroupOf(t);
  const int64_t lo = t.offset - g.begin, hi = lo + t.numel;
  return std::max(lo, g.own_lo) < std::min(hi, g.own_hi);
}

ShardedParams::Destination ShardedParams::Place(int kind, const ParamTensor& t) {
  const Group& g = GroupOf(t);
  const int64_t lo = t.offset - g.begin, hi = lo + t.numel;
  if (kind == 0 && options_.zero_stage < 3) {
    return {params_.data() + g.padded_begin + lo, 0, t.numel};
  }
  const int64_t from = std::max(lo, g.own_lo), to = std::min(hi, g.own_hi);
  if (from >= to) return {};
  if (kind == 0)
    return {shard_params_.data() + g.shard_begin + (from - g.own_lo), from - lo, to - lo};
  Buffer<float>& state = kind == 1 ? m_ : v_;
  return {state.data() + StateOffset(g, from), from - lo, to - lo};
}

void ShardedParams::RestoreTensor(int kind, const ParamTensor& t, const float* local) {
  const Destination d = Place(kind, t);
  if (d.data != nullptr) backend_->CopyFromHost(d.data, local + d.lo, d.hi - d.lo);
}

ShardedParams::Destination ShardedParams::RestoreTarget(int kind, const ParamTensor& t) {
  return backend_->host_memory() ? Place(kind, t) : Destination{};
}

absl::Status ShardedParams::BeginStep() {
  TY_RETURN_IF_ERROR(WaitAll());
  if (options_.zero_stage < 2) backend_->Fill(grads_.data(), 0.0f, grads_.size());
  if (options_.zero_stage >= 2) backend_->Fill(shard_grads_.data(), 0.0f, shard_grads_.size());
  {
    absl::MutexLock lock(&timeline_mu_);
    timeline_ = OverlapTimeline();
  }
  return absl::OkStatus();
}

absl::Status ShardedParams::WaitAll() {
  const int64_t start = NowNanos();
  absl::Status status;
  for (auto& w : in_flight_) status.Update(w.get());
  in_flight_.clear();
  AccumulateReduced(/*wait=*/true);
  // A group of one waits for nothing: its local accumulation is not communication.
  if (dp_->size() > 1) exposed_ns_ += NowNanos() - start;
  return status;
}

void ShardedParams::AccumulateReduced(bool wait) {
  while (!pending_.empty()) {
    PendingGradient& p = pending_.front();
    if (!wait && p.work.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
    // A failed reduce-scatter adds nothing; WaitAll reports its status.
    if (p.work.get().ok()) {
      const float* reduced = p.staging->data() + int64_t{p.rank} * p.chunk;
      backend_->Add(p.owned, p.owned, reduced, p.chunk);
    }
    UpdateTransient(-4 * p.staging->size());
    pending_.pop_front();  // frees the staging buffer, ordered after the queued Add
  }
}

void ShardedParams::StartGather(int index) {
  Group& g = groups_[index];
  g.gathered = backend_->AllocFloat(g.chunk * g.comm->size());
  UpdateTransient(4 * g.gathered.size());
  float* out = g.gathered.data();
  const float* in = shard_params_.data() + g.shard_begin;
  const int64_t chunk = g.chunk;
  Communicator* group = g.comm;
  g.gather = comm_->Submit([group, in, out, chunk] { return group->AllGather(in, out, chunk); });
  g.gather_pending = true;
}

absl::StatusOr<const float*> ShardedParams::Acquire(int index) {
  Group& g = groups_[index];
  if (options_.zero_stage < 3) return params_.data() + g.padded_begin;
  if (g.gathered.empty()) StartGather(index);
  if (g.gather_pending) {
    g.gather_pending = false;
    const int64_t start = NowNanos();
    const absl::Status gathered = g.gather.get();
    exposed_ns_ += NowNanos() - start;
    TY_RETURN_IF_ERROR_WITH(gathered, absl::StrCat("gathering parameter group ", index));
  }
  ++g.holds;
  return g.gathered.data();
}

void ShardedParams::Prefetch(int index) {
  if (options_.zero_stage < 3 || index < 0 || index >= static_cast<int>(groups_.size())) return;
  if (groups_[index].gathered.empty()) StartGather(index);
}

void ShardedParams::Release(int index) {
  if (options_.zero_stage < 3) return;
  Group& g = groups_[index];
  if (--g.holds == 0 && !g.gather_pending) {
    UpdateTransient(-4 * g.gathered.size());
    g.gathered = Buffer<float>();
  }
}

absl::StatusOr<float*> ShardedParams::Gradients(int index) {
  Group& g = groups_[index];
  if (options_.zero_stage < 2) return grads_.data() + g.padded_begin;
  if (!g.staging) {
    g.staging = std::make_shared<Buffer<float>>(backend_->AllocFloat(g.chunk * g.comm->size()));
    UpdateTransient(4 * g.staging->size());
  }
  return g.staging->data();
}

absl::Status ShardedParams::GradientsReady(int index) {
  if (index == ParameterLayout::kEmbeddingGroup) {
    absl::MutexLock lock(&timeline_mu_);
    timeline_.backward_end_ns = NowNanos();
  }
  LaunchReady(index);
  return absl::OkStatus();
}

void ShardedParams::LaunchReady(int index) {
  Group& g = groups_[index];
  if (options_.zero_stage >= 2) {
    // Reduce-scatter this micro-batch's gradient of the group in place, into this rank's slice
    // of the staging buffer; the training thread adds that slice into the owned chunk once it is
    // there (AccumulateReduced) and frees the staging buffer. Earlier groups' results are added
    // now, waiting for any still in flight: at most two full-size staging buffers exist at once
    // (this group's and the next one being filled), however far the reductions lag behind the
    // backward pass, which is the peak the planner predicts.
    AccumulateReduced(/*wait=*/true);
    float* staged = g.staging->data();
    const int64_t chunk = g.chunk;
    const size_t slot = NewTimelineSlot();
    Communicator* group = g.comm;
    AsyncRunner::Work work = comm_->Submit([this, group, staged, chunk, slot]() -> absl::Status {
      const absl::Status s =
          group->ReduceScatter(staged, staged + int64_t{group->rank()} * chunk, chunk);
      MarkDone(slot);
      return s;
    });
    in_flight_.push_back(work);
    pending_.push_back({std::move(work), std::move(g.staging), shard_grads_.data() + g.shard_begin,
                        chunk, group->rank()});
    return;
  }
  if (!last_micro_batch_ || g.comm->size() == 1) return;
  const int b = bucket_of_[index];
  if (++bucket_pending_[b] < static_cast<int>(buckets_[b].size())) return;
  bucket_pending_[b] = 0;
  const Group& lo = groups_[buckets_[b].back()];
  const Group& hi = groups_[buckets_[b].front()];
  float* data = grads_.data() + lo.padded_begin;
  Communicator* group = hi.comm;
  const int64_t count = hi.padded_begin + hi.chunk * group->size() - lo.padded_begin;
  const size_t slot = NewTimelineSlot();
  in_flight_.push_back(comm_->Submit([this, group, data, count, slot]() -> absl::Status {
    TY_RETURN_IF_ERROR(group->AllReduce(data, count));
    MarkDone(slot);
    return absl::OkStatus();
  }));
}

absl::Status ShardedParams::SumOverRanks(std::span<double> values) {
  if (dp_->size() == 1) return absl::OkStatus();
  const int64_t start = NowNanos();
  const absl::Status s = comm_->Run([&] { return AllReduceDoubles(*dp_, values); });
  exposed_ns_ += NowNanos() - start;
  return s;
}

absl::StatusOr<double> ShardedParams::SumOverRanks(double value) {
  if (dp_->size() == 1) return value;
  const int64_t start = NowNanos();
  absl::StatusOr<double> sum;
  const absl::Status s = comm_->Run([&] {
    sum = AllReduceDouble(*dp_, value);
    return sum.status();
  });
  exposed_ns_ += NowNanos() - start;
  TY_RETURN_IF_ERROR(s);
  return sum;
}

float* ShardedParams::GradAt(const Group& g, int64_t local) {
  return options_.zero_stage < 2 ? grads_.data() + g.padded_begin + local
                                 : shard_grads_.data() + g.shard_begin + (local - g.own_lo);
}

float* ShardedParams::ParamAt(const Group& g, int64_t local) {
  return options_.zero_stage < 3 ? params_.data() + g.padded_begin + local
                                 : shard_params_.data() + g.shard_begin + (local - g.own_lo);
}

int64_t ShardedParams::StateOffset(const Group& g, int64_t local) const {
  return options_.zero_stage == 0 ? g.padded_begin + local : g.shard_begin + (local - g.own_lo);
}

void ShardedParams::QueueGradientSquares() {
  if (squares_queued_) {  // queued by a step that ended before its norm: not this step's
    (void)squares_->Take();
    (void)expert_squares_->Take();
  }
  AddGradientSquares();
  squares_queued_ = true;
}

void ShardedParams::AddGradientSquares() {
  // Global gradient norm: each rank sums the squares it owns (all of it at stage 0, where every
  // data-parallel rank holds the same reduced gradient); tensors replicated across the tensor-
  // parallel group are counted by its rank 0 only.
  // Under expert parallelism the experts differ across the ep group: at stage 0 their squares
  // are summed over it (at stages 1–3 the data-parallel sum covers every owned chunk once).
  const bool count_replicated = tp_ == nullptr || tp_->rank() == 0;
  std::vector<std::pair<const float*, int64_t>> owned, owned_experts;
  for (const ParamTensor& t : layout_.tensors()) {
    if (t.shard == ShardKind::kReplicated && !count_replicated) continue;
    if (!layout_.first() && t.name == "wte") continue;  // the tied copy counts once
    const Group& g = GroupOf(t);
    const int64_t lo = std::max(t.offset - g.begin, g.own_lo);
    const int64_t hi = std::min(t.offset + t.numel - g.begin, g.own_hi);
    if (hi <= lo) continue;
    (g.comm != dp_ ? owned_experts : owned).emplace_back(GradAt(g, lo), hi - lo);
  }
  backend_->AddSumOfSquares(owned, squares_.get());
  if (!owned_experts.empty()) backend_->AddSumOfSquares(owned_experts, expert_squares_.get());
  squares_->StartRead();
  expert_squares_->StartRead();
}

absl::StatusOr<double> ShardedParams::GradientNorm(std::span<double> batch_sums) {
  if (!std::exchange(squares_queued_, false)) AddGradientSquares();
  TY_ASSIGN_OR_RETURN(double sumsq, squares_->Take());
  TY_ASSIGN_OR_RETURN(double experts_sumsq, expert_squares_->Take());
  if (options_.zero_stage == 0 && experts_.ep != nullptr) {
    TY_ASSIGN_OR_RETURN(experts_sumsq, AllReduceDouble(*experts_.ep, experts_sumsq));
  }
  sumsq += experts_sumsq;
  // [squares, batch sums…]: the squares are summed over the data-parallel group only where ZeRO
  // splits the gradients among its ranks, over the tensor-parallel group always; the batch sums
  // over the data-parallel and pipeline groups.
  std::vector<double> sums{sumsq};
  sums.insert(sums.end(), batch_sums.begin(), batch_sums.end());
  const std::span<double> all(sums), riders = all.subspan(1);
  TY_RETURN_IF_ERROR(SumOverRanks(options_.zero_stage > 0 ? all : riders));
  if (tp_ != nullptr) {
    TY_ASSIGN_OR_RETURN(sums[0], AllReduceDouble(*tp_, sums[0]));
  }
  if (pp_ != nullptr && pp_->size() > 1) TY_RETURN_IF_ERROR(AllReduceDoubles(*pp_, all));
  std::copy(riders.begin(), riders.end(), batch_sums.begin());
  return std::sqrt(sums[0]);
}

absl::Status ShardedParams::FinishGradients(Communicator* tied) {
  TY_RETURN_IF_ERROR_WITH(WaitAll(), "gradient reduction");
  if (tied == nullptr) return absl::OkStatus();
  // A pipeline's first and last stages both hold the tied token embedding: sum the copies'
  // gradients so that both apply the same update.
  if (options_.zero_stage >= 2) {
    return absl::UnimplementedError(
        "parallelism.zero: tied embeddings across pipeline stages need ZeRO stage 0 or 1");
  }
  const ParamTensor* wte = layout_.Find("wte");
  if (wte == nullptr) return absl::InternalError("tied embedding group without an embedding");
  const Group& g = GroupOf(*wte);
  return Annotate(tied->AllReduce(GradAt(g, wte->offset - g.begin), wte->numel),
                  "summing the tied embedding's gradients");
}

std::vector<OptimizerSlice> ShardedParams::OptimizerSlices() {
  std::vector<OptimizerSlice> slices;
  for (const ParamTensor& t : layout_.tensors()) {
    // The tensor's intersection with the owned range of its group.
    const Group& g = GroupOf(t);
    const int64_t lo = std::max(t.offset - g.begin, g.own_lo);
    const int64_t hi = std::min(t.offset + t.numel - g.begin, g.own_hi);
    if (hi <= lo) continue;
    slices.push_back({ParamAt(g, lo), GradAt(g, lo), m_.data() + StateOffset(g, lo),
                      v_.data() + StateOffset(g, lo), hi - lo, t.decay, &t,
                      lo - (t.offset - g.begin)});
  }
  return slices;
}

absl::Status ShardedParams::FinishUpdate() {
  const int stage = options_.zero_stage;
  if (stage == 1 || stage == 2) {
    // Every rank updated its chunk; put the full parameters back together, every group's gather
    // on the wire at once.
    for (Communicator* group : {dp_, experts_.edp}) {
      if (group == nullptr) continue;
      std::vector<Communicator::GatherPart> parts;
      for (Group& g : groups_) {
        if (g.comm != group) continue;
        float* base = params_.data() + g.padded_begin;
        parts.push_back({base + int64_t{group->rank()} * g.chunk, base, g.chunk});
      }
      if (parts.empty()) continue;
      in_flight_.push_back(
          comm_->Submit([group, parts = std::move(parts)] { return group->AllGatherMany(parts); }));
    }
    TY_RETURN_IF_ERROR_WITH(WaitAll(), "parameter all-gather");
    backend_->WeightsChanged();  // the gathers wrote them, not the backend
  }
  if (stage == 3) {
    for (Group& g : groups_) {
      if (g.gather_pending) {
        g.gather_pending = false;
        TY_RETURN_IF_ERROR(g.gather.get());
      }
      if (g.holds == 0 && !g.gathered.empty()) {
        UpdateTransient(-4 * g.gathered.size());
        g.gathered = Buffer<float>();
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace trainyard::worker::parallel
