// The trainyard CLI's commands, runnable in process (main.cc is a thin wrapper; tests call
// RunCli directly).
//
//   trainyard [--server ADDR] [--token-file FILE] [--json] COMMAND ...
//     submit SPEC.yaml [--watch]     queue a job; prints its id (--watch: then watch it)
//     list [--state S]... [--limit N]
//     status JOB                     state, attempts, mesh, progress, ETA, checkpoints, failures
//     watch JOB                      live progress bar and loss sparkline until the job ends
//     logs JOB [--rank R] [--attempt A] [--tail N] [--follow]
//     checkpoints JOB                every checkpoint save: step, time, size, cost, state, path
//     cancel JOB [--reason TEXT]
//     drain JOB [--reason TEXT]      checkpoint and stop, to be continued by a resubmission
//     nodes
//
// Exit codes: 0 success (watch: the job SUCCEEDED); 1 the job FAILED, or an unexpected error;
// 2 bad input (flags, spec, unknown job, a job in the wrong state: the server's one-line message
// is printed); 3 the coordinator cannot be reached; 4 the job was CANCELLED, 5 the job was
// DRAINED (watch, submit --watch).
//
// Threading: one call at a time.
#ifndef TRAINYARD_TOOLS_CLI_COMMANDS_H_
#define TRAINYARD_TOOLS_CLI_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "common/rpc.h"

namespace trainyard::cli {

struct CliIo {
  std::ostream* out = nullptr;
  absl::TimeZone time_zone;  // for times of day (`checkpoints`); default UTC
  std::ostream* err = nullptr;
  bool out_is_tty = false;      // redraw the watch line in place
  std::string server_env;       // $TRAINYARD_SERVER
  rpc::TlsFiles tls_env;        // $TRAINYARD_TLS_CA, _CERT, _KEY
  std::string token_file_env;   // $TRAINYARD_TOKEN_FILE
  std::string user_token_file;  // ~/.config/trainyard/token (empty: none)
  std::string user;             // sent with submissions
  FileSystem* fs = nullptr;
  Clock* clock = nullptr;
  std::string state_dir = "trainyard-state";  // where server.addr is looked for
};

// Runs one command line (without the program name) and returns the exit code. Errors are
// printed to io.err as one line, "trainyard: error: <message>", and the exit code is
// ExitCodeForStatus's (common/status.h): 2 bad input, 3 the coordinator cannot be reached, 1
// otherwise.
int RunCli(const std::vector<std::string>& args, const CliIo& io);

}  // namespace trainyard::cli

#endif  // TRAINYARD_TOOLS_CLI_COMMANDS_H_
