// trainyard-worker as a user runs it: bad input of every kind ends with one line that names the
// problem and exit code 2 — never a crash, a hang or a stack trace; a good spec trains.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/device_probe.h"
#include "common/filesystem.h"
#include "config/model_config.h"
#include "gtest/gtest.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_env.h"
#include "tests/integration/tokenizer_files.h"
#include "worker/checkpoint/format.h"
#include "worker/data/bin_shards.h"

namespace trainyard::testenv {
namespace {

namespace fs = std::filesystem;

class WorkerCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeScratchDir("worker_cli"); }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string Write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }

  std::string Shard(const std::string& name, int32_t magic, int32_t version, int32_t count,
                    int32_t body_tokens) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
    for (int32_t i = 0; i < body_tokens; ++i) {
      const uint16_t tok = static_cast<uint16_t>(i % 200);
      bytes.append(reinterpret_cast<const char*>(&tok), 2);
    }
    return Write(name, bytes);
  }

  std::string BinSpec(const std::string& shard) {
    return Write(
        "spec.yaml",
        absl::StrCat("name: t\nmodel:\n  preset: gpt2-debug\ndata:\n  source: bin\n"
                     "  path: ",
                     shard,
                     "\ntraining:\n  steps: 2\n  warmup_steps: 1\n  batch: 2\n  seq_len: 16\n"));
  }

  ProcessResult Worker(const std::vector<std::string>& args) {
    std::vector<std::string> argv{BinaryDir() + "/worker/trainyard-worker"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv, 60);
  }

  // Exit code 2 and exactly one line on stderr that contains `needle`.
  void ExpectBadInput(const ProcessResult& r, const std::string& needle) {
    ASSERT_FALSE(r.timed_out) << "hung";
    EXPECT_EQ(r.signal, 0) << "crashed: " << r.err;
    EXPECT_EQ(r.exit_code, 2) << r.err;
    std::vector<std::string> lines = absl::StrSplit(r.err, '\n', absl::SkipEmpty());
    ASSERT_GE(lines.size(), 1u);
    EXPECT_EQ(lines.size(), 1u) << r.err;
    EXPECT_NE(lines[0].find(needle), std::string::npos)
        << "'" << lines[0] << "' lacks '" << needle << "'";
  }

  fs::path dir_;
};

TEST_F(WorkerCli, MalformedYaml) {
  ExpectBadInput(Worker({"--standalone", Write("s.yaml", "name: [unclosed\nmodel: {\n")}),
                 "s.yaml:");
}

TEST_F(WorkerCli, MissingSpecFile) {
  ExpectBadInput(Worker({"--standalone", (dir_ / "nope.yaml").string()}), "nope.yaml");
}

TEST_F(WorkerCli, WidthNotDivisibleByHeads) {
  ExpectBadInput(Worker({"--standalone", Write("s.yaml",
                                               "name: t\nmodel:\n  preset: gpt2-debug\n"
                                               "  width: 100\n  heads: 3\n")}),
                 "model.heads");
}

// Two chunks on each of two pipeline ranks need layers in four equal chunks; gpt2-debug has two.
TEST_F(WorkerCli, InterleavedScheduleOverTooFewLayers) {
  ExpectBadInput(
      Worker({"--standalone",
              Write("s.yaml",
                    "name: t\nmodel:\n  preset: gpt2-debug\nresources: {devices_per_node: 2}\n"
                    "parallelism: {pp: 2, schedule: interleaved, virtual_stages: 2}\n"
                    "training: {batch: 8, micro_batch: 2}\n")}),
      "s.yaml:5:61: parallelism.virtual_stages: model.layers 2 do not split into pp 2 × "
      "virtual_stages 2 = 4 chunks");
}

TEST_F(WorkerCli, MissingDataFile) {
  ExpectBadInput(Worker({"--standalone", BinSpec((dir_ / "absent.bin").string())}), "absent.bin");
}

TEST_F(WorkerCli, ShardWithWrongMagic) {
  ExpectBadInput(Worker({"--standalone", BinSpec(Shard("bad.bin", 12345, 1, 1000, 1000))}),
                 "magic");
}

TEST_F(WorkerCli, TruncatedShard) {
  ExpectBadInput(Worker({"--standalone", BinSpec(Shard("short.bin", 20240520, 1, 5000, 100))}),
                 "truncated");
}

TEST_F(WorkerCli, UnknownFlag) { ExpectBadInput(Worker({"--bogus"}), "--bogus"); }

// --help describes both modes: standalone, and coordinated (how the agent starts a rank).
TEST_F(WorkerCli, HelpDescribesBothModes) {
  const ProcessResult help = Worker({"--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("--standalone SPEC.yaml"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--coordinator HOST:PORT --job JOB --attempt N --rank R"),
            std::string::npos)
      << help.out;
  EXPECT_NE(help.out.find("TRAINYARD_MEMORY_TIER"), std::string::npos) << help.out;
}

// A GPU job where no GPU can be used (none present, or a build without CUDA): one line that says
// so and why, exit code 2 — not a crash in the CUDA runtime.
TEST_F(WorkerCli, GpuJobWithoutAGpu) {
  if (SystemDeviceProbe().Probe().count > 0) GTEST_SKIP() << "this machine has a GPU";
  ExpectBadInput(Worker({"--standalone", Write("s.yaml",
                                               "name: t\nmodel:\n  preset: gpt2-debug\n"
                                               "resources: {kind: gpu}\n")}),
                 "cannot use a GPU");
}

// --threads sizes the CPU backend: with a GPU spec it would do nothing, so it is refused, on any
// machine, before a device is looked for.
TEST_F(WorkerCli, ThreadsWithAGpuSpec) {
  ExpectBadInput(Worker({"--standalone",
                         Write("s.yaml",
                               "name: t\nmodel:\n  preset: gpt2-debug\n"
                               "resources: {kind: gpu}\n"),
                         "--threads", "2"}),
                 "--threads is not used with a GPU spec");
}

TEST_F(WorkerCli, TrainsOnAValidShard) {
  const ProcessResult r =
      Worker({"--standalone", BinSpec(Shard("ok.bin", 20240520, 1, 5000, 5000))});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("done: 2 steps"), std::string::npos) << r.out;
}

// `tokenize` writes what the tokenizer makes of each file, after the separator, in order and cut
// into shards of the size asked, which a job then trains on; ids beyond 16 bits take Llama 3's
// format. Bad input is one line, and leaves nothing behind.
TEST_F(WorkerCli, TokenizesTextIntoShardsAJobTrainsOn) {
  const std::string tokenizer = Write("tok.json", ReversedBytesTokenizer());
  std::string a, b;
  for (int i = 0; i < 300; ++i) a += "The quick brown fox. ";
  for (int i = 0; i < 100; ++i) b += "caf\u00e9 \u65e5\u672c ";
  const std::string out = (dir_ / "shards").string();
  const ProcessResult r =
      Worker({"tokenize", Write("a.txt", a), Write("b.txt", b), "--tokenizer", tokenizer, "--out",
              out, "--separator", "\n", "--shard-tokens", "2000", "--threads", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string text = "\n" + a + "\n" + b;
  EXPECT_NE(r.out.find(absl::StrCat("tokenized 2 files, 2 documents (", a.size() + b.size(),
                                    " bytes of text) into ", text.size(),
                                    " tokens: ", (text.size() + 1999) / 2000, " shards")),
            std::string::npos)
      << r.out;
  auto stream = worker::BinShardStream::Open(out + "/train_*.bin", *RealFileSystem());
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_EQ((*stream)->size(), static_cast<int64_t>(text.size()));
  std::vector<int32_t> ids(text.size());
  (*stream)->Read(0, (*stream)->size(), ids.data());
  for (size_t i = 0; i < text.size(); ++i) {
    ASSERT_EQ(ids[i], 255 - static_cast<uint8_t>(text[i])) << "at " << i;  // byte b is 255 − b
  }
  EXPECT_EQ(fs::file_size(out + "/train_000000.bin"), 1024u + 2 * 2000);
  const ProcessResult trained = Worker({"--standalone", BinSpec(out + "/train_*.bin")});
  EXPECT_EQ(trained.exit_code, 0) << trained.err;
  EXPECT_NE(trained.out.find("done: 2 steps"), std::string::npos) << trained.out;

  // An added token numbered beyond 16 bits: 32-bit ids.
  std::string wide_json = ReversedBytesTokenizer(/*added=*/1);
  const std::string first_added = "\"id\": 256";
  wide_json.replace(wide_json.find(first_added), first_added.size(), "\"id\": 70000");
  const std::string wide = (dir_ / "wide").string();
  const ProcessResult w = Worker({"tokenize", Write("c.txt", "x<|x0|>"), "--tokenizer",
                                  Write("wide.json", wide_json), "--out", wide});
  ASSERT_EQ(w.exit_code, 0) << w.err;
  EXPECT_NE(w.out.find("32-bit ids (Llama 3's llm.c format)"), std::string::npos) << w.out;
  auto wide_stream = worker::BinShardStream::Open(wide + "/train_000000.bin", *RealFileSystem());
  ASSERT_TRUE(wide_stream.ok()) << wide_stream.status();
  std::vector<int32_t> wide_ids(2);
  (*wide_stream)->Read(0, 2, wide_ids.data());
  EXPECT_EQ(wide_ids, (std::vector<int32_t>{255 - 'x', 70000}));

  const std::string none = (dir_ / "none").string();
  auto tokenize = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "tokenize");
    return Worker(args);
  };
  ExpectBadInput(tokenize({Write("ok.txt", "fine"), Write("bad.txt", "caf\xe9"), "--tokenizer",
                           tokenizer, "--out", none, "--shard-tokens", "1", "--separator", "=="}),
                 "bad.txt: the text is not UTF-8 (at byte 3)");
  EXPECT_FALSE(fs::exists(none));  // the shard of ok.txt, and the directory, removed
  ExpectBadInput(tokenize({(dir_ / "a.txt").string(), "--tokenizer", tokenizer, "--out", out}),
                 "already holds shards (train_000000.bin)");
  ExpectBadInput(tokenize({(dir_ / "gone.txt").string(), "--tokenizer", tokenizer, "--out", none}),
                 "gone.txt: no such file");
  ExpectBadInput(tokenize({dir_.string(), "--tokenizer", tokenizer, "--out", none}),
                 "a directory; give the text files in it");
  ExpectBadInput(tokenize({(dir_ / "a.txt").string(), "--tokenizer", tokenizer, "--out", none,
                           "--shard-tokens", "0"}),
                 "--shard-tokens must be from 1 to 2147483647");
  ExpectBadInput(tokenize({"--tokenizer", tokenizer, "--out", none}), "no text files given");
  ExpectBadInput(tokenize({(dir_ / "a.txt").string(), "--out", none}), "--tokenizer is required");
  ExpectBadInput(tokenize({(dir_ / "a.txt").string(), "--tokenizer", tokenizer}),
                 "--out is required");
  ExpectBadInput(tokenize({(dir_ / "a.txt").string(), "--tokenizer", tokenizer, "--out", none,
                           "--separator", "\xff"}),
                 "--separator: the text is not UTF-8");
  EXPECT_FALSE(fs::exists(none));
}

// JSON Lines, compressed or not: each line's --field is a document, in order; a line that is not
// JSON is named with its line number.
TEST_F(WorkerCli, TokenizesJsonLinesDocuments) {
  const std::string tokenizer = Write("tok.json", ReversedBytesTokenizer());
  const std::string lines =
      Write("d.jsonl", "{\"text\": \"ab\", \"id\": 1}\n\n{\"text\": \"c\\n\"}\n");
  ASSERT_EQ(std::system(absl::StrCat("gzip -k '", lines, "'").c_str()), 0);
  const std::string out = (dir_ / "jl").string();
  const ProcessResult r = Worker({"tokenize", lines + ".gz", lines, "--field", "text",
                                  "--tokenizer", tokenizer, "--out", out, "--separator", "|"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tokenized 2 files, 4 documents (8 bytes of text) into 12 tokens"),
            std::string::npos)
      << r.out;
  auto stream = worker::BinShardStream::Open(out + "/train_000000.bin", *RealFileSystem());
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<int32_t> ids(12);
  (*stream)->Read(0, 12, ids.data());
  const std::string text = "|ab|c\n|ab|c\n";
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], 255 - text[i]) << "at " << i;
  const std::string nested = (dir_ / "a" / "b" / "c").string();
  ExpectBadInput(Worker({"tokenize", lines, Write("e.jsonl", "{\"text\": \"x\"}\nnot json\n"),
                         "--field", "text", "--tokenizer", tokenizer, "--out", nested}),
                 "e.jsonl:2: not a JSON object");
  EXPECT_FALSE(fs::exists(dir_ / "a"));  // the directories it made for --out, too
  ExpectBadInput(Worker({"tokenize", lines, "--field", "text", "--tokenizer", tokenizer, "--out",
                         nested, "--threads", "2000"}),
                 "--threads must be from 0 (every core) to 1024, got 2000");

  // Through the CLI, with more threads than documents and one document far longer than the rest:
  // the runs still come out in order.
  std::string uneven = absl::StrCat("{\"text\": \"", std::string(5000, 'L'), "\"}\n");
  std::string expected = "|" + std::string(5000, 'L');
  for (int i = 0; i < 5; ++i) {
    absl::StrAppend(&uneven, "{\"text\": \"s", i, "\"}\n");
    absl::StrAppend(&expected, "|s", i);
  }
  const std::string cli_out = (dir_ / "cli").string();
  const ProcessResult cli = RunProcess(
      {BinaryDir() + "/tools/cli/trainyard", "tokenize", Write("u.jsonl", uneven), "--field",
       "text", "--tokenizer", tokenizer, "--out", cli_out, "--separator", "|", "--threads", "16"},
      60);
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  auto cli_stream = worker::BinShardStream::Open(cli_out + "/train_000000.bin", *RealFileSystem());
  ASSERT_TRUE(cli_stream.ok()) << cli_stream.status();
  ASSERT_EQ((*cli_stream)->size(), static_cast<int64_t>(expected.size()));
  std::vector<int32_t> cli_ids(expected.size());
  (*cli_stream)->Read(0, (*cli_stream)->size(), cli_ids.data());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(cli_ids[i], 255 - expected[i]) << "at " << i;
  }
}

// checkpoint.resume_from that cannot be used: one line naming the problem, exit code 2, and
// nothing written (checkpoint.dir is not even created).
class WorkerResumeFrom : public WorkerCli {
 protected:
  std::string ResumeSpec(const std::string& preset, const std::string& from) {
    return Write("resume.yaml",
                 absl::StrCat("name: t\nmodel: {preset: ", preset,
                              "}\ntraining: {steps: 2, warmup_steps: 1, batch: 2, seq_len: 16, "
                              "eval_every: 0}\ncheckpoint: {dir: ",
                              (dir_ / "out").string(), ", resume_from: ", from, "}\n"));
  }
  void ExpectNothingWritten() { EXPECT_FALSE(fs::exists(dir_ / "out")); }
};

TEST_F(WorkerResumeFrom, MissingPath) {
  ExpectBadInput(Worker({"--standalone", ResumeSpec("gpt2-debug", (dir_ / "gone").string())}),
                 "checkpoint.resume_from: ");
  ExpectNothingWritten();
}

TEST_F(WorkerResumeFrom, DirectoryWithoutCheckpoints) {
  fs::create_directories(dir_ / "empty");
  std::ofstream(dir_ / "empty" / "notes.txt") << "not a checkpoint";
  ExpectBadInput(Worker({"--standalone", ResumeSpec("gpt2-debug", (dir_ / "empty").string())}),
                 "is not a checkpoint");
  ExpectNothingWritten();
}

TEST_F(WorkerResumeFrom, CheckpointOfAnotherModel) {
  const std::string saved = Write(
      "saved.yaml", absl::StrCat("name: t\nmodel: {preset: gpt2-debug}\n"
                                 "training: {steps: 2, warmup_steps: 1, batch: 2, seq_len: 16, "
                                 "eval_every: 0}\ncheckpoint: {dir: ",
                                 (dir_ / "saved").string(), "}\n"));
  const ProcessResult first = Worker({"--standalone", saved});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ExpectBadInput(Worker({"--standalone", ResumeSpec("llama-debug", (dir_ / "saved").string())}),
                 "model.family is gpt2 in the checkpoint, llama in the spec");
  ExpectNothingWritten();
  // The same checkpoint loads into the same model, from the directory or the checkpoint itself.
  const ProcessResult resumed =
      Worker({"--standalone", ResumeSpec("gpt2-debug", (dir_ / "saved").string())});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from step 2: "), std::string::npos) << resumed.out;
}

// Weights in and out from the command line: model.init_from that cannot be used, and export and
// sample with bad input, each end with one line naming the file (and tensor), exit code 2, and
// nothing written.
class WorkerWeights : public WorkerCli {
 protected:
  void SetUp() override {
    WorkerCli::SetUp();
    // A checkpoint of gpt2-debug to export and sample from.
    const ProcessResult trained = Worker({"--standalone", Spec("saved.yaml", "")});
    ASSERT_EQ(trained.exit_code, 0) << trained.err;
  }
  std::string Spec(const std::string& name, const std::string& init_from) {
    return Write(name,
                 absl::StrCat("name: t\nmodel: {preset: gpt2-debug",
                              init_from.empty() ? "" : ", init_from: " + init_from,
                              "}\ntraining: {steps: 2, warmup_steps: 1, batch: 2, "
                              "seq_len: 16, eval_every: 0}\ncheckpoint: {dir: ",
                              (dir_ / (init_from.empty() ? "saved" : "out")).string(), "}\n"));
  }
  // A Hugging Face directory exported from the checkpoint.
  std::string Exported(const std::string& name) {
    const ProcessResult r = Worker(
        {"export", (dir_ / "saved").string(), "--format", "hf", "--out", (dir_ / name).string()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return (dir_ / name).string();
  }
  void ExpectNothingWritten() { EXPECT_FALSE(fs::exists(dir_ / "out")); }
};

TEST_F(WorkerWeights, InitFromATruncatedFile) {
  const std::string hf = Exported("hf");
  const std::string file = hf + "/model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 4);
  ExpectBadInput(Worker({"--standalone", Spec("init.yaml", hf)}),
                 "model.init_from: " + file + ": tensor ");
  ExpectNothingWritten();
  fs::resize_file(file, 6);
  ExpectBadInput(Worker({"--standalone", Spec("init.yaml", hf)}), file + ": truncated");
  ExpectNothingWritten();
}

TEST_F(WorkerWeights, InitFromAnotherModel) {
  const std::string hf = Exported("hf");
  std::ifstream in(hf + "/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = config.find("\"n_layer\": 2");
  ASSERT_NE(at, std::string::npos) << config;
  config.replace(at, std::string("\"n_layer\": 2").size(), "\"n_layer\": 3");
  Write("hf/config.json", config);
  ExpectBadInput(Worker({"--standalone", Spec("init.yaml", hf)}),
                 "model.init_from: model.layers is 3 in " + hf + "/config.json, 2 in the spec");
  ExpectNothingWritten();
}

TEST_F(WorkerWeights, InitFromStartsTraining) {
  const ProcessResult r = Worker({"--standalone", Spec("init.yaml", Exported("hf"))});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("initialised from "), std::string::npos) << r.out;
}

TEST_F(WorkerWeights, ExportBadInput) {
  const std::string saved = (dir_ / "saved").string(), out = (dir_ / "out").string();
  ExpectBadInput(Worker({"export", (dir_ / "gone").string(), "--format", "hf", "--out", out}),
                 "gone: no such file or directory");
  ExpectBadInput(Worker({"export", saved, "--format", "onnx", "--out", out}),
                 "--format must be hf (Hugging Face) or llmc (llm.c), got 'onnx'");
  ExpectBadInput(
      Worker({"export", saved, "--format", "llmc", "--out", out, "--max-shard-size", "1MB"}),
      "--max-shard-size is not used with --format llmc");
  ExpectBadInput(Worker({"export", saved, "--format", "llmc"}), "--out FILE is required");
  ExpectBadInput(Worker({"export", saved, "--format", "hf", "--out", out, "--dtype", "fp8"}),
                 "--dtype");
  ExpectBadInput(Worker({"export", saved, "--format", "hf"}), "--out DIR is required");
  ExpectNothingWritten();
  fs::create_directories(out);
  Write("out/keep.txt", "mine");
  ExpectBadInput(Worker({"export", saved, "--format", "hf", "--out", out}), "is not empty");
  EXPECT_EQ(std::vector<fs::directory_entry>(fs::directory_iterator(out), {}).size(), 1u);
}

// An llm.c model file of gpt2-debug (vocabulary 256: no padding rows): llm.c's header and every
// parameter, and it samples as the checkpoint does. Over an existing file it is refused.
TEST_F(WorkerWeights, ExportLlmcFile) {
  const std::string saved = (dir_ / "saved").string(), bin = (dir_ / "model.bin").string();
  const ProcessResult r = Worker({"export", saved, "--format", "llmc", "--out", bin});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("exported step 2 of "), std::string::npos) << r.out;
  const config::ModelConfig m = *config::Preset("gpt2-debug");
  const int64_t c = m.width, l = m.layers;
  const int64_t numel = m.vocab * c + m.max_seq * c + l * (12 * c * c + 13 * c) + 2 * c;
  EXPECT_EQ(fs::file_size(bin), 1024 + 4 * numel);
  std::ifstream in(bin, std::ios::binary);
  int32_t header[8];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(
      std::vector<int32_t>(header, header + 8),
      (std::vector<int32_t>{20240326, 3, m.max_seq, m.vocab, m.layers, m.heads, m.width, m.vocab}));
  const ProcessResult from_file = Worker({"sample", bin, "--prompt", "hi", "--tokens", "8"});
  const ProcessResult from_saved = Worker({"sample", saved, "--prompt", "hi", "--tokens", "8"});
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_EQ(from_file.out, from_saved.out);
  ExpectBadInput(Worker({"export", saved, "--format", "llmc", "--out", bin}),
                 "model.bin exists (an llm.c export writes a new file)");
}

TEST_F(WorkerWeights, SampleBadInputAndGreedyText) {
  const std::string saved = (dir_ / "saved").string();
  ExpectBadInput(Worker({"sample", saved, "--prompt-tokens", "1 999"}),
                 "'999' is not a token id below the vocabulary of 256");
  ExpectBadInput(Worker({"sample", saved, "--prompt", "hi", "--tokens", "100"}),
                 "exceed the model's max_seq of 64");
  ExpectBadInput(Worker({"sample", saved}), "give one of --prompt TEXT and --prompt-tokens IDS");
  // Flags that greedy decoding (the default) or a CUDA model would ignore are refused by name.
  ExpectBadInput(Worker({"sample", saved, "--prompt", "hi", "--top-k", "5"}),
                 "--top-k is not used when --temperature is 0");
  ExpectBadInput(Worker({"sample", saved, "--prompt", "hi", "--temperature", "0", "--seed", "3"}),
                 "--seed is not used when --temperature is 0");
  ExpectBadInput(Worker({"sample", saved, "--prompt", "hi", "--device", "cuda", "--threads", "2"}),
                 "--threads is not used with --device cuda");
  const ProcessResult drawn = Worker({"sample", saved, "--prompt", "hi", "--tokens", "4",
                                      "--temperature", "0.9", "--top-k", "5", "--seed", "3"});
  EXPECT_EQ(drawn.exit_code, 0) << drawn.err;
  // gpt2-debug's vocabulary is bytes: the text comes back, then 8 more bytes, the same each time.
  const ProcessResult a = Worker({"sample", saved, "--prompt", "hi", "--tokens", "8"});
  const ProcessResult b = Worker({"sample", Exported("hf"), "--prompt", "hi", "--tokens", "8"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out.substr(0, 2), "hi");
  EXPECT_EQ(a.out.size(), 2u + 8u + 1u);
  EXPECT_EQ(a.out, b.out) << "the checkpoint and its export write the same";
}

// The text ends at an end-of-sequence token: --eos, or a Hugging Face directory's eos_token_id
// (generation_config.json, else config.json); the ids end with it, the text leaves it out.
// --top-p draws from the nucleus: a tiny one is greedy decoding. Tokens are drawn (a seed gives
// the same ones each time), since greedy ones repeat.
TEST_F(WorkerWeights, SampleEndsAtEndOfSequenceAndDrawsFromTheNucleus) {
  const std::string saved = (dir_ / "saved").string(), hf = Exported("hf");
  const ProcessResult all = Worker(
      {"sample", saved, "--prompt-tokens", "104 105", "--tokens", "12", "--temperature", "1"});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  std::vector<std::string> ids = absl::StrSplit(all.out, ' ', absl::SkipWhitespace());
  ASSERT_EQ(ids.size(), 12u) << all.out;
  for (std::string& id : ids) absl::StripAsciiWhitespace(&id);
  size_t last_new = 0;  // stopping there shows generation did not stop at an earlier token
  for (size_t i = 0; i < ids.size(); ++i) {
    if (std::find(ids.begin(), ids.begin() + i, ids[i]) == ids.begin() + i) last_new = i;
  }
  ASSERT_GE(last_new, 6u) << all.out;
  const std::string eos = ids[last_new];
  const std::string head = absl::StrJoin(ids.begin(), ids.begin() + last_new + 1, " ") + "\n";
  const std::string ended = absl::StrCat("ended at token ", eos, " after ", last_new + 1, " of 12");
  const ProcessResult flag = Worker({"sample", saved, "--prompt-tokens", "104 105", "--tokens",
                                     "12", "--temperature", "1", "--eos", eos + ",255"});
  ASSERT_EQ(flag.exit_code, 0) << flag.err;
  EXPECT_EQ(flag.out, head);
  EXPECT_NE(flag.err.find(ended), std::string::npos) << flag.err;

  std::stringstream config;
  config << std::ifstream(hf + "/config.json").rdbuf();
  Write("hf/config.json",
        absl::StrReplaceAll(config.str(),
                            {{"\"vocab_size\"", "\"eos_token_id\": " + eos + ", \"vocab_size\""}}));
  const ProcessResult from_config =
      Worker({"sample", hf, "--prompt-tokens", "104 105", "--tokens", "12", "--temperature", "1"});
  EXPECT_EQ(from_config.out, head) << from_config.err;
  // generation_config.json, when there is one, is what counts (transformers' generate).
  Write("hf/generation_config.json", "{\"eos_token_id\": null}");
  EXPECT_EQ(
      Worker({"sample", hf, "--prompt-tokens", "104 105", "--tokens", "12", "--temperature", "1"})
          .out,
      all.out);
  Write("hf/generation_config.json", absl::StrCat("{\"eos_token_id\": [255, ", eos, "]}"));
  const ProcessResult text =
      Worker({"sample", hf, "--prompt", "hi", "--tokens", "12", "--temperature", "1"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  std::string expected = "hi";
  for (size_t i = 0; i < last_new; ++i) expected += static_cast<char>(std::stoi(ids[i]));
  EXPECT_EQ(text.out, expected + "\n") << "the end-of-sequence token is not printed";
  EXPECT_NE(text.err.find(ended), std::string::npos) << text.err;
  EXPECT_EQ(Worker({"sample", hf, "--prompt-tokens", "104 105", "--tokens", "12", "--temperature",
                    "1", "--eos", "none"})
                .out,
            all.out);

  // A nucleus of the single most likely token is greedy decoding.
  const ProcessResult greedy =
      Worker({"sample", saved, "--prompt-tokens", "104 105", "--tokens", "12"});
  const std::string greedy_first = greedy.out.substr(0, greedy.out.find_first_of(" \n"));
  const ProcessResult nucleus = Worker({"sample", saved, "--prompt-tokens", "104 105", "--tokens",
                                        "12", "--temperature", "1", "--top-p", "1e-6"});
  EXPECT_NE(greedy.out, all.out);
  EXPECT_EQ(nucleus.out, greedy.out) << nucleus.err;
  // The trainyard CLI passes both flags on.
  const ProcessResult cli = RunProcess(
      {BinaryDir() + "/tools/cli/trainyard", "sample", saved, "--prompt-tokens", "104 105",
       "--tokens", "12", "--temperature", "1", "--top-p", "1e-6", "--eos", greedy_first},
      60);
  EXPECT_EQ(cli.out, greedy_first + "\n") << cli.err;

  ExpectBadInput(Worker({"sample", saved, "--prompt", "hi", "--top-p", "0.9"}),
                 "--top-p is not used when --temperature is 0");
  ExpectBadInput(Worker({"sample", saved, "--prompt", "hi", "--temperature", "1", "--top-p", "0"}),
                 "--top-p must be a number in (0, 1], got 0");
  ExpectBadInput(
      Worker({"sample", saved, "--prompt", "hi", "--temperature", "1", "--top-p", "1.5"}),
      "--top-p must be a number in (0, 1], got 1.5");
  ExpectBadInput(Worker({"sample", saved, "--prompt", "hi", "--eos", "x"}),
                 "--eos: 'x' is not a token id (give ids, or none)");
  ExpectBadInput(Worker({"sample", saved, "--prompt", "hi", "--eos", ","}),
                 "--eos holds no token ids");
  ExpectBadInput(Worker({"sample", saved, "--prompt", "hi", "--eos", "256"}),
                 "--eos: 256 is not a token id below the vocabulary of 256");
  Write("hf/generation_config.json", "{\"eos_token_id\": \"</s>\"}");
  ExpectBadInput(Worker({"sample", hf, "--prompt", "hi"}),
                 "generation_config.json: eos_token_id must be a token id below the vocabulary "
                 "of 256 or a list of them");
  Write("hf/generation_config.json", "{\"eos_token_id\": [1, 300]}");
  ExpectBadInput(Worker({"sample", hf, "--prompt", "hi"}),
                 "generation_config.json: eos_token_id must be a token id below");
}

// --prompt's text through a Hugging Face directory's tokenizer.json (or --tokenizer), and the
// new tokens back through it: the ids are those of the same prompt given as ids.
TEST_F(WorkerWeights, SampleThroughATokenizer) {
  const std::string hf = Exported("hf");
  Write("hf/tokenizer.json", testenv::ReversedBytesTokenizer());
  const ProcessResult text = Worker({"sample", hf, "--prompt", "hi", "--tokens", "8"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  const ProcessResult ids = Worker(
      {"sample", hf, "--prompt-tokens", absl::StrCat(255 - 'h', " ", 255 - 'i'), "--tokens", "8"});
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  std::string expected = "hi";
  for (absl::string_view id : absl::StrSplit(ids.out, ' ', absl::SkipWhitespace())) {
    expected += static_cast<char>(255 - std::stoi(std::string(id)));
  }
  EXPECT_EQ(text.out, expected + "\n");
  // The same tokenizer named for a checkpoint, which has none of its own.
  const std::string tokenizer = Write("tokenizer.json", testenv::ReversedBytesTokenizer());
  const ProcessResult saved = Worker({"sample", (dir_ / "saved").string(), "--prompt", "hi",
                                      "--tokens", "8", "--tokenizer", tokenizer});
  EXPECT_EQ(saved.out, text.out) << saved.err;

  ExpectBadInput(Worker({"sample", hf, "--prompt-tokens", "1", "--tokenizer", tokenizer}),
                 "--tokenizer is not used with --prompt-tokens");
  ExpectBadInput(Worker({"sample", hf, "--prompt", "caf\xe9"}),
                 "--prompt: the text is not UTF-8 (at byte 3)");
  ExpectBadInput(Worker({"sample", hf, "--prompt", "hi", "--tokenizer", hf + "/none.json"}),
                 "none.json: no such file");
  const std::string big = Write("big.json", testenv::ReversedBytesTokenizer(/*added=*/2));
  ExpectBadInput(Worker({"sample", hf, "--prompt", "hi", "--tokenizer", big}),
                 "the tokenizer has ids up to 257, beyond the model's vocabulary of 256");
  Write("hf/tokenizer.json",
        R"({"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
    "model": {"type": "Unigram"}})");
  ExpectBadInput(Worker({"sample", hf, "--prompt", "hi"}),
                 "tokenizer.json: model.type is \"Unigram\"; Trainyard reads BPE");
}

// A mixture-of-experts checkpoint samples like a dense one, by the routing it was trained with
// (the manifest records it); one of a shape no layout holds does not export. One written
// before the manifest recorded the routing is refused.
TEST_F(WorkerWeights, SampleAnMoeCheckpoint) {
  const std::string moe = (dir_ / "moe").string();
  const ProcessResult trained = Worker(
      {"--standalone",
       Write("moe.yaml", absl::StrCat("name: t\nmodel: {preset: llama-debug, moe: {experts: 4, "
                                      "top_k: 2, shared_experts: 1, every: 2, score: sigmoid, "
                                      "balance: bias}}\ntraining: {steps: 2, warmup_steps: 1, "
                                      "batch: 2, seq_len: 16, eval_every: 0}\ncheckpoint: {dir: ",
                                      moe, "}\n"))});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const ProcessResult a = Worker({"sample", moe, "--prompt", "hi", "--tokens", "8"});
  const ProcessResult b = Worker({"sample", moe, "--prompt", "hi", "--tokens", "8"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out.size(), 2u + 8u + 1u);
  EXPECT_EQ(a.out, b.out);
  ExpectBadInput(Worker({"sample", moe, "--prompt", "hi", "--device", "cuda"}),
                 "a mixture-of-experts model samples on the CPU for now");
  // Its routing (sigmoid scores, a selection bias) is GLM-4.5's, the one Hugging Face layout
  // Trainyard writes for it, which has no MoE block every second.
  ExpectBadInput(Worker({"export", moe, "--format", "hf", "--out", (dir_ / "out").string()}),
                 "model.moe.every: is 2; Trainyard writes a mixture of experts with sigmoid "
                 "scores, a selection bias, dense first blocks, scaled weights or expert groups "
                 "in GLM-4.5's layout only");
  ExpectBadInput(Worker({"export", moe, "--format", "llmc", "--out", (dir_ / "out").string()}),
                 "model.family is llama; llm.c's model file holds a GPT-2");
  ExpectNothingWritten();

  auto& files = *RealFileSystem();
  const auto saved = worker::checkpoint::ListCommitted(files, moe);
  ASSERT_TRUE(saved.ok() && !saved->empty()) << saved.status();
  auto manifest = worker::checkpoint::ReadManifest(files, saved->front());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_EQ(manifest->model().moe().top_k(), 2);
  manifest->mutable_model()->mutable_moe()->clear_top_k();
  manifest->mutable_model()->mutable_moe()->clear_sigmoid_score();
  manifest->mutable_model()->mutable_moe()->clear_normalize_top_k();
  std::ofstream(worker::checkpoint::JoinPath(saved->front(), worker::checkpoint::kManifestName))
      << worker::checkpoint::SerializeManifest(*manifest);
  ExpectBadInput(Worker({"sample", moe, "--prompt", "hi"}),
                 "predates the recording of its routing");
}

}  // namespace
}  // namespace trainyard::testenv
