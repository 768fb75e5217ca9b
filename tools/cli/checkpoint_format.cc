#include "tools/cli/checkpoint_format.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "tools/cli/format.h"

namespace trainyard::cli {
namespace {

std::string Seconds(double seconds) { return absl::StrFormat("%.2fs", seconds); }

// The path column: the path, and why for a save that did not commit.
std::string Where(const v1::Checkpoint& checkpoint) {
  std::string where = checkpoint.path().empty() ? "-" : checkpoint.path();
  if (!checkpoint.message().empty()) absl::StrAppend(&where, " (", checkpoint.message(), ")");
  return where;
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  if (bytes < 0) return "-";
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat(unit >= 2 ? "%.2f %s" : "%.1f %s", value, kUnits[unit]);
}

std::string CheckpointStateName(v1::CheckpointState state) {
  return std::string(absl::StripPrefix(v1::CheckpointState_Name(state), "CHECKPOINT_STATE_"));
}

std::string CheckpointPolicyText(const v1::CheckpointPolicy& policy) {
  if (policy.dir().empty()) return "off (the spec has no checkpoint.dir)";
  std::string interval = absl::StrCat("every ", policy.every_steps(), " steps");
  if (policy.interval_auto()) {
    interval = policy.every_steps() > 0
                   ? absl::StrCat(interval, " (auto: Young–Daly, see young-daly)")
                   : "auto (Young–Daly: the interval follows the first measured save)";
  }
  return absl::StrCat(interval, ", keep ", policy.keep(), ", dir ", policy.dir());
}

std::string LastCheckpointText(const v1::Checkpoint& checkpoint, int64_t now_ms) {
  if (checkpoint.path().empty()) return "none";
  std::string text = absl::StrCat("step ", checkpoint.step());
  if (checkpoint.written_unix_ms() > 0) {
    absl::StrAppend(&text, ", ", FormatDuration(now_ms - checkpoint.written_unix_ms()), " ago");
  }
  if (checkpoint.bytes() > 0) absl::StrAppend(&text, ", ", FormatBytes(checkpoint.bytes()));
  absl::StrAppend(&text, ", ", checkpoint.path());
  return text;
}

std::string CheckpointTable(const std::vector<v1::Checkpoint>& checkpoints, absl::TimeZone zone) {
  if (checkpoints.empty()) return "no checkpoints yet\n";
  std::vector<std::vector<std::string>> rows = {
      {"STEP", "TIME", "SIZE", "WRITE", "BLOCKED", "STATE", "PATH"}};
  for (const v1::Checkpoint& c : checkpoints) {
    const bool committed = c.state() == v1::CHECKPOINT_STATE_COMMITTED;
    rows.push_back({absl::StrCat(c.step()),
                    c.written_unix_ms() > 0
                        ? absl::FormatTime("%Y-%m-%d %H:%M:%S %Z",
                                           absl::FromUnixMillis(c.written_unix_ms()), zone)
                        : "-",
                    committed || c.bytes() > 0 ? FormatBytes(c.bytes()) : "-",
                    committed ? Seconds(c.write_seconds()) : "-", Seconds(c.blocked_seconds()),
                    CheckpointStateName(c.state()), Where(c)});
  }
  return Table(rows);
}

}  // namespace trainyard::cli
