// Checkpoints against real processes: a 2-rank standalone job (two worker processes under the
// local launcher) is killed with SIGKILL at 20 random moments while it saves a checkpoint every
// step; every run after a kill resumes from the newest committed checkpoint, and the last run
// ends with exactly the final loss of a run nobody killed. SIGTERM drains: the job checkpoints at
// a step both ranks agree on, exits 0, and the same command continues from there, again to the
// exact same loss.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/child_process.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_env.h"

namespace trainyard::testenv {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kSteps = 3000;

class CheckpointChaos : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeScratchDir("checkpoint_chaos"); }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A 2-rank data-parallel job (ZeRO-1: each rank owns half the optimizer state) of a tiny model.
  std::string Spec(const std::string& name, bool checkpoint) {
    std::string yaml = absl::StrCat(
        "name: chaos\nmodel: {preset: gpt2-debug}\ndata: {source: markov}\n"
        "training: {steps: ",
        kSteps,
        ", batch: 4, seq_len: 16, warmup_steps: 5, eval_every: 0, "
        "log_every: 1, threads: 1}\n"
        "parallelism: {dp: 2, zero: 1}\nresources: {devices_per_node: 2}\n");
    if (checkpoint) {
      absl::StrAppend(&yaml, "checkpoint: {dir: ", (dir_ / "ck").string(),
                      ", every_steps: 1, keep: 2}\n");
    }
    const fs::path path = dir_ / name;
    std::ofstream(path) << yaml;
    return path.string();
  }

  std::vector<std::string> Argv(const std::string& spec) {
    return {BinaryDir() + "/worker/trainyard-worker", "--standalone", spec, "--threads", "1"};
  }

  // The newest committed checkpoint's step under ck/ (0 when none).
  int64_t NewestCommitted() {
    int64_t newest = 0;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir_ / "ck", ec)) {
      const std::string name = entry.path().filename().string();
      int64_t step = 0;
      if (name.rfind("step-", 0) == 0 && fs::exists(entry.path() / "manifest.json") &&
          absl::SimpleAtoi(name.substr(5, 8), &step)) {
        newest = std::max(newest, step);
      }
    }
    return newest;
  }

  // The checkpoint directories under ck/.
  std::set<std::string> CheckpointDirs() {
    std::set<std::string> names;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir_ / "ck", ec)) {
      names.insert(entry.path().filename().string());
    }
    return names;
  }

  // A save of this run is being written: a directory without a manifest that was not there
  // before the run (a killed run's torn directories stay until the next commit prunes them).
  bool SaveInFlight(const std::set<std::string>& before) {
    for (const std::string& name : CheckpointDirs()) {
      if (!before.count(name) && !fs::exists(dir_ / "ck" / name / "manifest.json")) return true;
    }
    return false;
  }

  fs::path dir_;
};

std::string ExactFinalLoss(const std::string& out) {
  std::smatch m;
  return std::regex_search(out, m, std::regex("exact final loss (\\S+)")) ? m[1].str() : "";
}

// The pids of `parent`'s children.
std::vector<pid_t> Children(pid_t parent) {
  std::vector<pid_t> pids;
  std::ifstream in(absl::StrCat("/proc/", parent, "/task/", parent, "/children"));
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  return pids;
}

TEST_F(CheckpointChaos, KillNineDuringSavesNeverLosesTheExactLoss) {
  const ProcessResult reference = RunProcess(Argv(Spec("plain.yaml", false)), 300);
  ASSERT_EQ(reference.exit_code, 0) << reference.out << reference.err;
  const std::string want = ExactFinalLoss(reference.out);
  ASSERT_FALSE(want.empty()) << reference.out;

  const std::string spec = Spec("job.yaml", true);
  std::mt19937 random(20261123);
  int kills = 0, mid_save = 0, runs = 0;
  while (kills < 20) {
    ASSERT_LT(++runs, 40) << "the job kept finishing before the kill";
    const int64_t resume_from = NewestCommitted();
    const std::set<std::string> before = CheckpointDirs();
    const std::string out = (dir_ / absl::StrCat("run", runs, ".out")).string();
    ChildProcess job(Argv(spec), out, out + ".err");
    // Every run gets somewhere: wait for its first commit (however loaded the machine), then
    // let it train a random while longer.
    for (int i = 0;
         i < 6000 && ReadWholeFile(out).find(" committed: ") == std::string::npos && job.running();
         ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 500)(random)));
    const std::vector<pid_t> ranks = Children(job.pid());
    if (ranks.size() != 2) {
      ASSERT_TRUE(job.Wait(std::chrono::seconds(60)).has_value());
      continue;  // finished (or not started yet): try again
    }
    // Aim at a save: wait (a little) for one to be in flight.
    for (int i = 0; i < 4000 && !SaveInFlight(before); ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    const bool saving = SaveInFlight(before);
    kill(ranks[std::uniform_int_distribution<int>(0, 1)(random)], SIGKILL);
    const std::optional<int> status = job.Wait(std::chrono::seconds(60));
    ASSERT_TRUE(status.has_value()) << "the launcher must notice a dead rank";
    if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) continue;  // it finished first
    ++kills;
    mid_save += saving;
    const std::string log = ReadWholeFile(out);
    EXPECT_GT(NewestCommitted(), resume_from) << "run " << runs << " committed nothing";
    if (resume_from > 0 && log.find("step ") != std::string::npos) {
      EXPECT_THAT(log, HasSubstr(absl::StrCat("resumed from step ", resume_from, ": ")))
          << "run " << runs;
    }
  }
  std::printf("%d kills, %d of them with a save in flight, over %d runs\n", kills, mid_save, runs);
  EXPECT_GE(mid_save, 10) << "the kills should land during saves";
  const ProcessResult last = RunProcess(Argv(spec), 300);
  ASSERT_EQ(last.exit_code, 0) << last.out << last.err;
  EXPECT_THAT(last.out, HasSubstr("resumed from step"));
  EXPECT_EQ(ExactFinalLoss(last.out), want) << last.out;
}

TEST_F(CheckpointChaos, SigtermDrainsAndTheSameCommandContinues) {
  const ProcessResult reference = RunProcess(Argv(Spec("plain.yaml", false)), 300);
  ASSERT_EQ(reference.exit_code, 0) << reference.out << reference.err;
  const std::string spec = Spec("job.yaml", true);
  const std::string out = (dir_ / "drained.out").string();
  {
    ChildProcess job(Argv(spec), out, out + ".err");
    // Let it train a few steps, then ask it to stop as a batch system would.
    for (int i = 0; i < 600 && ReadWholeFile(out).find("step   10/") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    job.Signal(SIGTERM);
    const std::optional<int> status = job.Wait(std::chrono::seconds(60));
    ASSERT_TRUE(status.has_value());
    ASSERT_TRUE(WIFEXITED(*status)) << ReadWholeFile(out) << ReadWholeFile(out + ".err");
    EXPECT_EQ(WEXITSTATUS(*status), 0) << ReadWholeFile(out) << ReadWholeFile(out + ".err");
  }
  const std::string log = ReadWholeFile(out);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("drained at step (\\d+)"))) << log;
  const std::string step = m[1].str();
  EXPECT_THAT(log, HasSubstr(absl::StrCat("checkpoint step ", step, " committed")));
  EXPECT_LT(std::stoi(step), kSteps);
  EXPECT_EQ(NewestCommitted(), std::stoi(step));

  const ProcessResult resumed = RunProcess(Argv(spec), 300);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr(absl::StrCat("resumed from step ", step, ": ")));
  EXPECT_EQ(ExactFinalLoss(resumed.out), ExactFinalLoss(reference.out));
}

}  // namespace
}  // namespace trainyard::testenv
