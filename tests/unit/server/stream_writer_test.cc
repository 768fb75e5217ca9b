// QueuedWriter driven by a recording reactor: one write at a time, Finish only once the queue has
// drained, and never while work handed off from a reaction holds the stream.
#include "server/stream_writer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace trainyard::server {
namespace {

struct RecordingReactor {
  void StartWrite(const std::string* message) { writes.push_back(*message); }
  void Finish(const grpc::Status& status) { finished.push_back(status.error_message()); }
  std::vector<std::string> writes;
  std::vector<std::string> finished;
};

using Writer = QueuedWriter<RecordingReactor, std::string>;

TEST(QueuedWriterTest, WritesOneAtATimeAndFinishesOnceDrained) {
  RecordingReactor reactor;
  Writer writer(&reactor);
  writer.Push("a");
  writer.Push("b");
  writer.FinishWhenDrained(grpc::Status(grpc::StatusCode::ABORTED, "replaced"));
  EXPECT_EQ(reactor.writes, (std::vector<std::string>{"a"}));
  EXPECT_TRUE(reactor.finished.empty());
  writer.OnWriteDone(true);
  EXPECT_EQ(reactor.writes, (std::vector<std::string>{"a", "b"}));
  writer.OnWriteDone(true);
  EXPECT_EQ(reactor.finished, (std::vector<std::string>{"replaced"}));
}

TEST(QueuedWriterTest, AHeldStreamFinishesOnlyWhenReleased) {
  RecordingReactor reactor;
  Writer writer(&reactor);
  ASSERT_TRUE(writer.Hold());
  ASSERT_TRUE(writer.Hold());
  writer.Abandon(grpc::Status(grpc::StatusCode::CANCELLED, "the agent went away"));
  EXPECT_TRUE(writer.finishing());
  EXPECT_TRUE(reactor.finished.empty()) << "held: the handed-off work may still start a read";
  writer.Release();
  EXPECT_TRUE(reactor.finished.empty());
  writer.Release();
  EXPECT_EQ(reactor.finished, (std::vector<std::string>{"the agent went away"}));
  EXPECT_FALSE(writer.Hold()) << "Finish was sent: nothing may be held open any more";
}

TEST(QueuedWriterTest, NothingIsHeldAfterTheReactorIsDone) {
  RecordingReactor reactor;
  Writer writer(&reactor);
  writer.Detach();
  EXPECT_FALSE(writer.Hold());
  writer.Push("ignored");
  EXPECT_TRUE(reactor.writes.empty());
}

}  // namespace
}  // namespace trainyard::server
