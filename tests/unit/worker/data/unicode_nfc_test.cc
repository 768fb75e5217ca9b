// Unicode's NFC (worker/data/unicode_nfc.h): cases worked by hand from the standard's rules, then
// every code point alone and random sequences of the code points that interact, against Python's
// unicodedata.normalize("NFC") (the same Unicode version the tables were generated from).
#include "worker/data/unicode_nfc.h"

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/test_env.h"
#include "worker/data/utf8.h"

namespace trainyard::worker::data {
namespace {

TEST(UnicodeNfc, ComposesOrdersAndLeavesExclusionsByHand) {
  EXPECT_EQ(ToNfc("cafe\u0301"), "caf\u00e9");  // e + acute: é
  EXPECT_EQ(ToNfc("caf\u00e9"), "caf\u00e9");   // already composed
  // Below (220) sorts before above (230); then ẹ, then ệ.
  EXPECT_EQ(ToNfc("e\u0302\u0323"), "\u1ec7");
  // A second acute is blocked by the first (same class): it stays.
  EXPECT_EQ(ToNfc("a\u0301\u0301"), "\u00e1\u0301");
  EXPECT_EQ(ToNfc("\u212b"), "\u00c5");              // a singleton: Ångström sign → Å
  EXPECT_EQ(ToNfc("\u0958"), "\u0915\u093c");        // a composition exclusion stays apart
  EXPECT_EQ(ToNfc("\u1100\u1161\u11a8"), "\uac01");  // Hangul L V T → syllable
  EXPECT_EQ(ToNfc("\uac00\u11a8"), "\uac01");        // LV + T
  EXPECT_EQ(ToNfc("\u0301a"), "\u0301a");            // a mark with no starter before it
  EXPECT_EQ(ToNfc("\U0001F642 \U00011099\U000110BA"), "\U0001F642 \U0001109A");  // 4-byte
  EXPECT_FALSE(MayChangeUnderNfc("plain ASCII, caf\u00e9, \u65e5\u672c, \U0001F642"));
  EXPECT_TRUE(MayChangeUnderNfc("e\u0301"));
  EXPECT_TRUE(MayChangeUnderNfc("\u212b"));
  EXPECT_TRUE(MayChangeUnderNfc("\u1100\u1161"));
  EXPECT_EQ(std::string(NfcUnicodeVersion()), "14.0.0");
}

std::string Utf8(char32_t c) {
  std::string s;
  AppendUtf8(&s, c);
  return s;
}

// Every code point but the surrogates (and the newline that ends each line) alone, then 20,000
// random strings of up to 12 code points drawn from the marks, starters and jamo that compose and
// reorder, each line through Python.
TEST(UnicodeNfc, EqualsPythonsUnicodedata) {
  std::vector<std::string> texts;
  for (char32_t c = 1; c < 0x110000; ++c) {
    if ((c < 0xD800 || c >= 0xE000) && c != '\n') texts.push_back(Utf8(c));
  }
  const std::vector<char32_t> pool = {
      'a',     'e',     'o',    'A',    0x00E9, 0x0300, 0x0301, 0x0302, 0x0303, 0x0308, 0x0323,
      0x0327,  0x0328,  0x031B, 0x0345, 0x03B1, 0x0313, 0x0342, 0x1100, 0x1161, 0x11A8, 0xAC00,
      0x0915,  0x093C,  0x0958, 0x212B, 0x0B47, 0x0B3E, 0x0B57, 0x0CC6, 0x0CD5, 0x0CC2, 0x1025,
      0x102E,  0x0DD9,  0x0DCF, 0x0DCA, 0x05D0, 0x05B8, 0x05BC, 0x0F71, 0x0F72, 0x0F80, 0x1D158,
      0x1D165, 0x1D16E, 0x30AB, 0x3099, 0x309A, 0x0391, 0x0314, 0x0345};
  std::mt19937 rng(20261204);
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    for (int n = 1 + static_cast<int>(rng() % 12); n > 0; --n) s += Utf8(pool[rng() % pool.size()]);
    texts.push_back(s);
  }
  const std::filesystem::path dir = testenv::MakeScratchDir("nfc");
  {
    std::ofstream in(dir / "in.txt", std::ios::binary);
    for (const std::string& t : texts) in << t << '\n';
  }
  // Newlines and the other line breaks Python's splitlines knows are not split on: lines are
  // read as bytes up to "\n" only.
  const std::string script = absl::StrCat(
      "import sys, unicodedata\n"
      "data = open(sys.argv[1], 'rb').read().split(b'\\n')[:-1]\n"
      "out = open(sys.argv[2], 'wb')\n"
      "for line in data:\n"
      "    s = line.decode('utf-8', 'surrogatepass')\n"
      "    out.write(unicodedata.normalize('NFC', s).encode('utf-8', 'surrogatepass') + b'\\n')\n");
  { std::ofstream(dir / "nfc.py") << script; }
  const std::string cmd =
      absl::StrCat(testenv::PythonInterpreter(), " ", (dir / "nfc.py").string(), " ",
                   (dir / "in.txt").string(), " ", (dir / "out.txt").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream out(dir / "out.txt", std::ios::binary);
  std::string want;
  int differ = 0, changed = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    ASSERT_TRUE(std::getline(out, want)) << "line " << i;
    const std::string got = ToNfc(texts[i]);
    if (got != texts[i]) ++changed;
    if (got != want && ++differ <= 10) ADD_FAILURE() << "text " << i << ": " << texts[i];
    if (!MayChangeUnderNfc(texts[i]) && want != texts[i]) {
      ADD_FAILURE() << "text " << i << " changes under NFC but the quick check says it cannot";
    }
  }
  EXPECT_EQ(differ, 0);
  std::printf("%zu texts, %d changed by NFC, each as Python's\n", texts.size(), changed);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trainyard::worker::data
