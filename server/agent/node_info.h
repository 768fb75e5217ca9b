// What a node agent reports about its machine, and where it finds the worker binary.
//
// Threading: plain functions.
#ifndef TRAINYARD_SERVER_AGENT_NODE_INFO_H_
#define TRAINYARD_SERVER_AGENT_NODE_INFO_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device_probe.h"
#include "proto/trainyard.pb.h"

namespace trainyard::server::agent {

std::string LocalHostname();

// CPU cores this process may run on (its affinity mask), at least 1.
int LocalCpuCount();
// The machine's physical memory in bytes.
int64_t LocalMemoryBytes();

// The CUDA devices `probe` finds (SystemDeviceProbe(): none in a build without CUDA, or without
// a driver or GPU), one entry each, named after device 0 (a node holds one GPU model).
std::vector<trainyard::v1::GpuInfo> LocalGpus(const DeviceProbe& probe);

// The current process's environment as a map.
std::map<std::string, std::string> CurrentEnvironment();

// The trainyard-worker to exec: `flag` when given (must be executable), else
// $TRAINYARD_WORKER_BINARY, else "trainyard-worker" beside this executable or in the build
// tree's worker/ folder next to it, else on PATH. Always an absolute path. NOT_FOUND listing the
// places looked at.
[[nodiscard]] absl::StatusOr<std::string> FindWorkerBinary(const std::string& flag);

}  // namespace trainyard::server::agent

#endif  // TRAINYARD_SERVER_AGENT_NODE_INFO_H_
