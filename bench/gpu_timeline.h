// Every kernel, copy and fill the GPU ran during chosen training steps, on the device's own
// clock, through CUPTI's activity API (the record nsys builds its timelines from, without nsys).
// A step is the span between two marks; the summary accounts for its wall time: each kernel's
// share, the device's busy time (the union of its activities), and the idle gaps between
// activities with the kernels on either side, which is where host work and syncs show.
//
//   auto timeline = KernelTimeline::Start();   // before the first kernel worth recording
//   ... timeline->Mark() at each step boundary ...
//   std::string json = timeline->Finish("trainyard", "gpt2-124m");
//
// One per process (CUPTI's buffers are delivered to process-wide callbacks).
#ifndef TRAINYARD_BENCH_GPU_TIMELINE_H_
#define TRAINYARD_BENCH_GPU_TIMELINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainyard::bench {

class KernelTimeline {
 public:
  // Enables kernel, memcpy and memset records; fails where CUPTI cannot be initialised.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KernelTimeline>> Start();
  ~KernelTimeline();
  KernelTimeline(const KernelTimeline&) = delete;
  KernelTimeline& operator=(const KernelTimeline&) = delete;

  // A step boundary, on the clock of the activity records. Records are clipped to the span from
  // the first mark to the last (what lies outside it is left out).
  void Mark();
  int marks() const { return static_cast<int>(marks_ns_.size()); }

  // Flushes and stops recording, then summarises the steps between the marks as one JSON
  // object (bench/timeline_report.py renders it beside PyTorch's).
  [[nodiscard]] absl::StatusOr<std::string> Finish(const std::string& engine,
                                                   const std::string& preset);

 private:
  KernelTimeline() = default;
  std::vector<uint64_t> marks_ns_;
  bool finished_ = false;
};

}  // namespace trainyard::bench

#endif  // TRAINYARD_BENCH_GPU_TIMELINE_H_
