// Simulates a long training job under failures and compares the `auto` checkpoint interval
// (server/checkpoint_policy.h, fed what the coordinator feeds it) with fixed intervals.
//
// The job: `work` hours of steps of fixed length. A save blocks training for δ and commits when
// the block ends; a failure (exponential inter-failure times, on the wall clock, restarts
// included) loses the work since the last committed save and costs R (detection, restart,
// restore) before training resumes from that save. Progress reports reach the coordinator every
// `report_steps` steps; at each, and when an attempt starts, it asks the policy for the step of
// the next save. A scenario's MTBF may change when the job first reaches a fraction of its work.
//
// Prints markdown: the parameters, then per scenario the median (over seeds) time to finish and
// goodput (work / time) of `auto`, of every fixed interval and of an oracle that knows the true
// rate, and how often `auto` finished first seed by seed.
//
// Usage: young_daly_sim [--seeds N] [--memory_mtbfs H] [--prior_failures A0]
// (the last two override the policy's defaults, for studying the estimator)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "server/checkpoint_policy.h"

namespace trainyard::server {
namespace {

struct Phase {
  double until_work_fraction;  // the phase ends when the job first reaches this much work
  double mtbf_s;
};

struct Scenario {
  std::string name;
  double work_h = 100;
  double step_s = 10;
  double delta_s = 30;
  double restart_s = 300;
  int report_steps = 6;
  int nodes = 64;
  absl::Duration prior_node_mtbf;  // the policy's prior
  std::vector<Phase> phases;       // the true failure rate over the job
};

// What a run's `auto` policy may override (unset: the policy's defaults).
struct EstimatorFlags {
  std::optional<double> memory_mtbfs;
  std::optional<double> prior_failures;
};

// The interval rule of a run: the policy (`auto`), a fixed number of steps, or the oracle, which
// uses Daly's interval for the true MTBF of the current phase (not achievable: it knows the rate
// and when it changes; shown as a bound).
struct Rule {
  enum Kind { kAuto, kFixed, kOracle } kind = kAuto;
  int64_t every = 0;  // kFixed
};

struct RunResult {
  double total_s = 0;
  int64_t failures = 0;
  int64_t checkpoints = 0;
  std::vector<std::vector<int64_t>> intervals_by_phase;  // steps between consecutive saves
};

// One job from start to finish under one rule and one seed.
class JobSimulation {
 public:
  JobSimulation(const Scenario& sc, Rule rule, const EstimatorFlags& flags, uint64_t seed)
      : sc_(sc),
        rule_(rule),
        rng_(seed),
        total_steps_(std::llround(sc.work_h * 3600 / sc.step_s)),
        policy_(PolicyOptions(sc, flags)) {
    result_.intervals_by_phase.resize(sc.phases.size());
    next_failure_ = DrawFailureAfter(0);
  }

  RunResult Run() {
    save_at_ = NextSave();
    next_report_ = step_ + sc_.report_steps;
    while (step_ < total_steps_) {
      int64_t stop = std::min(total_steps_, next_report_);
      if (save_at_ && *save_at_ > step_) stop = std::min(stop, *save_at_);
      const double reach = t_ + (stop - step_) * sc_.step_s;
      if (next_failure_ < reach) {
        Fail();
        continue;
      }
      t_ = reach;
      step_ = stop;
      AdvancePhase();
      if (step_ >= total_steps_) break;
      if (save_at_ && step_ == *save_at_) {
        if (next_failure_ < t_ + sc_.delta_s) {
          Fail();  // the save never commits
          continue;
        }
        Commit();
      }
      if (step_ == next_report_) Report();
    }
    result_.total_s = t_;
    return result_;
  }

 private:
  static CheckpointPolicyOptions PolicyOptions(const Scenario& sc, const EstimatorFlags& flags) {
    CheckpointPolicyOptions options;
    options.node_mtbf = sc.prior_node_mtbf;
    options.nodes = sc.nodes;
    if (flags.memory_mtbfs) options.memory_mtbfs = *flags.memory_mtbfs;
    if (flags.prior_failures) options.prior_failures = *flags.prior_failures;
    return options;
  }

  bool automatic() const { return rule_.kind == Rule::kAuto; }

  double DrawFailureAfter(double when) {
    return when + unit_exp_(rng_) * sc_.phases[phase_].mtbf_s;
  }

  // The step of the next save, as the coordinator would order it now.
  std::optional<int64_t> NextSave() {
    switch (rule_.kind) {
      case Rule::kAuto:
        return policy_.NextCheckpointStep(step_, last_checkpoint_);
      case Rule::kFixed:
        return last_checkpoint_ + rule_.every;
      case Rule::kOracle: {
        const double tau = CheckpointPolicy::DalyInterval(sc_.delta_s, sc_.phases[phase_].mtbf_s);
        return std::max<int64_t>(last_checkpoint_ + std::llround(tau / sc_.step_s), step_ + 1);
      }
    }
    return std::nullopt;
  }

  void FeedExposureUntil(double when) {
    if (automatic() && when > fed_until_) policy_.ObserveRunning(absl::Seconds(when - fed_until_));
    fed_until_ = std::max(fed_until_, when);
  }

  // The failure at next_failure_ ends the attempt; the restart (which may fail too) resumes from
  // the last committed save.
  void Fail() {
    t_ = next_failure_;
    for (;;) {
      ++result_.failures;
      FeedExposureUntil(t_);
      if (automatic()) policy_.ObserveFailure();
      next_failure_ = DrawFailureAfter(t_);
      if (next_failure_ >= t_ + sc_.restart_s) break;
      t_ = next_failure_;
    }
    t_ += sc_.restart_s;
    step_ = last_checkpoint_;
    save_at_ = NextSave();
    next_report_ = step_ + sc_.report_steps;
  }

  void Commit() {
    t_ += sc_.delta_s;
    if (automatic()) policy_.ObserveCheckpoint(sc_.delta_s);
    result_.intervals_by_phase[phase_].push_back(step_ - last_checkpoint_);
    last_checkpoint_ = step_;
    ++result_.checkpoints;
    save_at_ = NextSave();
  }

  void Report() {
    if (automatic()) {
      policy_.ObserveStepTime(sc_.step_s);
      FeedExposureUntil(t_);
    }
    save_at_ = NextSave();
    next_report_ = step_ + sc_.report_steps;
  }

  // Enters the next phase once the job first reaches its share of the work.
  void AdvancePhase() {
    max_step_ = std::max(max_step_, step_);
    while (phase_ + 1 < sc_.phases.size() &&
           max_step_ >= sc_.phases[phase_].until_work_fraction * total_steps_) {
      ++phase_;
      // Inter-failure times are memoryless: draw the next failure under the new rate.
      next_failure_ = DrawFailureAfter(t_);
    }
  }

  const Scenario& sc_;
  const Rule rule_;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> unit_exp_{1.0};
  const int64_t total_steps_;
  CheckpointPolicy policy_;
  RunResult result_;

  size_t phase_ = 0;
  double t_ = 0;          // wall clock, seconds
  double fed_until_ = 0;  // exposure handed to the policy so far
  double next_failure_ = 0;
  int64_t step_ = 0;
  int64_t max_step_ = 0;
  int64_t last_checkpoint_ = 0;
  std::optional<int64_t> save_at_;
  int64_t next_report_ = 0;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

struct Row {
  std::string label;
  double total_h = 0;
  double goodput = 0;
  double failures = 0;
  double checkpoints = 0;
  std::vector<double> interval_by_phase;  // median steps between saves
  std::vector<double> totals_h;           // per seed, for paired comparisons
};

// Medians over seeds 1000, 1001, ...
Row Summarise(const Scenario& sc, Rule rule, const EstimatorFlags& flags, int seeds) {
  std::vector<double> totals, goodputs, failures, checkpoints;
  std::vector<std::vector<double>> intervals(sc.phases.size());
  for (int s = 0; s < seeds; ++s) {
    const RunResult r = JobSimulation(sc, rule, flags, 1000 + s).Run();
    totals.push_back(r.total_s / 3600);
    goodputs.push_back(sc.work_h * 3600 / r.total_s);
    failures.push_back(r.failures);
    checkpoints.push_back(r.checkpoints);
    for (size_t p = 0; p < sc.phases.size(); ++p) {
      const auto& steps = r.intervals_by_phase[p];
      if (!steps.empty()) intervals[p].push_back(Median({steps.begin(), steps.end()}));
    }
  }
  Row row;
  switch (rule.kind) {
    case Rule::kAuto:
      row.label = "auto";
      break;
    case Rule::kFixed:
      row.label = absl::StrFormat("%d", rule.every);
      break;
    case Rule::kOracle:
      row.label = "oracle (Daly at the true MTBF)";
      break;
  }
  row.totals_h = totals;
  row.total_h = Median(totals);
  row.goodput = Median(goodputs);
  row.failures = Median(failures);
  row.checkpoints = Median(checkpoints);
  for (const auto& phase : intervals) {
    row.interval_by_phase.push_back(phase.empty() ? 0 : Median(phase));
  }
  return row;
}

void PrintScenario(const Scenario& sc, const std::vector<int64_t>& fixed,
                   const EstimatorFlags& flags, int seeds) {
  std::printf("## %s\n\n", sc.name.c_str());
  std::vector<std::string> phases;
  for (const Phase& p : sc.phases) {
    phases.push_back(absl::StrFormat("MTBF %.2f h until %.0f%% of the work", p.mtbf_s / 3600,
                                     100 * p.until_work_fraction));
  }
  std::printf("- true failure rate: %s\n", absl::StrJoin(phases, ", then ").c_str());
  const double prior_job_s = absl::ToDoubleSeconds(sc.prior_node_mtbf) / sc.nodes;
  std::printf("- policy prior: %.0f h per node / %d nodes = job MTBF %.2f h\n",
              absl::ToDoubleHours(sc.prior_node_mtbf), sc.nodes, prior_job_s / 3600);
  std::printf("- Daly's optimum for each true MTBF: %s\n\n",
              absl::StrJoin(sc.phases, ", ", [&](std::string* out, const Phase& p) {
                const double tau = CheckpointPolicy::DalyInterval(sc.delta_s, p.mtbf_s);
                absl::StrAppendFormat(out, "%.0f s = %.0f steps at %.2f h", tau, tau / sc.step_s,
                                      p.mtbf_s / 3600);
              }).c_str());

  std::vector<Row> rows;
  rows.push_back(Summarise(sc, {Rule::kAuto}, flags, seeds));
  for (int64_t every : fixed) rows.push_back(Summarise(sc, {Rule::kFixed, every}, flags, seeds));
  const size_t best =
      std::min_element(rows.begin() + 1, rows.end(),
                       [](const Row& a, const Row& b) { return a.total_h < b.total_h; }) -
      rows.begin();
  rows.push_back(Summarise(sc, {Rule::kOracle}, flags, seeds));  // a bound, not a candidate

  std::printf(
      "| every_steps | time to finish, h | goodput | vs best fixed | failures | saves | "
      "steps between saves, per phase |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---|\n");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    std::vector<std::string> intervals;
    for (double steps : row.interval_by_phase) intervals.push_back(absl::StrFormat("%.0f", steps));
    std::printf("| %s%s | %.2f | %.4f | %+.2f%% | %.0f | %.0f | %s |\n", row.label.c_str(),
                i == best ? " (best fixed)" : "", row.total_h, row.goodput,
                100 * (row.total_h / rows[best].total_h - 1), row.failures, row.checkpoints,
                absl::StrJoin(intervals, " / ").c_str());
  }
  std::printf(
      "\n**`auto` vs the best fixed interval (%s steps): time to finish %+.2f%%, goodput %.4f vs "
      "%.4f.**\n\n",
      rows[best].label.c_str(), 100 * (rows[0].total_h / rows[best].total_h - 1), rows[0].goodput,
      rows[best].goodput);
  std::printf("Seed by seed, `auto` finished first against:");
  for (size_t i = 1; i + 1 < rows.size(); ++i) {
    int wins = 0;
    for (size_t s = 0; s < rows[0].totals_h.size(); ++s)
      wins += rows[0].totals_h[s] < rows[i].totals_h[s];
    std::printf("%s %s %.0f%%", i == 1 ? "" : ",", rows[i].label.c_str(),
                100.0 * wins / rows[0].totals_h.size());
  }
  std::printf(" of seeds.\n\n");
}

}  // namespace
}  // namespace trainyard::server

int main(int argc, char** argv) {
  using trainyard::server::EstimatorFlags;
  using trainyard::server::Scenario;
  int seeds = 200;
  EstimatorFlags flags;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seeds") == 0 && i + 1 < argc) {
      seeds = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--memory_mtbfs") == 0 && i + 1 < argc) {
      flags.memory_mtbfs = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--prior_failures") == 0 && i + 1 < argc) {
      flags.prior_failures = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--seeds N] [--memory_mtbfs H] [--prior_failures A0]\n",
                   argv[0]);
      return 2;
    }
  }
  if (seeds < 1 || (flags.memory_mtbfs && !(*flags.memory_mtbfs > 0)) ||
      (flags.prior_failures && !(*flags.prior_failures > 0))) {
    std::fprintf(stderr, "--seeds, --memory_mtbfs and --prior_failures must be positive\n");
    return 2;
  }

  Scenario constant;
  constant.name = "Scenario 1: constant failure rate, prior 4x optimistic";
  constant.prior_node_mtbf = absl::Hours(4 * 128);  // truth: 128 h per node, 2 h for 64 nodes
  constant.phases = {{1.0, 2 * 3600.0}};

  Scenario change;
  change.name = "Scenario 2: failure rate rises 16x halfway through the work";
  change.prior_node_mtbf = absl::Hours(8 * 64);  // right for the first half
  change.phases = {{0.5, 8 * 3600.0}, {1.0, 0.5 * 3600.0}};

  const std::vector<int64_t> fixed = {8,  12, 16, 24,  32,  40,  48,  56,  64,
                                      72, 80, 96, 112, 128, 160, 192, 256, 384};

  const trainyard::server::CheckpointPolicyOptions defaults;
  std::printf("# Young–Daly `auto` checkpoint interval vs fixed intervals (simulated)\n\n");
  std::printf(
      "- work: %.0f h in steps of %.0f s (%lld steps); a save blocks training for δ = %.0f s "
      "and commits when the block ends; a failure costs R = %.0f s (detection, restart, "
      "restore) plus the work since the last committed save\n",
      constant.work_h, constant.step_s,
      static_cast<long long>(constant.work_h * 3600 / constant.step_s), constant.delta_s,
      constant.restart_s);
  std::printf(
      "- failures: exponential inter-failure times on the wall clock, restarts included "
      "(a restart can fail too)\n");
  std::printf(
      "- `auto`: CheckpointPolicy, %d nodes, memory_mtbfs %g, prior_failures %g, other options "
      "default; fed what the coordinator feeds it: a step time and the running exposure with "
      "each progress report (every %d steps), δ for each committed save, each failure; asked "
      "for the next save at each report, save and restart\n",
      constant.nodes, flags.memory_mtbfs.value_or(defaults.memory_mtbfs),
      flags.prior_failures.value_or(defaults.prior_failures), constant.report_steps);
  std::printf(
      "- every figure is the median over %d seeds (1000..%d); each seed gives every rule the "
      "same stream of random draws\n\n",
      seeds, 1000 + seeds - 1);

  trainyard::server::PrintScenario(constant, fixed, flags, seeds);
  trainyard::server::PrintScenario(change, fixed, flags, seeds);
  return 0;
}
