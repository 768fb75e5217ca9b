#include "tests/integration/subprocess.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/process.h"

namespace trainyard::testenv {
namespace {

// A new empty file in the temporary directory; its path.
std::string TempFile() {
  std::string path = (std::filesystem::temp_directory_path() / "trainyard-run.XXXXXX").string();
  const int fd = mkstemp(path.data());
  if (fd >= 0) close(fd);
  return path;
}

std::string Take(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  return text.str();
}

}  // namespace

ProcessResult RunProcess(const std::vector<std::string>& argv, double timeout_seconds) {
  ProcessResult result;
  const std::string out = TempFile(), err = TempFile();
  absl::StatusOr<pid_t> pid = Spawn({.argv = argv, .stdout_path = out, .stderr_path = err});
  if (!pid.ok()) {
    Take(out);
    Take(err);
    result.exit_code = 127;
    result.err = std::string(pid.status().message());
    return result;
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  int status = 0;
  while (true) {
    const pid_t r = waitpid(*pid, &status, WNOHANG);
    if (r == *pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      kill(-*pid, SIGKILL);
      waitpid(*pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const ExitStatus exit = DecodeWaitStatus(status);
  result.exit_code = exit.exit_code;
  result.signal = exit.signal;
  result.out = Take(out);
  result.err = Take(err);
  return result;
}

}  // namespace trainyard::testenv
