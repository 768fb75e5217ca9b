// Checkpoints under a filesystem that crashes, fills up, fails I/O and rots bits
// (common/fault_injection_filesystem.h keeps only synced bytes and synced directory entries):
// whatever happens during a save, the next run resumes from the newest checkpoint that was
// committed, never from a torn one, removes the torn one with its next save, and ends with
// exactly the loss of a run nothing happened to.
#include <cctype>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/fault_injection_filesystem.h"
#include "config/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend.h"
#include "worker/checkpoint/format.h"
#include "worker/checkpoint/reader.h"
#include "worker/checkpoint/writer.h"
#include "worker/trainer.h"

namespace trainyard::worker {
namespace {

using ::testing::HasSubstr;
using Fault = FaultInjectionFileSystem::Fault;

constexpr char kDir[] = "/ck";

config::JobSpec Job() {
  config::JobSpec spec;
  spec.name = "faults";
  spec.model = *config::Preset("gpt2-debug");
  spec.model.vocab = 32;
  spec.model.max_seq = 16;
  spec.data.markov.vocab = 32;
  spec.data.markov.train_tokens = 1 << 12;
  spec.data.markov.val_tokens = 1 << 9;
  spec.training.steps = 6;
  spec.training.batch = 4;
  spec.training.seq_len = 16;
  spec.training.warmup_steps = 1;
  spec.training.eval_every = 0;
  spec.checkpoint.dir = kDir;
  spec.checkpoint.every_steps = 2;
  spec.checkpoint.keep = 2;
  return spec;
}

struct RunOutcome {
  absl::StatusOr<TrainResult> result = absl::UnknownError("not run");
  std::vector<checkpoint::SaveOutcome> outcomes;
};

// Trains Job() on `fs` up to step `stop_after` (0: to the end).
// `threads`: the rank's CPU threads (a restore reads its tensors on them).
RunOutcome TrainOn(FileSystem& fs, int64_t stop_after = 0, config::JobSpec spec = Job(),
                   int threads = 1) {
  auto backend = MakeCpuBackend(threads);
  RunOutcome run;
  TrainOptions options;
  options.fs = &fs;
  options.stop_after_step = stop_after;
  options.on_checkpoint = [&](const checkpoint::SaveOutcome& o) { run.outcomes.push_back(o); };
  run.result = Train(spec, *backend, options);
  return run;
}

double FinalLoss(const RunOutcome& run) {
  return run.result.ok() && !run.result->train_losses.empty() ? run.result->train_losses.back()
                                                              : -1.0;
}

// The loss a run on `threads` threads that nothing happened to ends with.
double ReferenceLoss(int threads = 1) {
  static std::map<int, double> losses;  // by threads
  auto it = losses.find(threads);
  if (it == losses.end()) {
    FaultInjectionFileSystem fs({"/"});
    config::JobSpec spec = Job();
    spec.checkpoint = {};
    it = losses.emplace(threads, FinalLoss(TrainOn(fs, 0, spec, threads))).first;
  }
  return it->second;
}

// Checkpoint directories under kDir without a manifest.
std::vector<std::string> TornDirs(FileSystem& fs) {
  std::vector<std::string> torn;
  absl::StatusOr<std::vector<std::string>> names = fs.ListDir(kDir);
  if (!names.ok()) return torn;
  for (const std::string& n : *names) {
    const std::string path = checkpoint::JoinPath(kDir, n);
    if (!fs.Exists(checkpoint::JoinPath(path, checkpoint::kManifestName))) torn.push_back(n);
  }
  return torn;
}

std::optional<int64_t> NewestCommittedStep(FileSystem& fs) {
  absl::StatusOr<std::vector<std::string>> list = checkpoint::ListCommitted(fs, kDir);
  if (!list.ok() || list->empty()) return std::nullopt;
  return checkpoint::StepOfPath(list->front());
}

// The mutating operations of the save of step 4 (a second save: it also prunes).
int64_t OpsOfOneSave() {
  FaultInjectionFileSystem fs({"/"});
  EXPECT_TRUE(TrainOn(fs, 2).result.ok());
  const int64_t before = fs.mutating_ops();
  EXPECT_TRUE(TrainOn(fs, 4).result.ok());
  return fs.mutating_ops() - before;
}

TEST(CheckpointFaultTest, AFencedRunNeitherCommitsNorPrunes) {
  FaultInjectionFileSystem fs({"/"});
  ASSERT_TRUE(TrainOn(fs, 4).result.ok());  // steps 2 and 4 committed
  // A stale run (a newer attempt owns the job) goes on from step 4 but may not commit.
  auto backend = MakeCpuBackend(1);
  std::vector<checkpoint::SaveOutcome> outcomes;
  TrainOptions options;
  options.fs = &fs;
  options.on_checkpoint = [&](const checkpoint::SaveOutcome& o) { outcomes.push_back(o); };
  options.may_commit = [] { return absl::FailedPreconditionError("attempt 1 has ended"); };
  const absl::StatusOr<TrainResult> stale = Train(Job(), *backend, options);
  ASSERT_TRUE(stale.ok()) << stale.status() << " (a refused commit does not stop training)";
  ASSERT_FALSE(outcomes.empty());
  for (const checkpoint::SaveOutcome& o : outcomes) {
    EXPECT_FALSE(o.committed);
    EXPECT_THAT(o.message, HasSubstr("not committed: attempt 1 has ended"));
  }
  // Nothing of the live run's was pruned, and nothing of the stale run's committed.
  absl::StatusOr<std::vector<std::string>> list = checkpoint::ListCommitted(fs, kDir);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
  EXPECT_EQ(NewestCommittedStep(fs), 4);
}

TEST(CheckpointFaultTest, SavesCommitAndTheNextRunContinuesExactly) {
  FaultInjectionFileSystem fs({"/"});
  RunOutcome first = TrainOn(fs, 4);
  ASSERT_TRUE(first.result.ok()) << first.result.status();
  ASSERT_EQ(first.outcomes.size(), 2u);
  EXPECT_TRUE(first.outcomes[1].committed) << first.outcomes[1].message;
  EXPECT_EQ(first.outcomes[1].step, 4);
  EXPECT_GT(first.outcomes[1].bytes, 0);
  fs.SimulateCrash();  // everything a commit claims is durable must be
  EXPECT_EQ(NewestCommittedStep(fs), 4);
  RunOutcome second = TrainOn(fs);
  ASSERT_TRUE(second.result.ok()) << second.result.status();
  EXPECT_EQ(second.result->first_step, 4);
  EXPECT_EQ(second.result->train_losses.size(), 2u);
  EXPECT_EQ(FinalLoss(second), ReferenceLoss());
  // keep: 2 — steps 4 and 6 remain.
  absl::StatusOr<std::vector<std::string>> list = checkpoint::ListCommitted(fs, kDir);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
}

TEST(CheckpointFaultTest, ACheckpointNewerThanTheRecordedOneIsResumedFrom) {
  // The coordinator records a checkpoint when rank 0's report of it arrives: a node that dies
  // between the commit and that report leaves the record one checkpoint behind.
  FaultInjectionFileSystem fs({"/"});
  ASSERT_TRUE(TrainOn(fs, 4).result.ok());  // steps 2 and 4 committed
  absl::StatusOr<std::vector<std::string>> list = checkpoint::ListCommitted(fs, kDir);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  const std::string newest = (*list)[0], recorded = (*list)[1];
  EXPECT_EQ(checkpoint::ResumeCandidates(fs, Job().checkpoint, recorded), *list);
  EXPECT_EQ(checkpoint::ResumeCandidates(fs, Job().checkpoint, newest), *list);
  // A record outside checkpoint.dir (the spec's directory changed) is still tried, after the
  // directory's newer checkpoints.
  EXPECT_EQ(checkpoint::ResumeCandidates(fs, Job().checkpoint, "/elsewhere/step-00000003-x"),
            (std::vector<std::string>{newest, "/elsewhere/step-00000003-x", recorded}));

  auto backend = MakeCpuBackend(1);
  TrainOptions options;
  options.fs = &fs;
  options.recorded_checkpoint = recorded;
  const absl::StatusOr<TrainResult> resumed = Train(Job(), *backend, options);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->first_step, 4);
  EXPECT_EQ(resumed->train_losses.back(), ReferenceLoss());
}

TEST(CheckpointFaultTest, CrashAtEveryOperationOfASave) {
  const int64_t ops = OpsOfOneSave();
  ASSERT_GT(ops, 8);
  for (int64_t n = 0; n < ops; ++n) {
    SCOPED_TRACE(testing::Message() << "crash at operation " << n << " of " << ops);
    FaultInjectionFileSystem fs({"/"});
    ASSERT_TRUE(TrainOn(fs, 2).result.ok());
    fs.FailAt(fs.mutating_ops() + n, Fault::kCrash);
    RunOutcome crashed = TrainOn(fs, 4);
    ASSERT_TRUE(crashed.result.ok()) << crashed.result.status();  // a failed save stops nothing
    fs.SimulateCrash();
    fs.ClearFaults();
    const std::optional<int64_t> newest = NewestCommittedStep(fs);
    ASSERT_TRUE(newest == 2 || newest == 4) << (newest ? *newest : -1);
    RunOutcome resumed = TrainOn(fs);
    ASSERT_TRUE(resumed.result.ok()) << resumed.result.status();
    EXPECT_EQ(resumed.result->first_step, *newest);
    EXPECT_EQ(FinalLoss(resumed), ReferenceLoss());
    EXPECT_THAT(TornDirs(fs), testing::IsEmpty());
  }
}

TEST(CheckpointFaultTest, NoSpaceOrIoErrorFailsTheSaveAndLeavesThePreviousOne) {
  const int64_t ops = OpsOfOneSave();
  for (Fault fault : {Fault::kNoSpace, Fault::kIoError}) {
    for (int64_t n = 0; n < ops; ++n) {
      SCOPED_TRACE(testing::Message()
                   << (fault == Fault::kNoSpace ? "ENOSPC" : "EIO") << " at operation " << n);
      FaultInjectionFileSystem fs({"/"});
      ASSERT_TRUE(TrainOn(fs, 2).result.ok());
      fs.FailAt(fs.mutating_ops() + n, fault);
      RunOutcome run = TrainOn(fs);
      ASSERT_TRUE(run.result.ok()) << run.result.status();
      EXPECT_EQ(FinalLoss(run), ReferenceLoss());  // training went on to the end
      ASSERT_GE(run.outcomes.size(), 1u);
      const checkpoint::SaveOutcome& at4 = run.outcomes[0];
      EXPECT_EQ(at4.step, 4);
      if (!at4.committed) {
        EXPECT_THAT(at4.message, HasSubstr(fault == Fault::kNoSpace ? "No space left on device"
                                                                    : "Input/output error"));
      }
      fs.SimulateCrash();
      EXPECT_TRUE(checkpoint::ReadManifest(fs, checkpoint::ListCommitted(fs, kDir)->back()).ok());
      EXPECT_EQ(NewestCommittedStep(fs), 6);
      EXPECT_THAT(TornDirs(fs), testing::IsEmpty());
    }
  }
}

// The files of the newest checkpoint under kDir.
std::vector<std::string> FilesOfNewest(FileSystem& fs) {
  const std::string newest = checkpoint::ListCommitted(fs, kDir)->front();
  const absl::StatusOr<std::vector<std::string>> names = fs.ListDir(newest);
  std::vector<std::string> files;
  for (const std::string& n : *names) files.push_back(checkpoint::JoinPath(newest, n));
  return files;
}

std::string ShardOfNewest(FileSystem& fs) {
  for (const std::string& file : FilesOfNewest(fs)) {
    if (!file.ends_with(checkpoint::kManifestName)) return file;
  }
  return "";
}

TEST(CheckpointFaultTest, AFlippedBitAnywhereIsDetectedAndThePreviousCheckpointLoads) {
  FaultInjectionFileSystem fs({"/"});
  ASSERT_TRUE(TrainOn(fs, 4).result.ok());
  const std::vector<std::string> files = FilesOfNewest(fs);
  ASSERT_EQ(files.size(), 2u);  // the manifest and one shard: nothing else is left behind
  for (const std::string& file : files) {
    const uint64_t size = *fs.FileSize(file);
    const std::string bytes = *fs.ReadFile(file);
    for (uint64_t offset : {uint64_t{0}, size / 7, size / 3, size / 2, size - 9, size - 1}) {
      // A flip that turns JSON whitespace into other whitespace changes nothing that is read:
      // move to the next byte that means something.
      auto space = [&](uint64_t i) { return std::isspace(static_cast<unsigned char>(bytes[i])); };
      while (offset + 1 < size && space(offset)) ++offset;
      while (offset > 0 && space(offset)) --offset;
      SCOPED_TRACE(testing::Message() << file << " byte " << offset);
      ASSERT_TRUE(fs.CorruptByte(file, offset).ok());
      RunOutcome run = TrainOn(fs, 2);  // restore only: both checkpoints are at step 2 or later
      ASSERT_TRUE(run.result.ok()) << run.result.status();
      EXPECT_EQ(run.result->first_step, 2) << "a corrupt checkpoint was loaded";
      ASSERT_TRUE(fs.CorruptByte(file, offset).ok());  // flip it back
    }
  }
  RunOutcome intact = TrainOn(fs, 2);
  ASSERT_TRUE(intact.result.ok());
  EXPECT_EQ(intact.result->first_step, 4);
}

// Tensors are read straight into the parameters and moments, so a damaged record found part way
// leaves a mix; the previous checkpoint (or, with none intact, the step-0 state) must replace all
// of it: the run ends with the exact loss.
TEST(CheckpointFaultTest, DamageFoundPartWayThroughARestoreLeavesNoTrace) {
  FaultInjectionFileSystem fs({"/"});
  ASSERT_TRUE(TrainOn(fs, 4).result.ok());
  const std::string newest = ShardOfNewest(fs);  // its last records are read last
  ASSERT_TRUE(fs.CorruptByte(newest, *fs.FileSize(newest) - 5).ok());
  RunOutcome fell_back = TrainOn(fs);
  ASSERT_TRUE(fell_back.result.ok()) << fell_back.result.status();
  EXPECT_EQ(fell_back.result->first_step, 2);
  EXPECT_EQ(FinalLoss(fell_back), ReferenceLoss());

  FaultInjectionFileSystem only({"/"});
  config::JobSpec spec = Job();
  spec.checkpoint.keep = 1;
  ASSERT_TRUE(TrainOn(only, 2, spec).result.ok());
  const std::string shard = ShardOfNewest(only);
  ASSERT_TRUE(only.CorruptByte(shard, *only.FileSize(shard) - 5).ok());
  RunOutcome fresh = TrainOn(only, 0, spec);
  ASSERT_TRUE(fresh.result.ok()) << fresh.result.status();
  EXPECT_EQ(fresh.result->first_step, 0);
  EXPECT_EQ(FinalLoss(fresh), ReferenceLoss());
}

// A rank of two threads reads its tensors on both: every tensor arrives (the run continues
// exactly), and a damaged record read by either thread sends the restore to the checkpoint
// before, with nothing of the damaged one left behind.
TEST(CheckpointFaultTest, ARestoreOnTwoThreadsReadsEveryTensorAndFallsBackFromDamage) {
  const double reference = ReferenceLoss(2);
  FaultInjectionFileSystem fs({"/"});
  ASSERT_TRUE(TrainOn(fs, 4, Job(), 2).result.ok());
  RunOutcome resumed = TrainOn(fs, 0, Job(), 2);
  ASSERT_TRUE(resumed.result.ok()) << resumed.result.status();
  EXPECT_EQ(resumed.result->first_step, 4);
  EXPECT_EQ(FinalLoss(resumed), reference);

  for (int part : {5, 2, 1}) {  // the largest tensors are read first
    FaultInjectionFileSystem damaged({"/"});
    ASSERT_TRUE(TrainOn(damaged, 4, Job(), 2).result.ok());
    const std::string shard = ShardOfNewest(damaged);
    const uint64_t offset = *damaged.FileSize(shard) / part - 5;
    SCOPED_TRACE(testing::Message() << "byte " << offset);
    ASSERT_TRUE(damaged.CorruptByte(shard, offset).ok());
    RunOutcome run = TrainOn(damaged, 0, Job(), 2);
    ASSERT_TRUE(run.result.ok()) << run.result.status();
    EXPECT_EQ(run.result->first_step, 2);
    EXPECT_EQ(FinalLoss(run), reference);
  }
}

TEST(CheckpointFaultTest, ATruncatedFileIsDetected) {
  for (int which = 0; which < 2; ++which) {
    FaultInjectionFileSystem fs({"/"});
    ASSERT_TRUE(TrainOn(fs, 4).result.ok());
    const std::string file = FilesOfNewest(fs)[which];
    SCOPED_TRACE(file);
    ASSERT_TRUE(fs.Truncate(file, *fs.FileSize(file) - 4).ok());
    RunOutcome run = TrainOn(fs);
    ASSERT_TRUE(run.result.ok()) << run.result.status();
    EXPECT_EQ(run.result->first_step, 2);
    EXPECT_EQ(FinalLoss(run), ReferenceLoss());
  }
}

TEST(CheckpointFaultTest, ACrashDuringRestoreLeavesTheNextRestartWorking) {
  FaultInjectionFileSystem fs({"/"});
  ASSERT_TRUE(TrainOn(fs, 4).result.ok());
  fs.FailAt(fs.mutating_ops(), Fault::kCrash);  // the machine dies as the next run starts
  RunOutcome interrupted = TrainOn(fs, 5);
  fs.SimulateCrash();
  fs.ClearFaults();
  RunOutcome resumed = TrainOn(fs);
  ASSERT_TRUE(resumed.result.ok()) << resumed.result.status();
  EXPECT_EQ(resumed.result->first_step, 4);
  EXPECT_EQ(FinalLoss(resumed), ReferenceLoss());
}

TEST(CheckpointFaultTest, ResumeFromRejectsBadInput) {
  FaultInjectionFileSystem fs({"/"});
  ASSERT_TRUE(TrainOn(fs, 2).result.ok());
  ASSERT_TRUE(fs.CreateDirs("/empty").ok());
  config::JobSpec spec = Job();
  spec.checkpoint.dir = "/other";
  auto check = [&](const std::string& from) {
    spec.checkpoint.resume_from = from;
    return checkpoint::CheckResumeFrom(fs, spec);
  };
  EXPECT_TRUE(check(kDir).ok());
  EXPECT_TRUE(check(checkpoint::ListCommitted(fs, kDir)->front()).ok());
  EXPECT_EQ(check("/missing").code(), absl::StatusCode::kNotFound);
  absl::Status empty = check("/empty");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("is not a checkpoint"));
  ASSERT_TRUE(fs.SetUnreadable(kDir).ok());
  EXPECT_EQ(check(kDir).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(fs.SetUnreadable(kDir, false).ok());
  spec.model.layers += 1;
  absl::Status other = check(kDir);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.message(), HasSubstr("model.layers"));
  for (const absl::Status& s : {empty, other}) {
    EXPECT_THAT(std::string(s.message()), testing::StartsWith("checkpoint.resume_from: "));
  }
  EXPECT_FALSE(fs.Exists("/other"));  // nothing written
}

}  // namespace
}  // namespace trainyard::worker
