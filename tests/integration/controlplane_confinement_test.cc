// Path confinement through the control plane (a coordinator with --data-root and
// --checkpoint-root, its embedded agent, real workers): symbolic links that lead out of the roots
// are refused at submit, and a link swapped in after the coordinator checked a path cannot be
// read by the worker.
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/controlplane_util.h"

namespace trainyard::testenv {
namespace {

namespace fs = std::filesystem;

class AuthConfinementTest : public testing::Test {
 protected:
  AuthConfinementTest() : cp_("cp_confinement") {}

  void SetUp() override {
    data_ = cp_.dir() + "/data";
    ckpt_ = cp_.dir() + "/ckpt";
    outside_ = cp_.dir() + "/outside";
    for (const std::string& dir : {data_ + "/corpus", ckpt_, outside_}) fs::create_directories(dir);
    std::string text;
    for (int i = 0; i < 2000; ++i) text += "the quick brown fox jumps over the lazy dog. ";
    std::ofstream(data_ + "/corpus/train.txt") << text;
    std::ofstream(outside_ + "/train.txt") << text;  // the "secret" a link would expose
    cp_.StartServer({.local_agent = true,
                     .local_slots = 1,
                     .extra_args = {"--data-root", data_, "--checkpoint-root", ckpt_}});
  }

  std::string TextJob(const std::string& name, const std::string& path, int steps,
                      const std::string& checkpoint = "") {
    return TinySpec({.name = name,
                     .steps = steps,
                     .data = "{source: text, path: " + path + "}",
                     .checkpoint = checkpoint});
  }

  ControlPlane cp_;
  std::string data_, ckpt_, outside_;
};

TEST_F(AuthConfinementTest, LinksLeadingOutAreRefusedAtSubmit) {
  fs::create_symlink(outside_ + "/train.txt", data_ + "/link.txt");
  fs::create_directory_symlink(outside_, data_ + "/linked-dir");
  fs::create_directory_symlink(outside_, ckpt_ + "/linked-ckpt");
  const std::string cases[] = {
      TextJob("file", data_ + "/link.txt", 5),
      TextJob("dir", data_ + "/linked-dir/train.txt", 5),
      TextJob("ckpt", data_ + "/corpus/train.txt", 5, "{dir: " + ckpt_ + "/linked-ckpt/run}"),
  };
  int i = 0;
  for (const std::string& spec : cases) {
    const ProcessResult submit =
        cp_.Cli({"submit", cp_.WriteSpec("bad" + std::to_string(i++) + ".yaml", spec)});
    EXPECT_EQ(submit.exit_code, 2) << submit.out << submit.err;
    EXPECT_THAT(submit.err, testing::HasSubstr("symbolic link")) << spec;
  }
  const ProcessResult list = cp_.Cli({"list"});
  EXPECT_THAT(list.out, testing::Not(testing::HasSubstr("j-"))) << "a refused job was stored";
}

TEST_F(AuthConfinementTest, ALinkSwappedInAfterSubmitIsNotFollowedByTheWorker) {
  // The one slot is busy, so the second job waits in the queue with its checked path.
  const std::string busy =
      cp_.Submit(cp_.WriteSpec("busy.yaml", TinySpec({.name = "busy", .steps = 1000000})));
  ASSERT_TRUE(cp_.WaitForStep(busy, 1, 120));
  const std::string queued =
      cp_.Submit(cp_.WriteSpec("queued.yaml", TextJob("queued", data_ + "/corpus/train.txt", 5)));
  ASSERT_FALSE(queued.empty());
  // Now the checked directory becomes a link out of the root.
  fs::remove_all(data_ + "/corpus");
  fs::create_directory_symlink(outside_, data_ + "/corpus");
  EXPECT_EQ(cp_.Cli({"cancel", busy}).exit_code, 0);

  ASSERT_TRUE(cp_.WaitFor(
      queued, [](const v1::GetJobReply& r) { return r.job().state() == v1::JOB_STATE_FAILED; },
      120))
      << cp_.Cli({"status", queued}).out;
  const ProcessResult logs = cp_.Cli({"logs", queued, "--rank", "0"});
  EXPECT_THAT(logs.out + logs.err, testing::HasSubstr("outside the allowed directories"));
}

}  // namespace
}  // namespace trainyard::testenv
