#include "worker/shape/schedule.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "worker/shape/stages.h"

namespace trainyard::worker {

bool SplitsBackward(PipelineSchedule schedule) { return schedule == PipelineSchedule::kZeroBubble; }

std::string PassName(const Pass& pass) {
  const char* kind = pass.kind == PassKind::kForward    ? "F"
                     : pass.kind == PassKind::kBackward ? "B"
                                                        : "W";
  std::string name = absl::StrCat(kind, pass.micro_batch);
  if (pass.chunk != 0) absl::StrAppend(&name, ".", pass.chunk);
  return name;
}

namespace {

std::vector<Pass> OneForwardOneBackward(int stages, int stage, int m) {
  const int warmup = std::min(stages - stage - 1, m);
  std::vector<Pass> passes;
  for (int i = 0; i < warmup; ++i) passes.push_back({PassKind::kForward, i});
  for (int j = 0; j < m - warmup; ++j) {
    passes.push_back({PassKind::kForward, warmup + j});
    passes.push_back({PassKind::kBackward, j});
  }
  for (int i = m - warmup; i < m; ++i) passes.push_back({PassKind::kBackward, i});
  return passes;
}

std::vector<Pass> ZeroBubbleH1(int stages, int stage, int m) {
  std::vector<Pass> passes;
  int f = 0, b = 0, w = 0;
  auto run = [&](PassKind kind, int& next) { passes.push_back({kind, next++}); };
  for (int i = 0; i < std::min(stages - stage - 1, m); ++i) run(PassKind::kForward, f);
  for (int i = 0; i < stage && f < m; ++i) {  // the W passes this stage defers
    run(PassKind::kForward, f);
    run(PassKind::kBackward, b);
  }
  while (f < m) {
    run(PassKind::kForward, f);
    run(PassKind::kBackward, b);
    run(PassKind::kWeight, w);
  }
  while (b < m) {
    run(PassKind::kBackward, b);
    run(PassKind::kWeight, w);
  }
  while (w < m) run(PassKind::kWeight, w);
  return passes;
}

// Megatron's interleaved 1F1B: the step's m·V chunk passes of each kind, taken in rounds of p
// micro-batches per chunk (forward: chunk 0's round, chunk 1's, …; backward: the last chunk's
// first), with (p − s − 1)·2 + (V − 1)·p warm-up forward passes on stage s, then one forward and
// one backward alternating, then the remaining backward passes. (Megatron runs every forward pass
// first when m = p; with the last virtual stage's backward inside its forward pass, the warm-up
// count alone keeps the bubble at its formula there too, and holds fewer activations.)
std::vector<Pass> Interleaved(int stages, int stage, int m, int chunks) {
  const int total = m * chunks, round = stages * chunks;
  auto nth = [&](PassKind kind, int k) {
    const int chunk = k % round / stages;
    return Pass{kind, k / round * stages + k % stages,
                kind == PassKind::kForward ? chunk : chunks - 1 - chunk};
  };
  const int warmup = std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
  std::vector<Pass> passes;
  for (int k = 0; k < warmup; ++k) passes.push_back(nth(PassKind::kForward, k));
  for (int k = 0; k < total - warmup; ++k) {
    passes.push_back(nth(PassKind::kForward, warmup + k));
    passes.push_back(nth(PassKind::kBackward, k));
  }
  for (int k = total - warmup; k < total; ++k) passes.push_back(nth(PassKind::kBackward, k));
  return passes;
}

// The pass of the same kind and micro-batch one virtual stage along the data's way (`toward` +1:
// downstream, where the output goes; −1: upstream, where the input comes from); forward passes
// flow up the virtual stages, backward passes down. None past either end, and for weight passes
// (they need only their own B pass, on this stage).
std::optional<StagePass> Adjacent(const ScheduleShape& shape, int stage, const Pass& pass,
                                  int toward) {
  if (pass.kind == PassKind::kWeight) return std::nullopt;
  const int p = shape.stages;
  const int v =
      VirtualStage(p, stage, pass.chunk) + (pass.kind == PassKind::kForward ? toward : -toward);
  if (v < 0 || v >= p * shape.virtual_stages) return std::nullopt;
  const StageChunk at = StageChunkOf(p, v);
  return StagePass{at.stage, Pass{pass.kind, pass.micro_batch, at.chunk}};
}

constexpr int kKinds = 3;

// A key for a pass of one stage, dense in [0, kKinds · virtual_stages · micro_batches).
int KeyOf(const ScheduleShape& shape, const Pass& pass) {
  return kKinds * (pass.chunk * shape.micro_batches + pass.micro_batch) +
         static_cast<int>(pass.kind);
}

// The tick of every pass on the unit clock (ticks[s][KeyOf(pass)]), or nothing when some pass can
// never start (a schedule whose orders wait on each other).
std::optional<std::vector<std::vector<int64_t>>> Ticks(
    const ScheduleShape& shape, const std::vector<std::vector<Pass>>& orders) {
  const int p = shape.stages;
  const int keys = kKinds * shape.virtual_stages * shape.micro_batches;
  std::vector<std::vector<int64_t>> tick(p, std::vector<int64_t>(keys, -1));
  std::vector<size_t> next(p, 0);
  std::vector<int64_t> free_at(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      for (; next[s] < orders[s].size(); ++next[s]) {
        const Pass& pass = orders[s][next[s]];
        int64_t start = free_at[s];
        if (pass.kind == PassKind::kWeight) {  // after its own B pass, earlier in this order
          start = std::max(
              start,
              tick[s][KeyOf(shape, {PassKind::kBackward, pass.micro_batch, pass.chunk})] + 1);
        }
        if (const std::optional<StagePass> from = SourceOf(shape, s, pass)) {
          const int64_t ready = tick[from->stage][KeyOf(shape, from->pass)];
          if (ready < 0) break;  // not run yet
          start = std::max(start, ready + 1);
        }
        tick[s][KeyOf(shape, pass)] = start;
        free_at[s] = start + 1;
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    if (next[s] != orders[s].size()) return std::nullopt;
  }
  return tick;
}

// Slot of every pass in stage `stage`'s order: a forward pass takes the lowest slot the stage has
// free (its chunks share the slots), the micro-batch's last pass on the chunk (W with a split
// backward, else B) frees it.
std::vector<int> Slots(const ScheduleShape& shape, const std::vector<Pass>& order) {
  std::vector<bool> used;
  std::map<std::pair<int, int>, int> held;  // (chunk, micro-batch) → slot
  const PassKind last = SplitsBackward(shape.schedule) ? PassKind::kWeight : PassKind::kBackward;
  std::vector<int> slots;
  for (const Pass& pass : order) {
    const std::pair<int, int> key{pass.chunk, pass.micro_batch};
    if (pass.kind == PassKind::kForward) {
      const int slot = static_cast<int>(std::find(used.begin(), used.end(), false) - used.begin());
      if (slot == static_cast<int>(used.size())) used.push_back(false);
      used[slot] = true;
      held[key] = slot;
      slots.push_back(slot);
      continue;
    }
    const int slot = held[key];
    if (pass.kind == last) {
      used[slot] = false;
      held.erase(key);
    }
    slots.push_back(slot);
  }
  return slots;
}

}  // namespace

std::optional<StagePass> SourceOf(const ScheduleShape& shape, int stage, const Pass& pass) {
  return Adjacent(shape, stage, pass, -1);
}

std::optional<StagePass> ConsumerOf(const ScheduleShape& shape, int stage, const Pass& pass) {
  return Adjacent(shape, stage, pass, +1);
}

std::vector<Pass> PassOrder(const ScheduleShape& shape, int stage) {
  switch (shape.schedule) {
    case PipelineSchedule::kOneForwardOneBackward:
      return OneForwardOneBackward(shape.stages, stage, shape.micro_batches);
    case PipelineSchedule::kInterleaved:
      return Interleaved(shape.stages, stage, shape.micro_batches, shape.virtual_stages);
    case PipelineSchedule::kZeroBubble:
      return ZeroBubbleH1(shape.stages, stage, shape.micro_batches);
  }
  return {};
}

std::vector<std::vector<ScheduleStep>> PlanSchedule(const ScheduleShape& shape) {
  const int p = shape.stages;
  std::vector<std::vector<Pass>> orders(p);
  for (int s = 0; s < p; ++s) orders[s] = PassOrder(shape, s);
  const std::optional<std::vector<std::vector<int64_t>>> ticks = Ticks(shape, orders);
  if (!ticks) return {};
  std::vector<std::map<int64_t, ScheduleStep>> by_tick(p);
  auto step_at = [&](int s, int64_t tick) -> ScheduleStep& {
    ScheduleStep& step = by_tick[s][tick];
    step.tick = tick;
    return step;
  };
  for (int s = 0; s < p; ++s) {
    const std::vector<int> slots = Slots(shape, orders[s]);
    for (size_t k = 0; k < orders[s].size(); ++k) {
      const Pass& pass = orders[s][k];
      ScheduleStep& step = step_at(s, (*ticks)[s][KeyOf(shape, pass)]);
      step.has_pass = true;
      step.pass = pass;
      step.slot = slots[k];
      const std::optional<StagePass> from = SourceOf(shape, s, pass);
      if (!from) continue;
      const int64_t sent = (*ticks)[from->stage][KeyOf(shape, from->pass)];
      const uint32_t tag = static_cast<uint32_t>(KeyOf(shape, pass));
      step_at(from->stage, sent)
          .transfers.push_back(
              {.send = true, .peer = s, .pass = from->pass, .consumer = pass, .tag = tag});
      step_at(s, sent).transfers.push_back(
          {.send = false, .peer = from->stage, .pass = from->pass, .consumer = pass, .tag = tag});
    }
  }
  std::vector<std::vector<ScheduleStep>> steps(p);
  for (int s = 0; s < p; ++s) {
    for (auto& [tick, step] : by_tick[s]) steps[s].push_back(std::move(step));
  }
  return steps;
}

bool ComputesWeightGradients(const ScheduleShape& shape, int stage, const Pass& pass) {
  const bool last =
      VirtualStage(shape.stages, stage, pass.chunk) + 1 == shape.stages * shape.virtual_stages;
  if (pass.kind == PassKind::kForward) return last;
  const bool split = SplitsBackward(shape.schedule);
  return pass.kind == PassKind::kWeight || (!split && !last);
}

int ActivationSlots(const ScheduleShape& shape, int stage) {
  const std::vector<int> slots = Slots(shape, PassOrder(shape, stage));
  return slots.empty() ? 0 : *std::max_element(slots.begin(), slots.end()) + 1;
}

}  // namespace trainyard::worker
