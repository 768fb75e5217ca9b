#include "bench/gpu_timeline.h"

#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainyard::bench {
namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kAlignment = 8;

struct Record {
  const char* kind;  // "kernel", "memcpy", "memset"
  uint64_t start_ns;
  uint64_t end_ns;
  uint64_t bytes;  // copies and fills; 0 for kernels
  std::string name;
};

// CUPTI hands completed buffers to process-wide callbacks, on its own thread.
std::mutex records_mutex;
std::vector<Record>& Records() {
  static auto* records = new std::vector<Record>();
  return *records;
}

std::string Demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain != nullptr ? plain : name;
  std::free(plain);
  return out;
}

const char* CopyKind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    default:
      return "memcpy other";
  }
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, kBufferBytes));
  *size = *buffer == nullptr ? 0 : kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<Record> batch;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        batch.push_back({"kernel", k->start, k->end, 0, Demangled(k->name)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        batch.push_back({"memcpy", c->start, c->end, c->bytes, CopyKind(c->copyKind)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        batch.push_back({"memset", m->start, m->end, m->bytes, "memset"});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(records_mutex);
  auto& records = Records();
  for (Record& r : batch) records.push_back(std::move(r));
}

absl::Status Check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return absl::OkStatus();
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  return absl::InternalError(
      absl::StrCat("CUPTI ", what, ": ", text != nullptr ? text : "unknown error"));
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelTimeline>> KernelTimeline::Start() {
  absl::Status s = Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted),
                         "registering buffers");
  for (CUpti_ActivityKind kind : kKinds) {
    if (s.ok()) s = Check(cuptiActivityEnable(kind), "enabling an activity kind");
  }
  if (!s.ok()) return s;
  return std::unique_ptr<KernelTimeline>(new KernelTimeline());
}

KernelTimeline::~KernelTimeline() {
  if (finished_) return;
  for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
}

void KernelTimeline::Mark() {
  uint64_t now = 0;
  if (cuptiGetTimestamp(&now) == CUPTI_SUCCESS) marks_ns_.push_back(now);
}

absl::StatusOr<std::string> KernelTimeline::Finish(const std::string& engine,
                                                   const std::string& preset) {
  if (finished_) return absl::FailedPreconditionError("the timeline is already finished");
  finished_ = true;
  absl::Status s = Check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flushing");
  for (CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
  if (!s.ok()) return s;
  if (marks_ns_.size() < 2) {
    return absl::FailedPreconditionError("a timeline needs two step marks");
  }
  const uint64_t first = marks_ns_.front(), last = marks_ns_.back();
  std::string out = absl::StrFormat("{\"engine\":%s,\"preset\":%s,\"clock\":\"ns\",\"marks\":[",
                                    JsonString(engine), JsonString(preset));
  for (size_t i = 0; i < marks_ns_.size(); ++i) {
    absl::StrAppend(&out, i ? "," : "", marks_ns_[i] - first);
  }
  absl::StrAppend(&out, "],\"records\":[");
  std::lock_guard<std::mutex> lock(records_mutex);
  bool any = false;
  for (const Record& r : Records()) {
    // A record that straddles a window's edge (the previous step's optimizer still running at
    // the first mark) counts for its part inside.
    if (r.end_ns <= first || r.start_ns >= last) continue;
    const uint64_t start = std::max(r.start_ns, first), end = std::min(r.end_ns, last);
    absl::StrAppendFormat(&out, "%s[\"%s\",%d,%d,%d,%s]", any ? ",\n" : "\n", r.kind, start - first,
                          end - first, r.bytes, JsonString(r.name));
    any = true;
  }
  absl::StrAppend(&out, "]}\n");
  return out;
}

}  // namespace trainyard::bench
