#!/usr/bin/env python3
"""Compares hybridlm's tokenizer made from a GGUF file's metadata with independent tokenizers of the same file:
  - llama.cpp's `llama-tokenize --no-parse-special` (when --llama-tokenize is given or on PATH): the ids
    hybridlm must equal, with BOS as the file says (hybridlm `tokenizer encode --add-special`) and without;
  - for "llama" vocabularies, the `sentencepiece` package running a SentencePiece BPE model built from the same
    pieces, scores and types (the model Gemma's tokenizer.model is), on texts without control tokens.
Texts cover spaces, newlines, tabs, digits, accents (composed and decomposed), CJK, emoji, code and random
mixes. Exit status 1 on any difference. Opt-in (tools/gguf_tokenizer/run.sh, ctest label `gguf`).

    python compare.py --gguf model.gguf --hybridlm build/release/hybridlm [--llama-tokenize PATH]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump_vocab import read_vocab  # noqa: E402

SPACE = "\u2581"

FIXED_TEXTS = [
    "Hello world",
    "Hello world! It's a test, isn't it? I'LL SEE, they'Re here.",
    "  leading spaces,\ttabs\t\tand\n\nnewlines\r\n  trailing  ",
    "one space  two spaces   three    four     five",
    "\n", "\n\n\n\n", " ", "   ", "\t", "a\n b\n\n  c\t\td",
    "3.14159 1,000,000 2024-06-01 0x1F 12345678901234567890",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber se\u00f1or \u0141\u00f3d\u017a",
    "cafe\u0301 nai\u0308ve",  # decomposed accents
    "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff0c\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4",
    "emoji \U0001F600\U0001F680\U0001F44D\U0001F3FD \u2764\ufe0f family \U0001F468\u200d\U0001F469\u200d\U0001F467",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "<table><tr><td>cell</td></tr></table> <b>bold</b>",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea \u0939\u093f\u0928\u094d\u0926\u0940 \u0e44\u0e17\u0e22",
    "mixed: abc\u4e2ddef \U0001F600x1\u00e92",
    "\u00a0non-breaking\u2009thin\u3000ideographic spaces",
    "a" * 300,
    "a literal \u2581 and \u2581\u2581 in the text",
]
SPECIAL_TEXTS = ["<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<bos>text<eos>"]


def random_texts(n, seed=0):
    rng = random.Random(seed)
    pool = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789 .,;:!?'\"()-\n\t") + \
        ["  ", "\u00e9", "\u00fc", "\u4e2d", "\u6587", "\u3002", "\U0001F600", "\u0301", "ing", "the", "\u00df"]
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 60))) for _ in range(n)]


def hybridlm_ids(binary, vocab_json, text, add_special):
    cmd = [binary, "tokenizer", "encode", "--tokenizer", vocab_json, "--text=" + text]
    if add_special:
        cmd.append("--add-special")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def llama_ids(binary, gguf_path, text, add_bos, workdir):
    path = os.path.join(workdir, "prompt.txt")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    # hybridlm reads control tokens written in a text as text, as llama.cpp does without parse_special.
    cmd = [binary, "-m", gguf_path, "-f", path, "--ids", "--log-disable", "--no-escape", "--no-parse-special"]
    if not add_bos:
        cmd.append("--no-bos")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def sentencepiece_model(vocab):
    """A SentencePiece BPE ModelProto from the GGUF pieces, as Gemma's tokenizer.model is: identity normalizer,
    spaces escaped, byte fallback, no dummy prefix unless add_space_prefix."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.vocab_size = len(vocab["tokenizer.ggml.tokens"])
    unk = vocab.get("tokenizer.ggml.unknown_token_id", 0)
    m.trainer_spec.unk_id = unk
    m.trainer_spec.bos_id = vocab.get("tokenizer.ggml.bos_token_id", -1)
    m.trainer_spec.eos_id = vocab.get("tokenizer.ggml.eos_token_id", -1)
    m.trainer_spec.pad_id = vocab.get("tokenizer.ggml.padding_token_id", -1)
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = vocab.get("tokenizer.ggml.add_space_prefix", True)
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    types = vocab.get("tokenizer.ggml.token_type") or [1] * len(vocab["tokenizer.ggml.tokens"])
    scores = vocab.get("tokenizer.ggml.scores") or [0.0] * len(types)
    for i, (text, score, kind) in enumerate(zip(vocab["tokenizer.ggml.tokens"], scores, types)):
        p = m.pieces.add()
        # llama.cpp's converter writes user-defined pieces with real spaces; SentencePiece keeps them escaped.
        p.piece = text.replace(" ", SPACE) if kind == 4 else text
        p.score = score
        p.type = 2 if i == unk else (kind if kind in (1, 3, 4, 5, 6) else 1)
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--hybridlm", required=True)
    ap.add_argument("--llama-tokenize", default=shutil.which("llama-tokenize"))
    ap.add_argument("--random", type=int, default=60, help="random texts besides the fixed ones")
    a = ap.parse_args()

    vocab, _ = read_vocab(a.gguf)
    work = tempfile.mkdtemp(prefix="hlm_gguf_tok_")
    vocab_json = os.path.join(work, "vocab.gguf.json")
    with open(vocab_json, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    texts = FIXED_TEXTS + random_texts(a.random)
    model = vocab["tokenizer.ggml.model"]
    print(f"{a.gguf}: {model} vocabulary of {len(vocab['tokenizer.ggml.tokens'])} tokens, {len(texts)} texts")

    failures = 0
    checks = 0

    def report(what, text, ours, theirs):
        nonlocal failures, checks
        checks += 1
        if ours != theirs:
            failures += 1
            print(f"DIFF {what} on {text!r}:\n  hybridlm {ours}\n  {what:8} {theirs}")

    sp = sentencepiece_model(vocab) if model == "llama" else None
    for text in texts + SPECIAL_TEXTS:
        ours = hybridlm_ids(a.hybridlm, vocab_json, text, add_special=False)
        # SentencePiece reads a U+2581 in the text as an escaped space and matches its user-defined "▁▁" pieces
        # there; llama.cpp's user-defined pieces are written with real spaces and matched before escaping.
        if sp is not None and SPACE not in text:
            report("spm", text, ours, sp.encode(text))
        if a.llama_tokenize:
            report("llama.cpp", text, ours, llama_ids(a.llama_tokenize, a.gguf, text, False, work))
            report("llama.cpp+bos", text, hybridlm_ids(a.hybridlm, vocab_json, text, add_special=True),
                   llama_ids(a.llama_tokenize, a.gguf, text, True, work))
    if not a.llama_tokenize:
        print("llama-tokenize not found (give --llama-tokenize): compared with sentencepiece only")
    shutil.rmtree(work, ignore_errors=True)
    print(f"{checks - failures}/{checks} comparisons equal")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
