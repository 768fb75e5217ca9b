#!/usr/bin/python3
"""Writes a GPT-2 model directory in Hugging Face's format as an llm.c model file.

Usage: write_llmc.py MODEL_DIR OUT_FILE [--version 3|5] [--padded-vocab VP]

The layout is llm.c's (train_gpt2.c, gpt2_build_from_checkpoint): a header of 256 int32 —
magic 20240326, version (3: float32 parameters, 5: bfloat16), max_seq_len, vocab_size,
num_layers, num_heads, channels, padded_vocab_size — then the parameters back to back, each kind
for all layers together, in the order wte [Vp, C] (rows past vocab_size zero), wpe [maxT, C],
ln1w [L, C], ln1b [L, C], qkvw [L, 3C, C], qkvb [L, 3C], attprojw [L, C, C], attprojb [L, C],
ln2w [L, C], ln2b [L, C], fcw [L, 4C, C], fcb [L, 4C], fcprojw [L, C, 4C], fcprojb [L, C],
lnfw [C], lnfb [C]. llm.c's matmuls take weights [out, in], so Hugging Face's Conv1D weights
([in, out]) are transposed. bfloat16 values are rounded to nearest even.

The model is read with hf_oracle.py's strict reader. Exit status 0, or 2 with one line on stderr.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_oracle  # noqa: E402

MAGIC = 20240326


def to_bf16_bits(values):
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def llmc_tensors(model, w, padded):
    L = model.layers
    wte = np.zeros((padded, model.width))
    wte[: model.vocab] = w["wte.weight"]

    def stack(suffix, transpose=False):
        parts = [w["h.%d.%s" % (i, suffix)] for i in range(L)]
        return np.stack([p.T if transpose else p for p in parts])

    return [wte, w["wpe.weight"],
            stack("ln_1.weight"), stack("ln_1.bias"),
            stack("attn.c_attn.weight", True), stack("attn.c_attn.bias"),
            stack("attn.c_proj.weight", True), stack("attn.c_proj.bias"),
            stack("ln_2.weight"), stack("ln_2.bias"),
            stack("mlp.c_fc.weight", True), stack("mlp.c_fc.bias"),
            stack("mlp.c_proj.weight", True), stack("mlp.c_proj.bias"),
            w["ln_f.weight"], w["ln_f.bias"]]


def run(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_file")
    parser.add_argument("--version", type=int, choices=(3, 5), default=3)
    parser.add_argument("--padded-vocab", type=int, default=0)
    args = parser.parse_args(argv)
    model = hf_oracle.read_config(args.model_dir)
    if not isinstance(model, hf_oracle.Gpt2) or not model.tied or model.inner != 4 * model.width:
        raise hf_oracle.InputError("%s: llm.c holds a tied GPT-2 with a 4x MLP only"
                                   % args.model_dir)
    weights = hf_oracle.load_weights(model, args.model_dir)
    padded = args.padded_vocab or (model.vocab + 127) // 128 * 128
    header = np.zeros(256, dtype="<i4")
    header[:8] = [MAGIC, args.version, model.positions, model.vocab, model.layers, model.heads,
                  model.width, padded]
    with open(args.out_file, "wb") as f:
        f.write(header.tobytes())
        for t in llmc_tensors(model, weights, padded):
            flat = np.ascontiguousarray(t, dtype="<f4").reshape(-1)
            f.write((flat if args.version == 3 else to_bf16_bits(flat)).tobytes())


def main(argv):
    try:
        run(argv[1:])
    except hf_oracle.InputError as e:
        sys.stderr.write("write_llmc: %s\n" % e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
