#include "planner/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/backend.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/kv_store.h"

namespace trainyard::planner {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `op` until `seconds` have passed (at least twice); returns seconds per run.
double SecondsPerRun(double seconds, const std::function<void()>& op) {
  op();  // warm up: first-touch of the buffers, thread pool start
  int64_t runs = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (runs < 2 || elapsed < seconds) {
    op();
    ++runs;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return elapsed / runs;
}

double GemmFlops(worker::Backend& backend, int64_t size, double seconds) {
  worker::Buffer<worker::Act> in = backend.AllocAct(size * size);
  worker::Buffer<worker::Act> out = backend.AllocAct(size * size);
  worker::Buffer<float> weight = backend.AllocFloat(size * size);
  backend.Fill(weight.data(), 0.01f, size * size);
  backend.Fill(in.data(), 0.5f, size * size);
  const double per_run = SecondsPerRun(seconds, [&] {
    backend.Linear(out.data(), in.data(), weight.data(), nullptr, size, size, size);
  });
  return 2.0 * size * size * size / per_run;
}

double AddBandwidth(worker::Backend& backend, double seconds) {
  constexpr int64_t kCount = int64_t{1} << 23;  // 32 MiB per operand, past the caches
  worker::Buffer<float> a = backend.AllocFloat(kCount), b = backend.AllocFloat(kCount);
  worker::Buffer<float> out = backend.AllocFloat(kCount);
  const double per_run =
      SecondsPerRun(seconds, [&] { backend.Add(out.data(), a.data(), b.data(), kCount); });
  return 3.0 * 4 * kCount / per_run;  // two reads and a write
}

// Median seconds of a ring all-reduce of `count` floats between the two ranks: two ring steps,
// each sending count / 2 floats, which is the planner's α–β form (2α + 4·count·β for n = 2).
absl::StatusOr<double> AllReduceSeconds(worker::parallel::Communicator& comm, int64_t count,
                                        int rounds) {
  std::vector<float> buffer(count, 1.0f);
  std::vector<double> times;
  for (int i = 0; i < rounds; ++i) {
    const auto start = Clock::now();
    TY_RETURN_IF_ERROR(comm.AllReduce(buffer.data(), count));
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

struct LinkTimes {
  double small = 0, large = 0;  // seconds per all-reduce
};

constexpr int64_t kSmallFloats = 2;
constexpr int64_t kLargeFloats = int64_t{1} << 22;  // 16 MiB

// Both ranks of the loopback pair: connect, then time small and large all-reduces.
absl::StatusOr<LinkTimes> PingPong(worker::parallel::KeyValueStore& store, int rank) {
  worker::parallel::GlooOptions options;
  options.timeout = std::chrono::milliseconds(30000);
  TY_ASSIGN_OR_RETURN(auto comm,
                      worker::parallel::ConnectGloo(store, "calibrate", rank, 2, options));
  LinkTimes t;
  TY_ASSIGN_OR_RETURN(t.small, AllReduceSeconds(*comm, kSmallFloats, 200));
  TY_ASSIGN_OR_RETURN(t.large, AllReduceSeconds(*comm, kLargeFloats, 7));
  TY_RETURN_IF_ERROR(comm->Barrier());
  return t;
}

absl::StatusOr<LinkTimes> MeasureLoopback(const std::string& scratch_dir) {
  std::error_code ec;
  std::filesystem::create_directories(scratch_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", scratch_dir, ": ", ec.message()));
  }
  auto store = worker::parallel::MakeFileKeyValueStore(scratch_dir);
  absl::StatusOr<LinkTimes> result[2] = {absl::UnknownError("not run"),
                                         absl::UnknownError("not run")};
  std::thread peer([&] { result[1] = PingPong(*store, 1); });
  result[0] = PingPong(*store, 0);
  peer.join();
  std::filesystem::remove_all(scratch_dir, ec);
  TY_RETURN_IF_ERROR(result[1].status());
  return result[0];
}

}  // namespace

absl::StatusOr<Calibration> CalibrateCpu(const CalibrationOptions& options) {
  Calibration c;
  {
    std::unique_ptr<worker::Backend> backend = worker::MakeCpuBackend(options.threads);
    c.large_gemm_flops = GemmFlops(*backend, 1024, options.seconds_per_probe);
    c.gemm_flops = GemmFlops(*backend, 512, options.seconds_per_probe);
    c.add_bytes_per_second = AddBandwidth(*backend, options.seconds_per_probe);
  }
  TY_ASSIGN_OR_RETURN(const LinkTimes link, MeasureLoopback(options.scratch_dir));
  // Two ring steps each; the large one sends kLargeFloats floats in all from each rank.
  c.alpha_seconds = link.small / 2;
  const double transfer = std::max(link.large - link.small, 1e-9);
  c.bytes_per_second = 4.0 * (kLargeFloats - kSmallFloats) / transfer;

  DeviceProfile& p = c.profile;
  p.name = "cpu";
  p.description = "CPU ranks (calibrated on this machine)";
  p.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  p.shared_node = true;
  p.peak_flops = std::max(c.large_gemm_flops, c.gemm_flops);
  p.matmul_flops = c.gemm_flops;
  p.memory_bytes_per_second = c.add_bytes_per_second;
  p.intra_node = Link{.alpha_seconds = c.alpha_seconds, .bytes_per_second = c.bytes_per_second};
  p.inter_node = p.intra_node;
  p.act_bytes = 4;
  p.max_logits_chunk = int64_t{1} << 20;
  p.calibrated = true;
  return c;
}

}  // namespace trainyard::planner
