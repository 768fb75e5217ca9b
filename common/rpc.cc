#include "common/rpc.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/filesystem.h"
#include "common/status.h"

namespace trainyard::rpc {
namespace {

struct Pem {
  std::string ca;
  std::string cert;
  std::string key;
};

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  absl::StatusOr<std::string> text = RealFileSystem()->ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the TLS ", what, " ", path, ": ", text.status().message()));
  }
  if (text->find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("the TLS ", what, " ", path, " is not PEM"));
  }
  return *std::move(text);
}

absl::StatusOr<Pem> ReadAll(const TlsFiles& files) {
  TY_RETURN_IF_ERROR(ValidateTlsFiles(files));
  Pem pem;
  TY_ASSIGN_OR_RETURN(pem.ca, ReadPem(files.ca, "CA"));
  TY_ASSIGN_OR_RETURN(pem.cert, ReadPem(files.cert, "certificate"));
  TY_ASSIGN_OR_RETURN(pem.key, ReadPem(files.key, "key"));
  return pem;
}

std::string Variable(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status ValidateTlsFiles(const TlsFiles& files, const std::string& flag) {
  if (!files.enabled()) return absl::OkStatus();
  std::vector<std::string> missing;
  if (files.ca.empty()) missing.push_back(flag + "-ca");
  if (files.cert.empty()) missing.push_back(flag + "-cert");
  if (files.key.empty()) missing.push_back(flag + "-key");
  if (missing.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("mutual TLS needs ", flag, "-ca, ", flag, "-cert and ", flag,
                   "-key together; missing: ", absl::StrJoin(missing, ", ")));
}

TlsFiles TlsFilesFromEnvironment() {
  return TlsFiles{.ca = Variable(kTlsCaVariable),
                  .cert = Variable(kTlsCertVariable),
                  .key = Variable(kTlsKeyVariable)};
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  TY_ASSIGN_OR_RETURN(Pem pem, ReadAll(files));
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = std::move(pem.ca);
  ssl.pem_cert_chain = std::move(pem.cert);
  ssl.pem_private_key = std::move(pem.key);
  return grpc::SslCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const TlsFiles& files,
                                                           const grpc::ChannelArguments& args) {
  TY_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      ChannelCredentials(files));
  return grpc::CreateCustomChannel(target, credentials, args);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  TY_ASSIGN_OR_RETURN(Pem pem, ReadAll(files));
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = std::move(pem.ca);
  ssl.pem_key_cert_pairs.push_back(
      {.private_key = std::move(pem.key), .cert_chain = std::move(pem.cert)});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace trainyard::rpc
