// libFuzzer target: the decoding of the coordinator's RPC requests. The first byte chooses a
// request type; the rest is parsed as that protobuf message, as gRPC hands it to the handler, and
// then goes through the handler's own decoding (server/convert.cc's FromProto for the agents' and
// workers' messages; the spec parser for SubmitJob). Every input must decode or be refused,
// never crash.
#include <cstddef>
#include <cstdint>

#include "config/spec.h"
#include "proto/trainyard.pb.h"
#include "server/convert.h"

namespace v1 = ::trainyard::v1;

namespace {

template <typename Message>
bool Parse(const uint8_t* data, size_t size, Message* message) {
  return message->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t kind = data[0] % 9;
  ++data;
  --size;
  using trainyard::server::FromProto;
  switch (kind) {
    case 0: {
      v1::SubmitJobRequest request;
      if (Parse(data, size, &request))
        (void)trainyard::config::ParseJobSpec(request.spec_yaml(), "fuzz");
      break;
    }
    case 1: {
      v1::AgentMessage message;
      if (Parse(data, size, &message) && message.has_registration()) {
        (void)FromProto(message.registration());
      }
      break;
    }
    case 2: {
      v1::RunningWorker worker;
      if (Parse(data, size, &worker)) (void)FromProto(worker);
      break;
    }
    case 3: {
      v1::WorkerExited exited;
      if (Parse(data, size, &exited)) (void)FromProto(exited);
      break;
    }
    case 4: {
      v1::ProgressReport report;
      if (Parse(data, size, &report)) (void)FromProto(report);
      break;
    }
    case 5: {
      v1::HangReport report;
      if (Parse(data, size, &report)) (void)FromProto(report);
      break;
    }
    case 6: {
      v1::JoinRequest request;
      (void)Parse(data, size, &request);
      break;
    }
    case 7: {
      v1::KvSetRequest request;
      (void)Parse(data, size, &request);
      break;
    }
    default: {
      v1::GetLogsRequest request;
      (void)Parse(data, size, &request);
      break;
    }
  }
  return 0;
}
