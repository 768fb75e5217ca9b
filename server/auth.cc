#include "server/auth.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/filesystem.h"
#include "common/logging.h"
#include "common/status.h"

namespace trainyard::server {
namespace {

constexpr char kExpiresFormat[] = "%Y-%m-%dT%H:%M:%SZ";
constexpr char kSecretPrefix[] = "attempt:";

std::string Hex(const unsigned char* bytes, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

bool SameSecret(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool IsLowerHex(absl::string_view text, size_t size) {
  if (text.size() != size) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::StatusOr<TokenEntry> ParseEntry(const std::vector<absl::string_view>& fields) {
  if (fields.size() < 3 || fields.size() > 5) {
    return absl::InvalidArgumentError("expected USER ROLE CREDENTIAL [expires=TIME] [nodes=GLOB]");
  }
  TokenEntry entry;
  entry.user = std::string(fields[0]);
  const std::optional<Role> role = ParseRole(fields[1]);
  if (!role) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown role '", fields[1], "' (expected user, admin or agent)"));
  }
  entry.role = *role;
  absl::string_view credential = fields[2];
  if (absl::ConsumePrefix(&credential, "sha256:")) {
    if (!IsLowerHex(credential, 64)) {
      return absl::InvalidArgumentError("sha256: needs 64 lower-case hex digits");
    }
    entry.sha256 = std::string(credential);
  } else if (absl::ConsumePrefix(&credential, "mtls:") && !credential.empty()) {
    entry.certificate = std::string(credential);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("credential '", fields[2], "' is neither sha256:HEX nor mtls:NAME"));
  }
  for (size_t i = 3; i < fields.size(); ++i) {
    absl::string_view option = fields[i];
    std::string error;
    if (absl::ConsumePrefix(&option, "nodes=")) {
      if (entry.role != Role::kAgent || option.empty() || !entry.nodes.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", fields[i], "': nodes= binds an agent's token to node ids, once per line"));
      }
      entry.nodes = std::string(option);
    } else if (!absl::ConsumePrefix(&option, "expires=") ||
               entry.expires != absl::InfiniteFuture() ||
               !absl::ParseTime(kExpiresFormat, option, &entry.expires, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", fields[i], "' is neither expires=YYYY-MM-DDTHH:MM:SSZ nor nodes=GLOB (once each)"));
    }
  }
  return entry;
}

}  // namespace

absl::Status MayRegisterNode(const Identity& caller, const std::string& node_id) {
  if (caller.role == Role::kAdmin) return absl::OkStatus();
  if (caller.role == Role::kAgent && ::fnmatch(caller.nodes.c_str(), node_id.c_str(), 0) == 0) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("the agent token of ", caller.user, " registers nodes matching '", caller.nodes,
                   "' only, not '", node_id,
                   "': use that node's token, or add one with trainyard-server token "
                   "add NAME --role agent --nodes PATTERN"));
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kUser:
      return "user";
    case Role::kAdmin:
      return "admin";
    case Role::kAgent:
      return "agent";
  }
  return "user";
}

std::optional<Role> ParseRole(absl::string_view name) {
  if (name == "user") return Role::kUser;
  if (name == "admin") return Role::kAdmin;
  if (name == "agent") return Role::kAgent;
  return std::nullopt;
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokenFile(absl::string_view text) {
  std::vector<TokenEntry> entries;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    absl::StatusOr<TokenEntry> entry = ParseEntry(fields);
    if (!entry.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": ", entry.status().message()));
    }
    entries.push_back(*std::move(entry));
  }
  return entries;
}

std::string FormatTokenEntry(const TokenEntry& entry) {
  std::string line =
      absl::StrCat(entry.user, " ", RoleName(entry.role), " ",
                   entry.certificate.empty() ? absl::StrCat("sha256:", entry.sha256)
                                             : absl::StrCat("mtls:", entry.certificate));
  if (entry.expires != absl::InfiniteFuture()) {
    absl::StrAppend(
        &line, " expires=", absl::FormatTime(kExpiresFormat, entry.expires, absl::UTCTimeZone()));
  }
  if (!entry.nodes.empty()) absl::StrAppend(&line, " nodes=", entry.nodes);
  return line;
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr);
  return Hex(digest, size);
}

std::string RandomHex(int bytes) {
  std::string raw(bytes, '\0');
  size_t filled = 0;
  while (filled < raw.size()) {
    const ssize_t got = getrandom(raw.data() + filled, raw.size() - filled, 0);
    if (got < 0 && errno == EINTR) continue;
    TY_CHECK(got > 0) << "getrandom failed: " << strerror(errno);
    filled += static_cast<size_t>(got);
  }
  return Hex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

std::string NewToken() { return absl::StrCat("ty_", RandomHex(32)); }

absl::Status WritePrivateFile(const std::string& path, const std::string& contents) {
  const std::string temporary = absl::StrCat(path, ".tmp-", getpid());
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot create ", temporary));
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = write(fd, contents.data() + written, contents.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int saved = errno;
      close(fd);
      unlink(temporary.c_str());
      return ErrnoStatus(saved, absl::StrCat("cannot write ", temporary));
    }
    written += static_cast<size_t>(n);
  }
  // fchmod as well: an existing temporary keeps its mode through O_CREAT.
  if (fchmod(fd, 0600) != 0 || fsync(fd) != 0) {
    const int saved = errno;
    close(fd);
    unlink(temporary.c_str());
    return ErrnoStatus(saved, absl::StrCat("cannot sync ", temporary));
  }
  close(fd);
  if (rename(temporary.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    unlink(temporary.c_str());
    return ErrnoStatus(saved, absl::StrCat("cannot rename ", temporary, " to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> LoadOrCreateSecret(const std::string& path, std::string (*make)()) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    if (errno != ENOENT) return ErrnoStatus(errno, absl::StrCat("cannot stat ", path));
    const std::string secret = make();
    TY_RETURN_IF_ERROR(WritePrivateFile(path, secret + "\n"));
    return secret;
  }
  if ((info.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(path, " may be read by other users (mode ",
                                                      absl::Hex(info.st_mode & 0777),
                                                      " in hex); make it private with chmod 600"));
  }
  TY_ASSIGN_OR_RETURN(const std::string text, RealFileSystem()->ReadFile(path));
  const std::string secret(absl::StripAsciiWhitespace(text));
  if (secret.empty()) return absl::FailedPreconditionError(absl::StrCat(path, " is empty"));
  return secret;
}

AttemptSecrets::AttemptSecrets(std::string key) {
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  EVP_MAC_CTX* ctx = hmac != nullptr ? EVP_MAC_CTX_new(hmac) : nullptr;
  EVP_MAC_free(hmac);  // the context holds its own reference
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                               OSSL_PARAM_construct_end()};
  TY_CHECK(ctx != nullptr && EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()),
                                          key.size(), params) == 1)
      << "OpenSSL cannot key HMAC-SHA256";
  OPENSSL_cleanse(key.data(), key.size());
  keyed_ = std::shared_ptr<const void>(ctx, [](const void* c) {
    EVP_MAC_CTX_free(static_cast<EVP_MAC_CTX*>(const_cast<void*>(c)));
  });
}

std::string AttemptSecrets::Mac(const std::string& job_id, int attempt_id) const {
  const std::string message = absl::StrCat(job_id, "/", attempt_id);
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_dup(static_cast<const EVP_MAC_CTX*>(keyed_.get()));
  unsigned char digest[EVP_MAX_MD_SIZE];
  size_t size = 0;
  TY_CHECK(ctx != nullptr &&
           EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1 &&
           EVP_MAC_final(ctx, digest, &size, sizeof(digest)) == 1)
      << "OpenSSL's HMAC-SHA256 failed";
  EVP_MAC_CTX_free(ctx);
  return Hex(digest, size);
}

bool AttemptSecrets::IsSecret(absl::string_view credential) {
  return absl::StartsWith(credential, kSecretPrefix);
}

std::string AttemptSecrets::For(const std::string& job_id, int attempt_id) const {
  return absl::StrCat(kSecretPrefix, job_id, ":", attempt_id, ":", Mac(job_id, attempt_id));
}

absl::Status AttemptSecrets::Check(absl::string_view secret, const std::string& job_id,
                                   int attempt_id) const {
  // Parsed from the right: the MAC and the attempt are fixed-shape, the job id is what is left.
  const absl::Status forged = absl::UnauthenticatedError(
      "the attempt secret is not valid (workers get theirs from the "
      "agent that starts them, in TRAINYARD_ATTEMPT_SECRET)");
  if (!absl::ConsumePrefix(&secret, kSecretPrefix)) return forged;
  const size_t mac_colon = secret.rfind(':');
  if (mac_colon == absl::string_view::npos) return forged;
  const absl::string_view mac = secret.substr(mac_colon + 1);
  const absl::string_view rest = secret.substr(0, mac_colon);
  const size_t attempt_colon = rest.rfind(':');
  int claimed_attempt = 0;
  if (attempt_colon == absl::string_view::npos ||
      !absl::SimpleAtoi(rest.substr(attempt_colon + 1), &claimed_attempt)) {
    return forged;
  }
  const std::string claimed_job(rest.substr(0, attempt_colon));
  if (!SameSecret(mac, Mac(claimed_job, claimed_attempt))) return forged;
  if (claimed_job != job_id || claimed_attempt != attempt_id) {
    return absl::PermissionDeniedError(absl::StrCat("the secret is attempt ", claimed_attempt,
                                                    " of job ", claimed_job, "'s, not attempt ",
                                                    attempt_id, " of job ", job_id, "'s"));
  }
  return absl::OkStatus();
}

Authenticator::Authenticator(AuthOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : RealClock()) {}

absl::Status Authenticator::Load() {
  absl::MutexLock lock(&mu_);
  ReloadIfChangedLocked();
  if (!load_error_.empty()) return absl::InvalidArgumentError(load_error_);
  return absl::OkStatus();
}

void Authenticator::ReloadIfChangedLocked() {
  if (options_.tokens_file.empty()) return;
  struct stat info {};
  FileStamp stamp;
  if (stat(options_.tokens_file.c_str(), &info) == 0) {
    stamp = {info.st_ino, static_cast<int64_t>(info.st_size),
             static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec};
  }
  if (loaded_ && stamp == stamp_) return;
  loaded_ = true;
  stamp_ = stamp;
  entries_.clear();
  load_error_.clear();
  if (stamp.size < 0 && !options_.tokens_file_required) return;
  absl::StatusOr<std::string> text = RealFileSystem()->ReadFile(options_.tokens_file);
  absl::StatusOr<std::vector<TokenEntry>> parsed =
      text.ok() ? ParseTokenFile(*text) : absl::StatusOr<std::vector<TokenEntry>>(text.status());
  if (!parsed.ok()) {
    load_error_ =
        absl::StrCat("token file ", options_.tokens_file, ": ", parsed.status().message());
    TY_LOG(ERROR) << load_error_ << "; it grants nothing until it is fixed";
    return;
  }
  entries_ = *std::move(parsed);
  TY_LOG(INFO) << "token file " << options_.tokens_file << ": " << entries_.size() << " entries";
}

absl::StatusOr<Identity> Authenticator::Authenticate(const std::optional<std::string>& bearer,
                                                     const std::string& certificate_name) {
  if (!bearer && certificate_name.empty()) {
    return absl::UnauthenticatedError(
        "no credentials: pass a token (trainyard --token-file FILE, or TRAINYARD_TOKEN_FILE; the "
        "embedded server's admin token is <state-dir>/admin.token)");
  }
  const std::string hash = bearer ? Sha256Hex(*bearer) : "";
  if (bearer && !options_.admin_sha256.empty() && SameSecret(hash, options_.admin_sha256)) {
    return Identity{options_.admin_user, Role::kAdmin};
  }
  absl::MutexLock lock(&mu_);
  ReloadIfChangedLocked();
  const absl::Time now = clock_->Now();
  for (const TokenEntry& entry : entries_) {
    const bool match = bearer ? !entry.sha256.empty() && SameSecret(hash, entry.sha256)
                              : entry.certificate == certificate_name;
    if (!match) continue;
    if (entry.expires <= now) {
      return absl::UnauthenticatedError(
          absl::StrCat("the token of ", entry.user, " expired at ",
                       absl::FormatTime(kExpiresFormat, entry.expires, absl::UTCTimeZone())));
    }
    Identity identity{entry.user, entry.role};
    if (entry.role == Role::kAgent) identity.nodes = entry.nodes.empty() ? entry.user : entry.nodes;
    return identity;
  }
  if (bearer) {
    return absl::UnauthenticatedError("the token is unknown or revoked");
  }
  return absl::UnauthenticatedError(absl::StrCat("the client certificate '", certificate_name,
                                                 "' maps to no user in the token file; pass a "
                                                 "token or add an mtls: line for it"));
}

absl::Status StreamQuota::Acquire(const std::string& user) {
  absl::MutexLock lock(&mu_);
  int& open = open_[user];
  if (open >= per_user_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(user, " has ", open,
                     " streams open, the limit per user "
                     "(trainyard-server --max-streams-per-user); close one first"));
  }
  ++open;
  return absl::OkStatus();
}

void StreamQuota::Release(const std::string& user) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(user);
  if (it == open_.end()) return;
  if (--it->second <= 0) open_.erase(it);
}

}  // namespace trainyard::server
