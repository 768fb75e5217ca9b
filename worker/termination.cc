#include "worker/termination.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "common/logging.h"

namespace trainyard::worker {
namespace {

int term_pipe[2] = {-1, -1};

void OnTerm(int) {
  const char byte = 1;
  [[maybe_unused]] ssize_t ignored = write(term_pipe[1], &byte, 1);
}

}  // namespace

void TerminationWatcher::DefaultTerminate() {
  signal(SIGTERM, SIG_DFL);
  raise(SIGTERM);
}

TerminationWatcher::TerminationWatcher(Ask ask, std::atomic<bool>* drain, Terminate terminate)
    : ask_(std::move(ask)), drain_(drain), terminate_(std::move(terminate)) {
  if (term_pipe[0] < 0 && pipe2(term_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    TY_LOG(WARNING) << "no pipe for SIGTERM (errno " << errno
                    << "); SIGTERM ends this worker at once";
    return;
  }
  struct sigaction action = {};
  action.sa_handler = OnTerm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  thread_ = std::thread([this] { Loop(); });
  // The agent starts workers with SIGTERM blocked; one that came before now reaches the handler.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &term, nullptr);
}

TerminationWatcher::~TerminationWatcher() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  signal(SIGTERM, SIG_DFL);
}

void TerminationWatcher::Loop() {
  while (!stop_) {
    pollfd fd = {.fd = term_pipe[0], .events = POLLIN, .revents = 0};
    if (poll(&fd, 1, /*timeout_ms=*/100) <= 0) continue;
    char bytes[16];
    if (read(term_pipe[0], bytes, sizeof(bytes)) <= 0) continue;  // signals close together: one ask
    handled_.fetch_add(1);
    const absl::StatusOr<v1::Order> order = ask_(kTerminationTimeout);
    if (order.ok() && *order == v1::ORDER_DRAIN) {
      if (!drain_->exchange(true)) {
        TY_LOG(INFO) << "SIGTERM: the coordinator drains the job; this rank checkpoints at a step "
                        "the ranks agree on, then exits";
      }
      continue;
    }
    if (stop_) return;  // the worker is ending on its own: no reason to end it here
    TY_LOG(INFO) << "SIGTERM: "
                 << (order.ok() ? "the coordinator is stopping this rank"
                                : "the coordinator did not answer (" +
                                      std::string(order.status().message()) + ")")
                 << "; exiting";
    terminate_();
    return;
  }
}

}  // namespace trainyard::worker
