#include "tools/cli/format.h"

#include <google/protobuf/util/json_util.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "planner/run_report_proto.h"
#include "tools/cli/checkpoint_format.h"

namespace trainyard::cli {
namespace {

constexpr int kExitLinesShown = 20;
constexpr int kEventsShown = 10;

std::string SignalName(int signal) {
  static const std::map<int, const char*> kNames = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"},
      {SIGSEGV, "SIGSEGV"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}};
  auto it = kNames.find(signal);
  return it == kNames.end() ? absl::StrCat("signal ", signal) : it->second;
}

std::string Step(const v1::Progress& p) {
  if (p.total_steps() <= 0) return "-";
  return absl::StrCat(p.step(), "/", p.total_steps());
}

std::string Loss(const v1::Progress& p) {
  if (p.step() <= 0) return "-";
  return absl::StrFormat("%.4f", p.loss());
}

std::string Age(int64_t since_ms, int64_t now_ms) {
  return since_ms > 0 ? FormatDuration(now_ms - since_ms) : "-";
}

std::string Labels(const google::protobuf::Map<std::string, std::string>& labels) {
  std::map<std::string, std::string> sorted(labels.begin(), labels.end());
  return absl::StrJoin(sorted, ", ", absl::PairFormatter("="));
}

std::string Mesh(const v1::Mesh& m) {
  // cp and ep shown only above 1 (0: a coordinator from before them), as the planner's MeshName
  // does.
  return absl::StrCat("dp ", m.dp(),
                      m.ep() > 1 ? absl::StrCat(" (experts over ep ", m.ep(), ")") : "",
                      m.cp() > 1 ? absl::StrCat(" × cp ", m.cp()) : "", " × tp ", m.tp(), " × pp ",
                      m.pp(), ", ZeRO-", m.zero_stage());
}

// The attempt's mesh and ranks, and the spec's ranks where an elastic attempt runs on others.
std::string MeshRow(const v1::Mesh& m, int spec_ranks) {
  const int64_t ranks = int64_t{m.dp()} * std::max(m.cp(), 1) * m.tp() * m.pp();
  std::string row = absl::StrCat(Mesh(m), ", ", ranks > 0 ? ranks : spec_ranks, " ranks");
  if (ranks > 0 && ranks != spec_ranks) {
    absl::StrAppend(&row, " (resized: the spec asks for ", spec_ranks, ")");
  }
  return row;
}

// A rank that exited badly on its own; one that ended after a stop order (a cancel, a drain, the
// end of its attempt after another rank failed) is not a failure.
bool Failed(const v1::RankExit& exit) {
  return !exit.stopped() && (exit.signal() != 0 || exit.exit_code() != 0);
}

std::string Seconds(double s) { return FormatDuration(static_cast<int64_t>(s * 1000 + 0.5)); }

// What failure handling knows of the job: its last failure, restart budgets, backoff, hang
// limit, Young–Daly interval, goodput and stragglers.
void AppendHealthRows(const v1::Job& job, int64_t now_ms,
                      std::vector<std::vector<std::string>>& rows) {
  const v1::FailureSummary& f = job.last_failure();
  if (!f.failure_class().empty()) {
    rows.push_back({"failure", absl::StrFormat("%s (attempt %d, detected %s after the fault): %s",
                                               f.failure_class(), f.attempt_id(),
                                               Seconds(f.detection_seconds()), f.cause())});
  }
  if (job.restart_budgets_size() > 0 && !IsFinal(job.state())) {
    std::vector<std::string> budgets;
    for (const v1::RestartBudget& b : job.restart_budgets()) {
      budgets.push_back(absl::StrCat(b.failure_class(), " ", b.used(), "/", b.budget()));
    }
    rows.push_back({"restarts", absl::StrCat(absl::StrJoin(budgets, ", "), " (of ",
                                             job.max_restarts(), " in all)")});
  }
  if (job.restart_at_unix_ms() > 0) {
    rows.push_back(
        {"backoff", absl::StrCat("next attempt in ", FormatDuration(std::max<int64_t>(
                                                         0, job.restart_at_unix_ms() - now_ms)))});
  }
  if (job.hang_limit_s() > 0) {
    rows.push_back({"hang limit", job.hang_limit_of().empty()
                                      ? Seconds(job.hang_limit_s())
                                      : absl::StrCat(Seconds(job.hang_limit_s()), " (",
                                                     job.hang_limit_of(), ")")});
  }
  if (job.has_young_daly()) {
    const v1::YoungDaly& y = job.young_daly();
    std::string text =
        y.checkpoint_cost_s() > 0
            ? absl::StrFormat("δ %.3f s per save, M %s", y.checkpoint_cost_s(), Seconds(y.mtbf_s()))
            : absl::StrCat("δ not measured yet, M ", Seconds(y.mtbf_s()));
    if (y.interval_s() > 0) absl::StrAppend(&text, ", τ ", Seconds(y.interval_s()));
    if (y.interval_steps() > 0) absl::StrAppend(&text, " = ", y.interval_steps(), " steps");
    if (y.next_step() > 0) absl::StrAppend(&text, "; next save at step ", y.next_step());
    rows.push_back({"young-daly", text});
  }
  const v1::Goodput& g = job.goodput();
  if (g.wall_s() > 0) {
    double restart = 0, lost = 0;
    for (const auto& [cause, s] : g.restart_s()) restart += s;
    for (const auto& [cause, s] : g.lost_s()) lost += s;
    rows.push_back(
        {"goodput", absl::StrFormat("%.1f%% of %s (checkpoints %s, start-up %s, "
                                    "restarts %s, lost work %s, other %s)",
                                    100 * g.ratio(), Seconds(g.wall_s()), Seconds(g.checkpoint_s()),
                                    Seconds(g.startup_s()), Seconds(restart), Seconds(lost),
                                    Seconds(g.other_s()))});
  }
  for (const v1::Straggler& s : job.stragglers()) {
    rows.push_back({"straggler", absl::StrFormat("rank %d on %s computes %.2f× its peers' median",
                                                 s.rank(), s.node_id(), s.score())});
  }
}

// The balancing rule's figure of an MoE layer: its aux loss or its selection bias's spread (both
// when the report did not say which rule the job uses), and its router z-loss when it has one.
std::string MoeBalanceText(const v1::MoeLayerProgress& layer) {
  const std::string aux = absl::StrFormat("aux loss %.4g", layer.aux_loss());
  const std::string bias = absl::StrFormat("bias spread %.4g", layer.bias_spread());
  const std::string z =
      layer.z_loss() > 0 ? absl::StrFormat(", router z-loss %.4g", layer.z_loss()) : "";
  switch (layer.balance()) {
    case v1::MOE_BALANCE_AUX_LOSS:
      return aux + z;
    case v1::MOE_BALANCE_BIAS:
      return bias + z;
    default:
      return absl::StrCat(aux, ", ", bias, z);
  }
}

// An MoE job's routing, one row per MoE layer, over the steps of the newest report that carried
// it; nothing for a dense job.
void AppendMoeRouting(const v1::Progress& p, std::string* text) {
  if (p.moe_size() == 0) return;
  absl::StrAppend(text, "moe routing (tokens per expert over the last ", p.moe(0).steps(),
                  p.moe(0).steps() == 1 ? " step" : " steps", "):\n");
  std::vector<std::vector<std::string>> rows = {
      {"LAYER", "MIN", "MAX", "CV", "MAX SHARE", "DEAD", "DROPPED", "BALANCE"}};
  for (const v1::MoeLayerProgress& layer : p.moe()) {
    rows.push_back({absl::StrCat(layer.layer()), FormatCount(layer.tokens_min()),
                    FormatCount(layer.tokens_max()), absl::StrFormat("%.3f", layer.tokens_cv()),
                    absl::StrFormat("%.3f", layer.tokens_max_share()),
                    absl::StrCat(layer.dead_experts(), "/", layer.tokens_per_expert_size()),
                    FormatCount(layer.dropped()), MoeBalanceText(layer)});
  }
  for (absl::string_view line : absl::StrSplit(Table(rows), '\n', absl::SkipEmpty())) {
    absl::StrAppend(text, "  ", line, "\n");
  }
}

void AppendFailures(const v1::GetJobReply& reply, std::string* text) {
  bool header = false;
  for (int a = reply.attempts_size() - 1; a >= 0; --a) {
    const v1::Attempt& attempt = reply.attempts(a);
    const bool latest = a == reply.attempts_size() - 1;
    for (const v1::RankExit& exit : attempt.exits()) {
      if (!Failed(exit)) continue;
      if (!header) {
        absl::StrAppend(text, "failures (newest first):\n");
        header = true;
      }
      absl::StrAppend(text, "  attempt ", attempt.attempt_id(), ": rank ", exit.rank(), " on node ",
                      exit.node_id(), exit.hostname().empty() ? "" : " (", exit.hostname(),
                      exit.hostname().empty() ? "" : ")", ": ", FormatExit(exit),
                      exit.pid() > 0 ? absl::StrCat(", pid ", exit.pid()) : "",
                      exit.message().empty() ? "" : absl::StrCat(" - ", exit.message()), "\n");
      if (!latest) continue;  // the log lines of the latest attempt only
      const int first = std::max(0, exit.last_log_lines_size() - kExitLinesShown);
      for (int i = first; i < exit.last_log_lines_size(); ++i) {
        absl::StrAppend(text, "    | ", exit.last_log_lines(i), "\n");
      }
    }
  }
}

}  // namespace

std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string text;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&text, line, "\n");
  }
  return text;
}

bool IsFinal(v1::JobState state) { return OutcomeExitCode(state) >= 0; }

std::string StateName(v1::JobState state) {
  return std::string(absl::StripPrefix(v1::JobState_Name(state), "JOB_STATE_"));
}

std::string AttemptStateName(v1::AttemptState state) {
  return std::string(absl::StripPrefix(v1::AttemptState_Name(state), "ATTEMPT_STATE_"));
}

std::string FormatDuration(int64_t millis) {
  if (millis < 0) return "-";
  if (millis < 1000) return absl::StrCat(millis, "ms");
  const int64_t s = millis / 1000;
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

std::string FormatCount(double value) {
  if (!std::isfinite(value)) return "-";
  const double magnitude = std::fabs(value);
  if (magnitude < 1e3) return absl::StrFormat("%.0f", value);
  if (magnitude < 1e6) return absl::StrFormat("%.1fk", value / 1e3);
  if (magnitude < 1e9) return absl::StrFormat("%.2fM", value / 1e6);
  return absl::StrFormat("%.2fG", value / 1e9);
}

std::string FormatExit(const v1::RankExit& exit) {
  if (exit.signal() != 0) {
    return absl::StrCat("killed by signal ", exit.signal(), " (", SignalName(exit.signal()), ")");
  }
  if (exit.exit_code() < 0) return "exit status unknown";
  return absl::StrCat("exit code ", exit.exit_code());
}

std::string FormatTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string ProgressBar(double fraction, int width) {
  if (!(fraction >= 0)) fraction = 0;
  fraction = std::min(fraction, 1.0);
  const int filled = static_cast<int>(std::lround(fraction * width));
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '-'), "]");
}

std::string Sparkline(const std::vector<double>& values, int width) {
  static const char* const kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::vector<double> shown;
  for (auto it = values.rbegin(); it != values.rend() && static_cast<int>(shown.size()) < width;
       ++it) {
    if (std::isfinite(*it)) shown.push_back(*it);
  }
  std::reverse(shown.begin(), shown.end());
  if (shown.empty()) return "";
  const auto [lo, hi] = std::minmax_element(shown.begin(), shown.end());
  const double low = *lo, range = *hi - *lo;
  std::string line;
  for (double v : shown) {
    const int level = range > 0 ? static_cast<int>(std::lround((v - low) / range * 7)) : 3;
    line += kBlocks[std::clamp(level, 0, 7)];
  }
  return line;
}

std::string WatchLine(const v1::Job& job, const std::vector<double>& losses, int64_t now_ms) {
  std::string line = absl::StrCat(job.id(), " ", job.name(), " ", StateName(job.state()));
  if (job.attempts() > 1) absl::StrAppend(&line, " (attempt ", job.attempts(), ")");
  const v1::Progress& p = job.progress();
  if (p.total_steps() <= 0) {
    absl::StrAppend(&line, " | ",
                    !job.waiting_reason().empty()         ? job.waiting_reason()
                    : job.state() == v1::JOB_STATE_QUEUED ? "waiting for slots"
                                                          : "no progress yet");
    return line;
  }
  const double fraction = static_cast<double>(p.step()) / p.total_steps();
  absl::StrAppendFormat(&line, " %s %3.0f%% | step %d/%d | loss %.4f", ProgressBar(fraction, 24),
                        100 * fraction, p.step(), p.total_steps(), p.loss());
  const std::string sparkline = Sparkline(losses, 30);
  if (!sparkline.empty()) absl::StrAppend(&line, " ", sparkline);
  if (p.tokens_per_second() > 0) {
    absl::StrAppend(&line, " | ", FormatCount(p.tokens_per_second()), " tok/s");
  }
  if (p.eta_ms() >= 0 && p.step() < p.total_steps()) {
    absl::StrAppend(&line, " | ETA ", FormatDuration(p.eta_ms()));
  }
  (void)now_ms;
  return line;
}

std::string OutcomeLine(const v1::Job& job) {
  std::string line = absl::StrCat(job.id(), " ", job.name(), " ", StateName(job.state()));
  const int64_t start = job.started_unix_ms() > 0 ? job.started_unix_ms() : job.created_unix_ms();
  if (job.finished_unix_ms() > 0 && start > 0) {
    absl::StrAppend(&line, " after ", FormatDuration(job.finished_unix_ms() - start));
  }
  const v1::Progress& p = job.progress();
  if (p.total_steps() > 0) {
    absl::StrAppendFormat(&line, " | step %d/%d | loss %.4f", p.step(), p.total_steps(), p.loss());
    if (p.has_val_loss()) absl::StrAppendFormat(&line, " | val loss %.4f", p.val_loss());
  }
  if (job.restarts() > 0) absl::StrAppend(&line, " | ", job.restarts(), " restarts");
  if (job.state() == v1::JOB_STATE_FAILED && !job.last_failure().failure_class().empty()) {
    absl::StrAppend(&line, " | ", job.last_failure().failure_class());
  }
  if (!job.message().empty()) absl::StrAppend(&line, " | ", job.message());
  return line;
}

std::string JobTable(const std::vector<v1::Job>& jobs, int64_t now_ms) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "STATE", "PRIORITY", "RANKS", "STEP", "LOSS", "AGE", "USER"}};
  for (const v1::Job& job : jobs) {
    rows.push_back({job.id(), job.name(), StateName(job.state()), absl::StrCat(job.priority()),
                    absl::StrCat(job.world_size()), Step(job.progress()), Loss(job.progress()),
                    Age(job.created_unix_ms(), now_ms), job.user().empty() ? "-" : job.user()});
  }
  // Why queued jobs wait, under the table (one line each).
  std::string notes;
  for (const v1::Job& job : jobs) {
    if (!job.waiting_reason().empty()) {
      absl::StrAppend(&notes, job.id(), " waits: ", job.waiting_reason(), "\n");
    }
  }
  return Table(rows) + notes;
}

namespace {

// `trainyard status JOB`'s rows about training: progress, the optimizer, step time and ETA.
void AddProgressRows(const v1::Job& job, std::vector<std::vector<std::string>>& rows) {
  const v1::Progress& p = job.progress();
  if (p.total_steps() > 0) {
    std::string progress =
        absl::StrFormat("step %d/%d (%.0f%%) | loss %.4f", p.step(), p.total_steps(),
                        100.0 * p.step() / p.total_steps(), p.loss());
    if (p.logit_z_loss() > 0) absl::StrAppendFormat(&progress, " | z-loss %.4g", p.logit_z_loss());
    if (p.has_val_loss()) absl::StrAppendFormat(&progress, " | val loss %.4f", p.val_loss());
    if (p.tokens_per_second() > 0) {
      absl::StrAppend(&progress, " | ", FormatCount(p.tokens_per_second()), " tok/s");
    }
    if (p.step_times().total_ms() > 0) {
      absl::StrAppendFormat(&progress, " | %.1f ms/step", p.step_times().total_ms());
    }
    rows.push_back({"progress", progress});
    if (p.step() > 0) {
      rows.push_back({"optimizer", absl::StrFormat("lr %.4g | grad norm %.4g before clipping",
                                                   p.learning_rate(), p.grad_norm())});
    }
    if (const v1::StepTimes& t = p.step_times(); t.total_ms() > 0) {
      rows.push_back(
          {"step time", absl::StrFormat("%.1f ms: forward %.1f, backward %.1f, "
                                        "optimizer %.1f, communication %.1f, data %.2f",
                                        t.total_ms(), t.forward_ms(), t.backward_ms(),
                                        t.optimizer_ms(), t.communication_ms(), t.data_ms())});
    }
    // Only a running job has a pace to extrapolate.
    rows.push_back({"ETA", job.state() == v1::JOB_STATE_RUNNING && p.eta_ms() >= 0 &&
                                   p.step() < p.total_steps()
                               ? FormatDuration(p.eta_ms())
                               : "-"});
  } else {
    rows.push_back({"progress", "none yet"});
  }
}

}  // namespace

std::string JobReport(const v1::GetJobReply& reply, int64_t now_ms) {
  const v1::Job& job = reply.job();
  const v1::Progress& p = job.progress();
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"state", StateName(job.state())});
  if (!job.waiting_reason().empty()) rows.push_back({"waiting", job.waiting_reason()});
  if (!job.user().empty()) rows.push_back({"user", job.user()});
  rows.push_back({"priority", absl::StrCat(job.priority())});
  if (!job.labels().empty()) rows.push_back({"labels", Labels(job.labels())});
  rows.push_back({"created", absl::StrCat(FormatTime(job.created_unix_ms()), " (",
                                          Age(job.created_unix_ms(), now_ms), " ago)")});
  if (job.started_unix_ms() > 0) rows.push_back({"started", FormatTime(job.started_unix_ms())});
  if (job.finished_unix_ms() > 0) {
    rows.push_back({"finished", absl::StrCat(FormatTime(job.finished_unix_ms()), " (ran ",
                                             FormatDuration(job.finished_unix_ms() -
                                                            (job.started_unix_ms() > 0
                                                                 ? job.started_unix_ms()
                                                                 : job.created_unix_ms())),
                                             ")")});
  }
  rows.push_back({"attempts", absl::StrCat(job.attempts(), " (", job.restarts(), " restarts of ",
                                           job.max_restarts(), " allowed)")});
  if (reply.attempts_size() > 0) {
    const v1::Attempt& current = reply.attempts(reply.attempts_size() - 1);
    rows.push_back({"mesh", MeshRow(current.mesh(), job.world_size())});
    std::vector<std::string> places;
    for (const v1::RankPlacement& place : current.placement()) {
      places.push_back(
          absl::StrCat(place.rank(), "→", place.node_id(), ":", place.slot(),
                       place.pid() > 0 ? absl::StrCat(" (pid ", place.pid(), ")") : ""));
    }
    rows.push_back({"placement", absl::StrCat("attempt ", current.attempt_id(), " ",
                                              AttemptStateName(current.state()), ": ",
                                              absl::StrJoin(places, ", "))});
  }
  AddProgressRows(job, rows);
  // "saving", not "checkpointing": the key column stays as wide as scripts and tests know it.
  rows.push_back({"saving", CheckpointPolicyText(job.checkpoint_policy())});
  rows.push_back({"checkpoint", LastCheckpointText(job.last_checkpoint(), now_ms)});
  if (job.cancel_requested() && job.state() != v1::JOB_STATE_CANCELLED) {
    rows.push_back({"cancel", "requested; waiting for the workers to stop"});
  }
  if (job.drain_requested() && !job.cancel_requested() && !IsFinal(job.state())) {
    rows.push_back({"drain", "requested; the ranks checkpoint at a step they agree on, then exit"});
  }
  if (!job.message().empty()) rows.push_back({"message", job.message()});
  AppendHealthRows(job, now_ms, rows);

  std::string text = absl::StrCat("job ", job.id(), " (", job.name(), ")\n");
  for (absl::string_view line : absl::StrSplit(Table(rows), '\n', absl::SkipEmpty())) {
    absl::StrAppend(&text, "  ", line, "\n");
  }
  AppendMoeRouting(p, &text);
  AppendFailures(reply, &text);
  if (p.has_run_report()) {
    absl::StrAppend(&text, planner::ComparisonText(planner::FromProto(p.run_report())));
  }
  if (reply.events_size() > 0) {
    absl::StrAppend(&text, "events (latest ", std::min(kEventsShown, reply.events_size()), "):\n");
    std::vector<std::vector<std::string>> events;
    for (int i = std::max(0, reply.events_size() - kEventsShown); i < reply.events_size(); ++i) {
      const v1::Event& e = reply.events(i);
      events.push_back({absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(e.time_unix_ms()),
                                         absl::UTCTimeZone()),
                        StateName(e.to_state()), e.kind(), e.cause()});
    }
    for (absl::string_view line : absl::StrSplit(Table(events), '\n', absl::SkipEmpty())) {
      absl::StrAppend(&text, "  ", line, "\n");
    }
  }
  return text;
}

std::string NodeTable(const std::vector<v1::Node>& nodes) {
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "HOST", "CPU SLOTS", "GPUS", "FREE", "CONNECTED", "HEARTBEAT", "SCHEDULING"}};
  for (const v1::Node& node : nodes) {
    rows.push_back({node.node_id(), node.hostname(), absl::StrCat(node.cpu_slots()),
                    absl::StrCat(node.gpus_size()), absl::StrCat(node.free_slots()),
                    node.connected() ? "yes" : "no",
                    absl::StrCat(FormatDuration(node.heartbeat_age_ms()), " ago"),
                    node.cordoned()
                        ? absl::StrCat("cordoned until ", FormatTime(node.cordoned_until_unix_ms()),
                                       ": ", node.cordon_reason())
                        : "ok"});
  }
  return Table(rows);
}

int OutcomeExitCode(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_SUCCEEDED:
      return 0;
    case v1::JOB_STATE_FAILED:
      return 1;
    case v1::JOB_STATE_CANCELLED:
      return 4;
    case v1::JOB_STATE_DRAINED:
      return 5;
    default:
      return -1;
  }
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return "{}";
  return json;
}

}  // namespace trainyard::cli
