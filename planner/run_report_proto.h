// The run report on the wire (v1::RunReport) and back: what rank 0 sends the coordinator at the
// end of a run, and what `trainyard report` reads.
//
// Threading: plain functions.
#ifndef TRAINYARD_PLANNER_RUN_REPORT_PROTO_H_
#define TRAINYARD_PLANNER_RUN_REPORT_PROTO_H_

#include "planner/run_report.h"
#include "proto/trainyard.pb.h"

namespace trainyard::planner {

trainyard::v1::RunReport ToProto(const RunComparison& comparison);
RunComparison FromProto(const trainyard::v1::RunReport& report);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_RUN_REPORT_PROTO_H_
