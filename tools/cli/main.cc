// trainyard: the command-line client of the coordinator (see commands.h for the commands and
// exit codes).
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "common/filesystem.h"
#include "tools/cli/commands.h"

namespace {

std::string LoginName() {
  if (const char* user = std::getenv("USER"); user != nullptr && *user != '\0') return user;
  if (const passwd* entry = getpwuid(getuid()); entry != nullptr) return entry->pw_name;
  return "";
}

// $XDG_CONFIG_HOME/trainyard/token, else ~/.config/trainyard/token.
std::string UserTokenFile() {
  if (const char* config = std::getenv("XDG_CONFIG_HOME"); config != nullptr && *config == '/') {
    return std::string(config) + "/trainyard/token";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::string(home) + "/.config/trainyard/token";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  trainyard::cli::CliIo io;
  io.out = &std::cout;
  io.err = &std::cerr;
  io.out_is_tty = isatty(STDOUT_FILENO) == 1;
  io.time_zone = absl::LocalTimeZone();
  if (const char* server = std::getenv("TRAINYARD_SERVER"); server != nullptr) {
    io.server_env = server;
  }
  io.tls_env = trainyard::rpc::TlsFilesFromEnvironment();
  if (const char* file = std::getenv(trainyard::rpc::kTokenFileVariable); file != nullptr) {
    io.token_file_env = file;
  }
  io.user_token_file = UserTokenFile();
  io.user = LoginName();
  io.fs = trainyard::RealFileSystem();
  io.clock = trainyard::RealClock();
  return trainyard::cli::RunCli(std::vector<std::string>(argv + 1, argv + argc), io);
}
