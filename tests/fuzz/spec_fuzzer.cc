// libFuzzer target: the job spec parser and validator (config::ParseJobSpec) on arbitrary bytes,
// as SubmitJob hands a request's spec_yaml to it. Every input must give a spec or a Status,
// never a crash, a hang or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<trainyard::config::JobSpec> spec = trainyard::config::ParseJobSpec(text, "fuzz");
  if (spec.ok()) (void)spec->world_size();
  return 0;
}
