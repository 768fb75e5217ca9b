// libFuzzer target: the job spec parser and validator (config::ParseJobSpec) on arbitrary bytes,
// as SubmitJob hands a request's spec_yaml to it. Every input must give a spec or a Status,
// never a crash, a hang or a sanitizer report. Every input the common form's reader takes must
// also be read by yaml-cpp, to the same tree (a difference aborts).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "config/spec.h"
#include "config/yaml_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<trainyard::config::JobSpec> spec = trainyard::config::ParseJobSpec(text, "fuzz");
  if (spec.ok()) (void)spec->world_size();
  const trainyard::config::YamlLimits limits;
  if (std::optional<trainyard::config::YamlNode> common =
          trainyard::config::ParseCommonYaml(text, limits.max_depth)) {
    absl::StatusOr<trainyard::config::YamlNode> full =
        trainyard::config::ParseYamlTreeWithYamlCpp(text, "fuzz", limits);
    if (!full.ok() || !trainyard::config::SameYamlTree(*common, *full)) std::abort();
  }
  return 0;
}
