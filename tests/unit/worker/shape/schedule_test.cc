// The one definition of the pipeline schedules (worker/shape/schedule.h): every stage runs every
// pass of the step once and in dependency order, the unit-clock plan takes the schedule's
// textbook makespan, every transfer meets its other end at the same tick (a tick sends at most
// its pass's output and receives at most one message from each neighbour), and the activation
// slots are what the pass order holds at once.
#include "worker/shape/schedule.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace trainyard::worker {
namespace {

ScheduleShape OneF1B(int p, int m) { return {.stages = p, .micro_batches = m}; }
ScheduleShape ZeroBubble(int p, int m) {
  return {.schedule = PipelineSchedule::kZeroBubble, .stages = p, .micro_batches = m};
}
ScheduleShape Interleaved(int p, int m, int v) {
  return {.schedule = PipelineSchedule::kInterleaved,
          .stages = p,
          .micro_batches = m,
          .virtual_stages = v};
}

std::string Names(const std::vector<Pass>& passes) {
  std::string out;
  for (const Pass& pass : passes) out += PassName(pass) + " ";
  return out;
}

// The step's length on the unit clock: the last tick any stage uses, plus one.
int64_t Makespan(const ScheduleShape& shape) {
  int64_t makespan = 0;
  for (const std::vector<ScheduleStep>& stage : PlanSchedule(shape)) {
    for (const ScheduleStep& step : stage) makespan = std::max(makespan, step.tick + 1);
  }
  return makespan;
}

// Every schedule at p = 2…6 and m = 1…9 (interleaved: m a multiple of p, V = 2…4).
std::vector<ScheduleShape> EveryShape() {
  std::vector<ScheduleShape> shapes;
  for (int p = 2; p <= 6; ++p) {
    for (int m = 1; m <= 9; ++m) {
      shapes.push_back(OneF1B(p, m));
      shapes.push_back(ZeroBubble(p, m));
      for (int v = 2; v <= 4 && m % p == 0; ++v) shapes.push_back(Interleaved(p, m, v));
    }
  }
  return shapes;
}

std::string Describe(const ScheduleShape& s) {
  return std::string(ScheduleName(s.schedule)) + " p " + std::to_string(s.stages) + " m " +
         std::to_string(s.micro_batches) + " v " + std::to_string(s.virtual_stages);
}

TEST(Schedule, OneForwardOneBackwardOrderIsWarmupSteadyCooldown) {
  EXPECT_EQ(Names(PassOrder(OneF1B(4, 6), 0)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(Names(PassOrder(OneF1B(4, 6), 2)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5 ");
  EXPECT_EQ(Names(PassOrder(OneF1B(4, 6), 3)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
  EXPECT_EQ(Names(PassOrder(OneF1B(4, 2), 0)), "F0 F1 B0 B1 ");
}

// Stage s defers s weight passes to the end of the step.
TEST(Schedule, ZeroBubbleDefersWeightPassesOnLaterStages) {
  EXPECT_EQ(Names(PassOrder(ZeroBubble(4, 5), 0)), "F0 F1 F2 F3 B0 W0 F4 B1 W1 B2 W2 B3 W3 B4 W4 ");
  EXPECT_EQ(Names(PassOrder(ZeroBubble(4, 5), 2)), "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 B4 W2 W3 W4 ");
  EXPECT_EQ(Names(PassOrder(ZeroBubble(4, 5), 3)), "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 W2 W3 W4 ");
}

// Virtual stage v = chunk · p + s: a forward pass after the one on v − 1, a backward pass after
// the one on v + 1 and after its own forward pass, a weight pass after its own backward pass.
TEST(Schedule, EveryStageRunsEveryPassOnceAfterWhatItNeeds) {
  for (const ScheduleShape& shape : EveryShape()) {
    const int p = shape.stages, m = shape.micro_batches, v = shape.virtual_stages;
    const bool split = SplitsBackward(shape.schedule);
    const std::vector<std::vector<ScheduleStep>> plan = PlanSchedule(shape);
    ASSERT_EQ(plan.size(), static_cast<size_t>(p)) << Describe(shape);
    // (virtual stage, kind, micro-batch) → tick
    std::map<std::tuple<int, int, int>, int64_t> ran;
    for (int s = 0; s < p; ++s) {
      int64_t last_tick = -1;
      for (const ScheduleStep& step : plan[s]) {
        EXPECT_GT(step.tick, last_tick);  // in tick order
        last_tick = step.tick;
        if (!step.has_pass) continue;
        const auto key = std::make_tuple(step.pass.chunk * p + s, static_cast<int>(step.pass.kind),
                                         step.pass.micro_batch);
        EXPECT_EQ(ran.count(key), 0u) << PassName(step.pass) << " twice on stage " << s;
        ran[key] = step.tick;
      }
    }
    ASSERT_EQ(ran.size(), static_cast<size_t>((split ? 3 : 2) * p * v * m)) << Describe(shape);
    auto at = [&](int vs, PassKind kind, int i) {
      return ran[std::make_tuple(vs, static_cast<int>(kind), i)];
    };
    for (int vs = 0; vs < p * v; ++vs) {
      for (int i = 0; i < m; ++i) {
        const int64_t f = at(vs, PassKind::kForward, i), b = at(vs, PassKind::kBackward, i);
        EXPECT_LT(f, b);
        if (split) {
          EXPECT_LT(b, at(vs, PassKind::kWeight, i));
        }
        if (vs > 0) {
          EXPECT_LT(at(vs - 1, PassKind::kForward, i), f);
        }
        if (vs + 1 < p * v) {
          EXPECT_LT(at(vs + 1, PassKind::kBackward, i), b);
        }
      }
    }
  }
}

TEST(Schedule, UnitClockTakesTheOneForwardOneBackwardMakespan) {
  for (int p = 2; p <= 6; ++p) {
    for (int m = 1; m <= 9; ++m) {
      const int64_t makespan = Makespan(OneF1B(p, m));
      // Every stage busy 2m ticks of 2(m + p − 1): the (p − 1)/(m + p − 1) bubble.
      EXPECT_EQ(makespan, 2 * (m + p - 1)) << "p " << p << " m " << m;
    }
  }
}

// With m ≥ p, every stage is busy 3m ticks of 3m + p − 1: idle (p − 1)(F + B − W) with unit
// passes, the (p − 1)/(3m + p − 1) bubble.
TEST(Schedule, UnitClockTakesTheZeroBubbleMakespan) {
  for (int p = 2; p <= 6; ++p) {
    for (int m = p; m <= 12; ++m) {
      EXPECT_EQ(Makespan(ZeroBubble(p, m)), 3 * m + p - 1) << "p " << p << " m " << m;
    }
  }
}

TEST(Schedule, EveryTransferMeetsItsOtherEndAtTheSameTick) {
  for (const ScheduleShape& shape : EveryShape()) {
    const int p = shape.stages, m = shape.micro_batches, v = shape.virtual_stages;
    {
      const std::vector<std::vector<ScheduleStep>> plan = PlanSchedule(shape);
      // (sender, receiver, tag) → tick, from each side.
      std::map<std::tuple<int, int, uint32_t>, int64_t> sends, recvs;
      for (int s = 0; s < p; ++s) {
        for (const ScheduleStep& step : plan[s]) {
          int sent = 0;
          std::map<int, int> received;  // by peer
          for (const Transfer& t : step.transfers) {
            // A neighbour; with several chunks per rank the last stage hands on to the first.
            EXPECT_TRUE(t.peer == (s + 1) % p || t.peer == (s + p - 1) % p);
            if (v == 1) {
              EXPECT_EQ(std::abs(t.peer - s), 1);
            }
            if (t.send) {
              ++sent;
              ASSERT_TRUE(step.has_pass);
              EXPECT_EQ(t.pass, step.pass);  // a tick sends what its pass produced
              sends[{s, t.peer, t.tag}] = step.tick;
            } else {
              ++received[t.peer];
              recvs[{t.peer, s, t.tag}] = step.tick;
            }
          }
          EXPECT_LE(sent, 1);
          for (const auto& [peer, count] : received) EXPECT_EQ(count, 1) << "from " << peer;
        }
      }
      EXPECT_EQ(sends, recvs) << Describe(shape);
      // One activation and one gradient per micro-batch between each pair of neighbouring
      // virtual stages.
      EXPECT_EQ(sends.size(), static_cast<size_t>(2 * (p * v - 1) * m)) << Describe(shape);
    }
  }
}

TEST(Schedule, ActivationSlotsAreTheMicroBatchesInFlight) {
  for (int p = 2; p <= 6; ++p) {
    for (int m = 1; m <= 9; ++m) {
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(ActivationSlots(OneF1B(p, m), s), std::min(p - s, m))
            << "p " << p << " m " << m << " stage " << s;
      }
    }
  }
}

// ZB-H1 holds what 1F1B's first stage holds, on every stage.
TEST(Schedule, ZeroBubbleHoldsAtMostOneForwardOneBackwardsPeak) {
  for (int p = 2; p <= 6; ++p) {
    for (int m = 1; m <= 9; ++m) {
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(ActivationSlots(ZeroBubble(p, m), s), std::min(p, m))
            << "p " << p << " m " << m << " stage " << s;
      }
    }
  }
}

// Megatron's order: rounds of p micro-batches per chunk, (p − s − 1)·2 + (V − 1)·p warm-up
// forward passes, then 1F1B over the chunk passes (with m = p too).
TEST(Schedule, InterleavedRunsRoundsOfChunks) {
  EXPECT_EQ(Names(PassOrder(Interleaved(2, 4, 2), 0)),
            "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3 ");
  EXPECT_EQ(Names(PassOrder(Interleaved(2, 4, 2), 1)),
            "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3 ");
  EXPECT_EQ(Names(PassOrder(Interleaved(2, 2, 2), 1)), "F0 F1 F0.1 B0.1 F1.1 B1.1 B0 B1 ");
}

// With m a multiple of p every stage is busy 2·V·m chunk ticks of 2(V·m + p − 1): the
// (p − 1)/(V·m + p − 1) bubble, V times smaller in time than 1F1B's.
TEST(Schedule, UnitClockTakesTheInterleavedMakespan) {
  for (int p = 2; p <= 6; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 4 * p; m += p) {
        EXPECT_EQ(Makespan(Interleaved(p, m, v)), 2 * (v * m + p - 1))
            << "p " << p << " m " << m << " v " << v;
      }
    }
  }
}

// Stage s holds (p − s − 1)·2 + (V − 1)·p + 1 chunk passes' activations at its peak (its warm-up
// and the one its first steady forward pass adds), at most all V·m.
TEST(Schedule, InterleavedActivationSlotsAreItsWarmUpPlusOne) {
  for (int p = 2; p <= 6; ++p) {
    for (int v = 2; v <= 4; ++v) {
      for (int m = p; m <= 3 * p; m += p) {
        for (int s = 0; s < p; ++s) {
          const int expected = std::min((p - s - 1) * 2 + (v - 1) * p + 1, v * m);
          EXPECT_EQ(ActivationSlots(Interleaved(p, m, v), s), expected)
              << "p " << p << " m " << m << " v " << v << " stage " << s;
        }
      }
    }
  }
}

TEST(Schedule, TheLastStageComputesWeightGradientsInItsForwardPass) {
  const ScheduleShape shape = OneF1B(3, 4);
  EXPECT_TRUE(ComputesWeightGradients(shape, 2, {PassKind::kForward, 1}));
  EXPECT_FALSE(ComputesWeightGradients(shape, 2, {PassKind::kBackward, 1}));
  EXPECT_TRUE(ComputesWeightGradients(shape, 0, {PassKind::kBackward, 1}));
  EXPECT_FALSE(ComputesWeightGradients(shape, 1, {PassKind::kForward, 1}));
  const ScheduleShape zb = ZeroBubble(3, 4);
  EXPECT_TRUE(ComputesWeightGradients(zb, 2, {PassKind::kForward, 1}));  // the head's
  EXPECT_TRUE(ComputesWeightGradients(zb, 2, {PassKind::kWeight, 1}));
  EXPECT_FALSE(ComputesWeightGradients(zb, 2, {PassKind::kBackward, 1}));
  EXPECT_FALSE(ComputesWeightGradients(zb, 0, {PassKind::kBackward, 1}));
  EXPECT_TRUE(ComputesWeightGradients(zb, 0, {PassKind::kWeight, 1}));
  // Interleaved: only the last virtual stage's forward pass; every other chunk's backward pass.
  const ScheduleShape il = Interleaved(2, 4, 2);
  EXPECT_TRUE(ComputesWeightGradients(il, 1, {PassKind::kForward, 1, 1}));
  EXPECT_FALSE(ComputesWeightGradients(il, 1, {PassKind::kForward, 1, 0}));
  EXPECT_TRUE(ComputesWeightGradients(il, 1, {PassKind::kBackward, 1, 0}));
  EXPECT_FALSE(ComputesWeightGradients(il, 1, {PassKind::kBackward, 1, 1}));
  EXPECT_TRUE(ComputesWeightGradients(il, 0, {PassKind::kBackward, 1, 1}));
}

}  // namespace
}  // namespace trainyard::worker
