"""An independent byte-level BPE tokenizer, the oracle for Trainyard's (worker/data/tokenizer.h).

It follows the algorithm as OpenAI published it for GPT-2 and as Hugging Face's `tokenizers`
documents it for tokenizer.json: split the text at added tokens, then by the pre-tokenizer's
pattern (Python's `regex` module, which has the look-ahead and Unicode classes the patterns
use), map each piece's bytes to the byte-level alphabet, and merge the lowest-ranked adjacent
pair until none is left. It shares no code with Trainyard.

SentencePiece's alphabet (Llama 2's, Mistral's) is the same merging over characters instead of
bytes: spaces become "▁", one is put before the text (Llama 2 before every stretch between added
tokens, Mistral's Metaspace only at the start), and a character the vocabulary lacks becomes its
UTF-8 bytes' <0xNN> tokens, or the unknown token (consecutive ones fused) when one is missing,
before any merge, in the order `tokenizers`' BPE model gives them (see Oracle.symbols).

  bpe_oracle.py cases STYLE DIR
      trains a small tokenizer of STYLE (gpt2: ByteLevel's own pattern; llama3: a Split by
      Llama 3's pattern, ignore_merges, added tokens and a <|begin_of_text|> template; llama2:
      Llama 2's normalizer and decoder, byte fallback, <unk> and a <s> template; mistral: a
      Metaspace pre-tokenizer putting "▁" only at the start; qwen2: Qwen2's pattern, its NFC
      normalizer, its added tokens, no template) on a built-in corpus, and writes
      DIR/tokenizer.json, DIR/texts.json (texts chosen to reach every branch, and random ones) and
      DIR/ids.json (each text's ids).
"""

import collections
import json
import os
import random
import sys
import unicodedata

import regex

GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                 r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

CORPUS = """The quick brown fox jumps over the lazy dog. It's what they'll say: we're here,
you've seen it, I'd know, and he's gone. Numbers like 12, 345 and 67890 appear in 2024 and 1999.
    Indented lines, tabs\tand  double  spaces,
trailing spaces   
Café naïve résumé — déjà vu; Grüße aus München. Ελληνικά κείμενα. Русский текст.
日本語のテキストと中文文本。 한국어 문장.
Emoji 🙂🚀 and symbols ©®™ ±×÷ … «quotes» "double" 'single'.
def f(x):\r\n    return x ** 2  # code\n\n\nThe end.
"""

# Characters the random texts are drawn from: every class the patterns tell apart.
ALPHABET = (list("abcXYZ") + list("019") + list(" \t\n\r") +
            list("'s'T'll") + list("!?.,-#") + ["é", "ß", "Ж", "日", "語", "🙂", "١", "Ⅻ",
                                                  "\u00a0", "\u3000", "\u2028", "\x0b",
                                                  "\x85", "\u00ad", "\x7f", "\x00"])
# And for the NFC normalizer: combining marks of several classes, a precomposed letter, Hangul
# jamo, a singleton (Ångström sign), a composition exclusion (U+0958), a Hangul syllable.
NFC_ALPHABET = ["e", "a", "\u0301", "\u0302", "\u0323", "\u0308", "\u0327", "\u00e9", "\u1100",
                "\u1161", "\u11a8", "\u212b", "\u0958", "\uac00", "\u0915", "\u093c"]


def byte_alphabet():
    """Byte b as one printable character: Latin-1's printable bytes stand for themselves, the rest
    for U+0100 upwards in byte order."""
    kept = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in kept:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


BYTES = byte_alphabet()


def to_alphabet(text):
    return "".join(BYTES[b] for b in text.encode("utf-8"))


def isolated_pieces(pattern, text):
    """The matches of `pattern` and the stretches between them, in order."""
    pieces, at = [], 0
    for m in regex.finditer(pattern, text):
        if m.start() == m.end():
            continue
        if m.start() > at:
            pieces.append(text[at:m.start()])
        pieces.append(m.group())
        at = m.end()
    if at < len(text):
        pieces.append(text[at:])
    return pieces


def merge(parts, pair):
    """`parts` with each occurrence of `pair` joined, left to right."""
    out, i = [], 0
    while i < len(parts):
        if i + 1 < len(parts) and (parts[i], parts[i + 1]) == pair:
            out.append(parts[i] + parts[i + 1])
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return out


def learn_merges(words, vocab, merges_wanted):
    """Merges the most frequent adjacent pair of known symbols in `words` (word → count) until
    `merges_wanted` or none is left, adding each merged symbol to `vocab`."""
    merges = []
    while len(merges) < merges_wanted:
        pairs = collections.Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                if pair[0] in vocab and pair[1] in vocab:
                    pairs[pair] += count
        if not pairs:
            break
        pair, _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(pair)
        vocab[pair[0] + pair[1]] = len(vocab)
        merged_words = collections.Counter()
        for word, c in words.items():
            merged_words[tuple(merge(word, pair))] += c
        words = merged_words
    return merges


def train(pattern, merges_wanted):
    words = collections.Counter(
        tuple(to_alphabet(p)) for p in isolated_pieces(pattern, CORPUS))
    vocab = {BYTES[b]: b for b in range(256)}
    return vocab, learn_merges(words, vocab, merges_wanted)


META = "\u2581"
# Byte tokens left out of the SentencePiece vocabularies, so that a character needing one (the
# 4-byte ones: emoji) falls to <unk>.
MISSING_BYTES = range(0xF0, 0xF5)


def train_chars(merges_wanted):
    """A SentencePiece-style vocabulary: <unk> <s> </s>, the byte tokens, the corpus's characters
    seen twice or more, and merges over "▁"-led words."""
    text = META + CORPUS.replace(" ", META)
    words = collections.Counter(tuple(w) for w in regex.split("(?=" + META + ")", text) if w)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        if b not in MISSING_BYTES:
            vocab["<0x%02X>" % b] = len(vocab)
    chars = collections.Counter(c for w, n in words.items() for c in w for _ in range(n))
    for c, n in sorted(chars.items()):
        if n >= 2:
            vocab[c] = len(vocab)
    return vocab, learn_merges(words, vocab, merges_wanted)


def sentencepiece_json(style):
    vocab, merges = train_chars(300)
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>",
             "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
             "byte_fallback": True, "vocab": vocab, "merges": [a + " " + b for a, b in merges]}
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": META}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    bos = {"id": "<s>", "ids": [1], "tokens": ["<s>"]}
    template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [], "special_tokens": {"<s>": bos}}
    tok = {"version": "1.0", "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
           "post_processor": template, "decoder": decoder, "model": model}
    if style == "llama2":
        tok["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": META},
            {"type": "Replace", "pattern": {"String": " "}, "content": META}]}
        tok["pre_tokenizer"] = None
    else:
        tok["normalizer"] = None
        tok["pre_tokenizer"] = {"type": "Metaspace", "replacement": META,
                                "prepend_scheme": "first", "split": False}
    return tok


def added(token_id, content):
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True}


def tokenizer_json(style):
    if style in ("llama2", "mistral"):
        return sentencepiece_json(style)
    pattern = {"gpt2": GPT2_PATTERN, "qwen2": QWEN2_PATTERN}.get(style, LLAMA3_PATTERN)
    vocab, merges = train(pattern, 400)
    n = len(vocab)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": style == "gpt2"}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": style != "gpt2", "vocab": vocab}
    if style == "gpt2":
        model["merges"] = [a + " " + b for a, b in merges]
        return {"version": "1.0", "added_tokens": [added(n, "<|endoftext|>")],
                "normalizer": None, "pre_tokenizer": byte_level,
                "post_processor": dict(byte_level, add_prefix_space=True),
                "decoder": byte_level, "model": model}
    model["merges"] = [[a, b] for a, b in merges]
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": False}
    if style == "qwen2":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        return {"version": "1.0", "added_tokens": [added(n + i, s) for i, s in enumerate(specials)],
                "normalizer": {"type": "NFC"},
                "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                    split, dict(byte_level, use_regex=False, trim_offsets=False)]},
                "post_processor": dict(byte_level, trim_offsets=False),
                "decoder": byte_level, "model": model}
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eot|>", "<|eot|>!"]
    bos = {"id": specials[0], "ids": [n], "tokens": [specials[0]]}
    template = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": specials[0], "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [], "special_tokens": {specials[0]: bos}}
    return {"version": "1.0", "added_tokens": [added(n + i, s) for i, s in enumerate(specials)],
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]},
            "post_processor": {"type": "Sequence", "processors": [byte_level, template]},
            "decoder": byte_level, "model": model}


class Oracle:
    def __init__(self, tok):
        model = tok["model"]
        self.vocab = model["vocab"]
        self.ranks = {}
        for rank, m in enumerate(model["merges"]):
            pair = tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
            self.ranks[pair] = rank  # a repeated pair keeps its last rank
        self.ignore_merges = model.get("ignore_merges", False)
        self.added = sorted(((t["content"], t["id"]) for t in tok["added_tokens"]),
                            key=lambda kv: -len(kv[0]))
        pre = tok["pre_tokenizer"] or {"type": "none"}
        norm = tok.get("normalizer")
        self.nfc = norm is not None and norm["type"] == "NFC"
        if self.nfc:
            norm = None
        self.sentencepiece = norm is not None or pre["type"] == "Metaspace"
        self.prepend = ("every" if norm is not None else
                        pre.get("prepend_scheme", "always") if self.sentencepiece else None)
        self.unk_token = model.get("unk_token")
        self.fuse_unk = model.get("fuse_unk", False)
        self.byte_fallback = model.get("byte_fallback", False)
        if pre["type"] in ("none", "Metaspace"):
            self.patterns = []
        elif pre["type"] == "Sequence":
            self.patterns = [p["pattern"]["Regex"] for p in pre["pretokenizers"]
                             if p["type"] == "Split"]
        else:
            self.patterns = [GPT2_PATTERN]
        self.prefix = []
        post = tok.get("post_processor") or {}
        for p in post.get("processors", [post]):
            if p.get("type") == "TemplateProcessing":
                for item in p["single"]:
                    if "SpecialToken" in item:
                        self.prefix += p["special_tokens"][item["SpecialToken"]["id"]]["ids"]

    def symbols(self, word):
        """The word's characters as tokens, before any merge: a character the vocabulary lacks
        becomes its UTF-8 bytes' <0xNN> tokens when all are there, else the unknown token. An
        unknown token waits until a character the vocabulary has (or the word's end) and fuses
        with the next unknown one; byte tokens do not make it wait less, so they can come out
        before it. With no unknown token, such a character is dropped."""
        out, pending = [], False
        for c in word:
            if c in self.vocab:
                if pending:
                    out.append(self.unk_token)
                    pending = False
                out.append(c)
                continue
            fallback = ["<0x%02X>" % b for b in c.encode("utf-8")]
            if self.byte_fallback and all(f in self.vocab for f in fallback):
                out += fallback
            elif self.unk_token is not None:
                if pending and not self.fuse_unk:
                    out.append(self.unk_token)
                pending = True
        if pending:
            out.append(self.unk_token)
        return out

    def bpe(self, word):
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        parts = self.symbols(word) if self.sentencepiece else list(word)
        while len(parts) > 1:
            pair = min(zip(parts, parts[1:]), key=lambda p: self.ranks.get(p, float("inf")))
            if pair not in self.ranks:
                break
            parts = merge(parts, pair)
        return [self.vocab[p] for p in parts]

    def segment(self, text, first):
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        if self.sentencepiece:
            if not text:
                return []
            s = text.replace(" ", META)
            if self.prepend == "every" or (
                    (self.prepend == "always" or (self.prepend == "first" and first))
                    and not s.startswith(META)):
                s = META + s
            return self.bpe(s)
        pieces = [text] if text else []
        for pattern in self.patterns:
            pieces = [q for p in pieces for q in isolated_pieces(pattern, p)]
        return [i for p in pieces for i in self.bpe(to_alphabet(p))]

    def encode(self, text):
        ids, start, at = list(self.prefix), 0, 0
        while at < len(text):
            hit = next(((c, i) for c, i in self.added if text.startswith(c, at)), None)
            if hit is None:
                at += 1
                continue
            ids += self.segment(text[start:at], start == 0) + [hit[1]]
            at += len(hit[0])
            start = at
        return ids + self.segment(text[start:], start == 0)


STYLES = ["gpt2", "llama3", "llama2", "mistral", "qwen2"]


def texts(style):
    fixed = [CORPUS, "Hello   world!!  \n x", "a   b", "  leading", "trailing  ", " ", "\n\n\n",
             "x\r\n\r\ny", "I'm THEY'LL we'Re it's", "1234567 89", "naïve café 日本語 🙂",
             "tab\t\tsep", "a\u00a0\u00a0b c\u3000\u3000d", "end<|endoftext|>start <|eot_id|>",
             "<|eot|><|eot_id|>", "<|eot|>!!", "!!!...??", "<s>after a start", "x </s> y",
             " space first", "emoji 🙂🚀 runs 🙂a🚀", "x  \n  y", "\u2028line\u2028 sep", "¡soft\u00adhyphen"]
    rng = random.Random(20261204 + STYLES.index(style))
    alphabet = ALPHABET + NFC_ALPHABET * 2 if style == "qwen2" else ALPHABET
    rand = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(300)]
    if style == "qwen2":
        fixed += ["cafe\u0301 de\u0301ja\u0300", "e\u0302\u0323 a\u0301\u0301 \u212b \u0958",
                  "\u1100\u1161\u11a8 \uac00\u11a8 12345", "<|im_start|>e\u0301<|im_end|>\u0301"]
    return fixed + rand


def main():
    if (len(sys.argv) != 4 or sys.argv[1] != "cases" or
            sys.argv[2] not in STYLES):
        sys.exit(__doc__)
    style, out = sys.argv[2], sys.argv[3]
    tok = tokenizer_json(style)
    oracle = Oracle(tok)
    cases = texts(style)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out, "texts.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f)
    with open(os.path.join(out, "ids.json"), "w", encoding="utf-8") as f:
        json.dump([oracle.encode(t) for t in cases], f)


if __name__ == "__main__":
    main()
