// What the CLI prints about checkpoints: sizes, the policy and newest checkpoint in `status`, the
// `checkpoints` table and its JSON, and the drained outcome.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/cli/checkpoint_format.h"
#include "tools/cli/format.h"

namespace trainyard::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::Checkpoint Committed(int64_t step, int64_t written_ms) {
  v1::Checkpoint checkpoint;
  checkpoint.set_step(step);
  checkpoint.set_path("ckpt/run/step-" + std::to_string(step));
  checkpoint.set_state(v1::CHECKPOINT_STATE_COMMITTED);
  checkpoint.set_bytes(12'897'485);  // 12.3 MiB
  checkpoint.set_write_seconds(4.256);
  checkpoint.set_blocked_seconds(0.041);
  checkpoint.set_written_unix_ms(written_ms);
  checkpoint.set_attempt_id(1);
  return checkpoint;
}

TEST(CheckpointOutputTest, Bytes) {
  EXPECT_EQ(FormatBytes(-1), "-");
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(12'897'485), "12.3 MiB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 30), "5.00 GiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 40), "3.00 TiB");
}

TEST(CheckpointOutputTest, PolicyText) {
  v1::CheckpointPolicy policy;
  EXPECT_EQ(CheckpointPolicyText(policy), "off (the spec has no checkpoint.dir)");
  policy.set_dir("ckpt/run");
  policy.set_every_steps(50);
  policy.set_keep(3);
  EXPECT_EQ(CheckpointPolicyText(policy), "every 50 steps, keep 3, dir ckpt/run");
  policy.set_every_steps(100);
  policy.set_interval_auto(true);
  EXPECT_EQ(CheckpointPolicyText(policy),
            "every 100 steps (auto: Young–Daly, see young-daly), keep 3, dir ckpt/run");
  policy.set_every_steps(0);  // no save measured yet
  EXPECT_EQ(CheckpointPolicyText(policy),
            "auto (Young–Daly: the interval follows the first measured save), keep 3, "
            "dir ckpt/run");
}

TEST(CheckpointOutputTest, StatusShowsThePolicyAndTheNewestCommittedCheckpoint) {
  v1::GetJobReply reply;
  v1::Job& job = *reply.mutable_job();
  job.set_id("j-000007");
  job.set_name("ckpt");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.mutable_checkpoint_policy()->set_dir("ckpt/run");
  job.mutable_checkpoint_policy()->set_every_steps(200);
  job.mutable_checkpoint_policy()->set_keep(2);
  *job.mutable_last_checkpoint() = Committed(200, 1'000'000);
  job.set_drain_requested(true);
  const std::string report = JobReport(reply, 1'185'000);
  EXPECT_THAT(report, HasSubstr("saving      every 200 steps, keep 2, dir ckpt/run\n"));
  EXPECT_THAT(report, HasSubstr("checkpoint  step 200, 3m05s ago, 12.3 MiB, ckpt/run/step-200\n"));
  EXPECT_THAT(report, HasSubstr("drain       requested; the ranks checkpoint"));
  job.set_state(v1::JOB_STATE_DRAINED);
  job.set_message("drained at step 200: checkpoint ckpt/run/step-200");
  EXPECT_THAT(JobReport(reply, 1'185'000), Not(HasSubstr("drain       requested")));
  EXPECT_THAT(JobReport(reply, 1'185'000),
              HasSubstr("message     drained at step 200: checkpoint ckpt/run/step-200"));
  // A worker that reported only a path and a step: no size.
  v1::Checkpoint bare;
  bare.set_step(40);
  bare.set_path("/ckpt/40");
  EXPECT_EQ(LastCheckpointText(bare, 5), "step 40, /ckpt/40");
  EXPECT_EQ(LastCheckpointText(v1::Checkpoint(), 5), "none");
}

TEST(CheckpointOutputTest, TableHasOneRowPerRecordWithLocalTimes) {
  v1::Checkpoint failed;
  failed.set_step(300);
  failed.set_path("ckpt/run/step-300");
  failed.set_state(v1::CHECKPOINT_STATE_FAILED);
  failed.set_blocked_seconds(0.05);
  failed.set_message("No space left on device");
  failed.set_written_unix_ms(1'700'000'600'000);
  const std::string table =
      CheckpointTable({Committed(200, 1'700'000'000'000), failed}, absl::FixedTimeZone(3600));
  EXPECT_EQ(table,
            "STEP  TIME                     SIZE      WRITE  BLOCKED  STATE      PATH\n"
            "200   2023-11-14 23:13:20 +01  12.3 MiB  4.26s  0.04s    COMMITTED  "
            "ckpt/run/step-200\n"
            "300   2023-11-14 23:23:20 +01  -         -      0.05s    FAILED     "
            "ckpt/run/step-300 (No space left on device)\n");
  EXPECT_EQ(CheckpointTable({}, absl::UTCTimeZone()), "no checkpoints yet\n");
}

TEST(CheckpointOutputTest, JsonListsTheRecordsWithProtoNames) {
  v1::ListCheckpointsReply reply;
  *reply.add_checkpoints() = Committed(200, 1'700'000'000'000);
  const std::string json = ToJson(reply);
  EXPECT_THAT(json, HasSubstr("\"checkpoints\":[{"));
  EXPECT_THAT(json, HasSubstr("\"step\":\"200\""));
  EXPECT_THAT(json, HasSubstr("\"state\":\"CHECKPOINT_STATE_COMMITTED\""));
  EXPECT_THAT(json, HasSubstr("\"bytes\":\"12897485\""));
  EXPECT_THAT(json, HasSubstr("\"write_seconds\":4.256"));
  EXPECT_THAT(json, HasSubstr("\"blocked_seconds\":0.041"));
  EXPECT_THAT(json, HasSubstr("\"path\":\"ckpt/run/step-200\""));
  EXPECT_THAT(json, Not(HasSubstr("\n")));
}

TEST(CheckpointOutputTest, DrainedJobsEndWithExitCodeFive) {
  EXPECT_EQ(OutcomeExitCode(v1::JOB_STATE_DRAINED), 5);
  EXPECT_TRUE(IsFinal(v1::JOB_STATE_DRAINED));
  v1::Job job;
  job.set_id("j-000002");
  job.set_name("d");
  job.set_state(v1::JOB_STATE_DRAINED);
  job.set_message("drained at step 40: checkpoint /ckpt/40");
  EXPECT_EQ(OutcomeLine(job), "j-000002 d DRAINED | drained at step 40: checkpoint /ckpt/40");
}

}  // namespace
}  // namespace trainyard::cli
