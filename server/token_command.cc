#include "server/token_command.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/filesystem.h"
#include "common/flags.h"
#include "common/status.h"
#include "server/auth.h"

// `token add`'s flags; each is checked as written, below.
ABSL_FLAG(std::string, role, "user", "the token's role: user, admin or agent");
ABSL_FLAG(std::string, nodes, "", "an agent token's node ids (a glob)");
ABSL_FLAG(std::string, expires_in, "", "the token's lifetime (\"30d\")");
ABSL_FLAG(std::string, certificate, "", "a client certificate's common name for the user");

namespace trainyard::server {
namespace {

constexpr char kUsage[] =
    "usage: trainyard-server token add USER [--role user|admin|agent] [--nodes GLOB] "
    "[--expires-in DURATION] [--certificate NAME] [--tokens FILE | --state-dir DIR]\n"
    "       trainyard-server token revoke USER [--tokens FILE | --state-dir DIR]\n"
    "       trainyard-server token list [--tokens FILE | --state-dir DIR]";

struct TokenLine {
  std::string command;
  std::string user;
  std::map<std::string, std::string> flags;
};

absl::StatusOr<TokenLine> Parse(const std::vector<std::string>& args) {
  // --tokens and --state-dir are the server's own flags (main.cc), read here as written.
  constexpr std::string_view kFlags[] = {"role",        "nodes",  "expires-in",
                                         "certificate", "tokens", "state-dir"};
  TY_ASSIGN_OR_RETURN(const CommandLine parsed, ParseCommandLine(args, kFlags, "token"));
  TokenLine line;
  for (const auto& [name, values] : parsed.values) line.flags[name] = values.back();
  const std::vector<std::string>& positional = parsed.positionals;
  if (positional.empty()) return absl::InvalidArgumentError("missing the command");
  line.command = positional[0];
  const bool needs_user = line.command == "add" || line.command == "revoke";
  if (line.command != "list" && !needs_user) {
    return absl::InvalidArgumentError(absl::StrCat("unknown token command '", line.command, "'"));
  }
  if (positional.size() != (needs_user ? 2u : 1u)) {
    return absl::InvalidArgumentError(needs_user ? "expected one USER" : "unexpected arguments");
  }
  if (line.command != "add") {
    // Only `add` makes a credential; these describe one.
    constexpr std::string_view kAddFlags[] = {"role", "nodes", "expires-in", "certificate"};
    TY_RETURN_IF_ERROR(RefuseGiven(
        parsed, kAddFlags, absl::StrCat(" is for token add: not used by token ", line.command)));
  }
  if (needs_user) line.user = positional[1];
  if (line.user.find_first_of(" \t\r\n#") != std::string::npos) {
    return absl::InvalidArgumentError("a user name must not contain white space or '#'");
  }
  if (line.flags.count("tokens") && line.flags.count("state-dir")) {
    return absl::InvalidArgumentError("give --tokens or --state-dir, not both");
  }
  return line;
}

// "90s", "45m", "12h", "30d".
absl::StatusOr<absl::Duration> ParseLifetime(const std::string& text) {
  int64_t amount = 0;
  const char unit = text.empty() ? '\0' : text.back();
  const std::map<char, absl::Duration> units = {{'s', absl::Seconds(1)},
                                                {'m', absl::Minutes(1)},
                                                {'h', absl::Hours(1)},
                                                {'d', absl::Hours(24)}};
  if (!units.count(unit) || !absl::SimpleAtoi(text.substr(0, text.size() - 1), &amount) ||
      amount <= 0 || amount > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--expires-in '", text, "': expected a number and s, m, h or d (\"30d\")"));
  }
  return amount * units.at(unit);
}

absl::StatusOr<std::vector<TokenEntry>> ReadEntries(const std::string& path) {
  absl::StatusOr<std::string> text = RealFileSystem()->ReadFile(path);
  if (absl::IsNotFound(text.status())) return std::vector<TokenEntry>();
  if (!text.ok()) return text.status();
  TY_ASSIGN_OR_RETURN_WITH(std::vector<TokenEntry> entries, ParseTokenFile(*text), path);
  return entries;
}

absl::Status WriteEntries(const std::string& path, const std::vector<TokenEntry>& entries) {
  std::string text =
      "# trainyard token file: USER ROLE CREDENTIAL [expires=TIME] [nodes=GLOB] (trainyard-server "
      "token)\n";
  for (const TokenEntry& entry : entries) absl::StrAppend(&text, FormatTokenEntry(entry), "\n");
  return WritePrivateFile(path, text);
}

absl::Status Add(const TokenLine& line, const std::string& path, std::ostream& out,
                 std::vector<TokenEntry>& entries) {
  TokenEntry entry;
  entry.user = line.user;
  if (auto it = line.flags.find("role"); it != line.flags.end()) {
    const std::optional<Role> role = ParseRole(it->second);
    if (!role) {
      return absl::InvalidArgumentError(
          absl::StrCat("--role '", it->second, "': expected user, admin or agent"));
    }
    entry.role = *role;
  }
  if (auto it = line.flags.find("nodes"); it != line.flags.end()) {
    // An agent registers the node ids the glob matches (default: its own name only).
    if (entry.role != Role::kAgent) {
      return absl::InvalidArgumentError("--nodes binds an agent's token: it needs --role agent");
    }
    if (it->second.empty() || it->second.find_first_of(" \t\r\n#") != std::string::npos) {
      return absl::InvalidArgumentError("--nodes: a glob without white space or '#' (\"gpu-*\")");
    }
    entry.nodes = it->second;
  }
  if (auto it = line.flags.find("expires-in"); it != line.flags.end()) {
    TY_ASSIGN_OR_RETURN(const absl::Duration lifetime, ParseLifetime(it->second));
    entry.expires = absl::FromUnixSeconds(absl::ToUnixSeconds(absl::Now() + lifetime));
  }
  std::string token;
  if (auto it = line.flags.find("certificate"); it != line.flags.end()) {
    entry.certificate = it->second;
    if (entry.certificate.empty() ||
        entry.certificate.find_first_of(" \t\r\n#") != std::string::npos) {
      return absl::InvalidArgumentError("--certificate: a common name without white space or '#'");
    }
  } else {
    token = NewToken();
    entry.sha256 = Sha256Hex(token);
  }
  entries.push_back(entry);
  TY_RETURN_IF_ERROR(WriteEntries(path, entries));
  if (!token.empty()) out << token << "\n";
  return absl::OkStatus();
}

absl::Status Apply(const TokenLine& line, const std::string& path, std::ostream& out) {
  TY_ASSIGN_OR_RETURN(std::vector<TokenEntry> entries, ReadEntries(path));
  if (line.command == "add") return Add(line, path, out, entries);
  if (line.command == "revoke") {
    const size_t before = entries.size();
    std::erase_if(entries, [&](const TokenEntry& e) { return e.user == line.user; });
    if (entries.size() == before) {
      return absl::NotFoundError(absl::StrCat(path, " has no credential of ", line.user));
    }
    return WriteEntries(path, entries);
  }
  for (const TokenEntry& e : entries) {
    out << e.user << " " << RoleName(e.role) << " "
        << (e.certificate.empty() ? absl::StrCat("token sha256:", e.sha256.substr(0, 12), "...")
                                  : absl::StrCat("certificate ", e.certificate))
        << (e.expires == absl::InfiniteFuture()
                ? ""
                : absl::StrCat(" expires ", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", e.expires,
                                                             absl::UTCTimeZone())))
        << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTokenCommand(const std::vector<std::string>& args, std::ostream& out) {
  if (std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    out << kUsage << "\n";
    return absl::OkStatus();
  }
  absl::StatusOr<TokenLine> line = Parse(args);
  if (!line.ok()) return Annotate(line.status(), kUsage);
  std::string path;
  if (auto it = line->flags.find("tokens"); it != line->flags.end()) {
    path = it->second;
  } else {
    auto dir = line->flags.find("state-dir");
    path = (dir == line->flags.end() ? std::string("trainyard-state") : dir->second) + "/tokens";
  }
  // One writer at a time: a lock file beside the token file.
  const std::string lock_path = path + ".lock";
  const int lock = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", lock_path));
  flock(lock, LOCK_EX);
  const absl::Status status = Apply(*line, path, out);
  close(lock);
  return status;
}

}  // namespace trainyard::server
