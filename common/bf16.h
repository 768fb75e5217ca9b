// bf16 on the host: conversions between IEEE fp32 and bfloat16 bit patterns (the upper half of an
// fp32), for code that moves or reduces bf16 tensors without a device.
#ifndef TRAINYARD_COMMON_BF16_H_
#define TRAINYARD_COMMON_BF16_H_

#include <cstdint>
#include <cstring>

namespace trainyard {

// Exact: every bf16 value is an fp32 value.
inline float Bf16BitsToFloat(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// Rounds to the nearest bf16, ties to even (what the device's __float2bfloat16_rn does). A NaN
// stays a NaN (quieted, sign kept) instead of rounding into an infinity.
inline uint16_t FloatToBf16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7FFFu + lsb;
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_BF16_H_
