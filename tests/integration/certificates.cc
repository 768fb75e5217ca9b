#include "tests/integration/certificates.h"

#include <fstream>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/subprocess.h"

namespace trainyard::testenv {
namespace {

void OpenSsl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessResult result = RunProcess(argv, 60);
  ASSERT_EQ(result.exit_code, 0) << result.err;
}

}  // namespace

void IssueTestCa(const std::string& dir) {
  OpenSsl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", dir + "/ca.key", "-out",
           dir + "/ca.crt", "-days", "1", "-subj", "/CN=trainyard-test-ca"});
}

void IssueTestCertificate(const std::string& dir, const std::string& name,
                          const std::string& alt_names) {
  const std::string base = dir + "/" + name;
  std::ofstream(base + ".ext") << "subjectAltName=" << alt_names << "\n";
  OpenSsl({"req", "-newkey", "rsa:2048", "-nodes", "-keyout", base + ".key", "-out", base + ".csr",
           "-subj", "/CN=" + name});
  if (testing::Test::HasFatalFailure()) return;
  OpenSsl({"x509", "-req", "-in", base + ".csr", "-CA", dir + "/ca.crt", "-CAkey", dir + "/ca.key",
           "-CAcreateserial", "-out", base + ".crt", "-days", "1", "-extfile", base + ".ext"});
}

}  // namespace trainyard::testenv
