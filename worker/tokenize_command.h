// `trainyard-worker tokenize` (`trainyard tokenize`): text files through a Hugging Face
// tokenizer.json (worker/data/tokenizer.h) into llm.c token shards (worker/data/bin_shards.h)
// that a job reads as `data: {source: bin, path: DIR/train_*.bin}`.
//
//   trainyard-worker tokenize FILE... --tokenizer PATH --out DIR [--field NAME]
//                             [--separator TEXT] [--shard-tokens N] [--threads N]
//
// Each file is one document, read whole (gzip or zstd compressed or not; see
// worker/data/text_documents.h); with --field, each file is JSON Lines and each line's NAME field
// one document. A document is encoded as the tokenizer encodes a text (Llama 3's template puts
// <|begin_of_text|> before each), after --separator (e.g. GPT-2's "<|endoftext|>", which becomes
// that added token). The documents' ids follow one another in the order given, cut into
// DIR/train_000000.bin, … of --shard-tokens ids (default 100,000,000, as llm.c's), in GPT-2's
// format when every id of the tokenizer fits in 16 bits, else Llama 3's. DIR must hold no .bin
// files yet; when an input is bad, what was written is removed.
//
// Exit codes: 0 written; 2 bad flags or input (a file that is missing or not UTF-8, named); 1
// anything else.
#ifndef TRAINYARD_WORKER_TOKENIZE_COMMAND_H_
#define TRAINYARD_WORKER_TOKENIZE_COMMAND_H_

namespace trainyard::worker {

bool IsTokenizeInvocation(int argc, char** argv);
int RunTokenize(int argc, char** argv);

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_TOKENIZE_COMMAND_H_
