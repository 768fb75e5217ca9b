// The CLI's behaviour that needs no coordinator: argument errors, server resolution, exit codes.
// (Commands against a real coordinator are covered by the control-plane integration tests.)
#include "tools/cli/commands.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>

#include "absl/strings/match.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cli/server_address.h"

namespace trainyard::cli {
namespace {

using ::testing::HasSubstr;

class CommandsTest : public ::testing::Test {
 protected:
  int Run(std::vector<std::string> args) {
    out_.str("");
    err_.str("");
    CliIo io;
    io.out = &out_;
    io.err = &err_;
    io.server_env = server_env_;
    io.fs = &fs_;
    io.clock = &clock_;
    io.state_dir = "/state";
    return RunCli(args, io);
  }

  // A loopback port nobody listens on.
  static std::string DeadAddress() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    close(fd);
    return "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  }

  std::ostringstream out_, err_;
  std::string server_env_;
  FakeFileSystem fs_;
  FakeClock clock_;
};

TEST_F(CommandsTest, HelpAndBadCommandLines) {
  EXPECT_EQ(Run({"--help"}), 0);
  EXPECT_THAT(out_.str(), HasSubstr("usage: trainyard"));
  EXPECT_EQ(Run({}), 2);
  EXPECT_EQ(Run({"frobnicate"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("trainyard: error: unknown command 'frobnicate'"));
  EXPECT_EQ(Run({"frobnicate", "--colour"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("unknown command 'frobnicate'"));
  // One parser: --flag=value as well as --flag value, and a switch is no flag's value.
  EXPECT_EQ(Run({"--server=127.0.0.1:1", "logs", "--follow", "--tail=-3", "j-1"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--tail must be a non-negative integer, got '-3'"));
  EXPECT_EQ(Run({"list", "--colour"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("unknown flag '--colour' for 'list'"));
  EXPECT_EQ(Run({"logs", "j-1", "--rank"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--rank needs a value"));
  EXPECT_EQ(Run({"--server", "127.0.0.1:1", "status"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("usage: trainyard status JOB"));
  EXPECT_EQ(Run({"--server", "127.0.0.1:1", "list", "--state", "sleeping"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("unknown state 'sleeping'"));
  EXPECT_EQ(Run({"--server", "127.0.0.1:1", "logs", "j-1", "--tail", "-3"}), 2);
}

TEST_F(CommandsTest, CheckpointsAndDrainCommandLines) {
  EXPECT_EQ(Run({"--help"}), 0);
  EXPECT_THAT(out_.str(), HasSubstr("checkpoints JOB"));
  EXPECT_THAT(out_.str(), HasSubstr("drain JOB [--reason TEXT]"));
  EXPECT_THAT(out_.str(), HasSubstr("5 drained"));
  EXPECT_EQ(Run({"--server", "127.0.0.1:1", "drain"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("usage: trainyard drain JOB"));
  EXPECT_EQ(Run({"--server", "127.0.0.1:1", "checkpoints", "j-1", "j-2"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("usage: trainyard checkpoints JOB"));
  EXPECT_EQ(Run({"checkpoints", "j-1", "--rank", "0"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("unknown flag '--rank' for 'checkpoints'"));
  EXPECT_EQ(Run({"drain", "j-1", "--reason"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--reason needs a value"));
  const std::string dead = DeadAddress();
  EXPECT_EQ(Run({"--server", dead, "drain", "j-1", "--reason", "maintenance"}), 3);
  EXPECT_THAT(err_.str(), HasSubstr("cannot reach the coordinator at " + dead));
  EXPECT_EQ(Run({"--server", dead, "checkpoints", "j-1", "--json"}), 3);
  // With --json the error is also a JSON object on stdout.
  EXPECT_THAT(out_.str(), HasSubstr("{\"error\":{\"code\":\"UNAVAILABLE\",\"message\":\"cannot "
                                    "reach the coordinator at " +
                                    dead));
  EXPECT_THAT(out_.str(), HasSubstr("\"exit_code\":3}}\n"));
  EXPECT_EQ(Run({"list", "--json", "--colour"}), 2);
  EXPECT_THAT(out_.str(), HasSubstr("{\"error\":{\"code\":\"INVALID_ARGUMENT\""));
}

TEST_F(CommandsTest, AMissingSpecIsBadInput) {
  EXPECT_EQ(Run({"--server", "127.0.0.1:1", "submit", "/jobs/missing.yaml"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read the spec"));
  EXPECT_THAT(err_.str(), HasSubstr("/jobs/missing.yaml"));
}

TEST_F(CommandsTest, ASpecOverTheSizeLimitIsBadInputBeforeItIsSent) {
  ASSERT_TRUE(fs_.CreateDirs("/jobs").ok());
  ASSERT_TRUE(fs_.WriteFileAtomic("/jobs/big.yaml", std::string((1 << 20) + 1, '#')).ok());
  EXPECT_EQ(Run({"--server", DeadAddress(), "submit", "/jobs/big.yaml"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("/jobs/big.yaml: the spec is 1048577 bytes, over the limit"));
}

TEST_F(CommandsTest, NoServerToTalkToIsExitThree) {
  EXPECT_EQ(Run({"list"}), 3);
  EXPECT_THAT(err_.str(), HasSubstr("no coordinator address"));
  const std::string dead = DeadAddress();
  EXPECT_EQ(Run({"--server", dead, "list"}), 3);
  EXPECT_THAT(err_.str(), HasSubstr("cannot reach the coordinator at " + dead));
  server_env_ = dead;
  EXPECT_EQ(Run({"status", "j-1", "--json"}), 3);
  ASSERT_TRUE(fs_.CreateDirs("/state").ok());
  ASSERT_TRUE(fs_.WriteFileAtomic("/state/server.addr", dead + "\n").ok());
  server_env_.clear();
  EXPECT_EQ(Run({"watch", "j-1"}), 3);  // gives up after the reconnect window (fake time)
  EXPECT_GE(clock_.TotalSlept(), absl::Seconds(60));
}

// export, sample and tokenize print plain text: --json is refused before the coordinator is
// asked.
TEST_F(CommandsTest, ExportAndSampleRefuseJson) {
  EXPECT_EQ(Run({"--server", DeadAddress(), "--json", "export", "j-1", "--format", "hf", "--out",
                 "/out"}),
            2);
  EXPECT_THAT(err_.str(), HasSubstr("--json is not available for export: it prints plain text"));
  EXPECT_EQ(Run({"--server", DeadAddress(), "sample", "j-1", "--prompt", "hi", "--json"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--json is not available for sample: it prints plain text"));
  EXPECT_EQ(Run({"--help"}), 0);
  EXPECT_THAT(out_.str(), HasSubstr("for every command but export, sample"));
  EXPECT_THAT(out_.str(), HasSubstr("[--device cpu|cuda] [--threads N]"));
  EXPECT_EQ(Run({"--json", "tokenize", "a.txt", "--tokenizer", "t.json", "--out", "/o"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--json is not available for tokenize: it prints plain text"));
}

// Of a path on this machine, export and sample reach no coordinator, nor does tokenize: its flags
// are refused by name (the worker is not started).
TEST_F(CommandsTest, ExportAndSampleOfALocalPathRefuseConnectionFlags) {
  ASSERT_TRUE(fs_.CreateDirs("/weights").ok());
  ASSERT_TRUE(fs_.WriteFileAtomic("/weights/model.bin", "not a model").ok());
  for (const std::string flag :
       {"--server", "--token-file", "--tls-ca", "--tls-cert", "--tls-key"}) {
    EXPECT_EQ(Run({flag, "/x", "sample", "/weights/model.bin", "--prompt", "hi"}), 2) << flag;
    EXPECT_THAT(err_.str(), HasSubstr(flag + " is not used: sample reads '/weights/model.bin' on "
                                             "this machine, without a coordinator"));
    EXPECT_EQ(Run({"export", "/weights/model.bin", "--format", "hf", "--out", "/out", flag, "/x"}),
              2)
        << flag;
    EXPECT_THAT(err_.str(), HasSubstr(flag + " is not used: export reads '/weights/model.bin'"));
    EXPECT_EQ(Run({flag, "/x", "tokenize", "a.txt", "--tokenizer", "t.json", "--out", "/o"}), 2);
    EXPECT_THAT(err_.str(), HasSubstr(flag + " is not used: tokenize reads 'a.txt' on this "
                                             "machine, without a coordinator"));
  }
}

TEST(ServerAddressTest, FlagThenEnvironmentThenStateFile) {
  FakeFileSystem fs;
  EXPECT_EQ(*ResolveServerAddress("a:1", "b:2", fs, "/s"), "a:1");
  EXPECT_EQ(*ResolveServerAddress("", "b:2", fs, "/s"), "b:2");
  EXPECT_TRUE(absl::IsUnavailable(ResolveServerAddress("", "", fs, "/s").status()));
  ASSERT_TRUE(fs.CreateDirs("/s").ok());
  ASSERT_TRUE(fs.WriteFileAtomic("/s/server.addr", "127.0.0.1:4567\n").ok());
  EXPECT_EQ(*ResolveServerAddress("", "", fs, "/s"), "127.0.0.1:4567");
}

}  // namespace
}  // namespace trainyard::cli
