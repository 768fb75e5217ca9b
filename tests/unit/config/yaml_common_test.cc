// The common form's reader (ParseCommonYaml) against yaml-cpp: whatever it reads must be the tree
// yaml-cpp's events build, marks included, and it must hand everything else to yaml-cpp.
#include "config/yaml_common.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace trainyard::config {
namespace {

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> ExampleSpecs() {
  const char* source_dir = std::getenv("TRAINYARD_SOURCE_DIR");
  const std::filesystem::path dir =
      std::filesystem::path(source_dir == nullptr ? "." : source_dir) / "config/examples";
  std::vector<std::string> specs;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") specs.push_back(ReadFile(entry.path()));
  }
  return specs;
}

// Forms a spec is written in, each read by both readers to the same tree.
const char* const kCommonForms[] = {
    "name: a\n",
    "name: my job   # a comment\nmodel:\n  preset: gpt2-debug\n  layers: 2\n",
    "# leading comment\n\nname: x\ntraining: {steps: 10, lr: 3.0e-3, warmup_steps: -1}\n",
    "labels: {team: 'it''s ours', tier: \"gold\"}  # quoted\n",
    "data:\n  files: [a.bin, /data/b.bin, 'c d']\n  more:\n    - x\n    - 'y'\n    - {k: v}\n",
    "a:\n    b:\n        c: 1\n    d: [1, [2, 3], {e: f}]\nz: end\n",
    "empty: {}\nnone: []\nspaced: {  a:   1  ,b: 2 }\n",
    "model: {preset: gpt2-debug}\ndata: {source: markov}\n"
    "training: {steps: 1000000, warmup_steps: 1, batch: 16, seq_len: 16}\n"
    "parallelism: {dp: 8}\nresources: {nodes: 1, devices_per_node: 8}\n",
};

// Forms left to yaml-cpp (nulls, multi-line and block scalars, anchors, tags, escapes,
// documents, tabs, bad indentation, duplicate keys, non-ASCII, null keys).
const char* const kOtherForms[] = {
    "",
    "name:\n",
    "name: a\n  continued\n",
    "text: |\n  block\n",
    "a: &x 1\nb: *x\n",
    "a: !!str 1\n",
    "a: \"tab\\t\"\n",
    "---\na: 1\n",
    "a: 1\n---\nb: 2\n",
    "a:\t1\n",
    "a: 1\na: 2\n",
    "a: caf\xc3\xa9\n",
    "null: 1\n",
    "a: ~\n",
    "a:\n- 1\n- 2\n",
    "list:\n  - a: 1\n",
    "a: {b: 1,}\n",
    "a: {b:1}\n",
    "a: [1, 2\n",
    "  a: 1\n",
    "a: b: c\n",
    "a: 'x'y\n",
    "a: http://example.com\n",
    "? a\n: 1\n",
    "a:\n    b: 1\n  c: 2\n",
};

void ExpectSameAsYamlCpp(const std::string& text) {
  std::optional<YamlNode> common = ParseCommonYaml(text, YamlLimits().max_depth);
  ASSERT_TRUE(common.has_value()) << "not read as the common form:\n" << text;
  absl::StatusOr<YamlNode> full = ParseYamlTreeWithYamlCpp(text, "t.yaml", YamlLimits());
  ASSERT_TRUE(full.ok()) << full.status() << "\n" << text;
  EXPECT_TRUE(SameYamlTree(*common, *full)) << text;
}

TEST(CommonYamlTest, ExampleSpecsReadAsYamlCppReadsThem) {
  const std::vector<std::string> specs = ExampleSpecs();
  ASSERT_GE(specs.size(), 4u);
  for (const std::string& spec : specs) ExpectSameAsYamlCpp(spec);
}

TEST(CommonYamlTest, CommonFormsReadAsYamlCppReadsThem) {
  for (const char* text : kCommonForms) ExpectSameAsYamlCpp(text);
}

TEST(CommonYamlTest, OtherFormsAreLeftToYamlCpp) {
  for (const char* text : kOtherForms) {
    EXPECT_FALSE(ParseCommonYaml(text, YamlLimits().max_depth).has_value()) << text;
  }
}

TEST(CommonYamlTest, NestingPastTheLimitIsLeftToYamlCpp) {
  EXPECT_TRUE(ParseCommonYaml("a: {b: {c: 1}}\n", 3).has_value());
  EXPECT_FALSE(ParseCommonYaml("a: {b: {c: 1}}\n", 2).has_value());
  absl::StatusOr<YamlNode> refused = ParseYamlTree("a: {b: {c: 1}}\n", "t.yaml", {.max_depth = 2});
  EXPECT_FALSE(refused.ok());
}

// Random edits of the example specs and the common forms: every text the common reader takes,
// yaml-cpp must read without error to the same tree.
TEST(CommonYamlTest, EditedSpecsReadAsYamlCppReadsThemOrAreLeftToIt) {
  std::vector<std::string> seeds = ExampleSpecs();
  for (const char* text : kCommonForms) seeds.emplace_back(text);
  const std::string alphabet = " \n:#-,{}[]'\"ab1.~&*!|>";
  std::mt19937 random(20261130);
  int taken = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string text = seeds[random() % seeds.size()];
    for (int edits = 1 + random() % 3; edits > 0 && !text.empty(); --edits) {
      const size_t at = random() % text.size();
      const char c = alphabet[random() % alphabet.size()];
      switch (random() % 3) {
        case 0:
          text[at] = c;
          break;
        case 1:
          text.insert(at, 1, c);
          break;
        default:
          text.erase(at, 1);
      }
    }
    std::optional<YamlNode> common = ParseCommonYaml(text, YamlLimits().max_depth);
    if (!common.has_value()) continue;
    ++taken;
    absl::StatusOr<YamlNode> full = ParseYamlTreeWithYamlCpp(text, "t.yaml", YamlLimits());
    ASSERT_TRUE(full.ok()) << full.status() << "\n" << text;
    ASSERT_TRUE(SameYamlTree(*common, *full)) << text;
  }
  EXPECT_GT(taken, 2000);  // the edits leave many texts in the common form
}

}  // namespace
}  // namespace trainyard::config
