// Runs every rank of a job's mesh as a thread of the test process: each rank has its own backend
// and its own Gloo context over loopback TCP, meeting through a file rendezvous store in a fresh
// scratch directory — the same code path as separate processes.
#ifndef TRAINYARD_TESTS_INTEGRATION_RANK_THREADS_H_
#define TRAINYARD_TESTS_INTEGRATION_RANK_THREADS_H_

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "tests/integration/test_env.h"
#include "worker/backend.h"
#include "worker/parallel/kv_store.h"
#include "worker/trainer.h"

namespace trainyard::testenv {

struct RankRunOptions {
  int64_t bucket_bytes = 1 << 20;
  std::chrono::milliseconds timeout{60000};
  // Per-rank training options (e.g. an on_step hook); may be empty.
  std::function<void(int rank, worker::TrainOptions&)> customize;
  // Each rank's backend (default: a one-thread CPU backend) and how its collectives reach the
  // backend's memory (GPU ranks sharing one device: host staging).
  std::function<std::unique_ptr<worker::Backend>(int rank)> make_backend;
  worker::RankContext::Collectives collectives = worker::RankContext::Collectives::kHost;
};

struct RankRun {
  std::vector<absl::StatusOr<worker::TrainResult>> results;
  std::vector<std::vector<float>> final_params;                 // per rank, layout order
  std::vector<std::chrono::steady_clock::time_point> finished;  // when each rank returned
};

inline RankRun RunRanks(const config::JobSpec& spec, const RankRunOptions& opts = {}) {
  const int world = spec.world_size();
  const std::filesystem::path dir = MakeScratchDir("rendezvous");
  auto store = worker::parallel::MakeFileKeyValueStore(dir.string());
  RankRun run;
  run.results.assign(world, absl::UnknownError("not run"));
  run.final_params.resize(world);
  run.finished.resize(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<worker::Backend> backend =
          opts.make_backend ? opts.make_backend(r) : worker::MakeCpuBackend(1);
      if (backend == nullptr) {
        run.results[r] = absl::FailedPreconditionError("no backend for rank");
        return;
      }
      worker::RankContext ctx;
      ctx.rank = r;
      ctx.collectives = opts.collectives;
      ctx.store = store.get();
      ctx.gloo.timeout = opts.timeout;
      ctx.bucket_bytes = opts.bucket_bytes;
      worker::TrainOptions options;
      options.final_parameters = &run.final_params[r];
      if (opts.customize) opts.customize(r, options);
      run.results[r] = worker::TrainRank(spec, ctx, *backend, options);
      run.finished[r] = std::chrono::steady_clock::now();
    });
  }
  for (auto& t : threads) t.join();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return run;
}

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_RANK_THREADS_H_
