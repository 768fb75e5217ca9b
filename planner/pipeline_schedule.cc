#include "planner/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "worker/shape/schedule.h"

namespace trainyard::planner {
namespace {

constexpr int kKinds = 3;  // forward, backward, weight

struct Pass {
  worker::PassKind kind = worker::PassKind::kForward;
  int micro_batch = 0;  // m: the stage's tail
  int index() const { return kKinds * micro_batch + static_cast<int>(kind); }
};

// Stage s's passes in the engine's order (worker/shape/schedule.h), then its tail.
std::vector<Pass> PassesOf(const worker::ScheduleShape& schedule, int stage) {
  std::vector<Pass> passes;
  for (const worker::Pass& pass : worker::PassOrder(schedule, stage)) {
    passes.push_back({pass.kind, pass.micro_batch});
  }
  passes.push_back({worker::PassKind::kForward, schedule.micro_batches});
  return passes;
}

}  // namespace

ScheduleSeconds SimulateSchedule(const worker::ScheduleShape& schedule,
                                 const std::vector<std::vector<PassSeconds>>& running) {
  constexpr double kNever = std::numeric_limits<double>::infinity();
  const int p = static_cast<int>(running.size());
  const int m = schedule.micro_batches;
  worker::ScheduleShape shape = schedule;
  shape.stages = p;
  ScheduleSeconds out;
  out.computing.assign(p, 0);
  out.communicating.assign(p, 0);
  out.idle.assign(p, 0);
  std::vector<std::vector<Pass>> passes(p);
  // arrival[s][pass.index()]: when what the pass waits for reaches stage s (0: it waits for
  // nothing on another stage: the first stage's forward passes, the last stage's backward ones).
  std::vector<std::vector<double>> arrival(p, std::vector<double>(kKinds * m + 1, kNever));
  for (int s = 0; s < p; ++s) {
    passes[s] = PassesOf(shape, s);
    arrival[s][kKinds * m] = 0;  // the tail waits for nothing but the stage's own passes
    for (int i = 0; i < m; ++i) {
      if (s == 0) arrival[s][Pass{worker::PassKind::kForward, i}.index()] = 0;
      if (s == p - 1) arrival[s][Pass{worker::PassKind::kBackward, i}.index()] = 0;
      arrival[s][Pass{worker::PassKind::kWeight, i}.index()] = 0;  // after its own B pass
    }
  }
  std::vector<size_t> next(p, 0);
  std::vector<double> left(p, 1.0);  // of the current pass's work
  double now = 0;
  auto arrives = [&](int s) {
    return next[s] == passes[s].size() ? kNever : arrival[s][passes[s][next[s]].index()];
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
    auto seconds_of = [&](int s) {
      const Pass pass = passes[s][next[s]];
      if (pass.micro_batch == m) return at_k[s].tail;
      switch (pass.kind) {
        case worker::PassKind::kForward:
          return at_k[s].forward;
        case worker::PassKind::kBackward:
          return at_k[s].backward;
        case worker::PassKind::kWeight:
          return at_k[s].weight;
      }
      return 0.0;
    };
    auto waiting_of = [&](int s) {
      const Pass pass = passes[s][next[s]];
      if (pass.micro_batch == m) return at_k[s].tail_waiting;
      return pass.kind == worker::PassKind::kForward    ? at_k[s].forward_waiting
             : pass.kind == worker::PassKind::kBackward ? at_k[s].backward_waiting
                                                        : 0.0;
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
      const int to = pass.kind == worker::PassKind::kBackward ? s - 1 : s + 1;
      if (pass.micro_batch < m && pass.kind != worker::PassKind::kWeight && to >= 0 && to < p) {
        arrival[to][pass.index()] = now + at_k[to].handoff;
      }
      ++next[s];
      left[s] = 1.0;
    }
  }
  out.makespan = now;
  return out;
}

}  // namespace trainyard::planner
