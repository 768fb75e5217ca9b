// `trainyard export --format llmc`: a GPT-2 checkpoint of any mesh as an llm.c model file
// (`gpt2_124M.bin`'s layout, which llm.c's train_gpt2 loads), the format model.init_from reads.
//
// The file: a header of 256 int32 (magic 20240326, version 3 for fp32 or 5 for bf16, max_seq,
// vocab, layers, heads, channels, the padded vocabulary), then the parameters back to back, each
// kind for all layers together: wte [Vp, C] (rows past the vocabulary zero; Vp the vocabulary
// rounded up to a multiple of 128, as llm.c pads it), wpe, ln1w, ln1b, qkvw, qkvb, attprojw,
// attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb. llm.c's weights are [out, in]
// like Trainyard's, so every tensor is copied as it is (bf16: rounded to nearest even).
//
// llm.c's GPT-2 has tied embeddings, an MLP of 4 × width and no experts; any other model is
// refused naming the field. One tensor is in memory at a time; the file is written under a
// temporary name, synced and renamed into place.
//
// Threading: plain functions.
#ifndef TRAINYARD_WORKER_CONVERT_LLMC_EXPORT_H_
#define TRAINYARD_WORKER_CONVERT_LLMC_EXPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/filesystem.h"
#include "worker/convert/hf_export.h"

namespace trainyard::worker::convert {

// Exports `source` (a checkpoint, or a checkpoint root's newest intact one) to the file
// `options.out_dir` names (which must not exist); options.dtype F32 writes version 3, BF16
// version 5; max_shard_bytes must be 0. INVALID_ARGUMENT for bad input, DATA_LOSS for a damaged
// checkpoint. ExportResult.files is 1.
[[nodiscard]] absl::StatusOr<ExportResult> ExportLlmc(FileSystem& fs, const std::string& source,
                                                      const ExportOptions& options);

}  // namespace trainyard::worker::convert

#endif  // TRAINYARD_WORKER_CONVERT_LLMC_EXPORT_H_
