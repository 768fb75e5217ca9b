// The sections of a job spec that say how and where it runs, as opposed to what it trains:
// parallelism, resources, checkpoint, fault_tolerance, priority and labels. Reading (YAML →
// structs, through FieldReader) and the cross-field checks, including confinement of the spec's
// paths to SpecLimits' roots.
//
// Threading: plain functions; no shared state.
#ifndef TRAINYARD_CONFIG_RUN_SECTIONS_H_
#define TRAINYARD_CONFIG_RUN_SECTIONS_H_

#include <optional>

#include "absl/status/status.h"
#include "config/field_reader.h"
#include "config/spec.h"
#include "config/spec_validation.h"

namespace trainyard::config {

inline constexpr int kMaxNodes = 4096;
inline constexpr int kMaxDevicesPerNode = 1024;
inline constexpr int kMaxRestarts = 1000;
// The failure causes a restart budget can be given for (fault_tolerance.max_restarts_by_cause).
inline constexpr const char* kRestartCauses[] = {"crash", "hang", "node_lost",
                                                 "collective_timeout"};
inline constexpr int kMaxCheckpointsKept = 1000;
inline constexpr int kMaxPriority = 1000;
inline constexpr int kMaxLabels = 32;
inline constexpr int kMaxLabelKeyLength = 63;
inline constexpr int kMaxLabelValueLength = 256;
inline constexpr double kMaxHeartbeatTimeoutSeconds = 3600;

// Reads the run sections of the top-level mapping `top` into `spec`. For `parallelism: auto` it
// only sets spec->parallelism.automatic; the caller resolves the mesh once the whole spec is read.
// fault_tolerance.min_nodes/max_nodes left out are filled in with resources.nodes.
[[nodiscard]] absl::Status ReadRunSections(FieldReader& top, JobSpec* spec);

// The first problem in the run sections (for an automatic mesh: that no mesh fits), then in the
// spec's paths under `limits`; nothing when all is well.
std::optional<SpecProblem> FindRunProblem(const JobSpec& spec, const SpecLimits& limits);

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_RUN_SECTIONS_H_
