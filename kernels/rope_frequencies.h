// The rotation frequencies of RoPE, shared by the CPU reference (kernels/cpu/rope.h) and the
// CUDA kernel (kernels/cuda/rope.h): pair i of a head of dimension d turns by position ·
// inv_freq(i), inv_freq(i) = theta^(−2i/d).
//
// Llama 3's scaling (factor > 0) stretches the long wavelengths to a longer context than the
// model was first trained on: with λ = 2π / inv_freq and the original context N, a pair whose λ
// exceeds N / low_freq_factor turns factor times slower; one whose λ is below
// N / high_freq_factor is unchanged; in between the two blend, with s = (N / λ − low_freq_factor)
// / (high_freq_factor − low_freq_factor): (1 − s) · inv_freq / factor + s · inv_freq. This is
// transformers' `rope_type: llama3`. Linear scaling (position interpolation, `rope_type: linear`)
// turns every pair factor times slower: inv_freq / factor.
//
// Partial rotation (rotary_dim < d, Phi-4 mini's partial_rotary_factor): only the first
// rotary_dim dimensions of each head turn, pair i being (i, i + rotary_dim / 2) at
// theta^(−2i/rotary_dim); the rest pass through. LongRoPE (pairs > 0, transformers'
// `rope_type: longrope`, Phi-3.5's and Phi-4 mini's) turns pair i pair_factor[i] times slower
// and multiplies both the cosine and the sine by `magnitude` (its attention_factor), so each
// query and key grows by that much.
#ifndef TRAINYARD_KERNELS_ROPE_FREQUENCIES_H_
#define TRAINYARD_KERNELS_ROPE_FREQUENCIES_H_

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define TY_ROPE_HOST_DEVICE __host__ __device__
#else
#define TY_ROPE_HOST_DEVICE
#endif

namespace trainyard::kernels {

// The most pairs LongRoPE's per-pair factors describe (heads of up to 256 rotated dimensions);
// the factors travel by value, to the CUDA kernel too.
inline constexpr int kMaxRopePairs = 128;

struct RopeFrequencies {
  double theta = 10000.0;
  double factor = 0.0;  // 0: no scaling
  bool linear = false;  // every pair slowed by factor; the rest is Llama 3's
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_seq = 8192.0;
  int64_t rotary_dim = 0;  // the dimensions of a head that turn; 0: all of them
  int pairs = 0;           // LongRoPE: pair_factor's length, rotary_dim / 2; 0: none
  float pair_factor[kMaxRopePairs] = {};
  double magnitude = 1.0;  // both cosine and sine times this (LongRoPE's attention factor)
};

// The dimensions of a head of dimension d that turn.
TY_ROPE_HOST_DEVICE inline int64_t RopeRotaryDim(const RopeFrequencies& f, int64_t d) {
  return f.rotary_dim > 0 ? f.rotary_dim : d;
}

// inv_freq(i) for pair i < rotary_dim / 2 of a head whose rotated part is rotary_dim wide, in
// fp64.
TY_ROPE_HOST_DEVICE inline double RopeInvFreq(const RopeFrequencies& f, int64_t i,
                                              int64_t rotary_dim) {
  const double inv_freq =
      pow(f.theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
  if (f.pairs > 0) return inv_freq / static_cast<double>(f.pair_factor[i]);
  if (!(f.factor > 0.0)) return inv_freq;
  if (f.linear) return inv_freq / f.factor;
  const double wavelength = 2.0 * 3.14159265358979323846 / inv_freq;
  if (wavelength < f.original_max_seq / f.high_freq_factor) return inv_freq;
  if (wavelength > f.original_max_seq / f.low_freq_factor) return inv_freq / f.factor;
  const double s = (f.original_max_seq / wavelength - f.low_freq_factor) /
                   (f.high_freq_factor - f.low_freq_factor);
  return (1.0 - s) * inv_freq / f.factor + s * inv_freq;
}

}  // namespace trainyard::kernels

#undef TY_ROPE_HOST_DEVICE

#endif  // TRAINYARD_KERNELS_ROPE_FREQUENCIES_H_
