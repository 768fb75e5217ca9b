// Test certificates made with the openssl command: a CA, and certificates it signs for mutual
// TLS between the coordinator, agents and clients.
#ifndef TRAINYARD_TESTS_INTEGRATION_CERTIFICATES_H_
#define TRAINYARD_TESTS_INTEGRATION_CERTIFICATES_H_

#include <string>

namespace trainyard::testenv {

// Writes <dir>/ca.crt and <dir>/ca.key. Fails the test (a fatal failure) on error.
void IssueTestCa(const std::string& dir);

// Writes <dir>/<name>.crt and <dir>/<name>.key, signed by the CA of `dir`, valid for `alt_names`
// (an openssl subjectAltName list, such as "IP:127.0.0.1,DNS:localhost").
void IssueTestCertificate(const std::string& dir, const std::string& name,
                          const std::string& alt_names = "IP:127.0.0.1,DNS:localhost");

}  // namespace trainyard::testenv

#endif  // TRAINYARD_TESTS_INTEGRATION_CERTIFICATES_H_
