#include "worker/calibrate.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "config/mesh.h"
#include "planner/memory_model.h"
#include "planner/planner.h"
#include "planner/rank_shape.h"
#include "planner/traffic_model.h"
#include "worker/backend.h"
#include "worker/local_model.h"
#include "worker/model.h"
#include "worker/optimizer.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/kv_store.h"
#include "worker/param_source.h"
#include "worker/shape/parameters.h"
#include "worker/shape/stages.h"

namespace trainyard::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

// Runs `op` until `seconds` have passed (at least twice); returns seconds per run.
double SecondsPerRun(double seconds, const std::function<void()>& op) {
  op();  // warm up: first-touch of the buffers, thread pool start
  int64_t runs = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (runs < 2 || elapsed < seconds) {
    op();
    ++runs;
    elapsed = Since(start);
  }
  return elapsed / runs;
}

double GemmFlops(Backend& backend, int64_t size, double seconds) {
  Buffer<Act> in = backend.AllocAct(size * size);
  Buffer<Act> out = backend.AllocAct(size * size);
  Buffer<float> weight = backend.AllocFloat(size * size);
  backend.Fill(weight.data(), 0.01f, size * size);
  backend.Fill(in.data(), 0.5f, size * size);
  const double per_run = SecondsPerRun(seconds, [&] {
    backend.Linear(out.data(), in.data(), weight.data(), nullptr, size, size, size);
  });
  return 2.0 * size * size * size / per_run;
}

double AddBandwidth(Backend& backend, double seconds) {
  constexpr int64_t kCount = int64_t{1} << 23;  // 32 MiB per operand, past the caches
  Buffer<float> a = backend.AllocFloat(kCount), b = backend.AllocFloat(kCount);
  Buffer<float> out = backend.AllocFloat(kCount);
  const double per_run =
      SecondsPerRun(seconds, [&] { backend.Add(out.data(), a.data(), b.data(), kCount); });
  return 3.0 * 4 * kCount / per_run;  // two reads and a write
}

// The threads one of `ranks` ranks sharing the machine's cores gets, as the standalone worker
// hands them out (worker/main.cc).
int ThreadsPerRank(int ranks) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / ranks);
}

// Runs body(rank) on `ranks` threads at once and returns the first error.
absl::Status OnRanks(int ranks, const std::function<absl::Status(int)>& body) {
  std::vector<absl::Status> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 1; r < ranks; ++r) threads.emplace_back([&, r] { results[r] = body(r); });
  results[0] = body(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) TY_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// Runs body(rank) for `ranks` ranks, each in a process of its own forked from this one, as a
// job's ranks run: every rank has its own communication threads, as the workers do (ranks run as
// threads of one process would share them). Returns each rank's figures. Call before this
// process starts threads (the CPU backend's pool, Gloo's): a child inherits none of them.
absl::StatusOr<std::vector<std::vector<double>>> InProcesses(
    int ranks, const std::function<absl::StatusOr<std::vector<double>>(int)>& body) {
  struct Child {
    pid_t pid = -1;
    int fd = -1;
  };
  std::vector<Child> children;
  absl::Status failed;
  for (int r = 0; r < ranks && failed.ok(); ++r) {
    int fds[2];
    if (pipe(fds) != 0) {
      failed = absl::InternalError("pipe failed");
      break;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      absl::StatusOr<std::vector<double>> result = body(r);
      std::string line = result.ok() ? "ok" : absl::StrCat("error ", result.status().ToString());
      if (result.ok()) {
        for (double v : *result) absl::StrAppendFormat(&line, " %.17g", v);
      }
      const char* at = line.data();
      size_t left = line.size();
      while (left > 0) {
        const ssize_t n = write(fds[1], at, left);
        if (n <= 0) break;
        at += n;
        left -= static_cast<size_t>(n);
      }
      _exit(result.ok() ? 0 : 1);
    }
    close(fds[1]);
    if (pid < 0) {
      close(fds[0]);
      failed = absl::InternalError("fork failed");
      break;
    }
    children.push_back({pid, fds[0]});
  }
  std::vector<std::vector<double>> figures(children.size());
  for (size_t r = 0; r < children.size(); ++r) {
    std::string text;
    char buffer[256];
    ssize_t n;
    while ((n = read(children[r].fd, buffer, sizeof(buffer))) > 0) text.append(buffer, n);
    close(children[r].fd);
    int wait_status = 0;
    waitpid(children[r].pid, &wait_status, 0);
    std::vector<std::string> words = absl::StrSplit(text, ' ', absl::SkipEmpty());
    if (!failed.ok()) continue;
    if (words.empty() || words[0] != "ok") {
      failed = absl::InternalError(absl::StrCat(
          "calibration rank ", r, text.empty() ? " exited without a result" : ": " + text));
      continue;
    }
    for (size_t i = 1; i < words.size(); ++i) {
      double v = 0;
      if (!absl::SimpleAtod(words[i], &v)) failed = absl::InternalError("bad calibration result");
      figures[r].push_back(v);
    }
  }
  TY_RETURN_IF_ERROR(failed);
  return figures;
}

// One rank of the compute probe: the reference model on its own CPU backend.
struct ReferenceRank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LocalModel> model;
  std::vector<int32_t> tokens;
  int micro = 0, seq_len = 0;

  [[nodiscard]] absl::Status Init(const config::JobSpec& reference, int threads) {
    backend = MakeCpuBackend(threads);
    TY_ASSIGN_OR_RETURN(model, LocalModel::Create(reference.model, backend.get()));
    model->InitParameters(1);
    micro = config::MicroBatchPerRank(reference.training, reference.parallelism);
    seq_len = reference.training.seq_len;
    tokens.resize(static_cast<size_t>(micro) * seq_len + 1);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 7 + 3) % reference.model.vocab;
    return Pass();  // warm up
  }
  [[nodiscard]] absl::Status Pass() {
    return model->ForwardBackward(tokens.data(), tokens.data() + 1, micro, seq_len, 1.0f).status();
  }
};

// One rank's timed operation, and what makes it: called on the rank's thread with the threads
// the worker would give it; what the operation needs lives in its captures.
using TimedOp = std::function<absl::Status()>;
using MakeTimedOp = std::function<absl::StatusOr<TimedOp>(int threads)>;

// Seconds per run of each rank's operation (at least two runs, then until `seconds` passed), the
// mean over `ranks` ranks running theirs at once as threads, started together.
absl::StatusOr<double> MeanSecondsOnRanks(int ranks, double seconds, const MakeTimedOp& make) {
  std::vector<double> per_run(ranks);
  std::barrier start(ranks);
  TY_RETURN_IF_ERROR(OnRanks(ranks, [&](int r) -> absl::Status {
    absl::StatusOr<TimedOp> op = make(ThreadsPerRank(ranks));
    start.arrive_and_wait();  // every rank arrives, also one whose set-up failed
    TY_RETURN_IF_ERROR(op.status());
    int64_t runs = 0;
    const auto begin = Clock::now();
    while (runs < 2 || Since(begin) < seconds) {
      TY_RETURN_IF_ERROR((*op)());
      ++runs;
    }
    per_run[r] = Since(begin) / runs;
    return absl::OkStatus();
  }));
  double sum = 0;
  for (double s : per_run) sum += s;
  return sum / ranks;
}

// Seconds per forward and backward pass of the reference micro-batch, the mean over `ranks`
// ranks running it at once (each with the threads the worker would give it).
absl::StatusOr<double> ReferencePassSeconds(const config::JobSpec& reference, int ranks,
                                            double seconds) {
  return MeanSecondsOnRanks(ranks, seconds, [&](int threads) -> absl::StatusOr<TimedOp> {
    auto rank = std::make_shared<ReferenceRank>();
    TY_RETURN_IF_ERROR(rank->Init(reference, threads));
    return TimedOp([rank] { return rank->Pass(); });
  });
}

// The optimizer probe's state: the reference model's parameters, gradients and AdamW.
struct OptimizerRank {
  std::unique_ptr<Backend> backend;
  ParameterLayout layout;
  AdamW adamw;
  Buffer<float> params, grads;
  int64_t step = 0;

  OptimizerRank(const config::ModelConfig& model, int threads)
      : backend(MakeCpuBackend(threads)),
        layout(model),
        adamw(OptimizerConfig{}, layout, backend.get()),
        params(backend->AllocFloat(layout.total())),
        grads(backend->AllocFloat(layout.total())) {
    backend->Fill(params.data(), 0.02f, layout.total());
    Step();  // warm up: first touch of the moments
  }
  void Step() {
    backend->Fill(grads.data(), 0.0f, layout.total());
    backend->Fill(grads.data(), 1e-3f, layout.total());  // stands for the passes' gradients
    adamw.ClipGradients(grads.data());
    adamw.Step(params.data(), grads.data(), step++);
  }
};

// Seconds per optimizer step of the reference model's parameters, the mean over `ranks` ranks
// running it at once (each with the threads the worker would give it): what the training loop
// does per step besides the passes, with the engine's own code: zero the gradients, take their
// global norm and clip them, and apply AdamW tensor by tensor.
absl::StatusOr<double> OptimizerStepSeconds(const config::JobSpec& reference, int ranks,
                                            double seconds) {
  return MeanSecondsOnRanks(ranks, seconds, [&](int threads) -> absl::StatusOr<TimedOp> {
    auto rank = std::make_shared<OptimizerRank>(reference.model, threads);
    return TimedOp([rank] {
      rank->Step();
      return absl::OkStatus();
    });
  });
}

// Median seconds of an all-reduce of `count` floats between the two ranks: one exchange of the
// whole buffer, which is the planner's α–β form (α + 4·count·β for n = 2).
absl::StatusOr<double> AllReduceSeconds(parallel::Communicator& comm, int64_t count, int rounds) {
  std::vector<float> buffer(count, 1.0f);
  std::vector<double> times;
  for (int i = 0; i < rounds; ++i) {
    const auto start = Clock::now();
    TY_RETURN_IF_ERROR(comm.AllReduce(buffer.data(), count));
    times.push_back(Since(start));
  }
  return Median(std::move(times));
}

struct LinkTimes {
  double small = 0, large = 0;  // seconds per all-reduce
};

constexpr int64_t kSmallFloats = 2;
constexpr int64_t kLargeFloats = int64_t{1} << 22;  // 16 MiB

// Both ranks of the loopback pair: connect, then time small and large all-reduces.
absl::StatusOr<LinkTimes> PingPong(parallel::KeyValueStore& store, int rank) {
  parallel::GlooOptions options;
  options.timeout = std::chrono::milliseconds(30000);
  TY_ASSIGN_OR_RETURN(auto comm, parallel::ConnectGloo(store, "calibrate", rank, 2, options));
  LinkTimes t;
  TY_ASSIGN_OR_RETURN(t.small, AllReduceSeconds(*comm, kSmallFloats, 200));
  TY_ASSIGN_OR_RETURN(t.large, AllReduceSeconds(*comm, kLargeFloats, 7));
  TY_RETURN_IF_ERROR(comm->Barrier());
  return t;
}

absl::Status MakeScratch(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// Runs a probe of `ranks` ranks as processes (InProcesses) meeting through a rendezvous store in
// scratch directory `name`, and returns rank 0's `count` figures.
absl::StatusOr<std::vector<double>> RankZeroFigures(
    const std::string& scratch_dir, const std::string& name, int ranks, size_t count,
    const std::function<absl::StatusOr<std::vector<double>>(parallel::KeyValueStore&, int)>& body) {
  const std::string dir = absl::StrCat(scratch_dir, "/", name);
  TY_RETURN_IF_ERROR(MakeScratch(dir));
  auto store = parallel::MakeFileKeyValueStore(dir);
  absl::StatusOr<std::vector<std::vector<double>>> figures =
      InProcesses(ranks, [&](int rank) { return body(*store, rank); });
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  TY_RETURN_IF_ERROR(figures.status());
  if ((*figures)[0].size() != count) {
    return absl::InternalError(absl::StrCat("bad result from the ", name, " probe"));
  }
  return (*figures)[0];
}

absl::StatusOr<LinkTimes> MeasureLoopback(const std::string& scratch_dir) {
  TY_ASSIGN_OR_RETURN(
      const std::vector<double> t,
      RankZeroFigures(
          scratch_dir, "loopback", 2, 2,
          [](parallel::KeyValueStore& store, int rank) -> absl::StatusOr<std::vector<double>> {
            TY_ASSIGN_OR_RETURN(const LinkTimes link, PingPong(store, rank));
            return std::vector<double>{link.small, link.large};
          }));
  return LinkTimes{t[0], t[1]};
}

// The reference split over a tensor-parallel pair (the default reference when the model cannot
// split in two).
config::JobSpec PairReference(const config::JobSpec& reference) {
  const config::ModelConfig& m = reference.model;
  const bool splits =
      m.vocab % 2 == 0 && m.heads % 2 == 0 && m.kv_heads % 2 == 0 && m.ffn_hidden % 2 == 0;
  config::JobSpec pair = splits ? reference : planner::DefaultCalibrationReference();
  pair.parallelism.tp = 2;
  return pair;
}

// One rank of the shared-core link probe. Ranks 0 and 1 are a tensor-parallel group of two
// running the reference's forward and backward passes (the engine's own collectives between the
// engine's own compute); the others run the reference alone, keeping the cores as busy as the
// rank count does. With `lockstep`, every rank of an even count is in a pair (an odd count's last
// one runs alone), and the pairs move in step as a mesh without pipelining does: after each pass
// all paired ranks sum a scalar, as the training loop does each step.
// Returns its seconds per pass in tensor-parallel collectives and outside them (outside the
// step's scalar sum too); zeros for a rank that is not paired.
struct PairedPass {
  double collectives = 0;
  double compute = 0;
};
absl::StatusOr<PairedPass> PairedRank(parallel::KeyValueStore& store,
                                      const config::JobSpec& reference, int ranks, int rank,
                                      double seconds, bool lockstep) {
  const bool paired = rank < 2 || (lockstep && rank < ranks - ranks % 2);
  if (!paired) {
    ReferenceRank alone;
    TY_RETURN_IF_ERROR(alone.Init(reference, ThreadsPerRank(ranks)));
    const auto begin = Clock::now();
    while (Since(begin) < seconds) TY_RETURN_IF_ERROR(alone.Pass());
    return PairedPass{};
  }
  const config::JobSpec pair = PairReference(reference);
  const int micro = config::MicroBatchPerRank(pair.training, config::ParallelismSpec{});
  const int seq_len = pair.training.seq_len;
  std::unique_ptr<Backend> backend = MakeCpuBackend(ThreadsPerRank(ranks));
  parallel::GlooOptions options;
  options.timeout = std::chrono::milliseconds(30000);
  TY_ASSIGN_OR_RETURN(auto comm, parallel::ConnectGloo(store, absl::StrCat("pair", rank / 2),
                                                       rank % 2, 2, options));
  std::unique_ptr<parallel::Communicator> step;
  if (lockstep) {
    TY_ASSIGN_OR_RETURN(step,
                        parallel::ConnectGloo(store, "step", rank, ranks - ranks % 2, options));
  }
  const PipelineStage stage = BalanceStages(pair.model, seq_len, 1)[0];
  const ParameterLayout layout(pair.model, rank % 2, 2, stage);
  LocalParamSource source(layout, backend.get());
  backend->Fill(source.params(), 0.02f, layout.total());
  TY_ASSIGN_OR_RETURN(auto model, Model::Create(pair.model, backend.get(), &source,
                                                {.tp = comm.get(), .chunks = {stage}}));
  std::vector<int32_t> tokens(static_cast<size_t>(micro) * seq_len + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 7 + 3) % pair.model.vocab;
  double summing = 0;  // seconds in the step's scalar sums
  auto pass = [&]() -> absl::Status {
    TY_RETURN_IF_ERROR(
        model->ForwardBackward(tokens.data(), tokens.data() + 1, micro, seq_len, 1.0f).status());
    if (step == nullptr) return absl::OkStatus();
    float sum[2] = {1, 0};
    const auto sum_start = Clock::now();
    const absl::Status summed = step->AllReduce(sum, 2);
    summing += Since(sum_start);
    return summed;
  };
  // A warm-up pass times the rest; the ranks that exchange agree on the count (the mean of their
  // estimates).
  auto start = Clock::now();
  TY_RETURN_IF_ERROR(pass());
  float estimate[2] = {static_cast<float>(seconds / std::max(Since(start), 1e-6)), 0};
  parallel::Communicator& agree = step != nullptr ? *step : *comm;
  TY_RETURN_IF_ERROR(agree.AllReduce(estimate, 2));
  const int passes = std::clamp(static_cast<int>(estimate[0] / agree.size()), 3, 200);
  const double before = model->tp_comm_seconds();
  summing = 0;
  const auto timed = Clock::now();
  for (int i = 0; i < passes; ++i) TY_RETURN_IF_ERROR(pass());
  PairedPass result;
  result.collectives = (model->tp_comm_seconds() - before) / passes;
  result.compute = std::max(Since(timed) / passes - result.collectives - summing / passes, 0.0);
  return result;
}

constexpr int64_t kBackgroundFloats = int64_t{1} << 16;  // 256 KiB per all-reduce

// One rank of the background link probe: every rank runs the reference alone on its training
// thread while a thread of its own all-reduces kBackgroundFloats over a ring of all `ranks`, back
// to back, as data parallelism's communication thread does beside the backward pass. Returns
// the median all-reduce's seconds.
absl::StatusOr<double> BackgroundRank(parallel::KeyValueStore& store,
                                      const config::JobSpec& reference, int ranks, int rank,
                                      double seconds) {
  ReferenceRank compute;
  TY_RETURN_IF_ERROR(compute.Init(reference, ThreadsPerRank(ranks)));
  parallel::GlooOptions options;
  options.timeout = std::chrono::milliseconds(30000);
  TY_ASSIGN_OR_RETURN(auto comm, parallel::ConnectGloo(store, "background", rank, ranks, options));
  std::atomic<bool> done = false;
  absl::StatusOr<double> median = absl::UnknownError("not run");
  std::thread communication([&] {
    std::vector<float> buffer(kBackgroundFloats, 1.0f);
    auto time_one = [&]() -> absl::StatusOr<double> {
      const auto start = Clock::now();
      TY_RETURN_IF_ERROR(comm->AllReduce(buffer.data(), kBackgroundFloats));
      return Since(start);
    };
    median = [&]() -> absl::StatusOr<double> {
      // A first all-reduce times the rest; the ranks agree on the count (the sum of estimates).
      TY_ASSIGN_OR_RETURN(const double first, time_one());
      float estimate[2] = {static_cast<float>(seconds / std::max(first, 1e-6)), 0};
      TY_RETURN_IF_ERROR(comm->AllReduce(estimate, 2));
      const int count = std::clamp(static_cast<int>(estimate[0] / ranks), 5, 2000);
      std::vector<double> times;
      for (int i = 0; i < count; ++i) {
        TY_ASSIGN_OR_RETURN(const double t, time_one());
        times.push_back(t);
      }
      return Median(std::move(times));
    }();
    done.store(true);
  });
  absl::Status computed = absl::OkStatus();
  while (!done.load() && computed.ok()) computed = compute.Pass();
  communication.join();
  TY_RETURN_IF_ERROR(computed);
  return median;
}

// Rank 0's median all-reduce seconds in the background probe of `ranks` ranks (BackgroundRank).
absl::StatusOr<double> BackgroundAllReduceSeconds(const planner::CalibrationOptions& options,
                                                  int ranks) {
  TY_ASSIGN_OR_RETURN(
      const std::vector<double> seconds,
      RankZeroFigures(
          options.scratch_dir, absl::StrCat("background-", ranks), ranks, 1,
          [&](parallel::KeyValueStore& store, int r) -> absl::StatusOr<std::vector<double>> {
            TY_ASSIGN_OR_RETURN(const double t, BackgroundRank(store, options.reference, ranks, r,
                                                               options.seconds_per_link_probe));
            return std::vector<double>{t};
          }));
  return seconds[0];
}

// Rank 0's seconds per pass in and outside tensor-parallel collectives with `ranks` ranks, one
// pair or (lockstep) all in pairs (PairedRank).
absl::StatusOr<PairedPass> PairedPassSeconds(const planner::CalibrationOptions& options, int ranks,
                                             bool lockstep) {
  TY_ASSIGN_OR_RETURN(
      const std::vector<double> seconds,
      RankZeroFigures(
          options.scratch_dir, absl::StrCat(lockstep ? "lockstep-" : "pairs-", ranks), ranks, 2,
          [&](parallel::KeyValueStore& store, int r) -> absl::StatusOr<std::vector<double>> {
            TY_ASSIGN_OR_RETURN(const PairedPass t,
                                PairedRank(store, options.reference, ranks, r,
                                           options.seconds_per_link_probe, lockstep));
            return std::vector<double>{t.collectives, t.compute};
          }));
  return PairedPass{seconds[0], seconds[1]};
}

// The rank counts calibrated: every count up to twice the cores on small machines; powers of
// two, the cores and twice the cores on larger ones (PerRankProfile scales between them).
std::vector<int> SharedRankCounts() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> counts;
  for (int k = 1; k <= 2 * cores; ++k) {
    if (2 * cores <= 8 || (k & (k - 1)) == 0 || k == cores || k == 2 * cores) counts.push_back(k);
  }
  return counts;
}

// Every probe runs in rounds, each round taking every probe of its kind in turn, and keeps the
// median round: a burst of load from outside (on a virtual machine, from other guests, which no
// count of this machine's busy time shows) spoils a round of each probe, not a whole probe. The
// link probes' waits also switch between regimes lasting a second or so (how the scheduler
// places the ranks' threads on the cores): many short rounds give the typical regime, as a run's
// median step does.
constexpr int kLinkRounds = 9;
constexpr int kComputeRounds = 3;

// The links, ranks as processes: the loopback pair's α and β, and for each count of ranks sharing
// the machine α from the paired collectives (their time less the bytes at the back-to-back β,
// per latency step), for one pair among computing ranks and for all ranks in pairs (for two
// ranks they are the same probe). Appends c.shared's entries.
absl::Status MeasureLinks(const planner::CalibrationOptions& options, planner::Calibration& c) {
  const std::vector<int> counts = SharedRankCounts();
  planner::CalibrationOptions round = options;
  round.seconds_per_link_probe = options.seconds_per_link_probe / kLinkRounds;
  std::vector<double> small, large;
  std::vector<std::vector<double>> pair(counts.size()), lockstep(counts.size()),
      background(counts.size()), lockstep_compute(counts.size());
  for (int i = 0; i < kLinkRounds; ++i) {
    TY_ASSIGN_OR_RETURN(const LinkTimes link, MeasureLoopback(options.scratch_dir));
    small.push_back(link.small);
    large.push_back(link.large);
    for (size_t j = 0; j < counts.size(); ++j) {
      if (counts[j] < 2) continue;
      TY_ASSIGN_OR_RETURN(const PairedPass paired, PairedPassSeconds(round, counts[j], false));
      pair[j].push_back(paired.collectives);
      // Two ranks in a pair are every rank in pairs: their pass is the lockstep one.
      if (counts[j] < 3) lockstep_compute[j].push_back(paired.compute);
      TY_ASSIGN_OR_RETURN(const double beside, BackgroundAllReduceSeconds(round, counts[j]));
      background[j].push_back(beside);
      if (counts[j] < 3) continue;
      TY_ASSIGN_OR_RETURN(const PairedPass all, PairedPassSeconds(round, counts[j], true));
      lockstep[j].push_back(all.collectives);
      lockstep_compute[j].push_back(all.compute);
    }
  }
  // One exchange each; the large one sends kLargeFloats floats from each rank.
  c.alpha_seconds = Median(small);
  const double transfer = std::max(Median(large) - c.alpha_seconds, 1e-9);
  c.bytes_per_second = 4.0 * (kLargeFloats - kSmallFloats) / transfer;

  // The pair's collectives per pass as the planner counts them.
  const planner::BackendShape backend{4, int64_t{1} << 20};
  const config::JobSpec reference = PairReference(options.reference);
  double latency = 0, bytes = 0;
  for (const planner::Collective& col : planner::ModelTensorParallelTraffic(
           planner::ShapeOf(reference, reference.parallelism, 0), backend, 0)) {
    latency += col.repeat * col.latency;
    bytes += col.repeat * col.bytes;
  }
  auto alpha = [&](double seconds) {
    return std::max((seconds - bytes / c.bytes_per_second) / latency, 1e-7);
  };
  for (size_t j = 0; j < counts.size(); ++j) {
    planner::SharedRanksCalibration& r = c.shared.emplace_back();
    r.entry.ranks = counts[j];
    r.entry.link.bytes_per_second = c.bytes_per_second;
    if (pair[j].empty()) continue;
    r.collective_seconds = Median(pair[j]);
    r.lockstep_collective_seconds =
        lockstep[j].empty() ? r.collective_seconds : Median(lockstep[j]);
    r.entry.link.alpha_seconds = alpha(r.collective_seconds);
    r.entry.lockstep_alpha_seconds = alpha(r.lockstep_collective_seconds);
    r.lockstep_compute_seconds = Median(lockstep_compute[j]);
    // The background all-reduce as the planner counts it (traffic_model.h).
    const int n = counts[j];
    r.background_seconds = Median(background[j]);
    const double ring_bytes = 4.0 * planner::RingAllReduceElements(kBackgroundFloats, n, 0);
    r.entry.background_alpha_seconds = std::max(
        (r.background_seconds - ring_bytes / c.bytes_per_second) / planner::AllReduceLatency(n),
        1e-7);
  }
  return absl::OkStatus();
}

// The compute, ranks as threads: the backend's GEMM and elementwise add with every core, and for
// each count of ranks sharing the machine the effective rate from the reference pass.
absl::Status MeasureCompute(const planner::CalibrationOptions& options, planner::Calibration& c) {
  std::vector<double> large_gemm, gemm, add;
  std::vector<std::vector<double>> passes(c.shared.size()), steps(c.shared.size());
  for (int i = 0; i < kComputeRounds; ++i) {
    {
      std::unique_ptr<Backend> backend = MakeCpuBackend(options.threads);
      large_gemm.push_back(GemmFlops(*backend, 1024, options.seconds_per_probe));
      gemm.push_back(GemmFlops(*backend, 512, options.seconds_per_probe));
      add.push_back(AddBandwidth(*backend, options.seconds_per_probe));
    }
    for (size_t j = 0; j < c.shared.size(); ++j) {
      TY_ASSIGN_OR_RETURN(const double pass,
                          ReferencePassSeconds(options.reference, c.shared[j].entry.ranks,
                                               options.seconds_per_probe));
      passes[j].push_back(pass);
      TY_ASSIGN_OR_RETURN(const double step,
                          OptimizerStepSeconds(options.reference, c.shared[j].entry.ranks,
                                               options.seconds_per_probe));
      steps[j].push_back(step);
    }
  }
  c.large_gemm_flops = Median(large_gemm);
  c.gemm_flops = Median(gemm);
  c.add_bytes_per_second = Median(add);
  const planner::BackendShape backend{4, int64_t{1} << 20};
  const planner::MicroBatchWork work = planner::WorkOf(
      planner::ShapeOf(options.reference, options.reference.parallelism, 0), backend);
  const config::JobSpec pair = PairReference(options.reference);
  const planner::MicroBatchWork pair_work =
      planner::WorkOf(planner::ShapeOf(pair, pair.parallelism, 0), backend);
  for (size_t j = 0; j < c.shared.size(); ++j) {
    planner::SharedRanksCalibration& r = c.shared[j];
    // The rate the planner's compute term (planner.h) gives the pass's time at.
    auto rate = [&](const planner::MicroBatchWork& w, double seconds) {
      const double elementwise = 3 * w.slot_bytes / (c.add_bytes_per_second / r.entry.ranks);
      return (w.forward_flops + w.backward_flops) / std::max(seconds - elementwise, 0.05 * seconds);
    };
    r.pass_seconds = Median(passes[j]);
    r.entry.matmul_flops = rate(work, r.pass_seconds);
    if (r.lockstep_compute_seconds > 0) {
      r.entry.lockstep_matmul_flops = rate(pair_work, r.lockstep_compute_seconds);
    }
    r.optimizer_step_seconds = Median(steps[j]);
    r.entry.optimizer_elements_per_second =
        ParameterLayout(options.reference.model).total() / r.optimizer_step_seconds;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<planner::Calibration> CalibrateCpu(const planner::CalibrationOptions& options) {
  planner::Calibration c;
  // The probes between ranks first: they fork, and this process has started no threads yet.
  TY_RETURN_IF_ERROR(MeasureLinks(options, c));
  TY_RETURN_IF_ERROR(MeasureCompute(options, c));
  for (const planner::SharedRanksCalibration& shared : c.shared)
    c.profile.shared.push_back(shared.entry);
  c.reference_name = planner::CalibrationReferenceName(options.reference);
  std::error_code ec;
  std::filesystem::remove_all(options.scratch_dir, ec);

  planner::DeviceProfile& p = c.profile;
  p.name = "cpu";
  p.description = "CPU ranks (calibrated on this machine)";
  p.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  p.shared_node = true;
  // The MFU basis: the best the machine reached, so that no prediction exceeds 100%.
  p.peak_flops = std::max(c.large_gemm_flops, c.gemm_flops);
  for (const planner::SharedRanks& e : p.shared)
    p.peak_flops = std::max(p.peak_flops, e.ranks * e.matmul_flops);
  p.matmul_flops = c.gemm_flops;
  p.memory_bytes_per_second = c.add_bytes_per_second;
  p.intra_node =
      planner::Link{.alpha_seconds = c.alpha_seconds, .bytes_per_second = c.bytes_per_second};
  p.inter_node = p.intra_node;
  p.act_bytes = 4;
  p.max_logits_chunk = int64_t{1} << 20;
  p.calibrated = true;
  p.reference = c.reference_name;
  p.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return c;
}

}  // namespace trainyard::worker
