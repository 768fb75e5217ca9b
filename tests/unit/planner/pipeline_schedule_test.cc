// The pipeline schedule simulation (planner/pipeline_schedule.h) against schedules worked out by
// hand here: uniform stages give each schedule's textbook makespan, hand-offs sit on the critical
// path, and passes that share the cores run at the rate of how many stages run beside them.
#include "planner/pipeline_schedule.h"

#include "gtest/gtest.h"

namespace trainyard::planner {
namespace {

// The 1F1B schedule of m micro-batches (its stages: running.size()).
worker::ScheduleShape OneF1B(int m) { return {.micro_batches = m}; }

// p stages that take `pass` whatever runs beside them.
std::vector<std::vector<PassSeconds>> Constant(int p, PassSeconds pass) {
  return std::vector<std::vector<PassSeconds>>(p, std::vector<PassSeconds>(p, pass));
}

TEST(PipelineSchedule, UniformStagesTakeTheTextbookMakespan) {
  for (int p = 1; p <= 4; ++p) {
    for (int m = 1; m <= 8; ++m) {
      const ScheduleSeconds s =
          SimulateSchedule(OneF1B(m), Constant(p, {.forward = 1, .backward = 2}));
      EXPECT_DOUBLE_EQ(s.makespan, (m + p - 1) * 3.0) << "p " << p << " m " << m;
      for (int stage = 0; stage < p; ++stage) {
        EXPECT_DOUBLE_EQ(s.computing[stage], 3.0 * m);
        EXPECT_DOUBLE_EQ(s.idle[stage], 3.0 * (p - 1));
        EXPECT_DOUBLE_EQ(s.communicating[stage], 0);
      }
    }
  }
}

// A step of hours in passes of minutes, with microsecond hand-offs and uneven sharing: the
// simulation ends (passes end by decision, not by floating-point work reaching zero) and keeps
// the textbook makespan's order.
TEST(PipelineSchedule, LongStepsEnd) {
  std::vector<std::vector<PassSeconds>> running =
      Constant(2, {.forward = 300.1, .backward = 600.3, .handoff = 1e-6});
  running[1] = std::vector<PassSeconds>(2, {.forward = 577.7, .backward = 1100.9, .handoff = 3e-6});
  const ScheduleSeconds s = SimulateSchedule(OneF1B(512), running);
  EXPECT_GT(s.makespan, 513 * 900.4);
  EXPECT_LT(s.makespan, 513 * 1678.6);
  EXPECT_NEAR(s.computing[0] + s.communicating[0] + s.idle[0], s.makespan, 1e-6 * s.makespan);
}

// Two stages, one micro-batch: F on stage 0, a hand-off, F then B on stage 1, a hand-off, B on
// stage 0: 1 + h + 1 + 2 + h + 2. A pass's waiting part counts as communication.
TEST(PipelineSchedule, HandOffsAreOnTheCriticalPath) {
  const ScheduleSeconds s = SimulateSchedule(
      OneF1B(1),
      Constant(2, {.forward = 1, .backward = 2, .forward_waiting = 0.25, .handoff = 0.5}));
  EXPECT_DOUBLE_EQ(s.makespan, 7.0);
  EXPECT_DOUBLE_EQ(s.communicating[0], 0.25);
  EXPECT_DOUBLE_EQ(s.computing[0], 2.75);
  EXPECT_DOUBLE_EQ(s.idle[0], 4.0);
  EXPECT_DOUBLE_EQ(s.idle[1], 4.0);
}

// A pass that hands its output on also moves its bytes (work, not waiting); the last virtual
// stage's forward pass and the first one's backward pass hand nothing on. Two stages, one
// micro-batch: 1.25 (F0 and its send) + h + 1 (F0) + 2.25 (B0 and its send) + h + 2 (B0).
TEST(PipelineSchedule, SendingPassesMoveTheirBytes) {
  const ScheduleSeconds s = SimulateSchedule(
      OneF1B(1), Constant(2, {.forward = 1, .backward = 2, .handoff = 0.5, .send = 0.25}));
  EXPECT_DOUBLE_EQ(s.makespan, 7.5);
  EXPECT_DOUBLE_EQ(s.computing[0], 3.25);
  EXPECT_DOUBLE_EQ(s.computing[1], 3.25);
  EXPECT_DOUBLE_EQ(s.idle[0], 4.25);
}

// Two stages, two micro-batches; a pass alone takes F 1 and B 2, beside another stage's twice
// that. Stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1:
//   0–1  s0 F0 alone
//   1–3  s0 F1 and s1 F0 together (2 each)
//   3–5  s1 B0 alone; s0 waits for it
//   5–7  s0 B0 and s1 F1 together: F1 ends, B0 is half done
//   7–9  s0 B0's other half and s1 B1 together: B0 ends, B1 is half done
//   9–10 s1 B1's other half alone; s0 waits for it
//  10–12 s0 B1 alone.
TEST(PipelineSchedule, PassesRunAtTheRateOfTheStagesBesideThem) {
  std::vector<std::vector<PassSeconds>> running = Constant(2, {.forward = 1, .backward = 2});
  running[1] = {{.forward = 2, .backward = 4}, {.forward = 2, .backward = 4}};
  const ScheduleSeconds s = SimulateSchedule(OneF1B(2), running);
  EXPECT_DOUBLE_EQ(s.makespan, 12.0);
  EXPECT_DOUBLE_EQ(s.idle[0], 3.0);
  EXPECT_DOUBLE_EQ(s.idle[1], 3.0);
  EXPECT_DOUBLE_EQ(s.computing[0], 9.0);
}

// The stages' tails (their optimizers and reductions) start together once the last pass has
// ended, and share the cores with each other. One micro-batch, F and B 1 alone and 2 together;
// stage 0's tail 1 alone, stage 1's 2 alone (half of it waiting):
//   0–1 s0 F0, 1–2 s1 F0, 2–3 s1 B0, 3–4 s0 B0 (each alone; s1 waits for s0 from 3)
//   4–6 both tails together: stage 0's ends, stage 1's is half done
//   6–7 stage 1's other half alone.
TEST(PipelineSchedule, TailsStartTogetherAfterTheLastPass) {
  std::vector<std::vector<PassSeconds>> running = {
      {{.forward = 1, .backward = 1, .tail = 1},
       {.forward = 1, .backward = 1, .tail = 2, .tail_waiting = 1}},
      {{.forward = 2, .backward = 2, .tail = 2},
       {.forward = 2, .backward = 2, .tail = 4, .tail_waiting = 2}}};
  const ScheduleSeconds s = SimulateSchedule(OneF1B(1), running);
  EXPECT_DOUBLE_EQ(s.makespan, 7.0);
  EXPECT_DOUBLE_EQ(s.idle[0], 3.0);           // 1–3 and 6–7
  EXPECT_DOUBLE_EQ(s.idle[1], 2.0);           // 0–1 and 3–4
  EXPECT_DOUBLE_EQ(s.communicating[1], 1.5);  // half of the tail, over 3 seconds
  EXPECT_DOUBLE_EQ(s.computing[0], 4.0);
}

// ZB-H1 with uniform stages and m ≥ p: each stage idles (p − 1)(F + B − W) of a step of
// m(F + B + W) + (p − 1)(F + B − W); with F = B = W that is the (p − 1)/(3m + p − 1) bubble.
TEST(PipelineSchedule, ZeroBubbleStagesIdleTheirFormula) {
  for (int p = 2; p <= 4; ++p) {
    for (int m = p; m <= 8; ++m) {
      const worker::ScheduleShape zb{.schedule = config::PipelineSchedule::kZeroBubble,
                                     .micro_batches = m};
      const ScheduleSeconds unit =
          SimulateSchedule(zb, Constant(p, {.forward = 1, .backward = 1, .weight = 1}));
      EXPECT_DOUBLE_EQ(unit.makespan, 3.0 * m + p - 1) << "p " << p << " m " << m;
      const ScheduleSeconds s =
          SimulateSchedule(zb, Constant(p, {.forward = 1, .backward = 1.5, .weight = 0.75}));
      EXPECT_DOUBLE_EQ(s.makespan, m * 3.25 + (p - 1) * 1.75) << "p " << p << " m " << m;
      for (int stage = 0; stage < p; ++stage) {
        EXPECT_DOUBLE_EQ(s.computing[stage], 3.25 * m);
        EXPECT_DOUBLE_EQ(s.idle[stage], (p - 1) * 1.75);
      }
    }
  }
}

// Interleaved 1F1B over V equal chunks with m a multiple of p: each chunk pass takes 1/V of the
// stage's F and B, and each stage idles (p − 1)(F + B)/V of a step of m(F + B) + (p − 1)(F + B)/V:
// the (p − 1)/(V·m + p − 1) bubble.
TEST(PipelineSchedule, InterleavedStagesIdleTheirFormula) {
  for (int p = 2; p <= 4; ++p) {
    for (int v = 2; v <= 3; ++v) {
      for (int m = p; m <= 3 * p; m += p) {
        const worker::ScheduleShape il{.schedule = config::PipelineSchedule::kInterleaved,
                                       .micro_batches = m,
                                       .virtual_stages = v};
        PassSeconds pass{.forward = 1, .backward = 2};
        pass.chunk_share.assign(v, 1.0 / v);
        const ScheduleSeconds s = SimulateSchedule(il, Constant(p, pass));
        const double idle = (p - 1) * 3.0 / v;
        EXPECT_NEAR(s.makespan, 3.0 * m + idle, 1e-9) << "p " << p << " m " << m << " v " << v;
        for (int stage = 0; stage < p; ++stage) {
          EXPECT_NEAR(s.computing[stage], 3.0 * m, 1e-9);
          EXPECT_NEAR(s.idle[stage], idle, 1e-9);
          EXPECT_NEAR(s.idle[stage] / s.makespan, (p - 1.0) / (v * m + p - 1.0), 1e-12);
        }
      }
    }
  }
}

}  // namespace
}  // namespace trainyard::planner
