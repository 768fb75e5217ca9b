#include "common/rpc.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/filesystem.h"
#include "common/status.h"
#include "grpcpp/support/client_interceptor.h"

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

constexpr char kAuthorizationHeader[] = "authorization";
constexpr char kBearerPrefix[] = "Bearer ";

// Adds the authorization header to every call of a channel.
class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationHeader, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;  // owned by the factory, which outlives the channel's calls
};

class BearerFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerFactory(std::string header) : header_(std::move(header)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerInterceptor(&header_);
  }

 private:
  const std::string header_;
};

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

grpc::ChannelArguments QuickReconnect(int max_backoff_ms) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  return args;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const TlsFiles& files,
                                                           const grpc::ChannelArguments& args,
                                                           const std::string& bearer) {
  TY_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                      ChannelCredentials(files));
  if (bearer.empty()) return grpc::CreateCustomChannel(target, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<BearerFactory>(absl::StrCat(kBearerPrefix, bearer)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(factories));
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, FileSystem& fs) {
  absl::StatusOr<std::string> text = fs.ReadFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("cannot read the token file: ", text.status().message()));
  }
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the token file ", path, " is empty"));
  }
  return token;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  return ReadTokenFile(path, *RealFileSystem());
}

std::string AttemptSecretFromEnvironment() { return Variable(kAttemptSecretVariable); }

void AddBearer(grpc::ClientContext& context, const std::string& bearer) {
  context.AddMetadata(kAuthorizationHeader, absl::StrCat(kBearerPrefix, bearer));
}

std::optional<std::string> BearerToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find(kAuthorizationHeader);
  if (found == metadata.end()) return std::nullopt;
  absl::string_view value(found->second.data(), found->second.size());
  if (!absl::ConsumePrefix(&value, kBearerPrefix)) return std::nullopt;
  return std::string(value);
}

std::string PeerCertificateName(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  const std::vector<grpc::string_ref> names = auth->FindPropertyValues("x509_common_name");
  if (names.empty()) return "";
  return std::string(names.front().data(), names.front().size());
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
