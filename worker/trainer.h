// The single-process training loop: data → micro-batches → forward/backward → clip → AdamW,
// with periodic validation and a progress line every few steps.
#ifndef TRAINYARD_WORKER_TRAINER_H_
#define TRAINYARD_WORKER_TRAINER_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "config/spec.h"
#include "worker/backend.h"
#include "worker/optimizer.h"

namespace trainyard::worker {

struct TrainOptions {
  FileSystem* fs = nullptr;          // defaults to RealFileSystem()
  Clock* clock = nullptr;            // defaults to RealClock()
  std::ostream* progress = nullptr;  // progress lines; none when null
};

struct EvalPoint {
  int64_t step;  // optimizer steps completed when it was measured
  double loss;   // mean validation cross-entropy, nats per token
};

struct TrainResult {
  std::vector<double> train_losses;  // mean loss of every optimizer step
  std::vector<EvalPoint> evals;
  std::optional<double> entropy_nats;  // the data's entropy rate, when known
  double tokens_per_second = 0.0;      // over the whole run, evaluation excluded
  int64_t parameters = 0;
};

OptimizerConfig OptimizerConfigFromSpec(const config::TrainingSpec& training);

// Trains spec.model on spec.data for spec.training.steps steps on `backend`. Errors: bad data
// (INVALID_ARGUMENT / NOT_FOUND naming the file), or a model/data mismatch (INVALID_ARGUMENT).
absl::StatusOr<TrainResult> Train(const config::JobSpec& spec, Backend& backend,
                                  const TrainOptions& options);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_TRAINER_H_
