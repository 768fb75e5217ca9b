#include "tools/cli/server_address.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/rpc.h"

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

absl::StatusOr<std::string> ResolveToken(const std::string& flag, const std::string& env,
                                         const std::string& user_file, FileSystem& fs,
                                         const std::string& state_dir) {
  if (!flag.empty()) return rpc::ReadTokenFile(flag, fs);
  if (!env.empty()) return rpc::ReadTokenFile(env, fs);
  for (const std::string& optional : {user_file, state_dir + "/admin.token"}) {
    if (optional.empty() || !fs.Exists(optional)) continue;
    // Unreadable (another user's admin token) or empty: present none, and be told so.
    absl::StatusOr<std::string> token = rpc::ReadTokenFile(optional, fs);
    if (token.ok()) return token;
  }
  return std::string();
}

}  // namespace trainyard::cli
