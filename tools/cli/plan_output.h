// The output of `trainyard plan`: the human table and the --json object (docs/planner.md).
//
// Threading: plain functions.
#ifndef TRAINYARD_TOOLS_CLI_PLAN_OUTPUT_H_
#define TRAINYARD_TOOLS_CLI_PLAN_OUTPUT_H_

#include <string>

#include "config/spec.h"
#include "planner/calibration.h"
#include "planner/planner.h"

namespace trainyard::cli {

// One line of JSON: {"candidates": [...], "chosen": INDEX|null, "explanation": "...",
// "young_daly": {...}|null}.
std::string PlanJson(const planner::Plan& plan);

// The header (job, world, device), one row per candidate, the explanation one sentence per line,
// and the Young–Daly interval when asked for.
std::string PlanText(const planner::Plan& plan, const config::JobSpec& spec);

// What --calibrate measured and where it was stored.
// What one calibration measured, where the profile is stored, and of how many calibrations
// (`kept`, this one included) the stored profile is the median.
std::string CalibrationText(const planner::Calibration& c, const std::string& path, int kept);
std::string CalibrationJson(const planner::Calibration& c, const std::string& path, int kept);

}  // namespace trainyard::cli

#endif  // TRAINYARD_TOOLS_CLI_PLAN_OUTPUT_H_
