#include "server/agent/worker_records.h"

#include "gtest/gtest.h"

namespace trainyard::server::agent {
namespace {

TEST(WorkerRecordsTest, RoundTrip) {
  std::vector<WorkerRecord> records = {
      {{"j-000001", 1, 0}, {4242, 123456789}, 1700000000000},
      {{"j-000001", 2, 3}, {77, 0}, 5},
  };
  absl::StatusOr<std::vector<WorkerRecord>> parsed =
      ParseWorkerRecords(SerializeWorkerRecords(records));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].key, records[0].key);
  EXPECT_EQ((*parsed)[0].process, records[0].process);
  EXPECT_EQ((*parsed)[0].started_unix_ms, records[0].started_unix_ms);
  EXPECT_EQ((*parsed)[1].key, records[1].key);
  EXPECT_TRUE(ParseWorkerRecords(SerializeWorkerRecords({}))->empty());
}

TEST(WorkerRecordsTest, MalformedFilesAreRefused) {
  EXPECT_FALSE(ParseWorkerRecords("").ok());
  EXPECT_FALSE(ParseWorkerRecords("something else\n").ok());
  absl::Status bad = ParseWorkerRecords("trainyard-agent-workers 1\nj 1 0 12\n").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "line 2: malformed worker record");
  EXPECT_FALSE(ParseWorkerRecords("trainyard-agent-workers 1\n../x 1 0 12 0 0\n").ok());
  EXPECT_FALSE(ParseWorkerRecords("trainyard-agent-workers 1\nj 1 0 -4 0 0\n").ok());
}

TEST(WorkerRecordsTest, SafeJobIds) {
  EXPECT_TRUE(IsSafeJobId("j-000001"));
  EXPECT_TRUE(IsSafeJobId("a.b_c-D9"));
  EXPECT_FALSE(IsSafeJobId(""));
  EXPECT_FALSE(IsSafeJobId("."));
  EXPECT_FALSE(IsSafeJobId(".."));
  EXPECT_FALSE(IsSafeJobId("a/b"));
  EXPECT_FALSE(IsSafeJobId("a b"));
  EXPECT_FALSE(IsSafeJobId(std::string(129, 'a')));
}

}  // namespace
}  // namespace trainyard::server::agent
