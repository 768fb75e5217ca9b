// Device profiles: what the planner assumes about the hardware a job runs on. `h100` and `h200`
// carry the vendors' published figures (docs/planner.md names the datasheets); `cpu` is measured
// on the machine itself by `trainyard plan --calibrate` (planner/calibration.h) and kept in a
// small JSON file (CpuProfilePath).
//
// Threading: plain values and functions; no shared state.
#ifndef TRAINYARD_PLANNER_DEVICE_PROFILE_H_
#define TRAINYARD_PLANNER_DEVICE_PROFILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "config/yaml_tree.h"

namespace trainyard::planner {

// A link class of the α–β model: moving b bytes in one message takes alpha + b / bandwidth.
struct Link {
  double alpha_seconds = 0;        // per message (per ring step of a collective)
  double bytes_per_second = 1e12;  // per direction, per device
};

// What each of `ranks` CPU ranks gets when that many run at once on one machine (they share its
// cores): measured by `trainyard plan --calibrate` with that many ranks running concurrently.
struct SharedRanks {
  int ranks = 1;
  // The engine's effective rate: the FLOPs the planner counts for a forward and backward pass of
  // the calibration's reference model, over the pass's time less its elementwise term.
  double matmul_flops = 0;
  Link link;  // its collectives between compute (alpha 0 for one rank: it has no peer)
  // α when every rank exchanges at once, all in tensor-parallel pairs (a mesh without pipelining
  // moves in step: every rank computes, then every rank waits on its peers). 0: not measured,
  // link.alpha_seconds applies.
  double lockstep_alpha_seconds = 0;
  // α of a collective a communication thread runs while every rank computes (data parallelism's
  // reductions and gathers). 0: not measured, link.alpha_seconds applies.
  double background_alpha_seconds = 0;
  // The engine's optimizer step (zeroing the gradients, their norm and clipping, AdamW), in
  // parameters per second. 0: not measured; the step streams 28 bytes per parameter it owns at
  // the memory bandwidth.
  double optimizer_elements_per_second = 0;
  // The effective rate (as matmul_flops) of a rank of a tensor-parallel pair when every rank is
  // in pairs moving in step: the lockstep link probe's passes outside their collectives and the
  // step's sum. Its neighbours sleep in their waits part of the time, and its own wake-ups run
  // inside the pass. 0: not measured, matmul_flops applies.
  double lockstep_matmul_flops = 0;
};

struct DeviceProfile {
  std::string name;         // "h100", "h200", "cpu"
  std::string description;  // one line, for the human output
  // One device's memory, matmul rates and memory bandwidth. With shared_node (CPU ranks) they
  // are the whole machine's, which its devices_per_node ranks share equally.
  int64_t memory_bytes = 0;
  bool shared_node = false;
  double peak_flops = 0;    // dense bf16 (GPU) or fp32 GEMM at a large size (CPU): the MFU basis
  double matmul_flops = 0;  // the rate compute time is predicted at
  double memory_bytes_per_second = 0;  // HBM (GPU) or DRAM (CPU) bandwidth
  Link intra_node;                     // NVLink; CPU: loopback TCP
  Link inter_node;                     // InfiniBand; CPU: as loopback (see docs/planner.md)
  // How the engine's backend stores activations on this device: bf16 on CUDA, fp32 on the CPU,
  // the most logits its chunked cross-entropy holds at once (Backend::max_logits_chunk) and the
  // multiple it pads the LM head's width to (Backend::logits_vocab_multiple).
  int64_t act_bytes = 4;
  int64_t max_logits_chunk = int64_t{1} << 20;
  int64_t logits_vocab_multiple = 1;
  // Ring attention's transfers run while the block in hand is computed (Gloo's started sends and
  // receives, CPU ranks). The CUDA backend's communicators start their exchanges too (NCCL on its
  // own stream, host staging through Gloo's), but until that overlap is measured on a GPU the
  // published GPU profiles count every hop whole.
  bool ring_overlap = true;
  bool calibrated = false;  // cpu: measured on this machine (false: the built-in placeholder)
  // cpu: the model and micro-batch the shared-rank probes ran, in words (empty: not recorded).
  std::string reference;
  // cpu: per-rank figures by the number of ranks sharing the machine, ascending; empty: each of
  // g ranks gets 1/g of the machine's matmul rate and the links as they are.
  std::vector<SharedRanks> shared;
  int cores = 0;  // cpu: the machine's cores (0: unknown)
  // Shared node, ranks in lockstep (PerRankProfile): what a rank waits at each collective that
  // every rank of a group must reach (an exposed one) for its slowest peer, as ranks
  // time-sharing the cores drift apart; the links' α is then the wake-up alone. 0 elsewhere.
  double sync_skew_seconds = 0;
  // Shared node: α of the communication thread's collectives (SharedRanks); 0: the links' α.
  double background_alpha_seconds = 0;
  // cpu: the optimizer step's rate in parameters per second (SharedRanks); 0: 28 bytes per
  // owned parameter at memory_bytes_per_second.
  double optimizer_elements_per_second = 0;
  // Shared node, ranks in lockstep: the matmul rate of a rank of a tensor-parallel group
  // (SharedRanks::lockstep_matmul_flops); 0: matmul_flops.
  double tensor_parallel_matmul_flops = 0;
  // Shared node: α when no rank computes (the machine's back-to-back link, before the entry's
  // replaced it); 0: the links' α.
  double idle_alpha_seconds = 0;
  // Whether collectives issued beside compute (data-parallel reductions, ZeRO-3's prefetch) run
  // on spare cores and hide behind it. Not when a shared node's ranks keep every core computing.
  bool overlap = true;
};

// One rank's share of `device` when `ranks` ranks share a node: with shared_node, 1/ranks of its
// memory, bandwidth and peak; the matmul rate and links of the calibrated entry for `ranks` (the
// entry for the largest count below it, its rate scaled by count / ranks, when none matches),
// else 1/ranks of the matmul rate; no overlap when the ranks' threads (each max(1, cores / ranks),
// as the standalone worker gives them) fill the cores. With `lockstep` (every rank of the node
// exchanges at once) and a measured lockstep α: the links' α is the wake-up of a rank that does
// not time-share (the entry for min(ranks, cores)), and sync_skew_seconds the rest of the
// lockstep α (its probe's collectives are one step each), and tensor_parallel_matmul_flops the
// entry's lockstep rate. Without shared_node, the device as it is.
DeviceProfile PerRankProfile(const DeviceProfile& device, int ranks, bool lockstep = false);

// The built-in profiles' names, for messages: "cpu", "h100", "h200".
std::vector<std::string> ProfileNames();

// The published profile `name` ("h100" or "h200"); INVALID_ARGUMENT naming the known profiles
// for anything else (the cpu profile comes from LoadCpuProfile).
[[nodiscard]] absl::StatusOr<DeviceProfile> PublishedProfile(const std::string& name);

// Where the calibrated cpu profile lives: $XDG_CONFIG_HOME/trainyard/cpu-profile.json, else
// $HOME/.config/trainyard/cpu-profile.json; empty when neither variable is set. The arguments
// are the variables' values (null when unset).
std::string CpuProfilePath(const char* xdg_config_home, const char* home);

// The cpu profile stored at `path`. A missing file gives the uncalibrated placeholder
// (calibrated == false), whose figures are deliberately round and marked as such in the output;
// an unreadable or malformed file is INVALID_ARGUMENT naming it.
[[nodiscard]] absl::StatusOr<DeviceProfile> LoadCpuProfile(FileSystem& fs, const std::string& path);

// One profile as JSON, and its inverse (a profile file's top level).
std::string ProfileToJson(const DeviceProfile& profile);
[[nodiscard]] absl::StatusOr<DeviceProfile> ProfileFromJson(const std::string& json);
// The same from a parsed document's node: a profile inside another object.
[[nodiscard]] absl::StatusOr<DeviceProfile> ProfileFromNode(const config::YamlNode& node);

// How many calibrations the cpu profile file keeps (CpuProfileFile).
inline constexpr int kKeptCalibrations = 5;

// The cpu profile file as `trainyard plan --calibrate` keeps it: every calibration it took on
// this machine with the same reference, the latest last and at most kKeptCalibrations, and the
// profile the planner uses, their median (MedianProfile). On a virtual machine the waits a
// calibration measures switch between regimes that last minutes (docs/planner.md), so one
// calibration is one draw; the median of several taken at different times is the typical one.
// A file without `calibrations` (an older one) holds its profile alone.
struct CpuProfileFile {
  DeviceProfile profile;
  std::vector<DeviceProfile> calibrations;
};

// Each measured figure's median over `calibrations` (at least one; the mean of the middle two
// for an even count): the rates, bandwidths, links and, entry by entry, the shared-ranks figures
// (over the calibrations with an entry for that rank count). Names, flags, cores and the entries'
// rank counts are the latest calibration's (the last).
DeviceProfile MedianProfile(const std::vector<DeviceProfile>& calibrations);

// The file after calibration `latest`: the earlier file's calibrations that were taken on the
// same machine (cores and memory) with the same reference, then `latest`, the oldest dropped
// beyond kKeptCalibrations; its profile their median. No earlier file (or `fresh`): `latest`
// alone.
CpuProfileFile AddCalibration(const std::optional<CpuProfileFile>& earlier,
                              const DeviceProfile& latest);

// The file at `path` (a missing one: the placeholder profile and no calibrations);
// INVALID_ARGUMENT as LoadCpuProfile for an unreadable or malformed one.
[[nodiscard]] absl::StatusOr<CpuProfileFile> LoadCpuProfileFile(FileSystem& fs,
                                                                const std::string& path);
// Writes `file` to `path` as JSON (creating the directory), atomically.
[[nodiscard]] absl::Status SaveCpuProfileFile(FileSystem& fs, const std::string& path,
                                              const CpuProfileFile& file);
std::string ProfileFileToJson(const CpuProfileFile& file);
[[nodiscard]] absl::StatusOr<CpuProfileFile> ProfileFileFromJson(const std::string& json);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_DEVICE_PROFILE_H_
