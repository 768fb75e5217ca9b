#include "worker/grpc_kv_store.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace trainyard::worker {
namespace {

namespace v1 = ::trainyard::v1;

constexpr absl::Duration kSetDeadline = absl::Seconds(10);
constexpr absl::Duration kSetRetryWindow = absl::Seconds(30);
constexpr absl::Duration kMaxLongPoll = absl::Seconds(30);  // the service's cap on wait_ms
constexpr absl::Duration kPollSlack = absl::Seconds(5);
constexpr absl::Duration kRetryPause = absl::Milliseconds(200);

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration d) {
  return std::chrono::system_clock::now() + std::chrono::microseconds(absl::ToInt64Microseconds(d));
}

absl::Duration Remaining(Clock* clock, int64_t until_nanos) {
  return absl::Nanoseconds(until_nanos - clock->NowNanosMonotonic());
}

}  // namespace

GrpcKeyValueStore::GrpcKeyValueStore(std::shared_ptr<v1::WorkerService::StubInterface> stub,
                                     std::string kv_prefix, Clock* clock)
    : stub_(std::move(stub)), prefix_(std::move(kv_prefix)), clock_(clock) {}

absl::Status GrpcKeyValueStore::Set(const std::string& key, const std::string& value) {
  v1::KvSetRequest request;
  request.set_key(prefix_ + key);
  request.set_value(value);
  const int64_t until = clock_->NowNanosMonotonic() + absl::ToInt64Nanoseconds(kSetRetryWindow);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(kSetDeadline));
    v1::KvSetReply reply;
    const absl::Status status = rpc::FromGrpc(stub_->KvSet(&context, request, &reply));
    if (!absl::IsUnavailable(status) || Remaining(clock_, until) <= absl::ZeroDuration()) {
      if (status.ok()) return status;
      return absl::Status(status.code(),
                          absl::StrCat("rendezvous set '", key, "': ", status.message()));
    }
    clock_->SleepFor(kRetryPause);
  }
}

absl::StatusOr<std::string> GrpcKeyValueStore::Get(const std::string& key,
                                                   std::chrono::milliseconds timeout) {
  const int64_t until =
      clock_->NowNanosMonotonic() + absl::ToInt64Nanoseconds(absl::Milliseconds(timeout.count()));
  v1::KvGetRequest request;
  request.set_key(prefix_ + key);
  while (true) {
    const absl::Duration left = std::max(absl::ZeroDuration(), Remaining(clock_, until));
    const absl::Duration wait = std::min(left, kMaxLongPoll);
    request.set_wait_ms(absl::ToInt64Milliseconds(wait));
    grpc::ClientContext context;
    context.set_deadline(DeadlineAfter(wait + kPollSlack));
    v1::KvGetReply reply;
    const absl::Status status = rpc::FromGrpc(stub_->KvGet(&context, request, &reply));
    if (status.ok() && reply.found()) return reply.value();
    if (!status.ok() && !absl::IsUnavailable(status)) {
      return absl::Status(status.code(),
                          absl::StrCat("rendezvous get '", key, "': ", status.message()));
    }
    if (Remaining(clock_, until) <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous key '", key, "' was not set within ", timeout.count(), " ms"));
    }
    if (!status.ok()) clock_->SleepFor(kRetryPause);  // the coordinator is unreachable: pace
  }
}

absl::Status GrpcKeyValueStore::Wait(const std::vector<std::string>& keys,
                                     std::chrono::milliseconds timeout) {
  const int64_t until =
      clock_->NowNanosMonotonic() + absl::ToInt64Nanoseconds(absl::Milliseconds(timeout.count()));
  for (const std::string& key : keys) {
    const absl::Duration left = std::max(absl::ZeroDuration(), Remaining(clock_, until));
    absl::StatusOr<std::string> value =
        Get(key, std::chrono::milliseconds(absl::ToInt64Milliseconds(left)));
    if (!value.ok()) return value.status();
  }
  return absl::OkStatus();
}

}  // namespace trainyard::worker
