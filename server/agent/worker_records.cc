#include "server/agent/worker_records.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainyard::server::agent {
namespace {

constexpr char kHeader[] = "trainyard-agent-workers 1";

}  // namespace

bool IsSafeJobId(std::string_view job_id) {
  if (job_id.empty() || job_id.size() > 128 || job_id == "." || job_id == "..") return false;
  for (char c : job_id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

std::string SerializeWorkerRecords(const std::vector<WorkerRecord>& records) {
  std::string text = absl::StrCat(kHeader, "\n");
  for (const WorkerRecord& r : records) {
    absl::StrAppend(&text, r.key.job_id, " ", r.key.attempt_id, " ", r.key.rank, " ", r.process.pid,
                    " ", r.process.start_ticks, " ", r.started_unix_ms, "\n");
  }
  return text;
}

absl::StatusOr<std::vector<WorkerRecord>> ParseWorkerRecords(std::string_view text) {
  std::vector<WorkerRecord> records;
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(text.data(), text.size()), '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kHeader) {
    return absl::InvalidArgumentError(absl::StrCat("line 1: expected '", kHeader, "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<absl::string_view> f = absl::StrSplit(lines[i], ' ');
    WorkerRecord r;
    if (f.size() != 6 || !IsSafeJobId(std::string_view(f[0].data(), f[0].size())) ||
        !absl::SimpleAtoi(f[1], &r.key.attempt_id) || !absl::SimpleAtoi(f[2], &r.key.rank) ||
        !absl::SimpleAtoi(f[3], &r.process.pid) ||
        !absl::SimpleAtoi(f[4], &r.process.start_ticks) ||
        !absl::SimpleAtoi(f[5], &r.started_unix_ms) || r.process.pid <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("line ", i + 1, ": malformed worker record"));
    }
    r.key.job_id = std::string(f[0]);
    records.push_back(std::move(r));
  }
  return records;
}

}  // namespace trainyard::server::agent
