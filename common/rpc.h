// The project's one seam to gRPC's own types: the conversion between absl::Status and
// grpc::Status, and the credentials every channel and server of the control plane is built with
// (plaintext, or mutual TLS from PEM files).
//
// Threading: plain functions.
#ifndef TRAINYARD_COMMON_RPC_H_
#define TRAINYARD_COMMON_RPC_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/filesystem.h"

namespace trainyard::rpc {

[[nodiscard]] absl::Status FromGrpc(const grpc::Status& status);
grpc::Status ToGrpc(const absl::Status& status);

// Mutual TLS from PEM files; all three empty: plaintext. A process presents `cert` (signed by the
// cluster's CA) to its peers and accepts only peers whose certificate `ca` signed.
struct TlsFiles {
  std::string ca;
  std::string cert;
  std::string key;

  bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

// The environment variables that carry TlsFiles to a child process and to the CLI.
inline constexpr char kTlsCaVariable[] = "TRAINYARD_TLS_CA";
inline constexpr char kTlsCertVariable[] = "TRAINYARD_TLS_CERT";
inline constexpr char kTlsKeyVariable[] = "TRAINYARD_TLS_KEY";

// OK when all three files are named or none is; INVALID_ARGUMENT naming what is missing. `flag`
// prefixes the names in the message ("--tls" gives --tls-ca, --tls-cert, --tls-key).
[[nodiscard]] absl::Status ValidateTlsFiles(const TlsFiles& files,
                                            const std::string& flag = "--tls");

// TlsFiles from the TRAINYARD_TLS_* variables of this process (empty where unset).
TlsFiles TlsFilesFromEnvironment();

// Credentials for a client: plaintext when `files` is empty, else TLS presenting the certificate.
// NOT_FOUND when a file cannot be read; INVALID_ARGUMENT when only some are named.
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& files);

// A channel to `target` with ChannelCredentials(files) and `args`. A non-empty `bearer` is sent
// with every call of the channel as "authorization: Bearer <bearer>" (a user's or an agent's
// token, a worker's attempt secret), over TLS or plaintext loopback alike.
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& target, const TlsFiles& files,
    const grpc::ChannelArguments& args = grpc::ChannelArguments(), const std::string& bearer = "");

// Channel arguments that reconnect to a restarted server from 100 ms up to `max_backoff` apart
// instead of gRPC's default backoff, which grows to two minutes.
grpc::ChannelArguments QuickReconnect(int max_backoff_ms = 1000);

// The variables that carry credentials: a token file for the CLI and a worker's attempt secret
// (set by its agent; never on a command line).
inline constexpr char kTokenFileVariable[] = "TRAINYARD_TOKEN_FILE";
inline constexpr char kAttemptSecretVariable[] = "TRAINYARD_ATTEMPT_SECRET";
// Where a worker reports its progress: its agent's ProgressRelay (host:port on loopback). Unset:
// to the coordinator's WorkerService.
inline constexpr char kProgressRelayVariable[] = "TRAINYARD_PROGRESS_RELAY";

// The token in `path` (surrounding white space removed). NOT_FOUND / PERMISSION_DENIED naming the
// file when it cannot be read; INVALID_ARGUMENT when it is empty.
[[nodiscard]] absl::StatusOr<std::string> ReadTokenFile(const std::string& path);
[[nodiscard]] absl::StatusOr<std::string> ReadTokenFile(const std::string& path, FileSystem& fs);

// This worker's attempt secret, from its environment ("" when unset).
std::string AttemptSecretFromEnvironment();

// Presents `bearer` on one call ("authorization: Bearer <bearer>"), for a call whose channel does
// not carry it (MakeChannel's `bearer` does that for every call of a channel).
void AddBearer(grpc::ClientContext& context, const std::string& bearer);

// The bearer token a call carries ("authorization: Bearer T"); nullopt when it carries none.
std::optional<std::string> BearerToken(const grpc::ServerContextBase& context);
// The common name of the client certificate the call's TLS connection verified; empty without one.
std::string PeerCertificateName(const grpc::ServerContextBase& context);

// Credentials for a server: plaintext when `files` is empty, else TLS that requires and verifies
// a client certificate signed by `files.ca`.
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsFiles& files);

}  // namespace trainyard::rpc

#endif  // TRAINYARD_COMMON_RPC_H_
