// Runs a child process for a test: argv (no shell), stdout and stderr captured, a hard timeout,
// and the child always reaped — killed with its process group if it outlives the timeout.
#ifndef TRAINYARD_TESTS_INTEGRATION_SUBPROCESS_H_
#define TRAINYARD_TESTS_INTEGRATION_SUBPROCESS_H_

#include <string>
#include <vector>

namespace trainyard::testenv {

struct ProcessResult {
  bool timed_out = false;
  int exit_code = -1;  // valid when the child exited normally
  int signal = 0;      // the terminating signal, if any
  std::string out, err;
};

ProcessResult RunProcess(const std::vector<std::string>& argv, double timeout_seconds);

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_SUBPROCESS_H_
