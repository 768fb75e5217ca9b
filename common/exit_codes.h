// The exit codes of trainyard-worker, the only channel through which a rank tells the node agent
// (and through it the coordinator) why it stopped. The coordinator's RestartPolicy classifies a
// failed attempt by them (server/restart_policy.h), so each code names a cause a restart can or
// cannot fix:
//
//   code  meaning                                              failure class
//   0     trained to the end                                   (not a failure)
//   1     internal or environmental error                      crash
//   2     the job's own input: spec, data file or flags        user_error
//   3     unavailable: a collective timed out, a peer or the    collective_timeout
//         coordinator stopped answering
//   4     the rank's hang watchdog fired                       hang
//   5     out of memory for the spec's own sizes               user_error
//
// A rank killed by a signal has no exit code (crash), and any other code is treated as 1.
// ExitCodeForStatus (common/status.h), the one table from a status to an exit code that every
// program of the project uses (the CLI too: there 3 reads "the coordinator cannot be reached"),
// yields 0 to 3; the watchdog and the out-of-memory path
// exit with 4 and 5 themselves. Agents and coordinators of other versions read these numbers:
// never renumber, only add.
#ifndef TRAINYARD_COMMON_EXIT_CODES_H_
#define TRAINYARD_COMMON_EXIT_CODES_H_

namespace trainyard {

// The rank finished its work.
inline constexpr int kExitOk = 0;
// Something outside the job went wrong (a bug, a failed syscall, a lost coordinator); a restart,
// perhaps elsewhere, may succeed.
inline constexpr int kExitInternalError = 1;
// The job's own input is at fault at run time: the spec, a missing or malformed data file, bad
// flags. The same input fails the same way, so no restart can help.
inline constexpr int kExitUserError = 2;
// Something this process waited on did not answer: a collective (or the rendezvous before it)
// timed out, a peer's connection broke, the coordinator could not be reached. The fault is
// usually on another rank or node; the same call may succeed later.
inline constexpr int kExitUnavailable = 3;
inline constexpr int kExitCollectiveTimeout = kExitUnavailable;
// The rank's own watchdog saw no progress for longer than its limit and ended the rank.
inline constexpr int kExitHang = 4;
// An allocation failed because the model, batch or mesh the spec asks for does not fit in the
// device's (or host's) memory: the same spec fails again.
inline constexpr int kExitOutOfMemory = 5;

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_EXIT_CODES_H_
