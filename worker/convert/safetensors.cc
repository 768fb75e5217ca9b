#include "worker/convert/safetensors.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/json.h"
#include "common/staged_appender.h"
#include "common/status.h"
#include "kernels/fp8_format.h"

namespace trainyard::worker::convert {
namespace {

// The staging ring (StagedAppender): eight buffers of 8 MiB let the caller run up to 56 MiB
// ahead of the disk, so that neither the disk waits through a slow stretch of conversion (a
// transposed matrix, a large tensor's checksum) nor the caller through a stretch of plain copies.
constexpr size_t kStagingBytes = size_t{8} << 20;
constexpr int kStagingBuffers = 8;

using google::protobuf::Struct;
using google::protobuf::Value;

// IEEE binary16 to binary32, exactly (subnormals, infinities and NaNs included).
float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    int shift = 0;  // a subnormal: normalise it
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | ((113 - shift) << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

absl::StatusOr<TensorDtype> ParseDtype(const std::string& name) {
  if (name == "F32") return TensorDtype::kF32;
  if (name == "BF16") return TensorDtype::kBF16;
  if (name == "F16") return TensorDtype::kF16;
  if (name == "F8_E4M3") return TensorDtype::kF8E4M3;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\" (Trainyard reads F32, BF16, F16 and F8_E4M3)"));
}

// A JSON number that is a non-negative integer below 2^53 (exact in a double).
bool AsCount(const Value& v, int64_t* out) {
  if (v.kind_case() != Value::kNumberValue) return false;
  const double d = v.number_value();
  if (!(d >= 0) || d > 9007199254740992.0 || d != std::floor(d)) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

struct Range {
  int64_t begin, end;
  size_t tensor;
};

// One tensor's header entry: dtype, shape and its [begin, end) relative to the data section.
absl::StatusOr<Range> ParseEntry(const std::string& name, const Value& entry, TensorInfo& info) {
  if (entry.kind_case() != Value::kStructValue) {
    return absl::InvalidArgumentError("its header entry is not a JSON object");
  }
  const auto& fields = entry.struct_value().fields();
  for (const auto& [key, unused] : fields) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return absl::InvalidArgumentError(absl::StrCat("unknown header key \"", key, "\""));
    }
  }
  auto dtype = fields.find("dtype");
  auto shape = fields.find("shape");
  auto offsets = fields.find("data_offsets");
  if (dtype == fields.end() || shape == fields.end() || offsets == fields.end()) {
    return absl::InvalidArgumentError("its header entry needs dtype, shape and data_offsets");
  }
  if (dtype->second.kind_case() != Value::kStringValue) {
    return absl::InvalidArgumentError("dtype is not a string");
  }
  TY_ASSIGN_OR_RETURN(info.dtype, ParseDtype(dtype->second.string_value()));
  if (shape->second.kind_case() != Value::kListValue) {
    return absl::InvalidArgumentError("shape is not a list");
  }
  info.name = name;
  for (const Value& d : shape->second.list_value().values()) {
    int64_t size;
    if (!AsCount(d, &size) || size > (int64_t{1} << 40)) {
      return absl::InvalidArgumentError("shape holds something other than a dimension size");
    }
    info.shape.push_back(size);
  }
  if (offsets->second.kind_case() != Value::kListValue ||
      offsets->second.list_value().values_size() != 2) {
    return absl::InvalidArgumentError("data_offsets is not a list of two offsets");
  }
  Range r{};
  if (!AsCount(offsets->second.list_value().values(0), &r.begin) ||
      !AsCount(offsets->second.list_value().values(1), &r.end) || r.end < r.begin) {
    return absl::InvalidArgumentError("data_offsets is not [begin, end] with begin <= end");
  }
  int64_t numel = 1;
  for (int64_t d : info.shape) {
    if (d != 0 && numel > (int64_t{1} << 50) / d) {
      return absl::InvalidArgumentError("its shape is too large");
    }
    numel *= d;
  }
  if (r.end - r.begin != numel * DtypeBytes(info.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("data_offsets hold ", r.end - r.begin,
                                                   " bytes, its dtype and shape need ",
                                                   numel * DtypeBytes(info.dtype)));
  }
  return r;
}

}  // namespace

const char* DtypeName(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kF32:
      return "F32";
    case TensorDtype::kBF16:
      return "BF16";
    case TensorDtype::kF16:
      return "F16";
    case TensorDtype::kF8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

int64_t DtypeBytes(TensorDtype dtype) {
  return dtype == TensorDtype::kF32 ? 4 : dtype == TensorDtype::kF8E4M3 ? 1 : 2;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(FileSystem& fs,
                                                                       const std::string& path) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
  };
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  absl::StatusOr<std::unique_ptr<ReadOnlyRegion>> region = fs.MapReadOnly(path);
  if (!region.ok()) return bad(std::string(region.status().message()));
  file->region_ = *std::move(region);
  const uint8_t* bytes = file->region_->data();
  const uint64_t size = file->region_->size();
  if (size < 8) return bad("truncated: shorter than the 8-byte header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];
  if (header_bytes > kMaxHeaderBytes) {
    return bad(absl::StrCat("header length ", header_bytes, " is over the limit of ",
                            kMaxHeaderBytes, " bytes"));
  }
  if (header_bytes > size - 8) {
    return bad(absl::StrCat("truncated: the header needs ", header_bytes, " bytes, the file has ",
                            size - 8, " after its length"));
  }
  Struct header;
  const std::string text(reinterpret_cast<const char*>(bytes + 8), header_bytes);
  if (!google::protobuf::util::JsonStringToMessage(text, &header).ok()) {
    return bad("the header is not a JSON object");
  }
  const uint8_t* data = bytes + 8 + header_bytes;
  const int64_t data_bytes = static_cast<int64_t>(size - 8 - header_bytes);
  std::vector<Range> ranges;
  // Name order, so that errors and listings do not depend on the JSON's order.
  std::map<std::string, const Value*> entries;
  for (const auto& [name, value] : header.fields()) entries[name] = &value;
  for (const auto& [name, value] : entries) {
    if (name == "__metadata__") {
      if (value->kind_case() != Value::kStructValue) return bad("__metadata__ is not an object");
      for (const auto& [key, v] : value->struct_value().fields()) {
        if (v.kind_case() != Value::kStringValue) {
          return bad(absl::StrCat("__metadata__ value of \"", key, "\" is not a string"));
        }
        file->metadata_[key] = v.string_value();
      }
      continue;
    }
    TensorInfo info;
    absl::StatusOr<Range> range = ParseEntry(name, *value, info);
    if (!range.ok()) return bad(absl::StrCat("tensor ", name, ": ", range.status().message()));
    if (range->end > data_bytes) {
      return bad(absl::StrCat("tensor ", name, ": data_offsets [", range->begin, ", ", range->end,
                              ") run past the file's ", data_bytes, " data bytes"));
    }
    range->tensor = file->tensors_.size();
    ranges.push_back(*range);
    file->by_name_[name] = file->tensors_.size();
    file->tensors_.push_back(std::move(info));
    file->data_.push_back(data + range->begin);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return bad(absl::StrCat("tensors ", file->tensors_[ranges[i - 1].tensor].name, " and ",
                              file->tensors_[ranges[i].tensor].name, " overlap"));
    }
  }
  return file;
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const float* SafetensorsFile::FloatData(const TensorInfo& tensor) const {
  const uint8_t* data = data_[&tensor - tensors_.data()];
  if (tensor.dtype != TensorDtype::kF32 || reinterpret_cast<uintptr_t>(data) % 4 != 0) {
    return nullptr;
  }
  return reinterpret_cast<const float*>(data);
}

void SafetensorsFile::ReadFloats(const TensorInfo& tensor, int64_t begin, int64_t count,
                                 float* out) const {
  const uint8_t* data = data_[&tensor - tensors_.data()];
  switch (tensor.dtype) {
    case TensorDtype::kF32:
      std::memcpy(out, data + 4 * begin, 4 * count);
      return;
    case TensorDtype::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, data + 2 * (begin + i), 2);
        out[i] = Bf16BitsToFloat(bits);
      }
      return;
    case TensorDtype::kF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, data + 2 * (begin + i), 2);
        out[i] = HalfBitsToFloat(bits);
      }
      return;
    case TensorDtype::kF8E4M3:
      for (int64_t i = 0; i < count; ++i) {
        out[i] = kernels::DecodeFp8(data[begin + i], kernels::Fp8Format::kE4M3);
      }
      return;
  }
}

std::string SafetensorsWriter::Header(const std::vector<TensorInfo>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      absl::StrAppend(&json, first ? "" : ",", JsonString(key), ":", JsonString(value));
      first = false;
    }
    json += "}";
  }
  int64_t at = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    absl::StrAppend(&json, i > 0 || !metadata.empty() ? "," : "", JsonString(t.name),
                    ":{\"dtype\":\"", DtypeName(t.dtype), "\",\"shape\":[");
    for (size_t d = 0; d < t.shape.size(); ++d) absl::StrAppend(&json, d ? "," : "", t.shape[d]);
    absl::StrAppend(&json, "],\"data_offsets\":[", at, ",", at + t.bytes(), "]}");
    at += t.bytes();
  }
  json += "}";
  // Padded with spaces so that the data starts 8-byte aligned, as the reference writer does.
  while (json.size() % 8 != 0) json += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return out + json;
}

SafetensorsWriter::SafetensorsWriter(FileSystem& fs, std::string path,
                                     std::vector<TensorInfo> tensors)
    : fs_(fs), path_(std::move(path)), tensors_(std::move(tensors)) {}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    FileSystem& fs, const std::string& path, std::vector<TensorInfo> tensors,
    const std::map<std::string, std::string>& metadata) {
  for (const TensorInfo& t : tensors) {
    if (t.dtype == TensorDtype::kF16) {
      return absl::InvalidArgumentError("writing F16 tensors is not supported (F32 or BF16)");
    }
  }
  const std::string header = Header(tensors, metadata);
  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter(fs, path, std::move(tensors)));
  TY_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                      fs.NewDirectWritableFile(path + ".partial"));
  TY_ASSIGN_OR_RETURN(writer->out_,
                      StagedAppender::Create(std::move(file), kStagingBytes, kStagingBuffers));
  TY_RETURN_IF_ERROR(writer->Put(header.data(), header.size()));
  return writer;
}

SafetensorsWriter::~SafetensorsWriter() = default;

absl::Status SafetensorsWriter::Put(const void* bytes, size_t size) {
  return out_->Put(bytes, size);
}

absl::Status SafetensorsWriter::Write(const std::string& name, const float* values) {
  const std::span<const float> whole(values, next_ < tensors_.size() ? tensors_[next_].numel() : 0);
  return Write(name, std::span<const std::span<const float>>(&whole, 1));
}

absl::Status SafetensorsWriter::Write(const std::string& name,
                                      std::span<const std::span<const float>> parts) {
  if (next_ >= tensors_.size() || tensors_[next_].name != name) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": ", name, " written out of order"));
  }
  const TensorInfo& t = tensors_[next_++];
  int64_t given = 0;
  for (std::span<const float> part : parts) given += static_cast<int64_t>(part.size());
  if (given != t.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": ", name, " has ", t.numel(), " elements, ", given, " were given"));
  }
  constexpr int64_t kChunk = 1 << 20;  // elements converted at a time
  std::vector<uint16_t> narrow;
  std::vector<uint8_t> codes;
  for (std::span<const float> part : parts) {
    if (t.dtype == TensorDtype::kF32) {
      TY_RETURN_IF_ERROR(Put(part.data(), 4 * part.size()));
      continue;
    }
    if (t.dtype == TensorDtype::kF8E4M3) {  // the values as given: the caller scaled them
      codes.resize(part.size());
      for (size_t i = 0; i < part.size(); ++i) {
        codes[i] = kernels::EncodeFp8(part[i], kernels::Fp8Format::kE4M3);
      }
      TY_RETURN_IF_ERROR(Put(codes.data(), codes.size()));
      continue;
    }
    for (size_t at = 0; at < part.size(); at += kChunk) {
      const size_t n = std::min<size_t>(kChunk, part.size() - at);
      narrow.resize(n);
      for (size_t i = 0; i < n; ++i) narrow[i] = FloatToBf16Bits(part[at + i]);
      TY_RETURN_IF_ERROR(Put(narrow.data(), 2 * n));
    }
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (next_ != tensors_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": ", tensors_[next_].name, " was never written"));
  }
  TY_RETURN_IF_ERROR(out_->Finish());
  return fs_.RenameFile(path_ + ".partial", path_);
}

}  // namespace trainyard::worker::convert
