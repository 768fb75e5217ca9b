// Mutual TLS: with a certificate, a key and a client CA the coordinator may listen beyond
// loopback, and then only clients presenting a certificate signed by that CA get in; they still
// need a token, or a certificate the token file maps to a user.
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/certificates.h"
#include "tests/integration/server_harness.h"
#include "tests/integration/subprocess.h"

namespace trainyard::testenv {
namespace {

TEST(ServerTlsTest, ExposedAddressNeedsMutualTlsAndThenOnlyAdmitsSignedClients) {
  const std::string dir = MakeScratchDir("server_tls").string();
  IssueTestCa(dir);
  IssueTestCertificate(dir, "server");
  IssueTestCertificate(dir, "client");
  ASSERT_FALSE(HasFatalFailure());

  ServerProcess server(dir + "/state",
                       {"--listen", "0.0.0.0:0", "--tls-cert", dir + "/server.crt", "--tls-key",
                        dir + "/server.key", "--tls-client-ca", dir + "/ca.crt"});
  ASSERT_TRUE(server.ok()) << server.log();
  const std::string port = server.address().substr(server.address().rfind(':') + 1);
  const std::string target = "127.0.0.1:" + port;

  auto list = [&](std::shared_ptr<grpc::ChannelCredentials> credentials) {
    auto stub = v1::JobService::NewStub(grpc::CreateChannel(target, credentials));
    v1::ListJobsReply reply;
    return stub->ListJobs(Deadline(10).get(), v1::ListJobsRequest(), &reply);
  };
  grpc::SslCredentialsOptions with_client;
  with_client.pem_root_certs = ReadWholeFile(dir + "/ca.crt");
  with_client.pem_private_key = ReadWholeFile(dir + "/client.key");
  with_client.pem_cert_chain = ReadWholeFile(dir + "/client.crt");
  grpc::Status admitted = list(grpc::CompositeChannelCredentials(
      grpc::SslCredentials(with_client), grpc::AccessTokenCredentials(server.admin_token())));
  EXPECT_TRUE(admitted.ok()) << admitted.error_message();
  // A signed certificate alone proves no user until the token file maps its name to one.
  EXPECT_EQ(list(grpc::SslCredentials(with_client)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  ProcessResult mapped =
      RunProcess({BinaryDir() + "/server/trainyard-server", "token", "add", "alice",
                  "--certificate", "client", "--state-dir", dir + "/state"},
                 30);
  ASSERT_EQ(mapped.exit_code, 0) << mapped.err;
  admitted = list(grpc::SslCredentials(with_client));
  EXPECT_TRUE(admitted.ok()) << admitted.error_message();

  grpc::SslCredentialsOptions anonymous;
  anonymous.pem_root_certs = ReadWholeFile(dir + "/ca.crt");
  EXPECT_FALSE(list(grpc::SslCredentials(anonymous)).ok());
  EXPECT_FALSE(list(grpc::InsecureChannelCredentials()).ok());
  EXPECT_TRUE(server.process().running());

  // TLS without client authentication is not enough to leave loopback.
  ProcessResult half =
      RunProcess({BinaryDir() + "/server/trainyard-server", "--no-local-agent", "--state-dir",
                  dir + "/other", "--listen", "0.0.0.0:0", "--tls-cert", dir + "/server.crt",
                  "--tls-key", dir + "/server.key"},
                 30);
  EXPECT_EQ(half.exit_code, 2) << half.err;
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace trainyard::testenv
