#include "server/service_auth.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "common/status.h"

namespace trainyard::server {

absl::StatusOr<Identity> ServiceAuth::Caller(const grpc::ServerContextBase& context) const {
  return authenticator_->Authenticate(rpc::BearerToken(context), rpc::PeerCertificateName(context));
}

absl::StatusOr<Identity> ServiceAuth::User(const grpc::ServerContextBase& context) const {
  TY_ASSIGN_OR_RETURN(Identity caller, Caller(context));
  if (caller.role == Role::kAgent) {
    return absl::PermissionDeniedError(absl::StrCat(
        "an agent's credential (", caller.user, ") cannot be used for jobs: use a user's token"));
  }
  return caller;
}

absl::StatusOr<Identity> ServiceAuth::Agent(const grpc::ServerContextBase& context) const {
  TY_ASSIGN_OR_RETURN(Identity caller, Caller(context));
  if (caller.role == Role::kUser) {
    return absl::PermissionDeniedError(
        absl::StrCat(caller.user,
                     "'s token is a user's: agents need a token of role agent "
                     "(trainyard-server token add --role agent)"));
  }
  return caller;
}

absl::Status ServiceAuth::Worker(const grpc::ServerContextBase& context, const std::string& job_id,
                                 int attempt_id) const {
  const std::optional<std::string> bearer = rpc::BearerToken(context);
  if (bearer && AttemptSecrets::IsSecret(*bearer)) {
    return secrets_->Check(*bearer, job_id, attempt_id);
  }
  TY_ASSIGN_OR_RETURN(const Identity caller, Caller(context));
  if (caller.admin()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(caller.user, "'s ", RoleName(caller.role),
                   " credential cannot act for a worker: workers present their attempt's secret"));
}

absl::Status ServiceAuth::MayUseJob(const Identity& caller, const std::string& job_id,
                                    const std::string& owner) {
  if (caller.admin() || caller.user == owner) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("job ", job_id, " belongs to another user (", caller.user,
                   " may see and act on their own jobs only; an admin on all)"));
}

}  // namespace trainyard::server
