// Specs that must be refused: each with the exact field path, position and a phrase of the reason,
// and always one line. Then the hostile ones (deep nesting, alias bombs, huge files), which must
// also be refused quickly, and random corruptions of a good spec, which must never crash.
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "config/spec.h"
#include "gtest/gtest.h"

namespace trainyard::config {
namespace {

struct BadSpec {
  const char* label;
  std::string yaml;
  std::string location;  // "line:column"
  std::string path;
  std::string reason_part;
};

// A valid spec that the cases below each break in one place.
std::string Base(const std::string& training, const std::string& data = "") {
  return absl::StrCat("name: job\nmodel:\n  preset: gpt2-debug\n", data, "training:\n", training);
}

std::vector<BadSpec> BadSpecs() {
  return {
      {"string for int", Base("  steps: many\n"), "5:10", "training.steps",
       "expected an integer, got 'many'"},
      {"quoted int", Base("  steps: \"300\"\n"), "5:10", "training.steps",
       "expected an integer, got the quoted string '300'"},
      {"float for int", Base("  batch: 3.5\n"), "5:10", "training.batch",
       "expected an integer, got '3.5'"},
      {"exponent for int", Base("  steps: 1e3\n"), "5:10", "training.steps", "(write it as 1000)"},
      {"int out of range", Base("  batch: 99999999999\n"), "5:10", "training.batch",
       "out of range"},
      {"list for map", "name: job\nmodel: {preset: gpt2-debug}\ntraining: [1, 2]\n", "3:11",
       "training", "expected a mapping, got a sequence"},
      {"map for int", Base("  steps: {a: 1}\n"), "5:10", "training.steps",
       "expected an integer, got a mapping"},
      {"empty value", Base("  steps:\n  batch: 2\n"), "5:3", "training.steps",
       "expected an integer, got null"},
      {"zero steps", Base("  steps: 0\n"), "5:10", "training.steps", "must be at least 1, got 0"},
      {"negative steps", Base("  steps: -5\n"), "5:10", "training.steps", "got -5"},
      {"micro_batch", Base("  batch: 16\n  micro_batch: 5\n"), "6:16", "training.micro_batch",
       "batch 16 is not divisible by micro_batch 5"},
      {"seq_len over max_seq", Base("  seq_len: 128\n"), "5:12", "training.seq_len",
       "seq_len 128 exceeds model.max_seq 64"},
      {"zero lr", Base("  lr: 0\n"), "5:7", "training.lr", "must be positive"},
      {"negative lr", Base("  lr: -1e-3\n"), "5:7", "training.lr", "must be positive"},
      {"nan lr", Base("  lr: nan\n"), "5:7", "training.lr", "expected a finite number"},
      {"beta1 of one", Base("  beta1: 1.0\n"), "5:10", "training.beta1", "must be in [0, 1)"},
      {"negative beta2", Base("  beta2: -0.1\n"), "5:10", "training.beta2", "must be in [0, 1)"},
      {"schedule typo", Base("  schedule: cosin\n"), "5:13", "training.schedule",
       "did you mean 'cosine'?"},
      {"warmup too long", Base("  steps: 10\n  warmup_steps: 20\n"), "6:17",
       "training.warmup_steps", "longer than the run"},
      {"bool as word", "name: job\nmodel:\n  preset: gpt2-debug\n  recompute: yes\n", "4:14",
       "model.recompute", "expected true or false, got 'yes'"},
      {"unknown source", Base("  steps: 10\n", "data:\n  source: csv\n"), "5:11", "data.source",
       "unknown source 'csv'"},
      {"bin without path", Base("  steps: 10\n", "data:\n  source: bin\n"), "5:11", "data.path",
       "required when source is bin"},
      {"val_fraction too big",
       Base("  steps: 10\n", "data:\n  source: text\n  path: a.txt\n  val_fraction: 1.5\n"), "7:17",
       "data.val_fraction", "must be in (0, 1), got 1.5"},
      {"val_fraction zero",
       Base("  steps: 10\n", "data:\n  source: bin\n  path: a.bin\n  val_fraction: 0\n"), "7:17",
       "data.val_fraction", "must be in (0, 1)"},
      {"markov path", Base("  steps: 10\n", "data:\n  source: markov\n  path: x.bin\n"), "6:9",
       "data.path", "not used when source is markov"},
      {"markov block with bin",
       Base("  steps: 10\n", "data:\n  source: bin\n  path: a.bin\n  markov: {vocab: 2}\n"), "7:11",
       "data.markov", "only used when source is markov"},
      {"markov vocab over model vocab", Base("  steps: 10\n", "data:\n  markov: {vocab: 300}\n"),
       "5:19", "data.markov.vocab", "vocab 300 exceeds model.vocab 256"},
      {"markov with too many contexts",
       Base("  steps: 10\n", "data:\n  markov: {order: 6, vocab: 64}\n"), "5:19",
       "data.markov.order", "more than 65536 contexts"},
      {"markov with too many transitions",
       "name: job\nmodel: {preset: gpt2-debug, vocab: 8192}\ndata: {markov: {vocab: 4097}}\n",
       "3:24", "data.markov.vocab", "more than 16777216 transition probabilities"},
      {"negative markov order", Base("  steps: 10\n", "data:\n  markov: {order: -1}\n"), "5:19",
       "data.markov.order", "must be at least 0"},
      {"text needs byte vocab",
       "name: job\nmodel:\n  preset: gpt2-debug\n  vocab: 64\ndata: {source: text, path: a}\n",
       "4:10", "model.vocab", "needs vocab >= 256"},
      {"width not divisible by heads", "name: job\nmodel:\n  preset: gpt2-debug\n  width: 66\n",
       "4:10", "model.heads", "width 66 is not divisible by heads 4"},
      {"llama kv heads", "name: job\nmodel:\n  preset: llama-debug\n  kv_heads: 3\n", "4:13",
       "model.kv_heads", "heads 4 is not divisible by kv_heads 3"},
      {"unknown preset", "name: job\nmodel:\n  preset: gpt2-debgu\n", "3:11", "model.preset",
       "did you mean 'gpt2-debug'?"},
      {"family mismatch", "name: job\nmodel:\n  preset: gpt2-debug\n  family: llama\n", "4:11",
       "model.family", "is a gpt2 model, not llama"},
      {"no preset, no family", "name: job\nmodel:\n  layers: 2\n", "3:3", "model.family",
       "required when no preset is given"},
      {"no preset, missing size",
       "name: job\nmodel: {family: gpt2, layers: 2, width: 64, heads: 4, vocab: 256, "
       "max_seq: 64}\n",
       "2:8", "model.ffn_hidden", "required when no preset is given"},
      {"rope on gpt2", "name: job\nmodel: {preset: gpt2-debug, rope_theta: 1e4}\n", "2:41",
       "model.rope_theta", "only the llama family"},
      {"unknown field typo", Base("  stpes: 10\n"), "5:3", "training.stpes",
       "unknown field; did you mean 'steps'?"},
      {"unknown top-level field", "name: job\nmodel: {preset: gpt2-debug}\ntrainig: {}\n", "3:1",
       "trainig", "did you mean 'training'?"},
      {"unknown field, no suggestion", Base("  colour: red\n"), "5:3", "training.colour",
       "unknown field (known fields: steps, batch,"},
      {"duplicate key", Base("  steps: 1\n  steps: 2\n"), "6:3", "training.steps",
       "duplicate key (first given on line 5)"},
      {"missing name", "model: {preset: gpt2-debug}\n", "1:1", "name", "required field"},
      {"missing model", "name: job\n", "1:1", "model", "required field"},
      {"bad name", "name: my job\nmodel: {preset: gpt2-debug}\n", "1:7", "name",
       "may contain only letters"},
      {"top level is a list", "- name: job\n", "1:1", "spec", "expected a mapping, got a sequence"},
      {"empty spec", "", "1:1", "spec", "empty"},
      {"comment-only spec", "# nothing here\n", "1:1", "spec", "empty"},
      {"two documents", "name: a\nmodel: {preset: gpt2-debug}\n---\nname: b\n", "3:1", "spec",
       "only one YAML document"},
      {"syntax error", "name: job\nmodel: {preset: gpt2-debug\ntraining: {steps: 1}\n", "3:9",
       "model", "invalid YAML"},
      {"mapping after sequence", "name: job\nmodel:\n  - 1\n  preset: gpt2-debug\n", "4:3", "spec",
       "invalid YAML"},
      {"tag", Base("  steps: !!int 5\n"), "5:10", "training.steps", "YAML tags are not allowed"},
      {"anchor", "name: job\nmodel: &m {preset: gpt2-debug}\n", "2:8", "model",
       "YAML anchors are not allowed"},
      {"merge key alias", "name: job\nmodel: {preset: gpt2-debug}\ntraining:\n  <<: *defaults\n",
       "4:7", "training.<<", "invalid YAML"},
      {"complex key", "name: job\nmodel: {preset: gpt2-debug}\n? [a, b]\n: 1\n", "3:3", "spec",
       "keys must be plain strings"},
      {"newline in value stays one line", Base("  schedule: \"cos\\nine\"\n"), "5:13",
       "training.schedule", "unknown schedule 'cos\\nine'"},
  };
}

TEST(SpecErrorsTest, EachBadSpecNamesFieldAndPosition) {
  ASSERT_GE(BadSpecs().size(), 15u);
  for (const BadSpec& bad : BadSpecs()) {
    SCOPED_TRACE(bad.label);
    absl::StatusOr<JobSpec> spec = ParseJobSpec(bad.yaml, "job.yaml");
    ASSERT_FALSE(spec.ok()) << bad.yaml;
    const absl::Status& status = spec.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    const std::string prefix = absl::StrCat("job.yaml:", bad.location, ": ", bad.path, ": ");
    EXPECT_TRUE(absl::StartsWith(status.message(), prefix))
        << "want prefix [" << prefix << "] got [" << status.message() << "]";
    EXPECT_TRUE(absl::StrContains(status.message(), bad.reason_part))
        << "want [" << bad.reason_part << "] in [" << status.message() << "]";
    EXPECT_FALSE(absl::StrContains(status.message(), "\n")) << status;
  }
}

// Parses `yaml`, expecting a fast refusal whose message starts with `prefix`.
void ExpectFastRefusal(const std::string& yaml, const std::string& prefix,
                       const std::string& reason_part) {
  const absl::Time start = absl::Now();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml, "hostile.yaml");
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(spec.status().message(), prefix)) << spec.status();
  EXPECT_TRUE(absl::StrContains(spec.status().message(), reason_part)) << spec.status();
  EXPECT_FALSE(absl::StrContains(spec.status().message(), "\n"));
  EXPECT_LT(took, absl::Seconds(2));
}

TEST(HostileSpecsTest, TenThousandDeepFlowNesting) {
  std::string yaml = "name: deep\nmodel: {preset: gpt2-debug}\ntraining: ";
  yaml.append(10000, '[').append(10000, ']').append("\n");
  // training's value is depth 2 (the top mapping is 1); the n-th '[' sits at column 10 + n and
  // opens depth n + 1, so the 32nd, at column 42, is the first one refused.
  ExpectFastRefusal(yaml, "hostile.yaml:3:42: training[0][0]", "nesting is deeper than 32 levels");
}

TEST(HostileSpecsTest, TenThousandDeepMappingsAndBlockSequences) {
  std::string maps = "name: deep\nmodel: {preset: gpt2-debug}\ndata: ";
  for (int i = 0; i < 10000; ++i) maps += "{a: ";
  maps.append("1").append(10000, '}').append("\n");
  ExpectFastRefusal(maps, "hostile.yaml:3:", "nesting is deeper than 32 levels");

  std::string dashes = "name: deep\nmodel:\n";
  for (int i = 0; i < 10000; ++i) dashes += "- ";
  dashes += "x\n";
  ExpectFastRefusal(dashes, "hostile.yaml:3:", "nesting is deeper than 32 levels");

  // Exactly 32 levels is allowed by the YAML layer (and then refused as a wrong type).
  std::string limit = "name: deep\nmodel: {preset: gpt2-debug}\ntraining: ";
  limit.append(31, '[').append(31, ']').append("\n");
  absl::StatusOr<JobSpec> spec = ParseJobSpec(limit, "limit.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_TRUE(absl::StartsWith(spec.status().message(),
                               "limit.yaml:3:11: training: expected a mapping, got a sequence"))
      << spec.status();
}

TEST(HostileSpecsTest, BillionLaughsIsRefusedAtTheFirstAnchor) {
  std::string yaml = "name: lol\nmodel: {preset: gpt2-debug}\nlol0: &a0 [\"lol\"]\n";
  for (int i = 1; i < 30; ++i) {
    absl::StrAppend(&yaml, "lol", i, ": &a", i, " [");
    for (int j = 0; j < 10; ++j) absl::StrAppend(&yaml, j ? ", " : "", "*a", i - 1);
    yaml += "]\n";
  }
  yaml += "training: {steps: *a29}\n";
  ExpectFastRefusal(yaml, "hostile.yaml:3:7: lol0: ", "YAML anchors are not allowed");
}

TEST(HostileSpecsTest, SpecOverOneMebibyteIsRefusedBeforeParsing) {
  std::string yaml = "name: big\nmodel: {preset: gpt2-debug}\n";
  yaml.append("# ").append(kMaxSpecBytes, 'x').append("\n");
  ExpectFastRefusal(yaml, "hostile.yaml:1:1: spec: ", "the limit is 1048576");
  // Just under the limit is read normally.
  std::string fits = "name: big\nmodel: {preset: gpt2-debug}\n# ";
  fits += std::string(kMaxSpecBytes - fits.size() - 1, 'x') + "\n";
  ASSERT_EQ(fits.size(), kMaxSpecBytes);
  EXPECT_TRUE(ParseJobSpec(fits).ok());
}

TEST(HostileSpecsTest, ManyKeysAndLongSequencesStayFast) {
  std::string yaml = "name: wide\nmodel: {preset: gpt2-debug}\ntraining:\n";
  for (int i = 0; i < 20000; ++i) absl::StrAppend(&yaml, "  k", i, ": 1\n");
  ExpectFastRefusal(yaml, "hostile.yaml:4:3: training.k0: ", "unknown field");
  std::string list = "name: long\nmodel: {preset: gpt2-debug}\ndata: [";
  for (int i = 0; i < 50000; ++i) absl::StrAppend(&list, i ? "," : "", "1");
  list += "]\n";
  ExpectFastRefusal(list, "hostile.yaml:3:7: data: ", "expected a mapping");
}

// Random byte edits of a good spec: every result is either a spec or a one-line
// INVALID_ARGUMENT, never a crash, hang or other code.
TEST(HostileSpecsTest, RandomCorruptionsNeverCrash) {
  const std::string good =
      "name: tiny\nmodel:\n  preset: gpt2-debug\n  layers: 2\ndata:\n  source: markov\n"
      "  markov: {order: 1, vocab: 32, seed: 7}\ntraining:\n  steps: 300\n  batch: 16\n"
      "  seq_len: 32\n  lr: 3.0e-3\n  schedule: cosine\n";
  ASSERT_TRUE(ParseJobSpec(good).ok());
  const std::string alphabet = "{}[]:-,&*!|>'\"#%@`?\n\t 019.eaxz\\\x01\xff";
  std::mt19937 rng(12345);
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (text.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          text.insert(at, 1, c);
          break;
        case 1:
          if (at < text.size()) text[at] = c;
          break;
        default:
          if (at < text.size()) text.erase(at, 1);
      }
    }
    absl::StatusOr<JobSpec> spec = ParseJobSpec(text, "fuzz.yaml");
    if (spec.ok()) {
      ++accepted;
      EXPECT_TRUE(ValidateJobSpec(*spec).ok());
      continue;
    }
    ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
    ASSERT_TRUE(absl::StartsWith(spec.status().message(), "fuzz.yaml:")) << spec.status();
    ASSERT_FALSE(absl::StrContains(spec.status().message(), "\n")) << spec.status();
  }
  EXPECT_GT(accepted, 0);  // some edits land in comments-free but harmless places
}

}  // namespace
}  // namespace trainyard::config
