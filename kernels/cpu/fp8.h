// FP8 on the CPU: the reference the CUDA quantizers are checked against, written from the
// formats' definitions (kernels/fp8_format.h), not from CUDA's conversion intrinsics.
#ifndef TRAINYARD_KERNELS_CPU_FP8_H_
#define TRAINYARD_KERNELS_CPU_FP8_H_

#include <cstdint>

#include "kernels/fp8_format.h"

namespace trainyard::kernels::cpu {

using kernels::DecodeFp8;
using kernels::EncodeFp8;

// max |x[i]| over n values; NaN if any is NaN.
float AbsMax(const float* x, int64_t n);

// The scale a tensor of largest magnitude `amax` is multiplied by: Fp8Max(f) / max(amax,
// kFp8MinAmax), in fp32.
float Fp8Scale(float amax, Fp8Format f);

// out[i] = EncodeFp8(x[i] · scale) for x as rows × cols; out_t (may be null) the same values
// transposed (cols × rows).
void QuantizeFp8(const float* x, int64_t rows, int64_t cols, float scale, Fp8Format f, uint8_t* out,
                 uint8_t* out_t);

}  // namespace trainyard::kernels::cpu

#endif  // TRAINYARD_KERNELS_CPU_FP8_H_
