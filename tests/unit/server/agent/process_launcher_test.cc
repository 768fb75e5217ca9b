// RealProcessLauncher with real short-lived processes (/bin/sh, /bin/sleep, /usr/bin/env).
#include "server/agent/process_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/server/agent/agent_test_util.h"

namespace trainyard::server::agent {
namespace {

using ::testing::HasSubstr;
using ::trainyard::server::agent::testing::ReadWholeFile;
using ::trainyard::server::agent::testing::TempDir;

class ProcessLauncherTest : public ::testing::Test {
 protected:
  LaunchRequest Request(std::vector<std::string> argv) {
    return LaunchRequest{.argv = std::move(argv),
                         .env = {"PATH=/usr/bin:/bin"},
                         .log_path = dir_.path() + "/out.log"};
  }

  // Polls until the process has ended (at most 10 s).
  ProcessExit WaitForExit(const ProcessId& id) {
    for (int i = 0; i < 1000; ++i) {
      if (std::optional<ProcessExit> exit = launcher_->Poll(id)) return *exit;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "pid " << id.pid << " did not exit";
    kill(-static_cast<pid_t>(id.pid), SIGKILL);
    return *launcher_->Poll(id);
  }

  bool GoneWithin(int64_t pid, int millis) {
    for (int i = 0; i < millis / 10; ++i) {
      if (!ProcessStartTicks(pid)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  std::string Log() { return ReadWholeFile(dir_.path() + "/out.log"); }

  TempDir dir_;
  std::unique_ptr<ProcessLauncher> launcher_ = MakeRealProcessLauncher();
};

TEST_F(ProcessLauncherTest, CapturesOutputAndExitCode) {
  absl::StatusOr<ProcessId> id =
      launcher_->Launch(Request({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_GT(id->start_ticks, 0u);
  const ProcessExit exit = WaitForExit(*id);
  EXPECT_TRUE(exit.known);
  EXPECT_EQ(exit.exit_code, 3);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_EQ(Log(), "out\nerr\n");
  // Appends rather than truncates.
  ASSERT_TRUE(WaitForExit(*launcher_->Launch(Request({"/bin/sh", "-c", "echo again"}))).known);
  EXPECT_EQ(Log(), "out\nerr\nagain\n");
}

TEST_F(ProcessLauncherTest, TheEnvironmentIsExactlyTheOneGiven) {
  setenv("TRAINYARD_TEST_LEAK", "1", 1);
  LaunchRequest request = Request({"/usr/bin/env"});
  request.env = {"A=1", "B=two words"};
  absl::StatusOr<ProcessId> id = launcher_->Launch(request);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(WaitForExit(*id).exit_code, 0);
  EXPECT_EQ(Log(), "A=1\nB=two words\n");
  unsetenv("TRAINYARD_TEST_LEAK");
}

TEST_F(ProcessLauncherTest, NoShellInterpretsTheArguments) {
  absl::StatusOr<ProcessId> id = launcher_->Launch(Request({"/bin/echo", "$HOME", "a;b", "`x`"}));
  ASSERT_TRUE(id.ok());
  WaitForExit(*id);
  EXPECT_EQ(Log(), "$HOME a;b `x`\n");
}

TEST_F(ProcessLauncherTest, RunsInItsOwnProcessGroupAndDiesOfSignals) {
  absl::StatusOr<ProcessId> id = launcher_->Launch(Request({"/bin/sleep", "30"}));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(getpgid(static_cast<pid_t>(id->pid)), id->pid);
  EXPECT_NE(getpgid(static_cast<pid_t>(id->pid)), getpgrp());
  EXPECT_TRUE(launcher_->IsAlive(*id));
  EXPECT_FALSE(launcher_->Poll(*id).has_value());
  ASSERT_TRUE(launcher_->SignalGroup(*id, SIGTERM).ok());
  const ProcessExit exit = WaitForExit(*id);
  EXPECT_EQ(exit.signal, SIGTERM);
  EXPECT_FALSE(launcher_->IsAlive(*id));
  EXPECT_TRUE(launcher_->SignalGroup(*id, SIGKILL).ok());  // gone: nothing to do
}

TEST_F(ProcessLauncherTest, IgnoredSignalsAreResetInTheChild) {
  struct sigaction ignore = {}, previous = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGTERM, &ignore, &previous);
  absl::StatusOr<ProcessId> id = launcher_->Launch(Request({"/bin/sleep", "30"}));
  sigaction(SIGTERM, &previous, nullptr);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(launcher_->SignalGroup(*id, SIGTERM).ok());
  EXPECT_EQ(WaitForExit(*id).signal, SIGTERM);
}

TEST_F(ProcessLauncherTest, SignallingTheGroupReachesGrandchildren) {
  absl::StatusOr<ProcessId> id =
      launcher_->Launch(Request({"/bin/sh", "-c", "sleep 300 & echo $!; wait"}));
  ASSERT_TRUE(id.ok());
  int64_t grandchild = 0;
  for (int i = 0; i < 500 && grandchild == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(Log()), &grandchild);
  }
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(ProcessStartTicks(grandchild).has_value());
  ASSERT_TRUE(launcher_->SignalGroup(*id, SIGKILL).ok());
  EXPECT_EQ(WaitForExit(*id).signal, SIGKILL);
  EXPECT_TRUE(GoneWithin(grandchild, 5000));
}

TEST_F(ProcessLauncherTest, WhatALeaderLeavesBehindIsKilledWhenItIsReaped) {
  absl::StatusOr<ProcessId> id =
      launcher_->Launch(Request({"/bin/sh", "-c", "sleep 300 & echo $!"}));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(WaitForExit(*id).exit_code, 0);
  int64_t orphan = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(Log()), &orphan));
  EXPECT_TRUE(GoneWithin(orphan, 5000));
}

TEST_F(ProcessLauncherTest, ExecFailureIsAnError) {
  absl::StatusOr<ProcessId> id = launcher_->Launch(Request({"/nonexistent/trainyard-worker"}));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(id.status().message(), "exec /nonexistent/trainyard-worker: No such file or directory");
  // A relative name is not looked up on PATH.
  EXPECT_FALSE(launcher_->Launch(Request({"sleep", "1"})).ok());
  LaunchRequest bad_log = Request({"/bin/true"});
  bad_log.log_path = dir_.path() + "/missing/dir/out.log";
  absl::Status status = launcher_->Launch(bad_log).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("open " + bad_log.log_path));
}

TEST_F(ProcessLauncherTest, DescriptorsDoNotLeakIntoTheChild) {
  const int leaked = open("/dev/null", O_RDONLY);  // deliberately without O_CLOEXEC
  ASSERT_GE(leaked, 3);
  absl::StatusOr<ProcessId> id = launcher_->Launch(Request({"/bin/ls", "/proc/self/fd"}));
  close(leaked);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(WaitForExit(*id).exit_code, 0);
  std::set<std::string> fds;
  for (absl::string_view fd : absl::StrSplit(Log(), '\n', absl::SkipEmpty())) fds.emplace(fd);
  // 0-2 are stdin/stdout/stderr; 3 is ls's own handle on /proc/self/fd.
  EXPECT_EQ(fds, (std::set<std::string>{"0", "1", "2", "3"}));
}

TEST_F(ProcessLauncherTest, ForeignProcessesAreWatchedByPidAndStartTime) {
  const ProcessId self{getpid(), *ProcessStartTicks(getpid())};
  EXPECT_TRUE(launcher_->IsAlive(self));
  EXPECT_FALSE(launcher_->Poll(self).has_value());                     // not our child, but alive
  EXPECT_FALSE(launcher_->IsAlive({getpid(), self.start_ticks + 1}));  // a reused pid
  const std::optional<ProcessExit> gone = launcher_->Poll({getpid(), self.start_ticks + 1});
  ASSERT_TRUE(gone.has_value());
  EXPECT_FALSE(gone->known);
  EXPECT_FALSE(ProcessStartTicks(0).has_value());
}

}  // namespace
}  // namespace trainyard::server::agent
