#include "worker/tokenize_command.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/exit_codes.h"
#include "common/filesystem.h"
#include "common/flags.h"
#include "common/status.h"
#include "worker/data/bin_shards.h"
#include "worker/data/tokenizer.h"
#include "worker/flags.h"

namespace trainyard::worker {
namespace {

constexpr char kUsage[] =
    "usage: trainyard-worker tokenize TEXT... --tokenizer PATH --out DIR [--separator TEXT] "
    "[--shard-tokens N] [--threads N]";

constexpr char kHelp[] =
    "Tokenize: text files through a Hugging Face tokenizer.json into llm.c token shards\n"
    "DIR/train_000000.bin, ... for a job's data (source: bin, path: DIR/train_*.bin). Each file\n"
    "is one document, read whole; the documents follow one another in the order given.\n"
    "  --tokenizer PATH       a BPE tokenizer.json (GPT-2's, Llama's, Mistral's), or a\n"
    "                         directory holding one\n"
    "  --out DIR              where the shards go (created; it must hold no .bin files yet)\n"
    "  --separator TEXT       text put before each document (e.g. \"<|endoftext|>\" for GPT-2's,\n"
    "                         which becomes that token); default none\n"
    "  --shard-tokens N       ids per shard (default 100000000); 16-bit ids (GPT-2's format)\n"
    "                         when the tokenizer's fit, else 32-bit (Llama 3's)\n"
    "  --threads N            documents encoded at once (default: every core)\n";

struct TokenizeFlags {
  std::vector<std::string> inputs;
  std::string tokenizer, out, separator;
  int64_t shard_tokens = 0;
  int threads = 0;
};

absl::StatusOr<TokenizeFlags> ParseTokenizeFlags(int argc, char** argv) {
  constexpr std::string_view kFlags[] = {"tokenizer", "out", "separator", "shard-tokens",
                                         "threads"};
  TY_ASSIGN_OR_RETURN(const CommandLine line, ParseCommandLine(argc, argv, 2, kFlags, "tokenize"));
  if (line.help) {
    std::cout << kUsage << "\n\n" << kHelp;
    std::exit(0);
  }
  TokenizeFlags flags{.inputs = line.positionals,
                      .tokenizer = absl::GetFlag(FLAGS_tokenizer),
                      .out = absl::GetFlag(FLAGS_out),
                      .separator = absl::GetFlag(FLAGS_separator),
                      .shard_tokens = absl::GetFlag(FLAGS_shard_tokens),
                      .threads = absl::GetFlag(FLAGS_threads)};
  if (flags.inputs.empty()) return absl::InvalidArgumentError("no text files given");
  if (flags.tokenizer.empty()) return absl::InvalidArgumentError("--tokenizer is required");
  if (flags.out.empty()) return absl::InvalidArgumentError("--out is required");
  if (flags.shard_tokens < 1 || flags.shard_tokens > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("--shard-tokens must be from 1 to ", INT32_MAX,
                                                   " (a shard's count is an int32), got ",
                                                   flags.shard_tokens));
  }
  if (flags.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be 0 (every core) or more, got ", flags.threads));
  }
  return flags;
}

// Every input is a file, and `out` holds no shards, before anything is written. Creates `out`
// when it is missing (`*created`).
absl::Status CheckPaths(FileSystem& fs, const TokenizeFlags& flags, bool* created) {
  for (const std::string& input : flags.inputs) {
    if (!fs.Exists(input)) return absl::InvalidArgumentError(absl::StrCat(input, ": no such file"));
    if (fs.IsDirectory(input)) {
      return absl::InvalidArgumentError(
          absl::StrCat(input, ": a directory; give the text files in it"));
    }
  }
  if (!fs.Exists(flags.out)) {
    *created = true;
    return fs.CreateDirs(flags.out);
  }
  if (!fs.IsDirectory(flags.out)) {
    return absl::InvalidArgumentError(absl::StrCat("--out ", flags.out, ": not a directory"));
  }
  TY_ASSIGN_OR_RETURN(const std::vector<std::string> names, fs.ListDir(flags.out));
  for (const std::string& name : names) {
    if (absl::EndsWith(name, ".bin")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--out ", flags.out, " already holds shards (", name,
                       "); tokenize writes into a directory without any, so that a glob over "
                       "it reads these documents only"));
    }
  }
  return absl::OkStatus();
}

// One document's ids: --separator, then the file's text, through the tokenizer.
absl::StatusOr<std::vector<int32_t>> EncodeFile(FileSystem& fs, const data::Tokenizer& tokenizer,
                                                const std::string& separator,
                                                const std::string& path, uint64_t* bytes) {
  TY_ASSIGN_OR_RETURN(const std::string text, fs.ReadFile(path));
  *bytes = text.size();
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(absl::StrCat(separator, text));
  if (!ids.ok()) {  // where in the file, not in the separator and file together
    absl::StatusOr<std::vector<int32_t>> alone = tokenizer.Encode(text);
    return Annotate(alone.ok() ? ids.status() : alone.status(), path);
  }
  return ids;
}

absl::Status Tokenize(const TokenizeFlags& flags) {
  const auto start = std::chrono::steady_clock::now();
  FileSystem& fs = *RealFileSystem();
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> tokenizer =
      data::Tokenizer::Load(fs, flags.tokenizer);
  if (!tokenizer.ok()) return Annotate(tokenizer.status(), "--tokenizer");
  if (absl::StatusOr<std::vector<int32_t>> ids = (*tokenizer)->Encode(flags.separator); !ids.ok()) {
    return Annotate(ids.status(), "--separator");
  }
  bool created = false;
  TY_RETURN_IF_ERROR(CheckPaths(fs, flags, &created));
  BinShardWriter writer(fs, ChildPath(flags.out, "train"), flags.shard_tokens,
                        (*tokenizer)->size() - 1);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t window = flags.threads > 0 ? flags.threads : cores;
  uint64_t bytes = 0;
  // Documents are encoded `window` at a time, each on its own thread, and written in order.
  auto write_all = [&]() -> absl::Status {
    for (size_t first = 0; first < flags.inputs.size(); first += window) {
      const size_t n = std::min(window, flags.inputs.size() - first);
      std::vector<absl::StatusOr<std::vector<int32_t>>> ids(n);
      std::vector<uint64_t> sizes(n, 0);
      std::vector<std::thread> threads;
      for (size_t i = 0; i < n; ++i) {
        threads.emplace_back([&, i] {
          ids[i] = EncodeFile(fs, **tokenizer, flags.separator, flags.inputs[first + i], &sizes[i]);
        });
      }
      for (std::thread& t : threads) t.join();
      for (size_t i = 0; i < n; ++i) {
        if (!ids[i].ok()) return ids[i].status();
        TY_RETURN_IF_ERROR(writer.Append(*ids[i]));
        bytes += sizes[i];
      }
    }
    TY_RETURN_IF_ERROR(writer.Finish());
    if (writer.paths().empty()) {
      return absl::InvalidArgumentError("the documents hold no tokens: nothing to write");
    }
    return absl::OkStatus();
  };
  if (absl::Status written = write_all(); !written.ok()) {
    for (const std::string& path : writer.paths()) fs.RemoveFile(path).IgnoreError();
    if (created) fs.RemoveDir(flags.out).IgnoreError();
    return written;  // a bad document leaves nothing behind
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << absl::StrFormat(
      "tokenized %d files (%d bytes) into %d tokens: %d shard%s %s_*.bin, %s ids "
      "(%s's llm.c format), in %.2f s\n",
      flags.inputs.size(), bytes, writer.tokens(), writer.paths().size(),
      writer.paths().size() == 1 ? "" : "s", ChildPath(flags.out, "train"),
      writer.wide() ? "32-bit" : "16-bit", writer.wide() ? "Llama 3" : "GPT-2", seconds);
  return absl::OkStatus();
}

}  // namespace

bool IsTokenizeInvocation(int argc, char** argv) {
  return argc >= 2 && std::string_view(argv[1]) == "tokenize";
}

int RunTokenize(int argc, char** argv) {
  absl::StatusOr<TokenizeFlags> flags = ParseTokenizeFlags(argc, argv);
  absl::Status status = flags.ok() ? Tokenize(*flags) : Annotate(flags.status(), kUsage);
  if (status.ok()) return kExitOk;
  std::cerr << "trainyard-worker: error: " << status.message() << "\n";
  return ExitCodeForStatus(status);
}

}  // namespace trainyard::worker
