#include "worker/tokenize_command.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <filesystem>
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
#include "worker/data/text_documents.h"
#include "worker/data/tokenizer.h"
#include "worker/flags.h"

namespace trainyard::worker {
namespace {

constexpr char kUsage[] =
    "usage: trainyard-worker tokenize FILE... --tokenizer PATH --out DIR [--field NAME] "
    "[--separator TEXT] [--shard-tokens N] [--threads N]";

constexpr char kHelp[] =
    "Tokenize: text files through a Hugging Face tokenizer.json into llm.c token shards\n"
    "DIR/train_000000.bin, ... for a job's data (source: bin, path: DIR/train_*.bin). Each file\n"
    "is one document, read whole (gzip or zstd compressed or not); with --field, JSON Lines\n"
    "whose every line is one. The documents follow one another in the order given.\n"
    "  --field NAME           each FILE is JSON Lines; each line's NAME (a string) is a document\n"
    "  --tokenizer PATH       a BPE tokenizer.json (GPT-2's, Llama's, Mistral's), or a\n"
    "                         directory holding one\n"
    "  --out DIR              where the shards go (created; it must hold no .bin files yet)\n"
    "  --separator TEXT       text put before each document (e.g. \"<|endoftext|>\" for GPT-2's,\n"
    "                         which becomes that token); default none\n"
    "  --shard-tokens N       ids per shard (default 100000000); 16-bit ids (GPT-2's format)\n"
    "                         when the tokenizer's fit, else 32-bit (Llama 3's)\n"
    "  --threads N            threads encoding documents (default: every core)\n";

constexpr int kMaxThreads = 1024;

struct TokenizeFlags {
  std::vector<std::string> inputs;
  std::string tokenizer, out, separator, field;
  int64_t shard_tokens = 0;
  int threads = 0;
};

absl::StatusOr<TokenizeFlags> ParseTokenizeFlags(int argc, char** argv) {
  constexpr std::string_view kFlags[] = {"tokenizer",    "out",     "separator",
                                         "shard-tokens", "threads", "field"};
  TY_ASSIGN_OR_RETURN(const CommandLine line, ParseCommandLine(argc, argv, 2, kFlags, "tokenize"));
  if (line.help) {
    std::cout << kUsage << "\n\n" << kHelp;
    std::exit(0);
  }
  TokenizeFlags flags{.inputs = line.positionals,
                      .tokenizer = absl::GetFlag(FLAGS_tokenizer),
                      .out = absl::GetFlag(FLAGS_out),
                      .separator = absl::GetFlag(FLAGS_separator),
                      .field = absl::GetFlag(FLAGS_field),
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
  if (flags.threads < 0 || flags.threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be from 0 (every core) to ",
                                                   kMaxThreads, ", got ", flags.threads));
  }
  return flags;
}

// Every input is a file, and `out` holds no shards, before anything is written. Creates `out`
// when it is missing, and with it any missing parent (`*created`: each, the deepest first).
absl::Status CheckPaths(FileSystem& fs, const TokenizeFlags& flags,
                        std::vector<std::string>* created) {
  for (const std::string& input : flags.inputs) {
    if (!fs.Exists(input)) return absl::InvalidArgumentError(absl::StrCat(input, ": no such file"));
    if (fs.IsDirectory(input)) {
      return absl::InvalidArgumentError(
          absl::StrCat(input, ": a directory; give the text files in it"));
    }
  }
  if (!fs.Exists(flags.out)) {
    for (std::string dir = flags.out; !dir.empty() && dir != "/" && !fs.Exists(dir);
         dir = std::filesystem::path(dir).parent_path().string()) {
      created->push_back(dir);
    }
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

// Documents gathered into batches of about kBatchBytes of text, each batch encoded by up to
// `threads` threads over contiguous runs of its documents (so that the ids come out in the
// documents' order) and appended to the shards.
class BatchEncoder {
 public:
  static constexpr uint64_t kBatchBytes = uint64_t{64} << 20;

  BatchEncoder(const data::Tokenizer& tokenizer, const std::string& separator, int threads,
               BinShardWriter& writer)
      : tokenizer_(tokenizer), separator_(separator), threads_(threads), writer_(writer) {}

  absl::Status Add(data::Document document) {
    pending_bytes_ += document.text.size();
    pending_.push_back(std::move(document));
    return pending_bytes_ >= kBatchBytes ? Flush() : absl::OkStatus();
  }

  absl::Status Flush() {
    const size_t n = pending_.size();
    const size_t parts = std::min<size_t>(threads_, n);
    std::vector<absl::StatusOr<std::vector<int32_t>>> ids(parts);
    std::vector<std::thread> threads;
    size_t first = 0;
    uint64_t done = 0;
    for (size_t part = 0; part < parts; ++part) {  // runs of about equal bytes
      size_t last = first;
      const uint64_t until = pending_bytes_ * (part + 1) / parts;
      while (last < n && (last == first || done < until || part + 1 == parts)) {
        done += pending_[last++].text.size();
      }
      threads.emplace_back([this, &ids, part, first, last] { ids[part] = Encode(first, last); });
      first = last;
    }
    for (std::thread& t : threads) t.join();
    for (auto& part : ids) {
      if (!part.ok()) return part.status();
      TY_RETURN_IF_ERROR(writer_.Append(*part));
    }
    documents_ += n;
    bytes_ += pending_bytes_;
    pending_.clear();
    pending_bytes_ = 0;
    return absl::OkStatus();
  }

  int64_t documents() const { return documents_; }
  uint64_t bytes() const { return bytes_; }

 private:
  // The ids of documents [first, last): each --separator then its text, through the tokenizer.
  absl::StatusOr<std::vector<int32_t>> Encode(size_t first, size_t last) const {
    std::vector<int32_t> out;
    for (size_t i = first; i < last; ++i) {
      const data::Document& d = pending_[i];
      absl::StatusOr<std::vector<int32_t>> ids =
          separator_.empty() ? tokenizer_.Encode(d.text)
                             : tokenizer_.Encode(absl::StrCat(separator_, d.text));
      if (!ids.ok()) {  // where in the document, not in the separator and document together
        absl::StatusOr<std::vector<int32_t>> alone = tokenizer_.Encode(d.text);
        return Annotate(alone.ok() ? ids.status() : alone.status(), d.source);
      }
      out.insert(out.end(), ids->begin(), ids->end());
    }
    return out;
  }

  const data::Tokenizer& tokenizer_;
  const std::string& separator_;
  const int threads_;
  BinShardWriter& writer_;
  std::vector<data::Document> pending_;
  uint64_t pending_bytes_ = 0;
  int64_t documents_ = 0;
  uint64_t bytes_ = 0;
};

// Every input's documents (decompressed; each line's --field of JSON Lines, streamed) through
// `encoder`.
absl::Status EncodeInputs(FileSystem& fs, const TokenizeFlags& flags, BatchEncoder& encoder) {
  for (const std::string& path : flags.inputs) {
    if (!flags.field.empty()) {
      TY_RETURN_IF_ERROR(data::ForEachJsonLine(
          fs, path, flags.field, [&](data::Document d) { return encoder.Add(std::move(d)); }));
      continue;
    }
    TY_ASSIGN_OR_RETURN(std::string contents, data::ReadDecompressed(fs, path));
    TY_RETURN_IF_ERROR(encoder.Add({path, std::move(contents)}));
  }
  return encoder.Flush();
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
  std::vector<std::string> created;
  TY_RETURN_IF_ERROR(CheckPaths(fs, flags, &created));
  BinShardWriter writer(fs, ChildPath(flags.out, "train"), flags.shard_tokens,
                        (*tokenizer)->size() - 1);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  BatchEncoder encoder(**tokenizer, flags.separator, flags.threads > 0 ? flags.threads : cores,
                       writer);
  absl::Status written = EncodeInputs(fs, flags, encoder);
  if (written.ok()) written = writer.Finish();
  if (written.ok() && writer.paths().empty()) {
    written = absl::InvalidArgumentError("the documents hold no tokens: nothing to write");
  }
  if (!written.ok()) {  // a bad document leaves nothing behind
    for (const std::string& path : writer.paths()) fs.RemoveFile(path).IgnoreError();
    for (const std::string& dir : created) fs.RemoveDir(dir).IgnoreError();
    return written;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << absl::StrFormat(
      "tokenized %d files, %d documents (%d bytes of text) into %d tokens: %d shard%s %s_*.bin, "
      "%s ids (%s's llm.c format), in %.2f s\n",
      flags.inputs.size(), encoder.documents(), encoder.bytes(), writer.tokens(),
      writer.paths().size(), writer.paths().size() == 1 ? "" : "s", ChildPath(flags.out, "train"),
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
