// The kinds of collective operation the engine issues, by which its communicators count bytes
// and the planner's traffic model predicts them. Part of the shape library (worker/shape/): the
// planner reads it without linking any engine code.
#ifndef TRAINYARD_WORKER_SHAPE_COLLECTIVES_H_
#define TRAINYARD_WORKER_SHAPE_COLLECTIVES_H_

namespace trainyard::worker::parallel {

enum class CollectiveKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSendRecv, kCount };

// "all_reduce", "reduce_scatter", …: the name metrics and reports use.
const char* CollectiveName(CollectiveKind kind);

}  // namespace trainyard::worker::parallel

#endif  // TRAINYARD_WORKER_SHAPE_COLLECTIVES_H_
