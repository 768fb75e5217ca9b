// Cross-field checks of a JobSpec, shared by ValidateJobSpec and the YAML parser (which turns the
// offending field path back into a line and column).
#ifndef TRAINYARD_CONFIG_SPEC_VALIDATION_H_
#define TRAINYARD_CONFIG_SPEC_VALIDATION_H_

#include <optional>
#include <string>
#include <vector>

#include "config/spec.h"

namespace trainyard::config {

struct SpecProblem {
  std::string path;    // the field to fix, e.g. "training.micro_batch"
  std::string reason;  // one line, e.g. "batch 16 is not divisible by micro_batch 5"
  // Other fields the rule involves, most relevant first ("training.batch"): where to point when
  // `path` itself was left at its default and one of these was written.
  std::vector<std::string> related;
};

// The first problem found, or nothing when the spec is consistent and its paths lie under
// `limits`' roots.
std::optional<SpecProblem> FindSpecProblem(const JobSpec& spec,
                                           const SpecLimits& limits = SpecLimits());

}  // namespace trainyard::config

#endif  // TRAINYARD_CONFIG_SPEC_VALIDATION_H_
