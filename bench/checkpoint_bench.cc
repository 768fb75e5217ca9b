// checkpoint_bench: what checkpoints cost the training loop, for one model preset on the CPU
// backend, with one rank and with dp ranks under ZeRO-1 (ranks are threads of this process,
// meeting through a file rendezvous store, the same code path as separate processes):
//   - training time blocked per save (SaveOutcome.blocked_seconds) against the median step time,
//     and against its floor, a memcpy of the rank's share of the state;
//   - write throughput (checkpoint bytes / write_seconds) against this disk's own fsync'd
//     sequential write bandwidth, measured here on the same directory;
//   - restore time of a run resumed from the last checkpoint, from the moment the last rank began
//     its restore to the moment the last rank finished (TrainResult.restore_began_ns / _ended_ns:
//     a rank's own restore_seconds also holds its wait for peers still starting up), with the
//     checkpoint's pages dropped from the page cache (cold) and again with them cached (warm),
//     --restore-rounds times each, alternating (the medians; a disk's speed drifts by minutes);
//   - export (`trainyard export --format hf` of the last checkpoint, against the disk's bandwidth
//     measured just before and just after it)
//     and model.init_from of the exported directory, the whole model in one process.
// bench/run_checkpoint_bench.sh runs it beside bench/torch_checkpoint_peer.py.
//
//   checkpoint_bench --preset gpt2-124m --batch 1 --seq 128 --steps 8 --every 2 --ranks 1,2
//                    [--dir /tmp] [--threads 2] [--disk-mib 1024] [--restore-rounds 3]
//
// --batch is per rank (dp ranks train a global batch of batch x ranks); --threads is the CPU
// threads of the whole run, split over the ranks. Prints a Markdown table, then one JSON line per
// row ({"engine":"trainyard",...}) and one with the machine's references ({"reference":...}).
// Everything is written under a fresh scratch directory (mkdtemp in --dir), removed at the end.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "config/model_config.h"
#include "config/spec.h"
#include "worker/backend.h"
#include "worker/checkpoint/writer.h"
#include "worker/convert/hf_export.h"
#include "worker/convert/init_from.h"
#include "worker/parallel/kv_store.h"
#include "worker/trainer.h"

namespace trainyard::bench {
namespace {

using worker::checkpoint::SaveOutcome;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kDiskChunk = 16 * kMiB;
constexpr int kBytesPerParam = 12;  // fp32 parameter and both AdamW moments

struct Flags {
  std::string preset = "gpt2-small-cpu";
  int batch = 1;  // per rank
  int seq = 64;
  int steps = 8;
  int every = 2;
  std::vector<int> ranks = {1, 2};
  std::string dir = "/tmp";
  int threads = 0;  // 0: every core
  int disk_mib = 1024;
  int restore_rounds = 3;
};

constexpr char kUsage[] =
    "usage: checkpoint_bench --preset NAME [--batch B] [--seq T] [--steps N] [--every K]\n"
    "                        [--ranks 1,2] [--dir PARENT] [--threads K] [--disk-mib M]\n"
    "                        [--restore-rounds R]\n";

absl::Status ParseIntFlag(const std::string& name, const std::string& value, int* out) {
  if (!absl::SimpleAtoi(value, out) || *out < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " needs a non-negative integer, got '", value, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(arg + " needs a value");
    const std::string value = argv[++i];
    int* number = arg == "--batch"            ? &f.batch
                  : arg == "--seq"            ? &f.seq
                  : arg == "--steps"          ? &f.steps
                  : arg == "--every"          ? &f.every
                  : arg == "--threads"        ? &f.threads
                  : arg == "--disk-mib"       ? &f.disk_mib
                  : arg == "--restore-rounds" ? &f.restore_rounds
                                              : nullptr;
    if (number != nullptr) {
      if (absl::Status s = ParseIntFlag(arg, value, number); !s.ok()) return s;
    } else if (arg == "--preset") {
      f.preset = value;
    } else if (arg == "--dir") {
      f.dir = value;
    } else if (arg == "--ranks") {
      f.ranks.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int r = 0;
        if (!absl::SimpleAtoi(part, &r) || r < 1) {
          return absl::InvalidArgumentError(absl::StrCat("--ranks: bad rank count '", part, "'"));
        }
        f.ranks.push_back(r);
      }
    } else {
      return absl::InvalidArgumentError("unknown flag " + arg);
    }
  }
  if (f.batch < 1 || f.seq < 1 || f.every < 1 || f.steps < 2 * f.every) {
    return absl::InvalidArgumentError(
        "--batch, --seq and --every must be positive and --steps at least 2 x --every "
        "(the first save allocates the snapshot buffer; later ones show the steady state)");
  }
  if (f.disk_mib < 16) return absl::InvalidArgumentError("--disk-mib must be at least 16");
  if (f.restore_rounds < 1) return absl::InvalidArgumentError("--restore-rounds must be positive");
  if (f.dir.find_first_of("\"\\\n") != std::string::npos) {
    return absl::InvalidArgumentError("--dir may not contain quotes, backslashes or newlines");
  }
  if (f.threads == 0)
    f.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return f;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

absl::Status ErrnoError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// A fresh directory (mkdtemp) under `parent`, removed with everything in it on destruction.
class ScratchDir {
 public:
  static absl::StatusOr<std::unique_ptr<ScratchDir>> Create(const std::string& parent) {
    std::string pattern = parent + "/trainyard-checkpoint-bench.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) return ErrnoError("mkdtemp in " + parent);
    return std::unique_ptr<ScratchDir>(new ScratchDir(pattern));
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

absl::Status WriteAll(int fd, const char* data, int64_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, static_cast<size_t>(bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("write");
    data += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

// The time to write `bytes` to a new file in `dir` with write(2) in 16 MiB chunks, then fsync.
// The source is as large as the file (as a snapshot is), not one cached chunk written again.
absl::StatusOr<double> TimeFsyncedWrite(const std::string& dir, int64_t bytes,
                                        const std::vector<char>& source) {
  const std::string path = dir + "/disk-reference.bin";
  ::sync();  // start with no one else's dirty pages queued ahead of ours
  const auto start = std::chrono::steady_clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("open " + path);
  absl::Status status;
  for (int64_t at = 0; at < bytes && status.ok(); at += kDiskChunk) {
    status = WriteAll(fd, source.data() + at, std::min(kDiskChunk, bytes - at));
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError("fsync " + path);
  if (::close(fd) != 0 && status.ok()) status = ErrnoError("close " + path);
  const double seconds = SecondsSince(start);
  ::unlink(path.c_str());
  if (!status.ok()) return status;
  return seconds;
}

// This disk's fsync'd sequential write bandwidth in `dir`, bytes per second: the median of three.
absl::StatusOr<double> FsyncedWriteBandwidth(const std::string& dir, int64_t bytes) {
  std::vector<char> chunk(bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= chunk.size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(chunk.data() + i, &word, 8);
  }
  std::vector<double> rates;
  for (int rep = 0; rep < 3; ++rep) {
    absl::StatusOr<double> seconds = TimeFsyncedWrite(dir, bytes, chunk);
    if (!seconds.ok()) return seconds.status();
    rates.push_back(static_cast<double>(bytes) / *seconds);
  }
  return Median(rates);
}

// One thread's memcpy bandwidth between two touched 256 MiB buffers, bytes per second (median
// of five): the floor of a snapshot, which copies the rank's state into a host buffer.
double MemcpyBandwidth() {
  const size_t bytes = 256 * kMiB;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);
  std::vector<double> rates;
  for (int rep = 0; rep < 5; ++rep) {
    src[rep] = static_cast<char>(rep);
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    rates.push_back(static_cast<double>(bytes) / SecondsSince(start));
  }
  volatile char sink = dst[4];
  (void)sink;
  return Median(rates);
}

std::string SpecYaml(const Flags& f, int ranks, const std::string& checkpoint_dir) {
  const int val_tokens = std::max(4096, 4 * (f.seq + 1));
  return absl::StrFormat(
      "name: checkpoint-bench\n"
      "model: {preset: %s}\n"
      "data:\n"
      "  source: markov\n"
      "  markov: {order: 1, vocab: 32, train_tokens: 262144, val_tokens: %d, seed: 3}\n"
      "training: {steps: %d, batch: %d, seq_len: %d, warmup_steps: 1, eval_every: 0,\n"
      "           log_every: 1000000, threads: %d}\n"
      "parallelism: {dp: %d, tp: 1, pp: 1, zero: %d}\n"
      "resources: {nodes: 1, devices_per_node: %d, kind: cpu}\n"
      "checkpoint: {dir: \"%s\", every_steps: %d, keep: 2}\n",
      f.preset, val_tokens, f.steps, f.batch * ranks, f.seq, std::max(1, f.threads / ranks), ranks,
      ranks > 1 ? 1 : 0, ranks, checkpoint_dir, f.every);
}

// What one run of every rank left: each rank's result, and rank 0's saves and step ends.
struct RunLog {
  std::vector<absl::StatusOr<worker::TrainResult>> results;
  std::vector<SaveOutcome> saves;     // rank 0's reports, oldest first
  std::vector<absl::Time> step_ends;  // rank 0: when each step's hooks ran (after its save began)
};

// Runs every rank of `spec` as a thread with its own CPU backend, meeting in `rendezvous_dir`
// (which must be new: the store keeps the previous run's keys).
RunLog RunRanks(const config::JobSpec& spec, int threads_per_rank, int64_t stop_after_step,
                const std::string& rendezvous_dir) {
  const int world = spec.world_size();
  std::unique_ptr<worker::parallel::KeyValueStore> store =
      worker::parallel::MakeFileKeyValueStore(rendezvous_dir);
  RunLog log;
  log.results.assign(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<worker::Backend> backend = worker::MakeCpuBackend(threads_per_rank);
      worker::RankContext rank;
      rank.rank = r;
      rank.store = store.get();
      rank.gloo.timeout = std::chrono::minutes(10);
      worker::TrainOptions options;
      options.stop_after_step = stop_after_step;
      if (r == 0) {  // only rank 0 reports saves; its thread alone touches `log` below
        options.on_checkpoint = [&log](const SaveOutcome& o) { log.saves.push_back(o); };
        options.on_step = [&log](const worker::StepReport&) {
          log.step_ends.push_back(absl::Now());
          return absl::OkStatus();
        };
      }
      log.results[r] = worker::TrainRank(spec, rank, *backend, options);
    });
  }
  for (std::thread& t : threads) t.join();
  return log;
}

absl::Status FirstError(const RunLog& log) {
  for (size_t r = 0; r < log.results.size(); ++r) {
    if (!log.results[r].ok()) {
      return absl::Status(log.results[r].status().code(),
                          absl::StrCat("rank ", r, ": ", log.results[r].status().message()));
    }
  }
  return absl::OkStatus();
}

// Drops every file under `dir` from the page cache (its pages are clean: the writer synced
// them), so that the next read comes from the disk.
absl::Status DropFromPageCache(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("open " + entry.path().string());
    const int err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (err != 0) return absl::InternalError(absl::StrCat("posix_fadvise: ", std::strerror(err)));
  }
  if (ec) return absl::InternalError(absl::StrCat("listing ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

// One row of the table: a preset on a mesh of `ranks` data-parallel ranks.
struct Row {
  std::string preset;
  int ranks = 1;
  int64_t params = 0;
  int64_t bytes = 0;  // the committed checkpoint, as the writer counted it
  int saves = 0;
  double step_s = 0.0;           // median step, the first step excluded
  double step_writing_s = 0.0;   // median of the steps during which a save was being written
  double first_blocked_s = 0.0;  // the first save: allocates and touches the snapshot buffer
  double blocked_s = 0.0;        // median over the later saves
  double floor_s = 0.0;          // memcpy of one rank's share of the state
  double write_s = 0.0;          // median snapshot → committed
  double last_write_s = 0.0;     // the save after the last step: training waits, the writer
                                 // has the cores to itself
  double restore_cold_s = 0.0;   // last start to last end; checkpoint not in the page cache
  double restore_warm_s = 0.0;   // the same, checkpoint cached
  double export_s = 0.0;         // the last checkpoint as a Hugging Face directory (fsync'd)
  int64_t export_bytes = 0;      // its tensors' bytes
  // The disk's fsync'd write bandwidth around the export: one write of the export's size just
  // before it and one just after, their mean time (the disk swings between runs).
  double export_disk_bytes_per_s = 0.0;
  double init_from_s = 0.0;  // model.init_from of that directory: the whole model, one process
};

// `trainyard export` of the newest checkpoint in `checkpoint_dir` to `out`, then model.init_from's
// reader over it into a buffer already touched (as a rank's parameters are): their seconds.
absl::Status TimeExportAndInitFrom(const config::JobSpec& spec, const std::string& checkpoint_dir,
                                   const std::string& out, Row& row) {
  // The reference writes as many bytes as the export's fp32 tensors (the parameters).
  const int64_t reference_bytes = row.params * static_cast<int64_t>(sizeof(float));
  std::vector<char> source(reference_bytes);
  std::mt19937_64 rng(2);
  for (size_t i = 0; i + 8 <= source.size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(source.data() + i, &word, 8);
  }
  const std::string scratch = std::filesystem::path(out).parent_path().string();
  absl::StatusOr<double> before = TimeFsyncedWrite(scratch, reference_bytes, source);
  if (!before.ok()) return before.status();
  absl::StatusOr<worker::convert::ExportResult> exported =
      worker::convert::ExportHf(*RealFileSystem(), checkpoint_dir, {.out_dir = out});
  if (!exported.ok()) return exported.status();
  absl::StatusOr<double> after = TimeFsyncedWrite(scratch, reference_bytes, source);
  if (!after.ok()) return after.status();
  row.export_disk_bytes_per_s = 2.0 * static_cast<double>(reference_bytes) / (*before + *after);
  row.export_s = exported->seconds;
  row.export_bytes = exported->tensor_bytes;
  config::JobSpec from = spec;
  from.init_from = out;
  const worker::ParameterLayout layout(spec.model);
  std::vector<float> params(layout.total(), 0.0f);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> loaded = worker::convert::LoadInitFrom(
      *RealFileSystem(), from, layout, [&](const worker::ParamTensor& t, const float* local) {
        std::copy(local, local + t.numel, params.data() + t.offset);
      });
  if (!loaded.ok()) return loaded.status();
  row.init_from_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::error_code ec;
  std::filesystem::remove_all(out, ec);
  return absl::OkStatus();
}

// Fills the step and save columns of `row` from the training run's log.
absl::Status Summarize(const RunLog& log, Row& row) {
  const worker::TrainResult& r0 = *log.results[0];
  if (log.saves.empty()) return absl::InternalError("no checkpoint was reported");
  std::vector<double> blocked, writes, steps, writing;
  for (const SaveOutcome& o : log.saves) {
    if (!o.committed) return absl::InternalError("save failed: " + o.message);
    if (&o != &log.saves.front()) blocked.push_back(o.blocked_seconds);
    writes.push_back(o.write_seconds);
  }
  // Step i+1 (index i) began when step i's hooks ran; it overlapped a write that was still going.
  for (size_t i = 1; i < r0.step_seconds.size() && i < log.step_ends.size(); ++i) {
    steps.push_back(r0.step_seconds[i]);
    const absl::Time began = log.step_ends[i - 1];
    for (const SaveOutcome& o : log.saves) {
      if (o.step <= static_cast<int64_t>(i) && o.finished > began) {
        writing.push_back(r0.step_seconds[i]);
        break;
      }
    }
  }
  row.params = r0.parameters;
  row.saves = static_cast<int>(log.saves.size());
  row.bytes = log.saves.back().bytes;
  row.first_blocked_s = log.saves.front().blocked_seconds;
  row.blocked_s = Median(blocked);
  row.write_s = Median(writes);
  row.last_write_s = log.saves.back().write_seconds;
  row.step_s = Median(steps);
  row.step_writing_s = Median(writing);
  return absl::OkStatus();
}

// A run resumed from the newest checkpoint in the spec's dir that stops at once; the restore's
// time from the last rank's start to the last rank's end (the ranks share this process's clock).
absl::StatusOr<double> TimeRestore(const config::JobSpec& spec, int threads_per_rank,
                                   const std::string& rendezvous_dir) {
  const RunLog log =
      RunRanks(spec, threads_per_rank, /*stop_after_step=*/spec.training.steps, rendezvous_dir);
  if (absl::Status s = FirstError(log); !s.ok()) return s;
  int64_t began = 0, ended = 0;
  for (const auto& result : log.results) {
    if (result->first_step != spec.training.steps) {
      return absl::InternalError(absl::StrCat("the resumed run started at step ",
                                              result->first_step, ", not at the last save"));
    }
    began = std::max(began, result->restore_began_ns);
    ended = std::max(ended, result->restore_ended_ns);
  }
  return (ended - began) / 1e9;
}

absl::StatusOr<Row> MeasureMesh(const Flags& f, int ranks, const std::string& scratch,
                                double memcpy_bw) {
  const std::string tag = absl::StrCat(f.preset, "-dp", ranks);
  const std::string checkpoint_dir = scratch + "/" + tag;
  absl::StatusOr<config::JobSpec> spec =
      config::ParseJobSpec(SpecYaml(f, ranks, checkpoint_dir), "<checkpoint_bench>");
  if (!spec.ok()) return spec.status();
  const int threads_per_rank = std::max(1, f.threads / ranks);
  std::fprintf(stderr, "checkpoint_bench: %s: training %d steps, a save every %d\n", tag.c_str(),
               f.steps, f.every);
  const RunLog train = RunRanks(*spec, threads_per_rank, 0, scratch + "/rdv-train-" + tag);
  if (absl::Status s = FirstError(train); !s.ok()) return s;
  Row row{.preset = f.preset, .ranks = ranks};
  if (absl::Status s = Summarize(train, row); !s.ok()) return s;
  row.floor_s = static_cast<double>(kBytesPerParam) * row.params / ranks / memcpy_bw;

  std::vector<double> cold_s, warm_s;
  for (int round = 0; round < f.restore_rounds; ++round) {
    std::fprintf(stderr, "checkpoint_bench: %s: restoring (cold, then warm page cache), round %d\n",
                 tag.c_str(), round + 1);
    const std::string rdv = absl::StrCat(scratch, "/rdv-", round, "-");
    if (absl::Status s = DropFromPageCache(checkpoint_dir); !s.ok()) return s;
    absl::StatusOr<double> cold = TimeRestore(*spec, threads_per_rank, rdv + "cold-" + tag);
    if (!cold.ok()) return cold.status();
    absl::StatusOr<double> warm = TimeRestore(*spec, threads_per_rank, rdv + "warm-" + tag);
    if (!warm.ok()) return warm.status();
    std::printf("%s: restore round %d: cold %.3f s, warm %.3f s\n", tag.c_str(), round + 1, *cold,
                *warm);
    cold_s.push_back(*cold);
    warm_s.push_back(*warm);
  }
  row.restore_cold_s = Median(cold_s);
  row.restore_warm_s = Median(warm_s);
  std::fprintf(stderr, "checkpoint_bench: %s: export and init_from\n", tag.c_str());
  if (absl::Status s = TimeExportAndInitFrom(*spec, checkpoint_dir, scratch + "/hf-" + tag, row);
      !s.ok()) {
    return s;
  }
  std::error_code ec;
  std::filesystem::remove_all(checkpoint_dir, ec);  // keep the scratch disk's footprint small
  return row;
}

void PrintTable(const Flags& f, const std::vector<Row>& rows, double disk_bw, double memcpy_bw) {
  std::printf(
      "checkpoints of %s: batch %d per rank, seq %d, %d steps, a save every %d steps, "
      "%d CPU threads in all\n",
      f.preset.c_str(), f.batch, f.seq, f.steps, f.every, f.threads);
  std::printf(
      "disk (fsync'd sequential write, %d MiB in 16 MiB writes, median of 3): %.0f MB/s; "
      "memcpy (1 thread): %.0f MB/s\n\n",
      f.disk_mib, disk_bw / 1e6, memcpy_bw / 1e6);
  std::printf(
      "| model | ranks | params | 12 B/param MiB | checkpoint MiB | median step s "
      "| step s, write in flight | 1st save blocked s | blocked s | blocked %% of step "
      "| memcpy floor s | write s | last write s | write MB/s | disk MB/s | %% of disk "
      "| restore cold s | restore warm s | export s | export MB/s | init_from s |\n");
  std::printf(
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
      "|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    const double write_bw = r.bytes / r.write_s;
    std::printf(
        "| %s | %d | %lld | %.1f | %.1f | %.3f | %.3f | %.4f | %.4f | %.2f%% | %.4f "
        "| %.3f | %.3f | %.0f | %.0f | %.0f%% | %.3f | %.3f | %.3f | %.0f | %.3f |\n",
        r.preset.c_str(), r.ranks, static_cast<long long>(r.params),
        1.0 * kBytesPerParam * r.params / kMiB, 1.0 * r.bytes / kMiB, r.step_s, r.step_writing_s,
        r.first_blocked_s, r.blocked_s, 100.0 * r.blocked_s / r.step_s, r.floor_s, r.write_s,
        r.last_write_s, write_bw / 1e6, disk_bw / 1e6, 100.0 * write_bw / disk_bw, r.restore_cold_s,
        r.restore_warm_s, r.export_s, r.export_bytes / r.export_s / 1e6, r.init_from_s);
  }
}

void PrintJson(const Flags& f, const std::vector<Row>& rows, double disk_bw, double memcpy_bw) {
  std::printf(
      "\n{\"reference\":true,\"preset\":\"%s\",\"disk_bytes_per_s\":%.0f,\"disk_mib\":%d,"
      "\"memcpy_bytes_per_s\":%.0f}\n",
      f.preset.c_str(), disk_bw, f.disk_mib, memcpy_bw);
  for (const Row& r : rows) {
    std::printf(
        "{\"engine\":\"trainyard\",\"preset\":\"%s\",\"ranks\":%d,\"batch_per_rank\":%d,"
        "\"seq\":%d,\"steps\":%d,\"every\":%d,\"threads\":%d,\"params\":%lld,"
        "\"bytes\":%lld,\"saves\":%d,\"median_step_s\":%.6f,\"step_writing_s\":%.6f,"
        "\"first_blocked_s\":%.6f,\"blocked_s\":%.6f,\"memcpy_floor_s\":%.6f,"
        "\"write_s\":%.6f,\"last_write_s\":%.6f,\"restore_cold_s\":%.6f,\"restore_warm_s\":%.6f,"
        "\"export_s\":%.6f,\"export_bytes\":%lld,\"init_from_s\":%.6f,"
        "\"disk_bytes_per_s\":%.0f,\"export_disk_bytes_per_s\":%.0f}\n",
        r.preset.c_str(), r.ranks, f.batch, f.seq, f.steps, f.every, f.threads,
        static_cast<long long>(r.params), static_cast<long long>(r.bytes), r.saves, r.step_s,
        r.step_writing_s, r.first_blocked_s, r.blocked_s, r.floor_s, r.write_s, r.last_write_s,
        r.restore_cold_s, r.restore_warm_s, r.export_s, static_cast<long long>(r.export_bytes),
        r.init_from_s, disk_bw, r.export_disk_bytes_per_s);
  }
}

int Fail(int code, const std::string& context, const absl::Status& status) {
  std::fprintf(stderr, "checkpoint_bench: %s: %s\n", context.c_str(), status.ToString().c_str());
  return code;
}

int Run(const Flags& f) {
  if (absl::StatusOr<config::ModelConfig> model = config::Preset(f.preset); !model.ok()) {
    return Fail(2, "--preset", model.status());
  }
  absl::StatusOr<std::unique_ptr<ScratchDir>> scratch = ScratchDir::Create(f.dir);
  if (!scratch.ok()) return Fail(1, "scratch", scratch.status());
  std::fprintf(stderr, "checkpoint_bench: scratch %s; measuring memcpy and the disk\n",
               (*scratch)->path().c_str());
  const double memcpy_bw = MemcpyBandwidth();
  double disk_bw = 0.0;
  if (f.disk_mib > 0) {
    absl::StatusOr<double> bw = FsyncedWriteBandwidth((*scratch)->path(), f.disk_mib * kMiB);
    if (!bw.ok()) return Fail(1, "disk", bw.status());
    disk_bw = *bw;
  }
  std::vector<Row> rows;
  for (int ranks : f.ranks) {
    absl::StatusOr<Row> row = MeasureMesh(f, ranks, (*scratch)->path(), memcpy_bw);
    if (!row.ok())
      return Fail(1, absl::StrCat(f.preset, " with ", ranks, " rank(s)"), row.status());
    rows.push_back(*row);
  }
  PrintTable(f, rows, disk_bw, memcpy_bw);
  PrintJson(f, rows, disk_bw, memcpy_bw);
  return 0;
}

}  // namespace
}  // namespace trainyard::bench

int main(int argc, char** argv) {
  absl::StatusOr<trainyard::bench::Flags> flags = trainyard::bench::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "checkpoint_bench: %s\n%s", std::string(flags.status().message()).c_str(),
                 trainyard::bench::kUsage);
    return 2;
  }
  return trainyard::bench::Run(*flags);
}
