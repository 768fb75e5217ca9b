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
// YaRN (`yarn`, transformers' `rope_type: yarn`) blends by pair index instead: with the
// original context N, pair i completes N · inv_freq(i) / 2π turns over it; the pairs whose index
// lies below the one that completes beta_fast turns keep their rate, those above the one that
// completes beta_slow turn factor times slower, and between the two indices (rounded out to whole
// pairs when `truncate`) the rate moves linearly from one to the other.
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
  bool linear = false;  // every pair slowed by factor; the rest is Llama 3's or YaRN's
  bool yarn = false;
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_seq = 8192.0;
  int64_t rotary_dim = 0;  // the dimensions of a head that turn; 0: all of them
  int pairs = 0;           // LongRoPE: pair_factor's length, rotary_dim / 2; 0: none
  float pair_factor[kMaxRopePairs] = {};
  double magnitude =
      1.0;  // both cosine and sine times this (LongRoPE's or YaRN's attention factor)
};

// The dimensions of a head of dimension d that turn.
TY_ROPE_HOST_DEVICE inline int64_t RopeRotaryDim(const RopeFrequencies& f, int64_t d) {
  return f.rotary_dim > 0 ? f.rotary_dim : d;
}

// YaRN: the (fractional) pair index that completes `turns` turns over the original context, for
// a rotated part `dim` wide.
TY_ROPE_HOST_DEVICE inline double RopeYarnPair(const RopeFrequencies& f, double turns, double dim) {
  return dim * log(f.original_max_seq / (turns * 2.0 * 3.14159265358979323846)) /
         (2.0 * log(f.theta));
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
  if (f.yarn) {
    const double dim = static_cast<double>(rotary_dim);
    double low = RopeYarnPair(f, f.beta_fast, dim), high = RopeYarnPair(f, f.beta_slow, dim);
    if (f.truncate) {
      low = floor(low);
      high = ceil(high);
    }
    low = low > 0.0 ? low : 0.0;
    high = high < dim - 1.0 ? high : dim - 1.0;
    if (low == high) high += 0.001;
    double ramp = (static_cast<double>(i) - low) / (high - low);  // 0: keeps its rate, 1: slowed
    ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
    return ramp * inv_freq / f.factor + (1.0 - ramp) * inv_freq;
  }
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
