#include "planner/pipeline_schedule.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "worker/shape/schedule.h"
#include "worker/shape/stages.h"

namespace trainyard::planner {
namespace {

constexpr int kKinds = 3;  // forward, backward, weight

// A pass of the schedule, or (micro_batch == m) the stage's tail.
struct Pass {
  worker::PassKind kind = worker::PassKind::kForward;
  int micro_batch = 0;
  int chunk = 0;
};

// A dense index of a pass of one stage: kKinds · (chunk · m + micro-batch) + kind; the tail is
// kKinds · V · m.
struct Keys {
  int m = 1, chunks = 1;
  int size() const { return kKinds * chunks * m + 1; }
  int of(const Pass& pass) const {
    if (pass.micro_batch == m) return kKinds * chunks * m;
    return kKinds * (pass.chunk * m + pass.micro_batch) + static_cast<int>(pass.kind);
  }
};

// Stage s's passes in the engine's order (worker/shape/schedule.h), then its tail.
std::vector<Pass> PassesOf(const worker::ScheduleShape& schedule, int stage) {
  std::vector<Pass> passes;
  for (const worker::Pass& pass : worker::PassOrder(schedule, stage)) {
    passes.push_back({pass.kind, pass.micro_batch, pass.chunk});
  }
  passes.push_back({worker::PassKind::kForward, schedule.micro_batches, 0});
  return passes;
}

// Where the output of `pass` on stage `s` goes: the stage and the pass on it that waits for it
// (none for weight passes, the tail, the last virtual stage's forward passes and the first one's
// backward passes).
std::optional<std::pair<int, Pass>> Consumer(const worker::ScheduleShape& shape, int s,
                                             const Pass& pass) {
  if (pass.micro_batch == shape.micro_batches) return std::nullopt;  // the tail
  const std::optional<worker::StagePass> to =
      worker::ConsumerOf(shape, s, {pass.kind, pass.micro_batch, pass.chunk});
  if (!to) return std::nullopt;
  return std::make_pair(to->stage, Pass{to->pass.kind, to->pass.micro_batch, to->pass.chunk});
}

}  // namespace

ScheduleSeconds SimulateSchedule(const worker::ScheduleShape& schedule,
                                 const std::vector<std::vector<PassSeconds>>& running) {
  constexpr double kNever = std::numeric_limits<double>::infinity();
  const int p = static_cast<int>(running.size());
  const int m = schedule.micro_batches, chunks = std::max(1, schedule.virtual_stages);
  worker::ScheduleShape shape = schedule;
  shape.stages = p;
  const Keys keys{m, chunks};
  ScheduleSeconds out;
  out.computing.assign(p, 0);
  out.communicating.assign(p, 0);
  out.idle.assign(p, 0);
  std::vector<std::vector<Pass>> passes(p);
  // arrival[s][key]: when what the pass waits for reaches stage s (0: it waits for nothing on
  // another stage: the first virtual stage's forward passes, the last one's backward passes, the
  // weight passes and the tail).
  std::vector<std::vector<double>> arrival(p, std::vector<double>(keys.size(), kNever));
  for (int s = 0; s < p; ++s) {
    passes[s] = PassesOf(shape, s);  // the tail's arrival: when every stage's passes are done
    for (int i = 0; i < m; ++i) {
      for (int c = 0; c < chunks; ++c) {
        const int v = worker::VirtualStage(p, s, c);
        if (v == 0) arrival[s][keys.of({worker::PassKind::kForward, i, c})] = 0;
        if (v == p * chunks - 1) arrival[s][keys.of({worker::PassKind::kBackward, i, c})] = 0;
        arrival[s][keys.of({worker::PassKind::kWeight, i, c})] = 0;  // after its own B pass
      }
    }
  }
  std::vector<size_t> next(p, 0);
  std::vector<double> left(p, 1.0);  // of the current pass's work
  double now = 0;
  auto arrives = [&](int s) {
    return next[s] == passes[s].size() ? kNever : arrival[s][keys.of(passes[s][next[s]])];
  };

  for (;;) {
    std::vector<int> active;
    double wake = kNever;  // the next hand-off to arrive
    for (int s = 0; s < p; ++s) {
      const double at = arrives(s);
      if (at <= now) {
        active.push_back(s);
      } else {
        wake = std::min(wake, at);
      }
    }
    if (active.empty() && wake == kNever) break;  // every stage is done
    const int k = static_cast<int>(active.size());
    const std::vector<PassSeconds>& at_k = running[std::max(k, 1) - 1];
    auto share = [&](int s, const Pass& pass) {
      return at_k[s].chunk_share.empty() ? 1.0 : at_k[s].chunk_share[pass.chunk];
    };
    auto seconds_of = [&](int s) {
      const Pass pass = passes[s][next[s]];
      if (pass.micro_batch == m) return at_k[s].tail;
      const double send = Consumer(shape, s, pass) ? at_k[s].send : 0.0;
      switch (pass.kind) {
        case worker::PassKind::kForward:
          return share(s, pass) * at_k[s].forward + send;
        case worker::PassKind::kBackward:
          return share(s, pass) * at_k[s].backward + send;
        case worker::PassKind::kWeight:
          return share(s, pass) * at_k[s].weight;
      }
      return 0.0;
    };
    auto waiting_of = [&](int s) {
      const Pass pass = passes[s][next[s]];
      if (pass.micro_batch == m) return at_k[s].tail_waiting;
      return share(s, pass) * (pass.kind == worker::PassKind::kForward    ? at_k[s].forward_waiting
                               : pass.kind == worker::PassKind::kBackward ? at_k[s].backward_waiting
                                                                          : 0.0);
    };
    // The next event: a hand-off arrives (exactly then, so that it is ready) or the passes
    // nearest their end end. Passes end by decision, not by their remaining work reaching zero
    // in floating point, which a long step's clock could round away.
    double dt = wake - now;
    for (int s : active) dt = std::min(dt, left[s] * seconds_of(s));
    const bool arrived = dt == wake - now;
    for (int s = 0; s < p; ++s) {
      if (std::find(active.begin(), active.end(), s) == active.end()) out.idle[s] += dt;
    }
    now = arrived ? wake : now + dt;
    for (int s : active) {
      const Pass pass = passes[s][next[s]];
      const double seconds = seconds_of(s);
      if (seconds > 0) {
        const double waiting = std::clamp(waiting_of(s) / seconds, 0.0, 1.0);
        out.communicating[s] += dt * waiting;
        out.computing[s] += dt * (1 - waiting);
        const double remaining = left[s] * seconds - dt;
        if (remaining > 1e-9 * seconds) {
          left[s] = remaining / seconds;
          continue;
        }
      }
      // Done: hand the result to the stage that waits for it.
      if (const auto consumer = Consumer(shape, s, pass)) {
        const auto& [to, waiting] = *consumer;
        arrival[to][keys.of(waiting)] = now + at_k[to].handoff;
      }
      ++next[s];
      left[s] = 1.0;
    }
    // The tails start together: the gradient norm, summed over the pipeline before any stage
    // updates, holds every stage until the last has finished its passes.
    const int tail = keys.of({worker::PassKind::kForward, m, 0});
    bool passes_done = arrival[0][tail] == kNever;
    for (int s = 0; s < p && passes_done; ++s) passes_done = next[s] + 1 >= passes[s].size();
    if (passes_done) {
      for (int s = 0; s < p; ++s) arrival[s][tail] = now;
    }
  }
  out.makespan = now;
  return out;
}

}  // namespace trainyard::planner
