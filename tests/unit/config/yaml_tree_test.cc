#include "config/yaml_tree.h"

#include "absl/strings/match.h"
#include "config/field_reader.h"
#include "gtest/gtest.h"

namespace trainyard::config {
namespace {

TEST(YamlTreeTest, BuildsNodesWithOneBasedMarks) {
  absl::StatusOr<YamlNode> root =
      ParseYamlTree("a: 1\nb:\n  - x\n  - \"y\"\nc: {d: ~}\n", "t.yaml");
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_EQ(root->kind, YamlNode::Kind::kMap);
  ASSERT_EQ(root->entries.size(), 3u);

  const YamlEntry* a = root->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->key_mark.line, 1);
  EXPECT_EQ(a->key_mark.column, 1);
  EXPECT_EQ(a->value.kind, YamlNode::Kind::kScalar);
  EXPECT_EQ(a->value.value, "1");
  EXPECT_EQ(a->value.mark.column, 4);
  EXPECT_FALSE(a->value.quoted);

  const YamlEntry* b = root->Find("b");
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(b->value.kind, YamlNode::Kind::kSequence);
  ASSERT_EQ(b->value.items.size(), 2u);
  EXPECT_EQ(b->value.items[1].value, "y");
  EXPECT_TRUE(b->value.items[1].quoted);
  EXPECT_EQ(b->value.items[1].mark.line, 4);
  EXPECT_EQ(b->value.items[1].mark.column, 5);

  const YamlEntry* c = root->Find("c");
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->value.kind, YamlNode::Kind::kMap);
  EXPECT_EQ(c->value.Find("d")->value.kind, YamlNode::Kind::kNull);
  EXPECT_EQ(root->Find("missing"), nullptr);
}

TEST(YamlTreeTest, DepthLimitIsExact) {
  YamlLimits limits;
  limits.max_depth = 3;
  EXPECT_TRUE(ParseYamlTree("a: {b: [1]}\n", "t", limits).ok());
  absl::Status status = ParseYamlTree("a: {b: [[1]]}\n", "t", limits).status();
  EXPECT_EQ(status.message(), "t:1:9: a.b[0]: nesting is deeper than 3 levels");
}

TEST(YamlTreeTest, SizeLimit) {
  YamlLimits limits;
  limits.max_bytes = 10;
  EXPECT_TRUE(ParseYamlTree("a: 1234567", "t", limits).ok());
  EXPECT_EQ(ParseYamlTree("a: 12345678", "t", limits).status().message(),
            "t:1:1: spec: the spec is 11 bytes; the limit is 10");
}

TEST(YamlTreeTest, RefusesAliasesTagsDuplicatesAndComplexKeys) {
  EXPECT_EQ(ParseYamlTree("a: &x 1\nb: 2\n", "t").status().message(),
            "t:1:4: a: YAML anchors are not allowed (found &'x')");
  EXPECT_EQ(ParseYamlTree("a: !!str 1\n", "t").status().message(),
            "t:1:4: a: YAML tags are not allowed (found 'tag:yaml.org,2002:str')");
  EXPECT_EQ(ParseYamlTree("a: 1\nb: 2\na: 3\n", "t").status().message(),
            "t:3:1: a: duplicate key (first given on line 1)");
  EXPECT_TRUE(absl::StrContains(ParseYamlTree("{[1]: 2}\n", "t").status().message(),
                                "keys must be plain strings"));
  EXPECT_TRUE(
      absl::StrContains(ParseYamlTree("a: *nowhere\n", "t").status().message(), "t:1:4: a: "));
}

TEST(YamlTreeTest, QuoteForMessageEscapesAndShortens) {
  EXPECT_EQ(QuoteForMessage("plain"), "'plain'");
  EXPECT_EQ(QuoteForMessage("two\nlines"), "'two\\nlines'");
  const std::string quoted = QuoteForMessage(std::string(100, 'x'));
  EXPECT_EQ(quoted, "'" + std::string(64, 'x') + "...'");
}

TEST(ClosestMatchTest, SuggestsWithinTwoEdits) {
  const std::vector<std::string> fields = {"steps", "batch", "seq_len", "lr"};
  EXPECT_EQ(ClosestMatch("stpes", fields), "steps");  // transposition
  EXPECT_EQ(ClosestMatch("step", fields), "steps");   // deletion
  EXPECT_EQ(ClosestMatch("seqlen", fields), "seq_len");
  EXPECT_EQ(ClosestMatch("batches", fields), "batch");
  EXPECT_EQ(ClosestMatch("xy", fields), "");  // two edits from "lr", but that is all of it
  EXPECT_EQ(ClosestMatch("colour", fields), "");
}

}  // namespace
}  // namespace trainyard::config
