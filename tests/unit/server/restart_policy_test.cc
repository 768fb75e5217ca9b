// RestartPolicy: classification of failures, restart budgets and the backoff sequence.
#include "server/restart_policy.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

using ::testing::HasSubstr;

FailureSignal Exit(int code) {
  FailureSignal signal;
  signal.exit_code = code;
  return signal;
}

FailureSignal Killed(int signal_number) {
  FailureSignal signal;
  signal.signal = signal_number;
  return signal;
}

RestartOptions NoJitter() {
  RestartOptions options;
  options.max_restarts = 3;
  options.backoff_initial = absl::Seconds(1);
  options.backoff_max = absl::Seconds(60);
  options.backoff_multiplier = 2;
  options.backoff_jitter = 0;
  return options;
}

TEST(RestartPolicyTest, NamesRoundTripAndAreStable) {
  const std::map<FailureClass, std::string> expected = {
      {FailureClass::kUserError, "user_error"},
      {FailureClass::kCrash, "crash"},
      {FailureClass::kHang, "hang"},
      {FailureClass::kNodeLost, "node_lost"},
      {FailureClass::kCollectiveTimeout, "collective_timeout"},
  };
  for (const auto& [failure_class, name] : expected) {
    EXPECT_EQ(FailureClassName(failure_class), name);
    EXPECT_EQ(ParseFailureClass(name), failure_class) << name;
  }
  EXPECT_EQ(ParseFailureClass("Crash"), std::nullopt);
  EXPECT_EQ(ParseFailureClass("user error"), std::nullopt);
  EXPECT_EQ(ParseFailureClass(""), std::nullopt);
}

TEST(RestartPolicyTest, ClassifiesEveryExitCode) {
  EXPECT_EQ(Classify(Exit(kExitOk)), FailureClass::kCrash);
  EXPECT_EQ(Classify(Exit(kExitInternalError)), FailureClass::kCrash);
  EXPECT_EQ(Classify(Exit(kExitUserError)), FailureClass::kUserError);
  EXPECT_EQ(Classify(Exit(kExitCollectiveTimeout)), FailureClass::kCollectiveTimeout);
  EXPECT_EQ(Classify(Exit(kExitHang)), FailureClass::kHang);
  EXPECT_EQ(Classify(Exit(kExitOutOfMemory)), FailureClass::kUserError);
  for (int unknown : {6, 42, 126, 127, 255, -1}) {
    EXPECT_EQ(Classify(Exit(unknown)), FailureClass::kCrash) << "exit code " << unknown;
  }
}

TEST(RestartPolicyTest, TheExitCodeTableIsStable) {
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(kExitInternalError, 1);
  EXPECT_EQ(kExitUserError, 2);
  EXPECT_EQ(kExitCollectiveTimeout, 3);
  EXPECT_EQ(kExitHang, 4);
  EXPECT_EQ(kExitOutOfMemory, 5);
}

TEST(RestartPolicyTest, ASignalIsACrashWhateverTheExitCode) {
  for (int signal_number : {SIGKILL, SIGSEGV, SIGABRT, SIGTERM, SIGBUS}) {
    EXPECT_EQ(Classify(Killed(signal_number)), FailureClass::kCrash) << signal_number;
  }
  FailureSignal killed = Killed(SIGKILL);
  killed.exit_code = kExitUserError;  // meaningless once a signal is set
  EXPECT_EQ(Classify(killed), FailureClass::kCrash);
}

TEST(RestartPolicyTest, NodeLostAndHangOverrideTheExitCode) {
  for (int code : {kExitOk, kExitUserError, kExitHang, kExitOutOfMemory, 99}) {
    FailureSignal lost = Exit(code);
    lost.node_lost = true;
    EXPECT_EQ(Classify(lost), FailureClass::kNodeLost) << code;
    FailureSignal hung = Exit(code);
    hung.hang_detected = true;
    EXPECT_EQ(Classify(hung), FailureClass::kHang) << code;
  }
  FailureSignal hung_and_killed = Killed(SIGKILL);
  hung_and_killed.hang_detected = true;
  EXPECT_EQ(Classify(hung_and_killed), FailureClass::kHang);
  FailureSignal both = Exit(kExitCollectiveTimeout);
  both.node_lost = true;
  both.hang_detected = true;
  EXPECT_EQ(Classify(both), FailureClass::kNodeLost);
}

TEST(RestartPolicyTest, DescribesTheFailureForPeople) {
  FailureSignal killed = Killed(SIGKILL);
  killed.message = "rank 3";
  EXPECT_EQ(DescribeFailure(killed), "killed by signal 9 (SIGKILL): rank 3");
  EXPECT_EQ(DescribeFailure(Exit(kExitHang)), "exit code 4 (hang watchdog)");
  EXPECT_THAT(DescribeFailure(Exit(77)), HasSubstr("exit code 77"));
  FailureSignal lost;
  lost.node_lost = true;
  EXPECT_EQ(DescribeFailure(lost), "node lost");
}

TEST(RestartPolicyTest, UserErrorNeverRestarts) {
  RestartOptions options = NoJitter();
  options.max_restarts = 10;
  const RestartPolicy policy(options);
  const RestartDecision decision = policy.Decide(FailureClass::kUserError, {}, 1, 0.5);
  EXPECT_FALSE(decision.restart);
  EXPECT_EQ(decision.delay, absl::ZeroDuration());
  EXPECT_EQ(decision.failure_class, FailureClass::kUserError);
  EXPECT_EQ(decision.class_budget, 0);
  EXPECT_EQ(decision.total_budget, 10);
  EXPECT_EQ(decision.reason, "user error: no restart can fix it");
  EXPECT_EQ(policy.BudgetFor(FailureClass::kUserError), 0);
}

TEST(RestartPolicyTest, AClassWithoutABudgetMayUseEveryRestart) {
  const RestartPolicy policy(NoJitter());
  std::map<FailureClass, int> used;
  for (int i = 0; i < 3; ++i) {
    const RestartDecision decision = policy.Decide(FailureClass::kCrash, used, 1, 0);
    ASSERT_TRUE(decision.restart) << i;
    EXPECT_EQ(decision.total_used, i);
    EXPECT_EQ(decision.class_used, i);
    EXPECT_EQ(decision.class_budget, 3);
    EXPECT_EQ(decision.reason, "crash: restart " + std::to_string(i + 1) + " of 3 in 1s");
    ++used[FailureClass::kCrash];
  }
  const RestartDecision exhausted = policy.Decide(FailureClass::kCrash, used, 1, 0);
  EXPECT_FALSE(exhausted.restart);
  EXPECT_EQ(exhausted.delay, absl::ZeroDuration());
  EXPECT_EQ(exhausted.reason, "crash: no restarts left (3 of 3 used)");
}

TEST(RestartPolicyTest, AClassBudgetLimitsOnlyThatClass) {
  RestartOptions options = NoJitter();
  options.budget[FailureClass::kHang] = 2;
  const RestartPolicy policy(options);

  const RestartDecision second_hang =
      policy.Decide(FailureClass::kHang, {{FailureClass::kHang, 1}}, 2, 0);
  EXPECT_TRUE(second_hang.restart);
  EXPECT_EQ(second_hang.class_used, 1);
  EXPECT_EQ(second_hang.class_budget, 2);
  EXPECT_EQ(second_hang.reason,
            "hang: restart 2 of 3 in 2s (2 of 2 hang restarts used after this)");

  const std::map<FailureClass, int> two_hangs = {{FailureClass::kHang, 2}};
  const RestartDecision third_hang = policy.Decide(FailureClass::kHang, two_hangs, 3, 0);
  EXPECT_FALSE(third_hang.restart);
  EXPECT_EQ(third_hang.total_used, 2);
  EXPECT_EQ(third_hang.reason, "hang: its budget of 2 restarts is used up");

  // The last restart of the total is still there for another class.
  const RestartDecision crash = policy.Decide(FailureClass::kCrash, two_hangs, 3, 0);
  EXPECT_TRUE(crash.restart);
  EXPECT_EQ(crash.total_used, 2);
  EXPECT_EQ(crash.class_used, 0);
  EXPECT_EQ(crash.class_budget, 3);
}

TEST(RestartPolicyTest, TheTotalLimitsEveryClassTogether) {
  RestartOptions options = NoJitter();
  options.budget[FailureClass::kNodeLost] = 3;
  const RestartPolicy policy(options);
  const std::map<FailureClass, int> used = {{FailureClass::kCrash, 2},
                                            {FailureClass::kCollectiveTimeout, 1}};
  const RestartDecision decision = policy.Decide(FailureClass::kNodeLost, used, 1, 0);
  EXPECT_FALSE(decision.restart);
  EXPECT_EQ(decision.class_used, 0);
  EXPECT_EQ(decision.total_used, 3);
  EXPECT_EQ(decision.reason, "node lost: no restarts left (3 of 3 used)");
}

TEST(RestartPolicyTest, AZeroBudgetNeverRestartsItsClass) {
  RestartOptions options = NoJitter();
  options.budget[FailureClass::kCollectiveTimeout] = 0;
  const RestartPolicy policy(options);
  const RestartDecision decision = policy.Decide(FailureClass::kCollectiveTimeout, {}, 1, 0);
  EXPECT_FALSE(decision.restart);
  EXPECT_EQ(decision.reason, "collective timeout: its budget allows no restarts");
  EXPECT_TRUE(policy.Decide(FailureClass::kCrash, {}, 1, 0).restart);
}

TEST(RestartPolicyTest, ZeroMaxRestartsNeverRestarts) {
  RestartOptions options = NoJitter();
  options.max_restarts = 0;
  const RestartPolicy policy(options);
  const RestartDecision decision = policy.Decide(FailureClass::kCrash, {}, 1, 0);
  EXPECT_FALSE(decision.restart);
  EXPECT_EQ(decision.reason, "crash: no restarts left (0 of 0 used)");
}

TEST(RestartPolicyTest, BackoffDoublesUpToTheCap) {
  const RestartPolicy policy(NoJitter());
  const std::vector<int> expected_seconds = {1, 2, 4, 8, 16, 32, 60, 60, 60};
  for (int n = 1; n <= static_cast<int>(expected_seconds.size()); ++n) {
    EXPECT_EQ(policy.Backoff(n, 0.5), absl::Seconds(expected_seconds[n - 1])) << "failure " << n;
  }
  // A very long run of failures stays at the cap rather than overflowing.
  EXPECT_EQ(policy.Backoff(100000, 0.5), absl::Seconds(60));
  // Below 1 counts as the first failure.
  EXPECT_EQ(policy.Backoff(0, 0.5), absl::Seconds(1));
  EXPECT_EQ(policy.Backoff(-3, 0.5), absl::Seconds(1));
}

TEST(RestartPolicyTest, DecideUsesTheBackoffOfTheConsecutiveFailure) {
  RestartOptions options = NoJitter();
  options.max_restarts = 10;
  const RestartPolicy policy(options);
  EXPECT_EQ(policy.Decide(FailureClass::kCrash, {}, 1, 0).delay, absl::Seconds(1));
  EXPECT_EQ(policy.Decide(FailureClass::kCrash, {{FailureClass::kCrash, 5}}, 4, 0).delay,
            absl::Seconds(8));
  // Progress since the last failure resets the sequence even with restarts used.
  EXPECT_EQ(policy.Decide(FailureClass::kCrash, {{FailureClass::kCrash, 5}}, 1, 0).delay,
            absl::Seconds(1));
}

TEST(RestartPolicyTest, JitterStaysWithinItsFraction) {
  RestartOptions options = NoJitter();
  options.backoff_jitter = 0.25;
  const RestartPolicy policy(options);
  // Draw 0 gives the lowest delay, draw near 1 nearly the highest, 0.5 the plain one.
  EXPECT_EQ(policy.Backoff(3, 0), absl::Seconds(3));
  EXPECT_EQ(policy.Backoff(3, 0.5), absl::Seconds(4));
  const absl::Duration high = policy.Backoff(3, 0.999);
  EXPECT_GT(high, absl::Milliseconds(4990));
  EXPECT_LT(high, absl::Seconds(5));
  // Applied after the cap: the capped delay moves by the same fraction.
  EXPECT_EQ(policy.Backoff(20, 0), absl::Seconds(45));
  const absl::Duration capped_high = policy.Backoff(20, 0.999);
  EXPECT_GT(capped_high, absl::Milliseconds(74900));
  EXPECT_LT(capped_high, absl::Seconds(75));
}

TEST(RestartPolicyTest, JitterDrawsAreASeededUniformSequence) {
  JitterDraws a(42), b(42), c(43);
  double sum = 0, low = 1, high = 0;
  bool differs = false;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) {
    const double x = a.Next();
    EXPECT_EQ(x, b.Next());  // the same seed, the same draws
    differs = differs || x != c.Next();
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
    sum += x;
    low = std::min(low, x);
    high = std::max(high, x);
  }
  EXPECT_TRUE(differs);
  EXPECT_NEAR(sum / kDraws, 0.5, 0.01);  // 1/sqrt(12·20000) ≈ 0.002 is one standard error
  EXPECT_LT(low, 0.001);
  EXPECT_GT(high, 0.999);
}

TEST(RestartPolicyTest, FullJitterNeverGoesNegative) {
  RestartOptions options = NoJitter();
  options.backoff_jitter = 1;
  const RestartPolicy policy(options);
  EXPECT_EQ(policy.Backoff(2, 0), absl::ZeroDuration());
  EXPECT_GE(policy.Backoff(2, -5), absl::ZeroDuration());  // out-of-range draws are clamped
  EXPECT_LE(policy.Backoff(2, 7), absl::Seconds(4));
}

TEST(RestartPolicyTest, ZeroInitialMeansNoDelay) {
  RestartOptions options = NoJitter();
  options.backoff_initial = absl::ZeroDuration();
  options.backoff_jitter = 0.5;
  const RestartPolicy policy(options);
  for (int n : {1, 2, 10}) EXPECT_EQ(policy.Backoff(n, 0.999), absl::ZeroDuration());
  const RestartDecision decision = policy.Decide(FailureClass::kHang, {}, 5, 0.999);
  EXPECT_TRUE(decision.restart);
  EXPECT_EQ(decision.delay, absl::ZeroDuration());
  EXPECT_EQ(decision.reason, "hang: restart 1 of 3");
}

TEST(RestartPolicyTest, MultiplierOneKeepsTheDelayConstant) {
  RestartOptions options = NoJitter();
  options.backoff_multiplier = 1;
  options.backoff_initial = absl::Seconds(5);
  const RestartPolicy policy(options);
  EXPECT_EQ(policy.Backoff(1, 0), absl::Seconds(5));
  EXPECT_EQ(policy.Backoff(50, 0), absl::Seconds(5));
}

TEST(RestartPolicyTest, DefaultOptionsAreValid) { EXPECT_TRUE(Validate(RestartOptions{}).ok()); }

// The message of Validate(options) after `change`, or "ok".
template <typename Change>
std::string ValidationError(Change change) {
  RestartOptions options = NoJitter();
  change(options);
  const absl::Status status = Validate(options);
  if (status.ok()) return "ok";
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

TEST(RestartPolicyTest, ValidationNamesTheField) {
  EXPECT_EQ(ValidationError([](RestartOptions& o) { o.max_restarts = -1; }),
            "max_restarts: must be at least 0 (got -1)");
  EXPECT_EQ(ValidationError([](RestartOptions& o) { o.budget[FailureClass::kHang] = 4; }),
            "budget.hang: must be between 0 and max_restarts = 3 (got 4)");
  EXPECT_EQ(ValidationError([](RestartOptions& o) { o.budget[FailureClass::kCrash] = -1; }),
            "budget.crash: must be between 0 and max_restarts = 3 (got -1)");
  EXPECT_EQ(ValidationError([](RestartOptions& o) { o.budget[FailureClass::kUserError] = 1; }),
            "budget.user_error: must be 0, since no restart can fix a user error (got 1)");
  EXPECT_EQ(ValidationError([](RestartOptions& o) { o.backoff_initial = absl::Seconds(-1); }),
            "backoff_initial: must be a finite duration of at least 0 (got -1s)");
  EXPECT_EQ(ValidationError([](RestartOptions& o) { o.backoff_max = absl::InfiniteDuration(); }),
            "backoff_max: must be a finite duration of at least 0 (got inf)");
  EXPECT_EQ(ValidationError([](RestartOptions& o) { o.backoff_initial = absl::Seconds(90); }),
            "backoff_initial: 1m30s is more than backoff_max (1m)");
  EXPECT_EQ(ValidationError([](RestartOptions& o) { o.backoff_multiplier = 0.5; }),
            "backoff_multiplier: must be a finite number of at least 1 (got 0.5)");
  EXPECT_THAT(ValidationError([](RestartOptions& o) { o.backoff_multiplier = NAN; }),
              HasSubstr("backoff_multiplier: must be a finite number of at least 1"));
  EXPECT_EQ(ValidationError([](RestartOptions& o) { o.backoff_jitter = 1.5; }),
            "backoff_jitter: must be a fraction between 0 and 1 (got 1.5)");
  EXPECT_EQ(ValidationError([](RestartOptions& o) { o.backoff_jitter = -0.1; }),
            "backoff_jitter: must be a fraction between 0 and 1 (got -0.1)");
  EXPECT_THAT(ValidationError([](RestartOptions& o) { o.backoff_jitter = NAN; }),
              HasSubstr("backoff_jitter"));
}

TEST(RestartPolicyTest, ValidationAcceptsTheEdges) {
  EXPECT_EQ(ValidationError([](RestartOptions& o) {
              o.max_restarts = 0;
              o.budget[FailureClass::kUserError] = 0;
              o.budget[FailureClass::kHang] = 0;
              o.backoff_initial = absl::ZeroDuration();
              o.backoff_max = absl::ZeroDuration();
              o.backoff_multiplier = 1;
              o.backoff_jitter = 1;
            }),
            "ok");
  EXPECT_EQ(ValidationError([](RestartOptions& o) {
              o.budget[FailureClass::kHang] = 3;
              o.backoff_initial = o.backoff_max;
              o.backoff_jitter = 0;
            }),
            "ok");
}

}  // namespace
}  // namespace trainyard::server
