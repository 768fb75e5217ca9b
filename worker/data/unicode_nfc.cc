#include "worker/data/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "worker/data/utf8.h"

namespace trainyard::worker::data {
namespace {

struct CombiningClass {
  char32_t cp;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp;
  uint8_t size;
  char32_t parts[4];
};
struct Composition {
  char32_t first, second, composite;
};
struct CodePointRange {
  char32_t lo, hi;
};

#include "worker/data/unicode_nfc_tables.inc"

// Hangul syllables decompose and compose by arithmetic (The Unicode Standard, section 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr char32_t kSCount = kLCount * kNCount;

int ClassOf(char32_t c) {
  if (c < 0x300) return 0;
  const auto* it = std::lower_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), c,
                                    [](const CombiningClass& e, char32_t v) { return e.cp < v; });
  return it != std::end(kCombiningClasses) && it->cp == c ? it->ccc : 0;
}

void Decompose(char32_t c, std::vector<char32_t>* out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + s % kNCount / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const auto* it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), c,
                                    [](const Decomposition& e, char32_t v) { return e.cp < v; });
  if (it == std::end(kDecompositions) || it->cp != c) {
    out->push_back(c);
    return;
  }
  out->insert(out->end(), it->parts, it->parts + it->size);
}

// The primary composite of `first` and `second`, or 0 for none.
char32_t Compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const auto* it =
      std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::pair(first, second),
                       [](const Composition& e, const std::pair<char32_t, char32_t>& v) {
                         return e.first < v.first || (e.first == v.first && e.second < v.second);
                       });
  return it != std::end(kCompositions) && it->first == first && it->second == second ? it->composite
                                                                                     : 0;
}

bool InQuickCheck(char32_t c) {
  const auto* it = std::upper_bound(std::begin(kQuickCheckRanges), std::end(kQuickCheckRanges), c,
                                    [](char32_t v, const CodePointRange& r) { return v < r.lo; });
  return it != std::begin(kQuickCheckRanges) && c <= std::prev(it)->hi;
}

}  // namespace

bool MayChangeUnderNfc(absl::string_view text) {
  for (size_t at = 0; at < text.size();) {
    if (static_cast<uint8_t>(text[at]) < 0x80) {
      ++at;
      continue;
    }
    uint32_t c;
    if (!NextCodePoint(text, &at, &c)) return true;  // not UTF-8: not ours to judge
    if (InQuickCheck(c)) return true;
  }
  return false;
}

std::string ToNfc(absl::string_view text) {
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    uint32_t c;
    if (!NextCodePoint(text, &at, &c)) c = static_cast<uint8_t>(text[at++]);  // not UTF-8
    Decompose(c, &cps);
  }
  // Canonical order: each run of non-starters sorted by class, stably.
  for (size_t i = 1; i < cps.size(); ++i) {
    const int ccc = ClassOf(cps[i]);
    if (ccc == 0) continue;
    for (size_t j = i; j > 0 && ClassOf(cps[j - 1]) > ccc; --j) std::swap(cps[j - 1], cps[j]);
  }
  // Composition: a code point joins the last starter unless something between them blocks it
  // (a starter, or a mark of a class as high as its own).
  std::vector<char32_t> out;
  out.reserve(cps.size());
  size_t starter = SIZE_MAX;
  int last_class = 0;
  for (char32_t c : cps) {
    const int ccc = ClassOf(c);
    if (starter != SIZE_MAX) {
      const bool adjacent = out.size() == starter + 1;
      if (adjacent || (last_class != 0 && last_class < ccc)) {
        if (const char32_t composite = Compose(out[starter], c); composite != 0) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) starter = out.size();
    out.push_back(c);
    last_class = ccc;
  }
  std::string utf8;
  utf8.reserve(text.size());
  for (char32_t c : out) AppendUtf8(&utf8, c);
  return utf8;
}

const char* NfcUnicodeVersion() { return kUnicodeVersion; }

}  // namespace trainyard::worker::data
