#include "worker/shape/collectives.h"

namespace trainyard::worker::parallel {

const char* CollectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kSendRecv:
      return "send_recv";
    case CollectiveKind::kCount:
      break;
  }
  return "?";
}

}  // namespace trainyard::worker::parallel
