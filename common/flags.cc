#include "common/flags.h"

#include <algorithm>
#include <optional>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainyard {

bool AbslParseFlag(absl::string_view text, FlagList* list, std::string* error) {
  list->values.clear();
  if (text.empty()) return true;
  list->values = absl::StrSplit(text, '\n');
  (void)error;  // every text is a list
  return true;
}

std::string AbslUnparseFlag(const FlagList& list) { return absl::StrJoin(list.values, "\n"); }

namespace {

// Flags are written with dashes (--pass-env) and defined as identifiers (pass_env).
std::string AbseilName(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}
std::string WrittenName(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

// One flag of the command line as written: its name and, for --name=value, the value.
struct Written {
  std::string name;
  std::optional<std::string> value;
  bool negated = false;  // --noname
};

class Parser {
 public:
  Parser(absl::Span<const std::string_view> accepted, std::string_view command)
      : accepted_(accepted), command_(command) {}

  // Every accepted flag back at its default, so that each parse starts from the same place.
  absl::Status ResetAccepted() {
    for (std::string_view name : accepted_) {
      absl::CommandLineFlag* flag = absl::FindCommandLineFlag(AbseilName(name));
      if (flag == nullptr) {
        return absl::InternalError(absl::StrCat("flag --", std::string(name), " is not defined"));
      }
      std::string error;
      if (!flag->ParseFrom(flag->DefaultValue(), &error)) {
        return absl::InternalError(absl::StrCat("--", std::string(name), ": ", error));
      }
    }
    return absl::OkStatus();
  }

  // The accepted flag `written` names (a boolean's --noname and --no-name included), else null.
  absl::CommandLineFlag* Find(Written& written) const {
    if (absl::CommandLineFlag* flag = Accepted(written.name)) return flag;
    for (std::string_view prefix : {"no-", "no"}) {
      if (written.name.rfind(prefix, 0) != 0 || written.value) continue;
      const std::string name = written.name.substr(prefix.size());
      absl::CommandLineFlag* flag = Accepted(name);
      if (flag != nullptr && flag->IsOfType<bool>()) {
        written.name = name;
        written.negated = true;
        return flag;
      }
    }
    return nullptr;
  }

  absl::Status UnknownFlag(const std::string& name) const {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown flag '--", name, "'",
                     command_.empty() ? "" : absl::StrCat(" for ", std::string(command_))));
  }

 private:
  // `name` in its written form (dashes), when the command takes it.
  absl::CommandLineFlag* Accepted(const std::string& name) const {
    if (std::find(accepted_.begin(), accepted_.end(), name) == accepted_.end()) return nullptr;
    return absl::FindCommandLineFlag(AbseilName(name));
  }

  absl::Span<const std::string_view> accepted_;
  std::string_view command_;
};

absl::Status SetFlag(absl::CommandLineFlag& flag, const Written& written, std::string value) {
  if (flag.IsOfType<FlagList>()) {
    if (value.empty() || absl::StrContains(value, '\n')) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", written.name, ": expected a value on one line, got '", value, "'"));
    }
    const std::string current = flag.CurrentValue();
    if (!current.empty()) value = absl::StrCat(current, "\n", value);
  }
  std::string error;  // Abseil's names the flag by its identifier; ours names it as written
  if (!flag.ParseFrom(value, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", written.name, ": invalid value '", value, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(absl::Span<const std::string> args,
                                             absl::Span<const std::string_view> accepted,
                                             std::string_view command) {
  Parser parser(accepted, command);
  if (absl::Status reset = parser.ResetAccepted(); !reset.ok()) return reset;
  CommandLine line;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      line.help = true;
      continue;
    }
    if (arg == "--") {
      line.positionals.insert(line.positionals.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (!absl::StartsWith(arg, "--")) {
      line.positionals.push_back(arg);
      continue;
    }
    Written written{.name = arg.substr(2)};
    if (const size_t equals = written.name.find('='); equals != std::string::npos) {
      written.value = written.name.substr(equals + 1);
      written.name.resize(equals);
    }
    written.name = WrittenName(written.name);
    absl::CommandLineFlag* flag = parser.Find(written);
    if (flag == nullptr) return parser.UnknownFlag(written.name);
    line.given.insert(written.name);
    std::string value;
    if (written.value) {
      value = *written.value;
    } else if (flag->IsOfType<bool>()) {
      value = written.negated ? "false" : "true";
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", written.name, " needs a value"));
    }
    line.values[written.name].push_back(value);
    if (absl::Status set = SetFlag(*flag, written, std::move(value)); !set.ok()) return set;
  }
  return line;
}

absl::Status RefusePositionals(const CommandLine& line, std::string_view command) {
  if (line.positionals.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unexpected argument '", line.positionals[0], "'",
                   command.empty() ? "" : absl::StrCat(" for ", std::string(command))));
}

absl::Status RefuseGiven(const CommandLine& line, absl::Span<const std::string_view> names,
                         std::string_view why) {
  for (std::string_view name : names) {
    if (line.Has(std::string(name))) {
      return absl::InvalidArgumentError(absl::StrCat("--", std::string(name), std::string(why)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv, int first,
                                             absl::Span<const std::string_view> accepted,
                                             std::string_view command) {
  std::vector<std::string> args;
  for (int i = std::max(first, 0); i < argc; ++i) args.emplace_back(argv[i]);
  return ParseCommandLine(args, accepted, command);
}

}  // namespace trainyard
