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

// Parses the bytes as a Message and, when they are one, hands it to `decode`.
template <typename Message, typename Fn>
void Decode(const uint8_t* data, size_t size, Fn decode) {
  Message message;
  if (message.ParseFromArray(data, static_cast<int>(size))) decode(message);
}

void Nothing(const google::protobuf::Message&) {}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t kind = data[0] % 9;
  ++data;
  --size;
  using trainyard::server::FromProto;
  switch (kind) {
    case 0:
      Decode<v1::SubmitJobRequest>(data, size, [](const auto& m) {
        (void)trainyard::config::ParseJobSpec(m.spec_yaml(), "fuzz");
      });
      break;
    case 1:
      Decode<v1::AgentMessage>(data, size, [](const auto& m) {
        if (m.has_registration()) (void)FromProto(m.registration());
      });
      break;
    case 2:
      Decode<v1::RunningWorker>(data, size, [](const auto& m) { (void)FromProto(m); });
      break;
    case 3:
      Decode<v1::WorkerExited>(data, size, [](const auto& m) { (void)FromProto(m); });
      break;
    case 4:
      Decode<v1::ProgressReport>(data, size, [](const auto& m) { (void)FromProto(m); });
      break;
    case 5:
      Decode<v1::HangReport>(data, size, [](const auto& m) { (void)FromProto(m); });
      break;
    case 6:
      Decode<v1::JoinRequest>(data, size, Nothing);
      break;
    case 7:
      Decode<v1::KvSetRequest>(data, size, Nothing);
      break;
    default:
      Decode<v1::GetLogsRequest>(data, size, Nothing);
      break;
  }
  return 0;
}
