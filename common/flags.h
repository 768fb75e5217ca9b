// Command lines, parsed with Abseil's flags library: the one parser of every Trainyard binary.
//
// A binary defines its flags with ABSL_FLAG (typed, with a default and help text), parses a
// command line with ParseCommandLine, naming the flags the command (or mode) takes, and reads
// them with absl::GetFlag. Every binary then accepts the same forms:
//   --name=value and --name value; a boolean as --name, --name=true|false or --noname;
//   -h and --help (CommandLine::help); `--` ends the flags; every other argument that does not
//   start with "--" is positional, in order.
// A flag of type FlagList may repeat, each occurrence adding a value; any other flag given twice
// takes the last value (as Abseil's own parser does: a wrapper can append an override). Refused:
// a flag the command does not take ("unknown flag '--x'"), a missing value ("--x needs a value")
// and a value the flag's type does not parse ("--x: invalid value 'v'"). All of these
// are INVALID_ARGUMENT, which the binaries exit with 2.
//
// Threading: flags are process-wide; parse before starting threads. A process that parses more
// than one command line (a test, the CLI's in-process runs) restores the defaults between them
// with absl::FlagSaver.
#ifndef TRAINYARD_COMMON_FLAGS_H_
#define TRAINYARD_COMMON_FLAGS_H_

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace trainyard {

// A flag that may repeat (`--pass-env A --pass-env B`): its values in the order given.
struct FlagList {
  std::vector<std::string> values;
};
// Abseil's marshalling of a FlagList: its values one per line (a value holds no newline).
bool AbslParseFlag(absl::string_view text, FlagList* list, std::string* error);
std::string AbslUnparseFlag(const FlagList& list);

struct CommandLine {
  std::vector<std::string> positionals;
  std::set<std::string> given;  // the names of the flags given, with dashes (without "--", "no-")
  // Each given flag's values as written, in order ("true" or "false" for a boolean); for a
  // command that passes its flags on to another program.
  std::map<std::string, std::vector<std::string>> values;
  bool help = false;

  bool Has(const std::string& name) const { return given.contains(name); }
};

// Parses `args` (without the program's name) into the Abseil flags named in `accepted` (written
// with dashes; each defined by the binary). `command` names the command or mode in the unknown-flag
// error ("for export"); empty: none.
[[nodiscard]] absl::StatusOr<CommandLine> ParseCommandLine(
    absl::Span<const std::string> args, absl::Span<const std::string_view> accepted,
    std::string_view command = "");

// INVALID_ARGUMENT naming the first positional argument, for a command that takes none
// ("unexpected argument 'x' for calibrate"); OK when there is none.
[[nodiscard]] absl::Status RefusePositionals(const CommandLine& line,
                                             std::string_view command = "");

// INVALID_ARGUMENT "--NAME<why>" for the first of `names` given (a flag that the others make a
// no-op); OK when none is.
[[nodiscard]] absl::Status RefuseGiven(const CommandLine& line,
                                       absl::Span<const std::string_view> names,
                                       std::string_view why);

// The same over main's argv from index `first` on.
[[nodiscard]] absl::StatusOr<CommandLine> ParseCommandLine(
    int argc, char** argv, int first, absl::Span<const std::string_view> accepted,
    std::string_view command = "");

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_FLAGS_H_
