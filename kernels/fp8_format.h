// The two 8-bit floating-point formats (OCP FP8) the linear layers may compute in, shared by the
// CPU reference (kernels/cpu/fp8.h) and the CUDA quantizers and GEMMs (kernels/cuda/fp8.h,
// gemm.h).
//
// E4M3: 4 exponent bits (bias 7), 3 mantissa bits, no infinities (S.1111.111 is NaN), largest
// finite 448; for weights and activations. E5M2: 5 exponent bits (bias 15), 2 mantissa bits,
// IEEE-like, largest finite 57344; for gradients. Both have subnormals. Encoding rounds to
// nearest even and saturates: a finite value beyond the largest, and an infinity, becomes the
// largest of its sign; NaN becomes 0x7F.
//
// Per-tensor ("tensorwise") current scaling: a tensor is multiplied by scale = max / amax (amax
// its largest magnitude, at least kFp8MinAmax; NaN when the tensor holds one) before encoding,
// so that it spans the format's range; a product of two such tensors is multiplied back by both
// 1 / scale.
#ifndef TRAINYARD_KERNELS_FP8_FORMAT_H_
#define TRAINYARD_KERNELS_FP8_FORMAT_H_

namespace trainyard::kernels {

enum class Fp8Format { kE4M3, kE5M2 };

// The largest finite value of the format: 448 (E4M3), 57344 (E5M2).
inline constexpr float Fp8Max(Fp8Format f) { return f == Fp8Format::kE4M3 ? 448.0f : 57344.0f; }

// An amax below this counts as this, so that an all-zero tensor gets a finite scale.
inline constexpr float kFp8MinAmax = 1e-12f;

}  // namespace trainyard::kernels

#endif  // TRAINYARD_KERNELS_FP8_FORMAT_H_
