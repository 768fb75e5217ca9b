// `trainyard-server token`: manages the coordinator's token file (server/auth.h), which the
// coordinator re-reads whenever it changes, so additions and revocations take effect at once.
//
//   trainyard-server token add USER [--role user|admin|agent] [--nodes GLOB] [--expires-in 30d]
//                              [--certificate NAME] [--tokens FILE | --state-dir DIR]
//       prints a new token (it is shown once: only its hash is stored); with --certificate it
//       maps a client certificate's common name to USER instead and prints nothing; --nodes
//       (agent credentials only) binds it to the node ids the glob matches
//   trainyard-server token revoke USER [--tokens FILE | --state-dir DIR]
//       removes every credential of USER
//   trainyard-server token list [--tokens FILE | --state-dir DIR]
//
// The token file defaults to <state-dir>/tokens, the state directory to ./trainyard-state (the
// coordinator's defaults). It is written atomically with mode 0600.
#ifndef TRAINYARD_SERVER_TOKEN_COMMAND_H_
#define TRAINYARD_SERVER_TOKEN_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace trainyard::server {

// `args` follow the word "token". INVALID_ARGUMENT for a bad command line.
[[nodiscard]] absl::Status RunTokenCommand(const std::vector<std::string>& args, std::ostream& out);

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_TOKEN_COMMAND_H_
