#include "server/checkpoint_ledger.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

using Outcome = CheckpointLedger::Outcome;

CheckpointInfo Record(int64_t step, CheckpointState state, int attempt = 1) {
  CheckpointInfo record;
  record.step = step;
  record.path = "ckpt/step-" + std::to_string(step);
  record.state = state;
  record.attempt_id = attempt;
  record.bytes = 1 << 20;
  record.write_seconds = 2.0;
  record.blocked_seconds = 0.3;
  record.written = absl::FromUnixSeconds(100 + step);
  return record;
}

TEST(CheckpointLedgerTest, RepeatsAreRecognisedAndNotObservedAgain) {
  CheckpointLedger ledger;
  EXPECT_EQ(ledger.Apply(Record(10, CheckpointState::kCommitted)), Outcome::kNew);
  EXPECT_EQ(ledger.Apply(Record(10, CheckpointState::kCommitted)), Outcome::kRepeat);
  EXPECT_EQ(ledger.stats().write_seconds.count(), 1u);
  // Same path, another state or attempt: the record is replaced and observed.
  EXPECT_EQ(ledger.Apply(Record(10, CheckpointState::kFailed)), Outcome::kReplaced);
  EXPECT_EQ(ledger.Apply(Record(10, CheckpointState::kFailed, 2)), Outcome::kReplaced);
  EXPECT_EQ(ledger.records().size(), 1u);
  EXPECT_EQ(ledger.stats().failures, 2);
  EXPECT_EQ(ledger.stats().blocked_seconds.count(), 3u);
  EXPECT_EQ(ledger.Apply(Record(20, CheckpointState::kSkipped)), Outcome::kNew);
  EXPECT_EQ(ledger.stats().blocked_seconds.count(), 3u);  // a skipped save blocked nothing
}

TEST(CheckpointLedgerTest, NewestCommittedCheckpointIsByStepAndIgnoresFailures) {
  CheckpointLedger ledger;
  EXPECT_TRUE(ledger.NewestCommitted({}).path.empty());
  ledger.Apply(Record(20, CheckpointState::kCommitted));
  ledger.Apply(Record(10, CheckpointState::kCommitted));  // late, older
  ledger.Apply(Record(30, CheckpointState::kFailed));
  EXPECT_EQ(ledger.NewestCommitted({}).step, 20);
  // A checkpoint a worker named without a record counts when it is newer...
  CheckpointInfo reported{25, "ckpt/other-25", absl::FromUnixSeconds(5)};
  EXPECT_EQ(ledger.NewestCommitted(reported).path, "ckpt/other-25");
  reported.step = 15;
  EXPECT_EQ(ledger.NewestCommitted(reported).step, 20);
  // ...but the ledger is the truth about the paths it knows.
  CheckpointInfo failed_path{30, "ckpt/step-30", absl::FromUnixSeconds(5)};
  EXPECT_EQ(ledger.NewestCommitted(failed_path).step, 20);
  // A committed checkpoint that turned out to fail is no longer the newest.
  ledger.Apply(Record(20, CheckpointState::kFailed));
  EXPECT_EQ(ledger.NewestCommitted({}).step, 10);
}

TEST(CheckpointLedgerTest, LoadedRecordsAreKnownButNotObserved) {
  CheckpointLedger ledger;
  ledger.Load({Record(10, CheckpointState::kCommitted), Record(20, CheckpointState::kFailed)});
  EXPECT_EQ(ledger.stats().write_seconds.count(), 0u);
  EXPECT_EQ(ledger.stats().failures, 0);
  EXPECT_EQ(ledger.Apply(Record(20, CheckpointState::kFailed)), Outcome::kRepeat);
  EXPECT_EQ(ledger.stats().failures, 0);
  ASSERT_NE(ledger.Find("ckpt/step-10"), nullptr);
  EXPECT_EQ(ledger.Find("ckpt/nope"), nullptr);
}

TEST(CheckpointLedgerTest, ChronologicalIsByWrittenTimeThenStep) {
  CheckpointLedger ledger;
  CheckpointInfo late = Record(5, CheckpointState::kCommitted);
  late.written = absl::FromUnixSeconds(900);
  ledger.Apply(late);
  ledger.Apply(Record(30, CheckpointState::kCommitted));
  ledger.Apply(Record(20, CheckpointState::kCommitted));
  std::vector<CheckpointInfo> sorted = ledger.Chronological();
  ASSERT_EQ(sorted.size(), 3u);
  EXPECT_EQ(sorted[0].step, 20);
  EXPECT_EQ(sorted[1].step, 30);
  EXPECT_EQ(sorted[2].step, 5);
}

TEST(CheckpointLedgerTest, ValidateRefusesRecordsThatCannotBeKept) {
  EXPECT_TRUE(CheckpointLedger::Validate(Record(1, CheckpointState::kCommitted)).ok());
  CheckpointInfo bad = Record(1, CheckpointState::kCommitted);
  bad.path.clear();
  EXPECT_EQ(CheckpointLedger::Validate(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = Record(1, static_cast<CheckpointState>(0));
  EXPECT_EQ(CheckpointLedger::Validate(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = Record(1, static_cast<CheckpointState>(4));
  EXPECT_FALSE(CheckpointLedger::Validate(bad).ok());
  bad = Record(-1, CheckpointState::kCommitted);
  EXPECT_FALSE(CheckpointLedger::Validate(bad).ok());
  bad = Record(1, CheckpointState::kCommitted);
  bad.blocked_seconds = std::nan("");
  EXPECT_FALSE(CheckpointLedger::Validate(bad).ok());
  bad.blocked_seconds = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(CheckpointLedger::Validate(bad).ok());
}

TEST(CheckpointLedgerTest, HistogramBucketsAreUpperBoundsInclusive) {
  Histogram histogram(CheckpointSecondsBuckets());
  EXPECT_EQ(histogram.bounds().front(), 0.1);
  EXPECT_EQ(histogram.bounds().back(), 3600);
  histogram.Observe(0.1);   // le 0.1
  histogram.Observe(0.11);  // le 0.25
  histogram.Observe(7200);  // +Inf
  EXPECT_EQ(histogram.counts().front(), 1u);
  EXPECT_EQ(histogram.counts()[1], 1u);
  EXPECT_EQ(histogram.counts().back(), 1u);
  EXPECT_EQ(histogram.count(), 3u);
  EXPECT_DOUBLE_EQ(histogram.sum(), 7200.21);
}

TEST(CheckpointLedgerTest, EventCausesSayWhatHappened) {
  CheckpointInfo committed = Record(200, CheckpointState::kCommitted);
  committed.bytes = 12'897'485;  // 12.3 MiB
  committed.write_seconds = 4.256;
  committed.blocked_seconds = 0.041;
  EXPECT_EQ(DescribeCheckpoint(committed),
            "checkpoint of step 200 committed at ckpt/step-200 (12.3 MiB, written in 4.26 s, "
            "training blocked 0.04 s)");
  CheckpointInfo failed = Record(300, CheckpointState::kFailed);
  failed.message = "No space left on device";
  EXPECT_EQ(DescribeCheckpoint(failed), "checkpoint of step 300 failed: No space left on device");
  CheckpointInfo skipped = Record(400, CheckpointState::kSkipped);
  skipped.message = "previous save still writing";
  EXPECT_EQ(DescribeCheckpoint(skipped),
            "checkpoint of step 400 skipped: previous save still writing");
}

}  // namespace
}  // namespace trainyard::server
