"""Writes the byte-level BPE fixtures of tests/data/hf_bpe_*/ with the Hugging Face `tokenizers` library.

Each fixture is a small BPE trained on the repository's docs with one real model family's text pipeline
(GPT-2, Llama 3 / SmolLM3, Qwen2 / Qwen3), its tokenizer_config.json, and expected.json: for each test text
the ids `tokenizers` gives (no special tokens added) and its decoding (special tokens skipped). The C++
test (tests/test_byte_level_bpe.cpp) asserts hybridlm gives the same. Rerun only to change the fixtures:

    python3 -m venv /tmp/tok && /tmp/tok/bin/pip install tokenizers
    /tmp/tok/bin/python tools/hf_check/make_bpe_fixtures.py
"""
import json
import pathlib

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The pre-tokenizer patterns of the model families (as published in their tokenizer.json files).
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "Hello world! It's a test, isn't it? I'LL SEE, they'Re here.",
    "  leading spaces,\ttabs\t\tand\n\nnewlines\r\n  trailing  ",
    "numbers 1234567 and 3.14159, 1e-5, 2026-12-03",
    "Caf\u00e9 vs Cafe\u0301 (NFC), na\u00efve, \u00c5ngstr\u00f6m, \ufb01ne (a ligature)",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u4e2d\u6587\u6587\u672c",
    "emoji \U0001f642\U0001f680 and symbols \u2211\u222b\u2248 \u00a9\u00ae\u2122",
    "<|endoftext|>after special<|im_start|>user\nhi<|im_end|>",
    "<think>reasoning</think> hybridlm rocks, HYBRIDLM too",
    "def f(x):\n    return x**2  # code\n\n\n",
    "",
    "a" * 50 + " " + "ab" * 30,
    "Full attention carries retrieval; sliding-window attention (SWA) is cheap.",
]


def corpus():
    for p in sorted((ROOT / "docs").glob("*.md")):
        yield p.read_text(encoding="utf-8")
    yield from TEXTS


def build(kind):
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    else:
        pattern = LLAMA3 if kind == "llama3" else QWEN2
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    # A non-special token matched on the raw text, and one matched after normalization.
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False),
                    AddedToken("hybridlm", normalized=True)])
    return tok


def main():
    for kind in ("gpt2", "llama3", "qwen2"):
        tok = build(kind)
        out = ROOT / "tests" / "data" / f"hf_bpe_{kind}"
        out.mkdir(parents=True, exist_ok=True)
        tok.save(str(out / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                  "bos_token": "<|im_start|>" if kind == "llama3" else None}
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        cases = []
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True)})
        lines = ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases)
        (out / "expected.json").write_text("[\n" + lines + "\n]\n")
        print(out, tok.get_vocab_size(), "tokens")


if __name__ == "__main__":
    main()
