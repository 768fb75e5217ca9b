// Human-readable output of the trainyard CLI: state names, durations, rates, exit statuses,
// progress bars and loss sparklines, the job table and the job report. Pure functions of their
// arguments (the current time is passed in), so they are unit-tested.
//
// Threading: plain functions.
#ifndef TRAINYARD_TOOLS_CLI_FORMAT_H_
#define TRAINYARD_TOOLS_CLI_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/json.h"
#include "proto/trainyard.pb.h"

namespace trainyard::cli {

namespace v1 = ::trainyard::v1;

// "RUNNING", "SUCCEEDED", ... (the enum name without its prefix).
std::string StateName(v1::JobState state);
std::string AttemptStateName(v1::AttemptState state);

// "850ms", "42s", "3m05s", "2h04m", "3d02h"; "-" for a negative duration.
std::string FormatDuration(int64_t millis);
// "950", "12.3k", "4.56M".
std::string FormatCount(double value);
// "exit code 3", "killed by signal 9 (SIGKILL)", "exit status unknown".
std::string FormatExit(const v1::RankExit& exit);
// A UTC timestamp, "2026-11-22 03:20:01 UTC"; "-" for 0.
std::string FormatTime(int64_t unix_ms);

// Left-aligned columns, two spaces apart (widths in bytes), one line per row.
std::string Table(const std::vector<std::vector<std::string>>& rows);

// "[########------------]" with `width` cells inside the brackets; `fraction` is clamped to [0, 1].
std::string ProgressBar(double fraction, int width);
// The last `width` values as block characters ("▁▂▃▄▅▆▇█") scaled between their minimum and
// maximum; non-finite values are skipped; "" for no values.
std::string Sparkline(const std::vector<double>& values, int width);

// The one-line live view of a job: name, state, bar, step, loss, sparkline, throughput, ETA.
std::string WatchLine(const v1::Job& job, const std::vector<double>& losses, int64_t now_ms);
// The line printed when a watched job ends.
std::string OutcomeLine(const v1::Job& job);

// `trainyard list`: one row per job under a header.
std::string JobTable(const std::vector<v1::Job>& jobs, int64_t now_ms);
// `trainyard status`: the job, its attempts, progress, checkpoint policy and newest committed
// checkpoint, an MoE job's routing per MoE layer, the failures with their last log lines, events.
std::string JobReport(const v1::GetJobReply& reply, int64_t now_ms);
// `trainyard nodes`.
std::string NodeTable(const std::vector<v1::Node>& nodes);

// The job's outcome as the CLI's exit code: 0 SUCCEEDED, 1 FAILED, 4 CANCELLED, 5 DRAINED, -1
// not final.
int OutcomeExitCode(v1::JobState state);
// SUCCEEDED, FAILED, CANCELLED or DRAINED.
bool IsFinal(v1::JobState state);

// The message as one line of JSON (proto field names, enums by name).
std::string ToJson(const google::protobuf::Message& message);

}  // namespace trainyard::cli

#endif  // TRAINYARD_TOOLS_CLI_FORMAT_H_
