// GrpcKeyValueStore against an in-process WorkerService that keeps a map, on loopback.
#include "worker/grpc_kv_store.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace trainyard::worker {
namespace {

namespace v1 = ::trainyard::v1;

constexpr char kPrefix[] = "jobs/j-1/attempts/1/";

class MapWorkerService : public v1::WorkerService::Service {
 public:
  grpc::Status KvSet(grpc::ServerContext*, const v1::KvSetRequest* request,
                     v1::KvSetReply*) override {
    absl::MutexLock lock(&mu_);
    if (closed_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "attempt ended");
    values_[request->key()] = request->value();
    return grpc::Status::OK;
  }

  grpc::Status KvGet(grpc::ServerContext*, const v1::KvGetRequest* request,
                     v1::KvGetReply* reply) override {
    absl::MutexLock lock(&mu_);
    ++gets_;
    auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return closed_ || values_.count(request->key()) > 0;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(request->wait_ms()));
    if (closed_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "attempt ended");
    auto it = values_.find(request->key());
    if (it != values_.end()) {
      reply->set_found(true);
      reply->set_value(it->second);
    }
    return grpc::Status::OK;
  }

  std::map<std::string, std::string> values() {
    absl::MutexLock lock(&mu_);
    return values_;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int gets_ ABSL_GUARDED_BY(mu_) = 0;
};

class GrpcKeyValueStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::WorkerService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                           grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now()); }

  MapWorkerService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<v1::WorkerService::StubInterface> stub_;
};

TEST_F(GrpcKeyValueStoreTest, KeysLiveUnderTheAttemptPrefix) {
  GrpcKeyValueStore store(stub_, kPrefix);
  ASSERT_TRUE(store.Set("dp/0/addr", std::string("127.0.0.1:5000\0x", 16)).ok());
  const std::map<std::string, std::string> values = service_.values();
  ASSERT_EQ(values.size(), 1u);
  EXPECT_EQ(values.begin()->first, "jobs/j-1/attempts/1/dp/0/addr");
  absl::StatusOr<std::string> got = store.Get("dp/0/addr", std::chrono::milliseconds(1000));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, std::string("127.0.0.1:5000\0x", 16));  // bytes, not C strings
}

TEST_F(GrpcKeyValueStoreTest, GetWaitsForAKeySetLater) {
  GrpcKeyValueStore reader(stub_, kPrefix), writer(stub_, kPrefix);
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(writer.Set("late", "v").ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = reader.Get("late", std::chrono::milliseconds(10000));
  later.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(reader.Wait({"late"}, std::chrono::milliseconds(100)).ok());
}

TEST_F(GrpcKeyValueStoreTest, MissingKeysTimeOutNamingTheKey) {
  GrpcKeyValueStore store(stub_, kPrefix);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = store.Get("never", std::chrono::milliseconds(400));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "'never'")) << got.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(390));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_TRUE(store.Set("a", "1").ok());
  absl::Status wait = store.Wait({"a", "b"}, std::chrono::milliseconds(300));
  EXPECT_EQ(wait.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(wait.message(), "'b'")) << wait;
}

TEST_F(GrpcKeyValueStoreTest, AnEndedAttemptFailsAtOnce) {
  GrpcKeyValueStore store(stub_, kPrefix);
  service_.Close();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = store.Get("k", std::chrono::milliseconds(10000));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(store.Set("k", "v").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GrpcKeyValueStoreUnreachableTest, RetriesUntilTheTimeout) {
  // A port nobody listens on: bind one, then close it.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);
  close(fd);
  std::shared_ptr<v1::WorkerService::StubInterface> stub = v1::WorkerService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  FakeClock clock;
  GrpcKeyValueStore store(stub, kPrefix, &clock);
  absl::Status set = store.Set("k", "v");
  EXPECT_EQ(set.code(), absl::StatusCode::kUnavailable) << set;
  EXPECT_GE(clock.TotalSlept(), absl::Seconds(30));
  absl::StatusOr<std::string> got = store.Get("k", std::chrono::milliseconds(2000));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
}

}  // namespace
}  // namespace trainyard::worker
