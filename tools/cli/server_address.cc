#include "tools/cli/server_address.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace trainyard::cli {

absl::StatusOr<std::string> ResolveServerAddress(const std::string& flag, const std::string& env,
                                                 FileSystem& fs, const std::string& state_dir) {
  if (!flag.empty()) return flag;
  if (!env.empty()) return env;
  const std::string path = state_dir + "/server.addr";
  if (fs.Exists(path)) {
    absl::StatusOr<std::string> text = fs.ReadFile(path);
    if (text.ok()) {
      const std::string address(absl::StripAsciiWhitespace(*text));
      if (!address.empty()) return address;
    }
  }
  return absl::UnavailableError(absl::StrCat(
      "no coordinator address: pass --server HOST:PORT, set TRAINYARD_SERVER, or run from the "
      "directory where trainyard-server keeps ",
      state_dir, "/"));
}

}  // namespace trainyard::cli
