#include "planner/pipeline_schedule.h"

#include <algorithm>
#include <limits>

namespace trainyard::planner {
namespace {

struct Pass {
  bool backward = false;
  int micro_batch = 0;  // m: the stage's tail
  int index() const { return 2 * micro_batch + (backward ? 1 : 0); }
};

// Stage s's passes in the engine's order, then its tail.
std::vector<Pass> PassesOf(int stage, int stages, int m) {
  const int warmup = std::min(stages - stage - 1, m);
  std::vector<Pass> passes;
  for (int i = 0; i < warmup; ++i) passes.push_back({false, i});
  for (int j = 0; j < m - warmup; ++j) {
    passes.push_back({false, warmup + j});
    passes.push_back({true, j});
  }
  for (int i = m - warmup; i < m; ++i) passes.push_back({true, i});
  passes.push_back({false, m});
  return passes;
}

}  // namespace

ScheduleSeconds SimulateOneForwardOneBackward(
    int micro_batches, const std::vector<std::vector<PassSeconds>>& running) {
  constexpr double kNever = std::numeric_limits<double>::infinity();
  const int p = static_cast<int>(running.size());
  const int m = micro_batches;
  ScheduleSeconds out;
  out.computing.assign(p, 0);
  out.communicating.assign(p, 0);
  out.idle.assign(p, 0);
  std::vector<std::vector<Pass>> passes(p);
  // arrival[s][pass.index()]: when what the pass waits for reaches stage s (0: it waits for
  // nothing on another stage: the first stage's forward passes, the last stage's backward ones).
  std::vector<std::vector<double>> arrival(p, std::vector<double>(2 * m + 1, kNever));
  for (int s = 0; s < p; ++s) {
    passes[s] = PassesOf(s, p, m);
    arrival[s][2 * m] = 0;  // the tail waits for nothing but the stage's own passes
    for (int i = 0; i < m; ++i) {
      if (s == 0) arrival[s][2 * i] = 0;
      if (s == p - 1) arrival[s][2 * i + 1] = 0;
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
      return pass.micro_batch == m ? at_k[s].tail
             : pass.backward       ? at_k[s].backward
                                   : at_k[s].forward;
    };
    auto waiting_of = [&](int s) {
      const Pass pass = passes[s][next[s]];
      return pass.micro_batch == m ? at_k[s].tail_waiting
             : pass.backward       ? at_k[s].backward_waiting
                                   : at_k[s].forward_waiting;
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
      const int to = pass.backward ? s - 1 : s + 1;
      if (pass.micro_batch < m && to >= 0 && to < p) {
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
