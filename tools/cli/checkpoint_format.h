// Human-readable output about checkpoints: sizes, the checkpoint policy and the newest committed
// checkpoint (rows of `trainyard status`), and the table of `trainyard checkpoints`. Pure
// functions of their arguments (the current time and the time zone are passed in).
//
// Threading: plain functions.
#ifndef TRAINYARD_TOOLS_CLI_CHECKPOINT_FORMAT_H_
#define TRAINYARD_TOOLS_CLI_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/trainyard.pb.h"

namespace trainyard::cli {

namespace v1 = ::trainyard::v1;

// "512 B", "1.5 KiB", "12.3 MiB", "1.20 GiB", "3.00 TiB"; "-" for a negative size.
std::string FormatBytes(int64_t bytes);
// "COMMITTED", "FAILED", "SKIPPED" (the enum name without its prefix).
std::string CheckpointStateName(v1::CheckpointState state);
// "every 50 steps, keep 3, dir ckpt/run"; for `every_steps: auto` "every 100 steps (auto: a
// fixed interval until the Young–Daly policy exists), keep 3, dir ckpt/run"; "off (the spec has
// no checkpoint.dir)".
std::string CheckpointPolicyText(const v1::CheckpointPolicy& policy);
// "step 200, 3m05s ago, 12.3 MiB, ckpt/run/step-200" (the size left out when unknown); "none".
std::string LastCheckpointText(const v1::Checkpoint& checkpoint, int64_t now_ms);
// `trainyard checkpoints`: one row per record (step, time in `zone`, size, write seconds,
// blocked seconds, state, path, and why for a failed or skipped save) under a header;
// "no checkpoints yet\n" when there are none.
std::string CheckpointTable(const std::vector<v1::Checkpoint>& checkpoints, absl::TimeZone zone);

}  // namespace trainyard::cli

#endif  // TRAINYARD_TOOLS_CLI_CHECKPOINT_FORMAT_H_
