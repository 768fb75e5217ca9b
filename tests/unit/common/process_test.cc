// Spawn, the project's one fork/exec: the environment it passes, where output goes, the signals
// it leaves blocked, the process group, and an exec failure reported as a status.
#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

class SpawnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (std::filesystem::temp_directory_path() / "spawn-test.XXXXXX").string();
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `script` under /bin/sh with `options` (argv replaced) and waits for it.
  ExitStatus Run(SpawnOptions options, const std::string& script) {
    options.argv = {"/bin/sh", "-c", script};
    absl::StatusOr<pid_t> pid = Spawn(options);
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (!pid.ok()) return {};
    int status = 0;
    EXPECT_EQ(waitpid(*pid, &status, 0), *pid);
    return DecodeWaitStatus(status);
  }
  std::string Read(const std::string& name) {
    std::ifstream in(dir_ + "/" + name);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  std::string Path(const std::string& name) { return dir_ + "/" + name; }

  std::string dir_;
};

TEST_F(SpawnTest, WholeEnvironmentReplacesThisProcesss) {
  ASSERT_EQ(setenv("SPAWN_TEST_INHERITED", "yes", 1), 0);
  SpawnOptions options{.env = std::vector<std::string>{"ONLY=this"}, .stdout_path = Path("out")};
  EXPECT_EQ(Run(options, "echo \"$ONLY/$SPAWN_TEST_INHERITED\"").exit_code, 0);
  EXPECT_EQ(Read("out"), "this/\n");
}

TEST_F(SpawnTest, ExtraEnvironmentIsAddedToTheInheritedOne) {
  ASSERT_EQ(setenv("SPAWN_TEST_INHERITED", "yes", 1), 0);
  ASSERT_EQ(setenv("SPAWN_TEST_REPLACED", "old", 1), 0);
  SpawnOptions options{.extra_env = {"SPAWN_TEST_REPLACED=new", "SPAWN_TEST_ADDED=1"},
                       .stdout_path = Path("out")};
  EXPECT_EQ(Run(options, "echo \"$SPAWN_TEST_INHERITED $SPAWN_TEST_REPLACED $SPAWN_TEST_ADDED\"")
                .exit_code,
            0);
  EXPECT_EQ(Read("out"), "yes new 1\n");
}

TEST_F(SpawnTest, OutputGoesToSeparateOrSharedFilesAppended) {
  SpawnOptions apart{.stdout_path = Path("out"), .stderr_path = Path("err")};
  EXPECT_EQ(Run(apart, "echo o; echo e >&2; exit 4").exit_code, 4);
  EXPECT_EQ(Read("out"), "o\n");
  EXPECT_EQ(Read("err"), "e\n");
  SpawnOptions together{.stdout_path = Path("log"), .stderr_path = Path("log")};
  Run(together, "echo one; echo two >&2");
  Run(together, "echo three");
  EXPECT_EQ(Read("log"), "one\ntwo\nthree\n");
}

TEST_F(SpawnTest, StdinIsDevNullAndNoDescriptorLeaks) {
  const int leaked = open("/dev/null", O_RDONLY);  // deliberately without O_CLOEXEC
  ASSERT_GE(leaked, 0);
  SpawnOptions options{.stdout_path = Path("out")};
  Run(options, "read line; echo \"read $?\"; ls /proc/self/fd | wc -l");
  close(leaked);
  // stdin at EOF; fds 0, 1, 2 and the one ls opens to list the directory: nothing inherited.
  EXPECT_EQ(Read("out"), "read 1\n4\n");
}

TEST_F(SpawnTest, BlockedSignalsStayBlockedAcrossExecAndTheChildLeadsItsGroup) {
  // Read by the exec'd program itself (a shell may change its own mask).
  SpawnOptions options{.argv = {"/bin/grep", "-E", "^(SigBlk|NSpgid|NSpid)", "/proc/self/status"},
                       .stdout_path = Path("out"),
                       .blocked_signals = {SIGTERM}};
  absl::StatusOr<pid_t> pid = Spawn(options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  int status = 0;
  ASSERT_EQ(waitpid(*pid, &status, 0), *pid);
  const std::string out = Read("out");
  // SigBlk is a hex mask; SIGTERM (15) is bit 14 = 0x4000.
  EXPECT_NE(out.find("SigBlk:\t0000000000004000"), std::string::npos) << out;
  EXPECT_NE(out.find(absl::StrCat("NSpgid:\t", *pid, "\n")), std::string::npos) << out;
}

TEST_F(SpawnTest, AProgramThatCannotRunIsAStatusNotExit127) {
  absl::StatusOr<pid_t> pid = Spawn({.argv = {"/nonexistent/program"}});
  ASSERT_FALSE(pid.ok());
  EXPECT_TRUE(absl::IsUnavailable(pid.status())) << pid.status();
  EXPECT_NE(pid.status().message().find("exec /nonexistent/program"), std::string::npos);
  EXPECT_TRUE(absl::IsInvalidArgument(Spawn({}).status()));
  SpawnOptions unwritable{.argv = {"/bin/true"}, .stdout_path = Path("no/such/dir/out")};
  EXPECT_TRUE(absl::IsUnavailable(Spawn(unwritable).status()));
}

TEST_F(SpawnTest, ASignalledChildDecodesAsItsSignal) {
  const ExitStatus killed = Run({}, "kill -9 $$");
  EXPECT_EQ(killed.signal, SIGKILL);
}

}  // namespace
}  // namespace trainyard
