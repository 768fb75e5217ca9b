#!/usr/bin/env python3
"""Write llm.c token shards (.bin) that Trainyard's `bin` data source reads.

Format: a header of 256 little-endian int32 ([0] magic 20240520, [1] version 1, [2] token count,
the rest zero) followed by that many little-endian uint16 tokens.

Examples:
  write_bin_shard.py out.bin --text corpus.txt            # the file's bytes as tokens (vocab 256)
  write_bin_shard.py out.bin --random 100000 --vocab 512 --seed 7
  write_bin_shard.py data/train.bin --text corpus.txt --shard-tokens 1000000
      # -> data/train_000000.bin, data/train_000001.bin, ... (read them with path 'data/train_*.bin')

Only the Python standard library is used.
"""

import argparse
import array
import os
import random
import struct
import sys

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
MAX_SHARD_TOKENS = 2**31 - 1  # the count is an int32


def write_shard(path, tokens):
    """Writes one shard holding `tokens` (an array('H')) to `path`."""
    if not 0 < len(tokens) <= MAX_SHARD_TOKENS:
        raise ValueError(f"{path}: a shard holds 1 to {MAX_SHARD_TOKENS} tokens, not {len(tokens)}")
    header = struct.pack("<3i", MAGIC, VERSION, len(tokens)) + bytes(4 * (HEADER_INTS - 3))
    body = array.array("H", tokens)
    if sys.byteorder == "big":
        body.byteswap()
    with open(path, "wb") as f:
        f.write(header)
        f.write(body.tobytes())


def shard_paths(out, count):
    """`out` itself for one shard; otherwise out's stem with _000000, _000001, ... suffixes."""
    if count == 1:
        return [out]
    stem, ext = os.path.splitext(out)
    return [f"{stem}_{i:06d}{ext or '.bin'}" for i in range(count)]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="output shard path (the stem of the shard names with --shard-tokens)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", metavar="FILE", help="use the bytes of FILE as tokens")
    source.add_argument("--random", metavar="N", type=int, help="N uniformly random tokens")
    parser.add_argument("--vocab", type=int, default=50257,
                        help="random tokens are drawn from [0, VOCAB) (default 50257)")
    parser.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")
    parser.add_argument("--shard-tokens", type=int, metavar="K",
                        help="split into shards of at most K tokens")
    args = parser.parse_args(argv)

    if args.text is not None:
        with open(args.text, "rb") as f:
            # Not array("H", bytes): that would reinterpret byte pairs as uint16 values.
            tokens = array.array("H", list(f.read()))
    else:
        if args.random <= 0:
            parser.error("--random needs a positive token count")
        if not 1 <= args.vocab <= 65536:
            parser.error("--vocab must lie in [1, 65536] (tokens are uint16)")
        rng = random.Random(args.seed)
        tokens = array.array("H", (rng.randrange(args.vocab) for _ in range(args.random)))
    if not tokens:
        parser.error("no tokens to write (empty input)")

    per_shard = args.shard_tokens or min(len(tokens), MAX_SHARD_TOKENS)
    if per_shard <= 0 or per_shard > MAX_SHARD_TOKENS:
        parser.error(f"--shard-tokens must lie in [1, {MAX_SHARD_TOKENS}]")
    count = (len(tokens) + per_shard - 1) // per_shard
    for i, path in enumerate(shard_paths(args.out, count)):
        part = tokens[i * per_shard:(i + 1) * per_shard]
        write_shard(path, part)
        print(f"{path}: {len(part)} tokens")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ValueError) as error:
        print(f"write_bin_shard: error: {error}", file=sys.stderr)
        sys.exit(1)
