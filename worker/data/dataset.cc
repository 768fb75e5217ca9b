#include "worker/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/bin_shards.h"
#include "worker/data/markov.h"
#include "worker/data/text_bytes.h"

namespace trainyard::worker {
namespace {

struct OpenedStream {
  std::unique_ptr<TokenStream> stream;
  std::string description;
};

absl::StatusOr<DataSplits> OpenMarkov(const config::MarkovSpec& spec) {
  if (spec.train_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.markov.train_tokens: ", spec.train_tokens, " must be positive"));
  }
  if (spec.val_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.markov.val_tokens: ", spec.val_tokens, " is negative"));
  }
  TY_ASSIGN_OR_RETURN(const MarkovChain chain, MarkovChain::Random(spec, "data.markov"));
  DataSplits splits;
  splits.vocab_bound = chain.vocab();
  splits.train =
      std::make_unique<MemoryStream>(chain.Generate(spec.train_tokens, spec.seed), chain.vocab());
  splits.val = std::make_unique<MemoryStream>(
      chain.Generate(spec.val_tokens, spec.seed ^ kValidationSeedXor), chain.vocab());
  splits.entropy_nats = chain.EntropyRateNats();
  splits.description = absl::StrCat(
      "markov: order ", spec.order, ", vocab ", spec.vocab, ", concentration ", spec.concentration,
      ", seed ", spec.seed, "; entropy rate ", chain.EntropyRateNats(), " nats/token; train ",
      spec.train_tokens, " tokens, val ", spec.val_tokens, " tokens");
  return splits;
}

// Opens `path` as a `source` ("bin" or "text") stream.
absl::StatusOr<OpenedStream> OpenFileStream(const std::string& source, const std::string& path,
                                            FileSystem& fs) {
  OpenedStream opened;
  if (source == "bin") {
    TY_ASSIGN_OR_RETURN(std::unique_ptr<BinShardStream> bin, BinShardStream::Open(path, fs));
    opened.description =
        absl::StrCat(bin->paths().size(), bin->paths().size() == 1 ? " shard" : " shards",
                     " matching '", path, "', ", bin->size(), " tokens");
    opened.stream = std::move(bin);
  } else {
    TY_ASSIGN_OR_RETURN(std::unique_ptr<TextByteStream> text, TextByteStream::Open(path, fs));
    opened.description = absl::StrCat("'", path, "', ", text->size(), " bytes");
    opened.stream = std::move(text);
  }
  return opened;
}

absl::StatusOr<DataSplits> OpenFiles(const config::DataSpec& spec, FileSystem& fs) {
  if (spec.path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.path: required for source '", spec.source, "'"));
  }
  TY_ASSIGN_OR_RETURN_WITH(OpenedStream train, OpenFileStream(spec.source, spec.path, fs),
                           "data.path");
  DataSplits splits;
  std::string val_description;
  if (!spec.val_path.empty()) {
    TY_ASSIGN_OR_RETURN_WITH(OpenedStream val, OpenFileStream(spec.source, spec.val_path, fs),
                             "data.val_path");
    splits.train = std::move(train.stream);
    splits.val = std::move(val.stream);
    val_description = val.description;
  } else {
    if (!(spec.val_fraction > 0.0 && spec.val_fraction < 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.val_fraction: ", spec.val_fraction,
                       " must lie strictly between 0 and 1 when data.val_path is not set"));
    }
    std::shared_ptr<const TokenStream> all = std::move(train.stream);
    const int64_t size = all->size();
    const int64_t val_size = static_cast<int64_t>(std::floor(size * spec.val_fraction));
    splits.train = std::make_unique<SliceStream>(all, 0, size - val_size);
    splits.val = std::make_unique<SliceStream>(all, size - val_size, val_size);
    val_description = absl::StrCat("last ", spec.val_fraction * 100, "% (", val_size, " tokens)");
  }
  splits.vocab_bound = std::max(splits.train->vocab_bound(), splits.val->vocab_bound());
  splits.description =
      absl::StrCat(spec.source, ": ", train.description, ", vocab bound ", splits.vocab_bound,
                   "; train ", splits.train->size(), " tokens, val ", val_description);
  return splits;
}

}  // namespace

absl::StatusOr<DataSplits> OpenData(const config::DataSpec& spec, FileSystem& fs) {
  if (spec.source == "markov") return OpenMarkov(spec.markov);
  if (spec.source == "bin" || spec.source == "text") return OpenFiles(spec, fs);
  return absl::InvalidArgumentError(absl::StrCat("data.source: unknown source '", spec.source,
                                                 "' (expected markov, bin or text)"));
}

}  // namespace trainyard::worker
