// The gRPC edge of authentication (server/auth.h): who a call comes from, checked against what
// the service it reaches allows. JobService takes users and admins, AgentService agents and
// admins, WorkerService the secret of the attempt the request names (or an admin's token).
//
// Threading: thread-safe (the Authenticator is).
#ifndef TRAINYARD_SERVER_SERVICE_AUTH_H_
#define TRAINYARD_SERVER_SERVICE_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "server/auth.h"

namespace trainyard::server {

class ServiceAuth {
 public:
  // Neither is owned; both must outlive this.
  ServiceAuth(Authenticator* authenticator, const AttemptSecrets* secrets)
      : authenticator_(authenticator), secrets_(secrets) {}

  // A user or an admin (JobService); PERMISSION_DENIED for an agent's credential.
  [[nodiscard]] absl::StatusOr<Identity> User(const grpc::ServerContextBase& context) const;
  // An agent or an admin (AgentService); PERMISSION_DENIED for a user's credential.
  [[nodiscard]] absl::StatusOr<Identity> Agent(const grpc::ServerContextBase& context) const;
  // A worker of attempt `attempt_id` of `job_id`, or an admin (WorkerService).
  [[nodiscard]] absl::Status Worker(const grpc::ServerContextBase& context,
                                    const std::string& job_id, int attempt_id) const;

  // May `caller` see and act on a job `owner` submitted? PERMISSION_DENIED naming the job if not.
  [[nodiscard]] static absl::Status MayUseJob(const Identity& caller, const std::string& job_id,
                                              const std::string& owner);

  const AttemptSecrets& secrets() const { return *secrets_; }

 private:
  [[nodiscard]] absl::StatusOr<Identity> Caller(const grpc::ServerContextBase& context) const;

  Authenticator* const authenticator_;
  const AttemptSecrets* const secrets_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_SERVICE_AUTH_H_
