// Which coordinator the CLI talks to: --server ADDR, else $TRAINYARD_SERVER, else the address
// the embedded default wrote to ./trainyard-state/server.addr. And which token it presents:
// --token-file FILE, else $TRAINYARD_TOKEN_FILE, else the user's own token file
// (~/.config/trainyard/token), else the embedded default's admin token
// (./trainyard-state/admin.token, readable only by the user who runs the coordinator).
#ifndef TRAINYARD_TOOLS_CLI_SERVER_ADDRESS_H_
#define TRAINYARD_TOOLS_CLI_SERVER_ADDRESS_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/filesystem.h"

namespace trainyard::cli {

// The CLI's global flags that say how to reach the coordinator.
inline constexpr std::string_view kConnectionFlags[] = {"server", "token-file", "tls-ca",
                                                        "tls-cert", "tls-key"};

// `flag` and `env` as given (empty when absent); `state_dir` is where server.addr is looked for.
// UNAVAILABLE (exit 3: no server to reach) when none of them names one.
[[nodiscard]] absl::StatusOr<std::string> ResolveServerAddress(
    const std::string& flag, const std::string& env, FileSystem& fs,
    const std::string& state_dir = "trainyard-state");

// The token to present; "" when none is found. `flag` and `env` name files that must be readable
// (NOT_FOUND / PERMISSION_DENIED naming them); `user_file` and the admin token are used when they
// can be read.
[[nodiscard]] absl::StatusOr<std::string> ResolveToken(
    const std::string& flag, const std::string& env, const std::string& user_file, FileSystem& fs,
    const std::string& state_dir = "trainyard-state");

}  // namespace trainyard::cli

#endif  // TRAINYARD_TOOLS_CLI_SERVER_ADDRESS_H_
