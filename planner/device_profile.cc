#include "planner/device_profile.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/json.h"
#include "common/status.h"
#include "config/yaml_tree.h"

namespace trainyard::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The SXM parts of both datasheets share everything but memory: 989 dense bf16 TFLOPS (the
// datasheets' 1,979 is with 2:4 sparsity), NVLink 900 GB/s per GPU (both directions, so 450 GB/s
// each way), and in their DGX systems one 400 Gb/s ConnectX-7 InfiniBand port per GPU (50 GB/s
// each way). The link latencies are the planner's assumptions, not datasheet figures.
DeviceProfile HopperSxm(std::string name, double memory_gib, double hbm_bytes_per_second) {
  DeviceProfile p;
  p.name = std::move(name);
  p.description = absl::StrFormat(
      "NVIDIA %s SXM: %.0f GB HBM at %.2f TB/s, 989 bf16 TFLOPS dense, NVLink 450 GB/s and "
      "InfiniBand 50 GB/s per direction",
      p.name == "h100" ? "H100" : "H200", memory_gib, hbm_bytes_per_second / 1e12);
  p.memory_bytes = static_cast<int64_t>(memory_gib * kGiB);
  p.peak_flops = 989.4e12;
  p.matmul_flops = p.peak_flops;
  p.memory_bytes_per_second = hbm_bytes_per_second;
  p.intra_node = Link{.alpha_seconds = 5e-6, .bytes_per_second = 450e9};
  p.inter_node = Link{.alpha_seconds = 10e-6, .bytes_per_second = 50e9};
  p.act_bytes = 2;                        // bf16 activations
  p.max_logits_chunk = int64_t{1} << 27;  // the CUDA backend's
  p.logits_vocab_multiple = 128;          // likewise
  p.ring_overlap = false;                 // started exchanges not yet measured on a GPU
  p.calibrated = true;
  return p;
}

// Until `trainyard plan --calibrate` has run: round figures of a small machine, flagged.
DeviceProfile UncalibratedCpu() {
  DeviceProfile p;
  p.name = "cpu";
  p.description = "CPU ranks (not calibrated: run `trainyard plan --calibrate`)";
  p.memory_bytes = static_cast<int64_t>(8 * kGiB);
  p.shared_node = true;
  p.peak_flops = 50e9;
  p.matmul_flops = p.peak_flops;
  p.memory_bytes_per_second = 10e9;
  p.intra_node = Link{.alpha_seconds = 50e-6, .bytes_per_second = 2e9};
  p.inter_node = p.intra_node;
  p.act_bytes = 4;
  p.max_logits_chunk = int64_t{1} << 20;
  p.calibrated = false;
  return p;
}

absl::StatusOr<double> Number(const config::YamlNode& root, const std::string& path) {
  const config::YamlNode* node = &root;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
    const config::YamlEntry* entry = node->Find(key);
    if (entry == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing ", path));
    node = &entry->value;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  double value = 0;
  if (node->kind != config::YamlNode::Kind::kScalar || !absl::SimpleAtod(node->value, &value) ||
      !std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a non-negative number"));
  }
  return value;
}

// The optional "shared_ranks" list: entries with distinct positive rank counts, ascending.
absl::StatusOr<std::vector<SharedRanks>> SharedRanksFromJson(const config::YamlNode& root) {
  std::vector<SharedRanks> shared;
  const config::YamlEntry* list = root.Find("shared_ranks");
  if (list == nullptr) return shared;
  if (list->value.kind != config::YamlNode::Kind::kSequence) {
    return absl::InvalidArgumentError("shared_ranks is not a list");
  }
  for (const config::YamlNode& item : list->value.items) {
    SharedRanks e;
    TY_ASSIGN_OR_RETURN(const double ranks, Number(item, "ranks"));
    e.ranks = static_cast<int>(ranks);
    TY_ASSIGN_OR_RETURN(e.matmul_flops, Number(item, "matmul_flops"));
    TY_ASSIGN_OR_RETURN(e.link.alpha_seconds, Number(item, "alpha_seconds"));
    TY_ASSIGN_OR_RETURN(e.link.bytes_per_second, Number(item, "bytes_per_second"));
    if (item.Find("lockstep_alpha_seconds") != nullptr) {
      TY_ASSIGN_OR_RETURN(e.lockstep_alpha_seconds, Number(item, "lockstep_alpha_seconds"));
    }
    if (item.Find("background_alpha_seconds") != nullptr) {
      TY_ASSIGN_OR_RETURN(e.background_alpha_seconds, Number(item, "background_alpha_seconds"));
    }
    if (item.Find("optimizer_elements_per_second") != nullptr) {
      TY_ASSIGN_OR_RETURN(e.optimizer_elements_per_second,
                          Number(item, "optimizer_elements_per_second"));
    }
    if (item.Find("lockstep_matmul_flops") != nullptr) {
      TY_ASSIGN_OR_RETURN(e.lockstep_matmul_flops, Number(item, "lockstep_matmul_flops"));
    }
    if (e.ranks < 1 || e.ranks != ranks || e.matmul_flops <= 0 || e.link.bytes_per_second <= 0 ||
        (!shared.empty() && e.ranks <= shared.back().ranks)) {
      return absl::InvalidArgumentError(
          "shared_ranks entries need ascending whole rank counts and positive rates");
    }
    shared.push_back(e);
  }
  return shared;
}

}  // namespace

absl::StatusOr<DeviceProfile> ProfileFromNode(const config::YamlNode& root) {
  DeviceProfile p = UncalibratedCpu();
  p.description = "CPU ranks (calibrated on this machine)";
  p.calibrated = true;
  TY_ASSIGN_OR_RETURN(const double memory, Number(root, "memory_bytes"));
  p.memory_bytes = static_cast<int64_t>(memory);
  TY_ASSIGN_OR_RETURN(p.peak_flops, Number(root, "peak_flops"));
  TY_ASSIGN_OR_RETURN(p.matmul_flops, Number(root, "matmul_flops"));
  TY_ASSIGN_OR_RETURN(p.memory_bytes_per_second, Number(root, "memory_bytes_per_second"));
  TY_ASSIGN_OR_RETURN(p.intra_node.alpha_seconds, Number(root, "intra_node.alpha_seconds"));
  TY_ASSIGN_OR_RETURN(p.intra_node.bytes_per_second, Number(root, "intra_node.bytes_per_second"));
  TY_ASSIGN_OR_RETURN(p.inter_node.alpha_seconds, Number(root, "inter_node.alpha_seconds"));
  TY_ASSIGN_OR_RETURN(p.inter_node.bytes_per_second, Number(root, "inter_node.bytes_per_second"));
  TY_ASSIGN_OR_RETURN(p.shared, SharedRanksFromJson(root));
  if (const config::YamlEntry* reference = root.Find("reference"); reference != nullptr) {
    if (reference->value.kind != config::YamlNode::Kind::kScalar) {
      return absl::InvalidArgumentError("reference is not a string");
    }
    p.reference = reference->value.value;
  }
  if (root.Find("cores") != nullptr) {
    TY_ASSIGN_OR_RETURN(const double cores, Number(root, "cores"));
    p.cores = static_cast<int>(cores);
  }
  if (p.peak_flops <= 0 || p.matmul_flops <= 0 || p.memory_bytes_per_second <= 0 ||
      p.intra_node.bytes_per_second <= 0 || p.inter_node.bytes_per_second <= 0 ||
      p.memory_bytes <= 0) {
    return absl::InvalidArgumentError("rates and memory must be positive");
  }
  return p;
}

namespace {

// The median of `values` (not empty); the mean of the middle two for an even count.
double MedianOf(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The median of `figure(item)` over the items.
template <typename T, typename Figure>
double MedianOver(const std::vector<const T*>& items, Figure figure) {
  std::vector<double> values;
  for (const T* item : items) values.push_back(figure(*item));
  return MedianOf(std::move(values));
}

const SharedRanks* EntryFor(const DeviceProfile& p, int ranks) {
  for (const SharedRanks& e : p.shared) {
    if (e.ranks == ranks) return &e;
  }
  return nullptr;
}

// Sets every figure of `entry` to its median over the calibrations' entries of the same count.
void TakeEntryMedian(const std::vector<DeviceProfile>& calibrations, SharedRanks& entry) {
  std::vector<const SharedRanks*> found;
  for (const DeviceProfile& c : calibrations) {
    if (const SharedRanks* e = EntryFor(c, entry.ranks)) found.push_back(e);
  }
  auto median = [&](auto figure) { return MedianOver(found, figure); };
  entry.matmul_flops = median([](const SharedRanks& e) { return e.matmul_flops; });
  entry.link.alpha_seconds = median([](const SharedRanks& e) { return e.link.alpha_seconds; });
  entry.link.bytes_per_second =
      median([](const SharedRanks& e) { return e.link.bytes_per_second; });
  entry.lockstep_alpha_seconds =
      median([](const SharedRanks& e) { return e.lockstep_alpha_seconds; });
  entry.background_alpha_seconds =
      median([](const SharedRanks& e) { return e.background_alpha_seconds; });
  entry.optimizer_elements_per_second =
      median([](const SharedRanks& e) { return e.optimizer_elements_per_second; });
  // Calibrations from before the figure was measured lack it (0): the median of those that have
  // it.
  std::vector<const SharedRanks*> measured;
  for (const SharedRanks* e : found) {
    if (e->lockstep_matmul_flops > 0) measured.push_back(e);
  }
  entry.lockstep_matmul_flops =
      measured.empty()
          ? 0.0
          : MedianOver(measured, [](const SharedRanks& e) { return e.lockstep_matmul_flops; });
}

// Says in the profile's description that it is the median of `count` calibrations.
void DescribeMedian(size_t count, DeviceProfile& p) {
  if (count > 1) {
    p.description = absl::StrCat("CPU ranks (calibrated on this machine; the median of ", count,
                                 " calibrations)");
  }
}

bool SameMachineAndReference(const DeviceProfile& a, const DeviceProfile& b) {
  return a.cores == b.cores && a.memory_bytes == b.memory_bytes && a.reference == b.reference;
}

}  // namespace

std::vector<std::string> ProfileNames() { return {"cpu", "h100", "h200"}; }

absl::StatusOr<DeviceProfile> PublishedProfile(const std::string& name) {
  if (name == "h100") return HopperSxm("h100", 80, 3.35e12);
  if (name == "h200") return HopperSxm("h200", 141, 4.8e12);
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown device profile '", name, "' (known: ", absl::StrJoin(ProfileNames(), ", "), ")"));
}

std::string CpuProfilePath(const char* xdg_config_home, const char* home) {
  if (xdg_config_home != nullptr && *xdg_config_home != '\0') {
    return absl::StrCat(xdg_config_home, "/trainyard/cpu-profile.json");
  }
  if (home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.config/trainyard/cpu-profile.json");
  }
  return "";
}

DeviceProfile PerRankProfile(const DeviceProfile& device, int ranks, bool lockstep) {
  if (!device.shared_node) return device;
  DeviceProfile share = device;
  share.shared.clear();
  share.memory_bytes /= ranks;
  share.peak_flops /= ranks;
  share.memory_bytes_per_second /= ranks;
  share.overlap = device.cores <= 0 || ranks * std::max(1, device.cores / ranks) < device.cores;
  auto entry_for = [&](int count) {
    const SharedRanks* found = nullptr;
    for (const SharedRanks& e : device.shared) {
      if (e.ranks <= count && (found == nullptr || e.ranks > found->ranks)) found = &e;
    }
    return found;
  };
  const SharedRanks* entry = entry_for(ranks);
  if (entry == nullptr) {
    share.matmul_flops /= ranks;
    return share;
  }
  share.matmul_flops = entry->matmul_flops * entry->ranks / ranks;
  share.optimizer_elements_per_second = entry->optimizer_elements_per_second * entry->ranks / ranks;
  if (lockstep) {
    share.tensor_parallel_matmul_flops = entry->lockstep_matmul_flops * entry->ranks / ranks;
  }
  if (entry->link.alpha_seconds > 0) {
    share.idle_alpha_seconds = device.intra_node.alpha_seconds;
    share.intra_node = entry->link;
    const SharedRanks* alone = entry_for(std::min(ranks, std::max(device.cores, 2)));
    if (lockstep && entry->lockstep_alpha_seconds > 0 && alone != nullptr &&
        alone->link.alpha_seconds > 0) {
      share.intra_node.alpha_seconds = alone->link.alpha_seconds;
      share.sync_skew_seconds =
          std::max(0.0, entry->lockstep_alpha_seconds - alone->link.alpha_seconds);
    }
    share.inter_node = share.intra_node;  // across nodes the cpu profile assumes loopback
    share.background_alpha_seconds = entry->background_alpha_seconds;
  }
  return share;
}

namespace {

// One profile as a JSON object, with `more` (further members, each starting ",\n  ") after its
// own.
std::string ProfileJson(const DeviceProfile& p, const std::string& more) {
  auto link = [](const Link& l) {
    return absl::StrCat("\"alpha_seconds\": ", JsonNumber(l.alpha_seconds),
                        ", \"bytes_per_second\": ", JsonNumber(l.bytes_per_second));
  };
  std::vector<std::string> shared;
  for (const SharedRanks& e : p.shared) {
    shared.push_back(absl::StrCat(
        "    {\"ranks\": ", e.ranks, ", \"matmul_flops\": ", JsonNumber(e.matmul_flops), ", ",
        link(e.link), ", \"lockstep_alpha_seconds\": ", JsonNumber(e.lockstep_alpha_seconds),
        ", \"background_alpha_seconds\": ", JsonNumber(e.background_alpha_seconds),
        ", \"optimizer_elements_per_second\": ", JsonNumber(e.optimizer_elements_per_second),
        ", \"lockstep_matmul_flops\": ", JsonNumber(e.lockstep_matmul_flops), "}"));
  }
  return absl::StrFormat(
      "{\n  \"name\": \"cpu\",\n  \"memory_bytes\": %d,\n  \"peak_flops\": %s,\n"
      "  \"matmul_flops\": %s,\n  \"memory_bytes_per_second\": %s,\n"
      "  \"intra_node\": {%s},\n  \"inter_node\": {%s},\n  \"cores\": %d,\n"
      "  \"reference\": %s,\n  \"shared_ranks\": [%s%s%s]%s\n}\n",
      p.memory_bytes, JsonNumber(p.peak_flops), JsonNumber(p.matmul_flops),
      JsonNumber(p.memory_bytes_per_second), link(p.intra_node), link(p.inter_node), p.cores,
      JsonString(p.reference), shared.empty() ? "" : "\n", absl::StrJoin(shared, ",\n"),
      shared.empty() ? "" : "\n  ", more);
}

}  // namespace

std::string ProfileToJson(const DeviceProfile& p) { return ProfileJson(p, ""); }

absl::StatusOr<DeviceProfile> ProfileFromJson(const std::string& json) {
  TY_ASSIGN_OR_RETURN(const config::YamlNode root, config::ParseYamlTree(json, "cpu profile"));
  return ProfileFromNode(root);
}

DeviceProfile MedianProfile(const std::vector<DeviceProfile>& calibrations) {
  std::vector<const DeviceProfile*> all;
  for (const DeviceProfile& c : calibrations) all.push_back(&c);
  auto median = [&](auto figure) { return MedianOver(all, figure); };
  DeviceProfile p = calibrations.back();
  p.peak_flops = median([](const DeviceProfile& c) { return c.peak_flops; });
  p.matmul_flops = median([](const DeviceProfile& c) { return c.matmul_flops; });
  p.memory_bytes_per_second =
      median([](const DeviceProfile& c) { return c.memory_bytes_per_second; });
  p.intra_node.alpha_seconds =
      median([](const DeviceProfile& c) { return c.intra_node.alpha_seconds; });
  p.intra_node.bytes_per_second =
      median([](const DeviceProfile& c) { return c.intra_node.bytes_per_second; });
  p.inter_node.alpha_seconds =
      median([](const DeviceProfile& c) { return c.inter_node.alpha_seconds; });
  p.inter_node.bytes_per_second =
      median([](const DeviceProfile& c) { return c.inter_node.bytes_per_second; });
  for (SharedRanks& entry : p.shared) TakeEntryMedian(calibrations, entry);
  DescribeMedian(calibrations.size(), p);
  return p;
}

CpuProfileFile AddCalibration(const std::optional<CpuProfileFile>& earlier,
                              const DeviceProfile& latest) {
  CpuProfileFile file;
  if (earlier) {
    for (const DeviceProfile& c : earlier->calibrations) {
      if (SameMachineAndReference(c, latest)) file.calibrations.push_back(c);
    }
  }
  file.calibrations.push_back(latest);
  if (file.calibrations.size() > static_cast<size_t>(kKeptCalibrations)) {
    file.calibrations.erase(file.calibrations.begin(), file.calibrations.end() - kKeptCalibrations);
  }
  file.profile = MedianProfile(file.calibrations);
  return file;
}

std::string ProfileFileToJson(const CpuProfileFile& file) {
  std::vector<std::string> calibrations;
  for (const DeviceProfile& c : file.calibrations) {
    std::string one = ProfileToJson(c);
    one.pop_back();  // its final newline; the list's indentation goes in front of every line
    calibrations.push_back(absl::StrReplaceAll(one, {{"\n", "\n    "}}));
  }
  return ProfileJson(file.profile,
                     absl::StrCat(",\n  \"calibrations\": [", calibrations.empty() ? "" : "\n    ",
                                  absl::StrJoin(calibrations, ",\n    "),
                                  calibrations.empty() ? "" : "\n  ", "]"));
}

absl::StatusOr<CpuProfileFile> ProfileFileFromJson(const std::string& json) {
  TY_ASSIGN_OR_RETURN(const config::YamlNode root, config::ParseYamlTree(json, "cpu profile"));
  CpuProfileFile file;
  TY_ASSIGN_OR_RETURN(file.profile, ProfileFromNode(root));
  const config::YamlEntry* list = root.Find("calibrations");
  if (list == nullptr) return file;
  if (list->value.kind != config::YamlNode::Kind::kSequence) {
    return absl::InvalidArgumentError("calibrations is not a list");
  }
  for (const config::YamlNode& item : list->value.items) {
    absl::StatusOr<DeviceProfile> c = ProfileFromNode(item);
    if (!c.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("calibration ", file.calibrations.size() + 1, ": ", c.status().message()));
    }
    file.calibrations.push_back(*std::move(c));
  }
  DescribeMedian(file.calibrations.size(), file.profile);
  return file;
}

absl::StatusOr<DeviceProfile> LoadCpuProfile(FileSystem& fs, const std::string& path) {
  TY_ASSIGN_OR_RETURN(CpuProfileFile file, LoadCpuProfileFile(fs, path));
  return std::move(file.profile);
}

absl::StatusOr<CpuProfileFile> LoadCpuProfileFile(FileSystem& fs, const std::string& path) {
  if (path.empty() || !fs.Exists(path)) return CpuProfileFile{.profile = UncalibratedCpu()};
  absl::StatusOr<std::string> text = fs.ReadFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the cpu profile ", path, ": ", text.status().message()));
  }
  absl::StatusOr<CpuProfileFile> file = ProfileFileFromJson(*text);
  if (!file.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the cpu profile ", path, " is malformed (",
                                                   file.status().message(),
                                                   "); run `trainyard plan --calibrate` again"));
  }
  return file;
}

absl::Status SaveCpuProfileFile(FileSystem& fs, const std::string& path,
                                const CpuProfileFile& file) {
  if (path.empty()) {
    return absl::FailedPreconditionError(
        "nowhere to keep the cpu profile: set XDG_CONFIG_HOME or HOME");
  }
  TY_RETURN_IF_ERROR(fs.CreateDirs(Dirname(path)));
  return fs.WriteFileAtomic(path, ProfileFileToJson(file));
}

}  // namespace trainyard::planner
