// Element types of tensors that cross module boundaries (activations, collectives).
#ifndef TRAINYARD_COMMON_DTYPE_H_
#define TRAINYARD_COMMON_DTYPE_H_

#include <cstdint>

namespace trainyard {

enum class DType : int { kF32 = 0, kBF16 = 1 };

constexpr int64_t DTypeBytes(DType d) { return d == DType::kBF16 ? 2 : 4; }
constexpr const char* DTypeName(DType d) { return d == DType::kBF16 ? "bf16" : "f32"; }

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_DTYPE_H_
