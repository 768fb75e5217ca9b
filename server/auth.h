// Who calls the coordinator, and what they may do (DESIGN.md section 7).
//
// Three kinds of caller, each with its own credential:
// - users and admins (the CLI) and agents present a bearer token ("authorization: Bearer T").
//   The coordinator knows tokens only by their SHA-256, from the token file (TokenEntry lines,
//   `trainyard-server token add` writes them) and from the embedded admin token that every state
//   directory holds in admin.token (mode 0600, so only the coordinator's own user can read it).
//   A caller with a client certificate (mutual TLS) and no token is the user its certificate's
//   common name maps to in the token file ("mtls:NAME").
// - workers present their attempt's secret, an HMAC of (job, attempt) under the state directory's
//   attempt.key: it lets a worker join, report for and use the key–value space of its own
//   attempt only, and survives a coordinator restart without being stored.
//
// Refusals: UNAUTHENTICATED when the caller proves no identity (no credential, an unknown,
// expired or revoked token, a forged secret); PERMISSION_DENIED when the identity may not do
// what it asks (a user's token on AgentService, an agent's on JobService, a secret of another
// attempt). Every message is one line that says what to do.
//
// Threading: Authenticator and StreamQuota are thread-safe; the rest are values and pure
// functions.
#ifndef TRAINYARD_SERVER_AUTH_H_
#define TRAINYARD_SERVER_AUTH_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace trainyard::server {

enum class Role { kUser, kAdmin, kAgent };

absl::string_view RoleName(Role role);
std::optional<Role> ParseRole(absl::string_view name);

struct Identity {
  std::string user;
  Role role = Role::kUser;
  // An agent's: the node ids it may register, a shell glob (TokenEntry::nodes, by default the
  // agent's user name itself). Empty for the other roles.
  std::string nodes;

  bool admin() const { return role == Role::kAdmin; }
};

// OK when `caller` may register node `node_id`: an admin any node, an agent a node its pattern
// matches; PERMISSION_DENIED with one line naming the token, the pattern and how to get another.
[[nodiscard]] absl::Status MayRegisterNode(const Identity& caller, const std::string& node_id);

// One line of the token file: "USER ROLE CREDENTIAL [expires=YYYY-MM-DDTHH:MM:SSZ]
// [nodes=GLOB]", where CREDENTIAL is "sha256:HEX" (the token's hash) or "mtls:NAME" (a client
// certificate's common name), and nodes= (agents only) the node ids the agent may register, a
// shell glob ("gpu-*", "*"); without it an agent registers only the node named like its user.
// '#' starts a comment; blank lines are ignored.
struct TokenEntry {
  std::string user;
  Role role = Role::kUser;
  std::string sha256;       // lower-case hex; empty for a certificate
  std::string certificate;  // the common name; empty for a token
  absl::Time expires = absl::InfiniteFuture();
  std::string nodes;  // agents: empty means `user`
};

// INVALID_ARGUMENT naming the line of the first malformed entry.
[[nodiscard]] absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(absl::string_view text);
std::string FormatTokenEntry(const TokenEntry& entry);

// Lower-case hex of the SHA-256 of `data`.
std::string Sha256Hex(absl::string_view data);
// `bytes` random bytes from the kernel, as lower-case hex.
std::string RandomHex(int bytes);
// A new bearer token: "ty_" and 64 hex digits (256 random bits).
std::string NewToken();

// Reads the secret in `path`, or creates the file with `make()`'s value, mode 0600, durably.
// FAILED_PRECONDITION when the file exists and others may read it (group or other bits set).
[[nodiscard]] absl::StatusOr<std::string> LoadOrCreateSecret(const std::string& path,
                                                             std::string (*make)());

// Writes `contents` to `path` atomically (a 0600 temporary, synced, renamed over it).
[[nodiscard]] absl::Status WritePrivateFile(const std::string& path, const std::string& contents);

// Attempt secrets: "attempt:JOB:ATTEMPT:HMAC", HMAC-SHA256 of "JOB/ATTEMPT" under the key.
class AttemptSecrets {
 public:
  explicit AttemptSecrets(std::string key);

  std::string For(const std::string& job_id, int attempt_id) const;
  // True for a credential shaped like an attempt secret (not necessarily a valid one).
  static bool IsSecret(absl::string_view credential);
  // OK when `secret` is this attempt's; PERMISSION_DENIED for a genuine secret of another
  // attempt; UNAUTHENTICATED for anything else.
  [[nodiscard]] absl::Status Check(absl::string_view secret, const std::string& job_id,
                                   int attempt_id) const;

 private:
  std::string Mac(const std::string& job_id, int attempt_id) const;

  // HMAC-SHA256 keyed once (OpenSSL's EVP_MAC_CTX; never changed after construction, so that
  // concurrent Mac calls may copy it): fetching and keying per MAC cost 20,000 instructions.
  std::shared_ptr<const void> keyed_;
};

struct AuthOptions {
  std::string tokens_file;  // empty: none (only the embedded admin token)
  // A missing token file grants nothing (false) or is an error that grants nothing (true).
  bool tokens_file_required = true;
  // The embedded admin token's SHA-256 and the user it stands for.
  std::string admin_sha256;
  std::string admin_user;
  Clock* clock = nullptr;  // null: RealClock()
};

// The token table, re-read whenever the token file changes (so a revocation takes effect on the
// next call). A token file that cannot be read or parsed grants nothing until it is fixed (the
// embedded admin token still works).
class Authenticator {
 public:
  explicit Authenticator(AuthOptions options);

  // Reads the token file once; INVALID_ARGUMENT or NOT_FOUND when it is unusable at startup.
  [[nodiscard]] absl::Status Load();

  // The caller, from its bearer token (nullopt: none sent) or, without one, the common name of
  // its verified client certificate (empty: none).
  [[nodiscard]] absl::StatusOr<Identity> Authenticate(const std::optional<std::string>& bearer,
                                                      const std::string& certificate_name);

 private:
  struct FileStamp {
    ino_t inode = 0;
    int64_t size = -1;
    int64_t mtime_ns = -1;
    bool operator==(const FileStamp&) const = default;
  };

  // A file that cannot be read or parsed leaves no entries and says why in load_error_.
  void ReloadIfChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AuthOptions options_;
  Clock* const clock_;
  absl::Mutex mu_;
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);
  std::vector<TokenEntry> entries_ ABSL_GUARDED_BY(mu_);
  std::string load_error_ ABSL_GUARDED_BY(mu_);  // why the file grants nothing now
};

// Per-user bounds on open streams (WatchJob, GetLogs).
class StreamQuota {
 public:
  explicit StreamQuota(int per_user) : per_user_(per_user) {}

  // RESOURCE_EXHAUSTED when `user` already has the limit open; else counts one more.
  [[nodiscard]] absl::Status Acquire(const std::string& user);
  void Release(const std::string& user);

 private:
  const int per_user_;
  absl::Mutex mu_;
  std::map<std::string, int> open_ ABSL_GUARDED_BY(mu_);
};

// A user's open stream, counted by the StreamQuota until the ticket is destroyed
// (move-only).
class StreamTicket {
 public:
  StreamTicket() = default;
  StreamTicket(StreamQuota* quota, std::string user) : quota_(quota), user_(std::move(user)) {}
  StreamTicket(StreamTicket&& other) noexcept
      : quota_(std::exchange(other.quota_, nullptr)), user_(std::move(other.user_)) {}
  StreamTicket& operator=(StreamTicket&& other) noexcept {
    Reset();
    quota_ = std::exchange(other.quota_, nullptr);
    user_ = std::move(other.user_);
    return *this;
  }
  ~StreamTicket() { Reset(); }

 private:
  void Reset() {
    if (quota_ != nullptr) quota_->Release(user_);
    quota_ = nullptr;
  }

  StreamQuota* quota_ = nullptr;
  std::string user_;
};

}  // namespace trainyard::server

#endif  // TRAINYARD_SERVER_AUTH_H_
