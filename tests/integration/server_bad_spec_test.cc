// Bad specs submitted over gRPC: each is refused with INVALID_ARGUMENT naming the field path (and
// line:column), the server stays up, and nothing is stored — not even after a restart.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/server_harness.h"
#include "tests/integration/tokenizer_files.h"

namespace trainyard::testenv {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = "model: {preset: gpt2-debug}\n";
constexpr char kData[] = "data: {source: markov}\n";
constexpr char kTraining[] = "training: {steps: 5, warmup_steps: 1, batch: 4, seq_len: 16}\n";

std::string Spec(const std::string& name_line, const std::string& model, const std::string& data,
                 const std::string& training, const std::string& extra = "") {
  return name_line + model + data + training + extra;
}

std::string WithExtra(const std::string& extra) {
  return Spec("name: bad\n", kModel, kData, kTraining, extra);
}

struct BadSpec {
  std::string what;
  std::string yaml;
  std::string expected;  // a substring of the message: the field path (or the YAML problem)
};

std::vector<BadSpec> Corpus() {
  std::string deep = "name: deep\nx: ";
  for (int i = 0; i < 40; ++i) deep += "[";
  for (int i = 0; i < 40; ++i) deep += "]";
  deep += "\n";
  return {
      {"misspelled top-level field", "nmae: x\n" + std::string(kModel) + kData + kTraining, "nmae"},
      {"missing name", Spec("", kModel, kData, kTraining), "name"},
      {"name with a space", Spec("name: 'bad name'\n", kModel, kData, kTraining), "name"},
      {"unknown preset", Spec("name: bad\n", "model: {preset: gpt5}\n", kData, kTraining),
       "model.preset"},
      {"zero layers",
       Spec("name: bad\n", "model: {preset: gpt2-debug, layers: 0}\n", kData, kTraining),
       "model.layers"},
      {"heads do not divide width",
       Spec("name: bad\n", "model: {preset: gpt2-debug, heads: 5}\n", kData, kTraining), "model."},
      {"quoted integer", Spec("name: bad\n", kModel, kData, "training: {steps: \"300\"}\n"),
       "training.steps"},
      {"misspelled training field", Spec("name: bad\n", kModel, kData, "training: {stpes: 3}\n"),
       "training.stpes"},
      {"negative batch", Spec("name: bad\n", kModel, kData, "training: {batch: -1}\n"),
       "training.batch"},
      {"micro batch does not divide batch",
       Spec("name: bad\n", kModel, kData,
            "training: {steps: 5, warmup_steps: 1, batch: 4, micro_batch: 3}\n"),
       "training.micro_batch"},
      {"unknown schedule",
       Spec("name: bad\n", kModel, kData,
            "training: {steps: 5, warmup_steps: 1, schedule: sawtooth}\n"),
       "training.schedule"},
      {"sequence longer than the model's",
       Spec("name: bad\n", kModel, kData, "training: {steps: 5, warmup_steps: 1, seq_len: 4096}\n"),
       "training.seq_len"},
      {"non-numeric learning rate",
       Spec("name: bad\n", kModel, kData, "training: {steps: 5, warmup_steps: 1, lr: fast}\n"),
       "training.lr"},
      {"unknown data source", Spec("name: bad\n", kModel, "data: {source: csv}\n", kTraining),
       "data.source"},
      {"path with a markov source",
       Spec("name: bad\n", kModel, "data: {source: markov, path: /tmp/x.bin}\n", kTraining),
       "data.path"},
      {"markov vocabulary beyond the model's",
       Spec("name: bad\n", kModel, "data: {source: markov, markov: {vocab: 100000}}\n", kTraining),
       "data.markov.vocab"},
      {"mesh larger than the resources", WithExtra("parallelism: {dp: 2}\n"), "parallelism.dp"},
      {"ZeRO stage 5", WithExtra("parallelism: {zero: 5}\n"), "parallelism.zero"},
      {"interleaved schedule without virtual stages",
       WithExtra("resources: {devices_per_node: 2}\nparallelism: {pp: 2, schedule: interleaved}\n"),
       "parallelism.virtual_stages"},
      {"sequence not in 2 × cp chunks (16 tokens, cp 3)",
       WithExtra("resources: {devices_per_node: 3}\nparallelism: {cp: 3}\n"), "parallelism.cp"},
      {"more top-k experts than experts",
       Spec("name: bad\n", "model: {preset: gpt2-debug, moe: {experts: 4, top_k: 5}}\n", kData,
            kTraining),
       "model.moe.top_k"},
      {"expert ffn not divisible by tp",
       Spec("name: bad\n", "model: {preset: gpt2-debug, moe: {experts: 4, ffn: 90}}\n", kData,
            kTraining, "resources: {devices_per_node: 4}\nparallelism: {tp: 4}\n"),
       "model.moe.ffn 90 is not divisible by tp 4"},
      {"mixture of experts on GPUs",
       Spec("name: bad\n", "model: {preset: gpt2-debug, moe: {experts: 4}}\n", kData, kTraining,
            "resources: {kind: gpu}\n"),
       "model.moe: needs CPU ranks"},
      {"expert parallelism not dividing the experts",
       Spec("name: bad\n", "model: {preset: gpt2-debug, moe: {experts: 3}}\n", kData, kTraining,
            "resources: {devices_per_node: 2}\nparallelism: {dp: 2, ep: 2}\n"),
       "parallelism.ep: ep 2 does not divide model.moe.experts 3"},
      {"expert parallelism without experts",
       WithExtra("resources: {devices_per_node: 2}\nparallelism: {dp: 2, ep: 2}\n"),
       "parallelism.ep: ep 2 needs a mixture-of-experts model"},
      {"unknown device kind", WithExtra("resources: {kind: tpu}\n"), "resources.kind"},
      {"zero nodes", WithExtra("resources: {nodes: 0}\n"), "resources.nodes"},
      {"negative restarts", WithExtra("fault_tolerance: {max_restarts: -1}\n"),
       "fault_tolerance.max_restarts"},
      {"zero heartbeat timeout", WithExtra("fault_tolerance: {heartbeat_timeout_s: 0}\n"),
       "fault_tolerance.heartbeat_timeout_s"},
      {"priority out of range", WithExtra("priority: 5000\n"), "priority"},
      {"bad label key", WithExtra("labels: {'bad key!': x}\n"), "labels"},
      {"checkpoint without a dir", WithExtra("checkpoint: {every_steps: 10}\n"), "checkpoint.dir"},
      {"anchor and alias", WithExtra("x1: &a {steps: 5}\nx2: *a\n"), "anchor"},
      {"duplicate key", WithExtra("name: again\n"), "name"},
      {"unclosed flow mapping", "name: bad\ntraining: {steps: 5\n", ":"},
      {"nesting too deep", deep, "nest"},
      {"not a mapping", "- just\n- a list\n", "mapping"},
  };
}

class ServerBadSpecTest : public ::testing::Test {
 protected:
  void SetUp() override { state_dir_ = (MakeScratchDir("bad_spec") / "state").string(); }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(std::filesystem::path(state_dir_).parent_path(), ignored);
  }
  std::string state_dir_;
};

TEST_F(ServerBadSpecTest, EveryBadSpecIsRefusedWithItsFieldPathAndNothingIsStored) {
  std::vector<BadSpec> corpus = Corpus();
  ASSERT_GE(corpus.size(), 20u);
  {
    ServerProcess server(state_dir_);
    ASSERT_TRUE(server.ok()) << server.log();
    auto stub = server.JobStub();
    for (const BadSpec& bad : corpus) {
      v1::SubmitJobRequest request;
      request.set_spec_yaml(bad.yaml);
      request.set_spec_source("job.yaml");
      request.set_user("tester");
      v1::SubmitJobReply reply;
      grpc::Status status = stub->SubmitJob(Deadline(10).get(), request, &reply);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << bad.what << ": " << status.error_message();
      EXPECT_THAT(status.error_message(), HasSubstr(bad.expected)) << bad.what;
      EXPECT_THAT(status.error_message(), HasSubstr("job.yaml")) << bad.what;
      EXPECT_FALSE(reply.has_job()) << bad.what;
    }
    // Over the size limit.
    v1::SubmitJobRequest huge;
    huge.set_spec_yaml(WithExtra("# " + std::string(size_t{1} << 20, 'x') + "\n"));
    v1::SubmitJobReply reply;
    EXPECT_EQ(stub->SubmitJob(Deadline(10).get(), huge, &reply).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);

    // Still serving, and nothing was stored.
    EXPECT_TRUE(server.process().running());
    v1::ListJobsReply list;
    ASSERT_TRUE(stub->ListJobs(Deadline(5).get(), v1::ListJobsRequest(), &list).ok());
    EXPECT_EQ(list.jobs_size(), 0);
    v1::GetJobRequest get;
    get.set_job_id("j-000001");
    v1::GetJobReply job;
    EXPECT_EQ(stub->GetJob(Deadline(5).get(), get, &job).error_code(), grpc::StatusCode::NOT_FOUND);

    // The same server accepts a good spec: the refusals above were about the specs.
    v1::SubmitJobRequest good;
    good.set_spec_yaml(SmallSpec("good"));
    ASSERT_TRUE(stub->SubmitJob(Deadline(10).get(), good, &reply).ok());
    EXPECT_EQ(reply.job().id(), "j-000001");
    EXPECT_EQ(reply.job().state(), v1::JOB_STATE_QUEUED);
    server.process().Signal(SIGTERM);
    EXPECT_TRUE(server.process().Wait(std::chrono::seconds(20)).has_value());
  }
  // After a restart, only the good job exists.
  ServerProcess again(state_dir_);
  ASSERT_TRUE(again.ok()) << again.log();
  v1::ListJobsReply list;
  ASSERT_TRUE(again.JobStub()->ListJobs(Deadline(5).get(), v1::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).name(), "good");
}

// Submits `spec_yaml` to a fresh server: it is refused with INVALID_ARGUMENT containing
// `message`, and nothing is stored.
void ExpectRefusedAtSubmit(const std::string& state_dir, const std::string& spec_yaml,
                           const std::string& message) {
  ServerProcess server(state_dir);
  ASSERT_TRUE(server.ok()) << server.log();
  auto stub = server.JobStub();
  v1::SubmitJobRequest request;
  request.set_spec_yaml(spec_yaml);
  request.set_spec_source("job.yaml");
  request.set_user("tester");
  v1::SubmitJobReply reply;
  grpc::Status status = stub->SubmitJob(Deadline(10).get(), request, &reply);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(message));
  v1::ListJobsReply list;
  ASSERT_TRUE(stub->ListJobs(Deadline(5).get(), v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
}

// model.init_from that this machine can read is checked at submit: weights of another model are
// refused naming the field and both values, and nothing is stored.
TEST_F(ServerBadSpecTest, InitFromOfAnotherModelIsRefusedAtSubmit) {
  const std::filesystem::path weights = std::filesystem::path(state_dir_).parent_path() / "gpt2";
  std::filesystem::create_directories(weights);
  std::ofstream(weights / "config.json")
      << R"({"model_type": "gpt2", "vocab_size": 256, "n_positions": 64, "n_embd": 64,)"
      << R"( "n_layer": 3, "n_head": 4})";
  ExpectRefusedAtSubmit(
      state_dir_,
      Spec("name: bad\n", "model: {preset: gpt2-debug, init_from: " + weights.string() + "}\n",
           kData, kTraining),
      "model.init_from: model.layers is 3 in " + (weights / "config.json").string() +
          ", 2 in the spec");
}

// training.sample_tokenizer that this machine can read is checked at submit too: one with ids
// beyond the model's vocabulary is refused naming the field, and nothing is stored.
TEST_F(ServerBadSpecTest, SampleTokenizerBeyondTheVocabularyIsRefusedAtSubmit) {
  const std::filesystem::path tokenizer =
      std::filesystem::path(state_dir_).parent_path() / "tokenizer.json";
  std::ofstream(tokenizer) << ReversedBytesTokenizer(/*added=*/3);
  ExpectRefusedAtSubmit(state_dir_,
                        Spec("name: bad\n", kModel, kData,
                             "training: {steps: 5, warmup_steps: 1, batch: 4, seq_len: 16, "
                             "sample_every: 5, sample_tokens: 8, sample_prompt: hi, "
                             "sample_tokenizer: " +
                                 tokenizer.string() + "}\n"),
                        "training.sample_tokenizer: " + tokenizer.string() +
                            " has ids up to 258, beyond model.vocab 256");
}

}  // namespace
}  // namespace trainyard::testenv
