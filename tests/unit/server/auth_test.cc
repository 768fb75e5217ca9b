// The pieces of server/auth.h without gRPC: the token file's format, the attempt secrets, the
// Authenticator's expiry and reloading, and the per-user stream quota.
#include "server/auth.h"

#include <fstream>

#include "absl/strings/match.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_env.h"

namespace trainyard::server {
namespace {

TEST(AuthTokenFileTest, EntriesRoundTripThroughTheirLines) {
  TokenEntry token{.user = "alice", .role = Role::kAdmin, .sha256 = Sha256Hex("secret")};
  token.expires = absl::FromUnixSeconds(1893456000);  // 2030-01-01
  TokenEntry certificate{
      .user = "rack-7", .role = Role::kAgent, .certificate = "node7.example", .nodes = "rack-7-*"};
  const std::string text = absl::StrCat("# comment\n\n", FormatTokenEntry(token), "  # note\n",
                                        FormatTokenEntry(certificate), "\n");
  absl::StatusOr<std::vector<TokenEntry>> parsed = ParseTokenFile(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].user, "alice");
  EXPECT_EQ((*parsed)[0].role, Role::kAdmin);
  EXPECT_EQ((*parsed)[0].sha256, Sha256Hex("secret"));
  EXPECT_EQ((*parsed)[0].expires, token.expires);
  EXPECT_EQ((*parsed)[1].certificate, "node7.example");
  EXPECT_EQ((*parsed)[1].expires, absl::InfiniteFuture());
  EXPECT_EQ((*parsed)[1].nodes, "rack-7-*");
  EXPECT_EQ((*parsed)[0].nodes, "");
  // A known vector: SHA-256("abc").
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(AuthTokenFileTest, MalformedLinesAreNamed) {
  const std::string hash = Sha256Hex("x");
  for (const std::string& line : std::vector<std::string>{
           "alice", "alice root sha256:" + hash, "alice user sha256:ABC", "alice user md5:" + hash,
           "alice user mtls:", "alice user sha256:" + hash + " soon",
           "alice user sha256:" + hash + " expires=tomorrow",
           "alice user sha256:" + hash + " nodes=*",  // only an agent is bound to nodes
           "rack agent sha256:" + hash + " nodes=a nodes=b",
           "rack agent sha256:" + hash + " nodes=",
           "rack agent sha256:" + hash + " expires=2030-01-01T00:00:00Z nodes=a extra"}) {
    absl::StatusOr<std::vector<TokenEntry>> parsed = ParseTokenFile("\n" + line + "\n");
    ASSERT_FALSE(parsed.ok()) << line;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), "line 2")) << parsed.status();
  }
}

// An agent registers the nodes its token's glob matches, by default only the node named like
// its user; an admin any node; a user none.
TEST(AuthNodeBindingTest, AnAgentRegistersOnlyTheNodesItsTokenNames) {
  const Identity bound{.user = "node-3", .role = Role::kAgent, .nodes = "node-3"};
  EXPECT_TRUE(MayRegisterNode(bound, "node-3").ok());
  const absl::Status other = MayRegisterNode(bound, "node-4");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(other.message(),
                                "registers nodes matching 'node-3' only, not "
                                "'node-4'"))
      << other;
  EXPECT_FALSE(absl::StrContains(other.message(), "\n"));
  const Identity rack{.user = "rack-1", .role = Role::kAgent, .nodes = "gpu-[0-9]*"};
  EXPECT_TRUE(MayRegisterNode(rack, "gpu-17").ok());
  EXPECT_FALSE(MayRegisterNode(rack, "cpu-1").ok());
  EXPECT_TRUE(MayRegisterNode({.user = "root", .role = Role::kAdmin}, "anything").ok());
  EXPECT_FALSE(MayRegisterNode({.user = "alice", .role = Role::kUser}, "alice").ok());
}

TEST(AuthNodeBindingTest, AnAgentsNodesComeFromItsTokenLine) {
  const std::string dir = testenv::MakeScratchDir("auth_nodes").string();
  const TokenEntry own{.user = "node-3", .role = Role::kAgent, .sha256 = Sha256Hex("ty_own")};
  const TokenEntry rack{
      .user = "rack", .role = Role::kAgent, .sha256 = Sha256Hex("ty_rack"), .nodes = "rack-*"};
  ASSERT_TRUE(WritePrivateFile(dir + "/tokens",
                               FormatTokenEntry(own) + "\n" + FormatTokenEntry(rack) + "\n")
                  .ok());
  Authenticator auth(AuthOptions{.tokens_file = dir + "/tokens"});
  ASSERT_TRUE(auth.Load().ok());
  absl::StatusOr<Identity> who = auth.Authenticate(std::string("ty_own"), "");
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->nodes, "node-3");  // no nodes=: its own name only
  who = auth.Authenticate(std::string("ty_rack"), "");
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->nodes, "rack-*");
}

TEST(AuthAttemptSecretsTest, ASecretIsGoodForItsOwnAttemptOnly) {
  const AttemptSecrets secrets(RandomHex(32));
  const std::string secret = secrets.For("job-7", 3);
  EXPECT_TRUE(secrets.Check(secret, "job-7", 3).ok());
  EXPECT_EQ(secrets.Check(secret, "job-7", 4).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(secrets.Check(secret, "job-8", 3).code(), absl::StatusCode::kPermissionDenied);
  // Another key (another coordinator's state), a changed claim or MAC, or junk: no identity.
  EXPECT_EQ(AttemptSecrets(RandomHex(32)).Check(secret, "job-7", 3).code(),
            absl::StatusCode::kUnauthenticated);
  std::string claim = secret;
  claim.replace(claim.find(":3:"), 3, ":4:");
  EXPECT_EQ(secrets.Check(claim, "job-7", 4).code(), absl::StatusCode::kUnauthenticated);
  for (const std::string junk :
       std::vector<std::string>{"", "attempt:", "attempt:job-7:3:", "attempt:job-7:x:00", "ty_1"}) {
    EXPECT_EQ(secrets.Check(junk, "job-7", 3).code(), absl::StatusCode::kUnauthenticated) << junk;
  }
  // Job ids with the separator in them cannot be confused with another job's.
  EXPECT_NE(secrets.For("a:1", 2), secrets.For("a", 12));
  EXPECT_EQ(secrets.Check(secrets.For("a:1", 2), "a:1", 2).code(), absl::StatusCode::kOk);
}

TEST(AuthAuthenticatorTest, TokensExpireAndTheFileIsReReadWhenItChanges) {
  const std::string dir = testenv::MakeScratchDir("auth_unit").string();
  const std::string path = dir + "/tokens";
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  TokenEntry alice{.user = "alice", .sha256 = Sha256Hex("ty_alice")};
  alice.expires = clock.Now() + absl::Hours(1);
  ASSERT_TRUE(WritePrivateFile(path, FormatTokenEntry(alice) + "\n").ok());
  Authenticator auth(AuthOptions{.tokens_file = path,
                                 .admin_sha256 = Sha256Hex("ty_admin"),
                                 .admin_user = "root",
                                 .clock = &clock});
  ASSERT_TRUE(auth.Load().ok());

  absl::StatusOr<Identity> who = auth.Authenticate(std::string("ty_alice"), "");
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->user, "alice");
  EXPECT_FALSE(who->admin());
  who = auth.Authenticate(std::string("ty_admin"), "");
  ASSERT_TRUE(who.ok());
  EXPECT_TRUE(who->admin());
  EXPECT_EQ(auth.Authenticate(std::nullopt, "").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authenticate(std::nullopt, "unmapped").status().code(),
            absl::StatusCode::kUnauthenticated);

  clock.Advance(absl::Hours(2));
  EXPECT_TRUE(absl::StrContains(auth.Authenticate(std::string("ty_alice"), "").status().message(),
                                "expired"));

  // A rewrite takes effect at once; a broken file grants nothing but the admin token.
  TokenEntry bob{.user = "bob", .sha256 = Sha256Hex("ty_bob")};
  TokenEntry rack{.user = "rack-1", .role = Role::kAgent, .certificate = "rack-1.example"};
  ASSERT_TRUE(
      WritePrivateFile(path, FormatTokenEntry(bob) + "\n" + FormatTokenEntry(rack) + "\n").ok());
  EXPECT_TRUE(auth.Authenticate(std::string("ty_bob"), "").ok());
  who = auth.Authenticate(std::nullopt, "rack-1.example");
  ASSERT_TRUE(who.ok()) << who.status();
  EXPECT_EQ(who->role, Role::kAgent);
  ASSERT_TRUE(WritePrivateFile(path, "bob user sha256:broken\n").ok());
  EXPECT_EQ(auth.Authenticate(std::string("ty_bob"), "").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(auth.Authenticate(std::string("ty_admin"), "").ok());
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST(AuthStreamQuotaTest, CountsOpenStreamsPerUser) {
  StreamQuota quota(2);
  ASSERT_TRUE(quota.Acquire("alice").ok());
  {
    StreamTicket ticket(&quota, "alice");  // the second, released at the end of the block
    ASSERT_TRUE(quota.Acquire("alice").ok());
    EXPECT_EQ(quota.Acquire("alice").code(), absl::StatusCode::kResourceExhausted);
    quota.Release("alice");
    ASSERT_TRUE(quota.Acquire("alice").ok());
    EXPECT_TRUE(quota.Acquire("bob").ok());
  }
  EXPECT_TRUE(quota.Acquire("alice").ok());
}

}  // namespace
}  // namespace trainyard::server
