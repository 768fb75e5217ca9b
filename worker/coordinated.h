// The control-plane mode of trainyard-worker, as an agent starts it:
//
//   trainyard-worker --coordinator HOST:PORT --job JOB --attempt N --rank R
//                    [--threads N] [--join-timeout-s S] [--collective-timeout-s S]
//
// The worker joins the attempt's rendezvous (WorkerService.Join, which answers once every rank
// has joined, with the spec, the mesh and the attempt's key-value prefix), bootstraps its
// collectives through the coordinator's key-value space (GrpcKeyValueStore), trains its rank with
// worker::TrainRank, and reports progress, obeying the orders in the replies (ProgressReporter).
// SIGTERM asks the coordinator what it means (worker/termination.h): a drain of the job, or, when
// the coordinator is stopping this rank or does not answer, the end SIGTERM's default gives.
//
// Exit codes (through ExitCodeForStatus): 0 trained to the end; 2 the spec or a data file is
// bad, the coordinator refused the join (FAILED_PRECONDITION: a superseded attempt), or it
// could not be reached over TLS for 10 s (its certificate does not verify, or does not name the
// host dialled: FAILED_PRECONDITION, saying so); 3 the rendezvous did not complete in time; 1
// anything else, including a stop order (CANCELLED) and the coordinator ending the attempt
// (ABORTED).
#ifndef TRAINYARD_WORKER_COORDINATED_H_
#define TRAINYARD_WORKER_COORDINATED_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trainyard::worker {

struct CoordinatedOptions {
  std::string coordinator;  // host:port of the coordinator's WorkerService
  std::string job_id;
  int attempt_id = 0;
  int rank = -1;
  int threads = -1;  // CPU threads; -1: the spec's training.threads, else $OMP_NUM_THREADS
  absl::Duration join_timeout = absl::Minutes(5);
  absl::Duration collective_timeout = absl::Seconds(60);  // every Gloo collective
};

// True when the command line asks for the control-plane mode (it has --coordinator).
bool IsCoordinatedInvocation(int argc, char** argv);

// INVALID_ARGUMENT for unknown, missing or malformed flags.
[[nodiscard]] absl::StatusOr<CoordinatedOptions> ParseCoordinatedFlags(int argc, char** argv);

// Runs this rank to the end (see the file comment for the outcomes).
[[nodiscard]] absl::Status RunCoordinated(const CoordinatedOptions& options);

// ParseCoordinatedFlags, then RunCoordinated: what trainyard-worker's main calls.
[[nodiscard]] absl::Status RunCoordinatedFromFlags(int argc, char** argv);

// Writes `exit_code` to the file named by $TRAINYARD_EXIT_STATUS_FILE, when set, so that an agent
// that restarted while this worker ran (and so cannot wait for it) learns how it ended. Best
// effort: failures are ignored.
void RecordExitStatus(int exit_code);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_COORDINATED_H_
