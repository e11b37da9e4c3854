#!/usr/bin/env python3
"""Writes the tokenizer metadata of a GGUF file (the tokenizer.ggml.* keys) as the JSON that hybridlm's
`--tokenizer FILE.gguf.json` reads (data/vocab_tokenizer.h). Needs the `gguf` package from PyPI.

    python dump_vocab.py model.gguf out.gguf.json
"""
import argparse
import json
import sys

KEYS = {  # GGUF key -> how its value is kept
    "tokenizer.ggml.model": str, "tokenizer.ggml.pre": str,
    "tokenizer.ggml.tokens": list, "tokenizer.ggml.scores": list, "tokenizer.ggml.token_type": list,
    "tokenizer.ggml.merges": list,
    "tokenizer.ggml.bos_token_id": int, "tokenizer.ggml.eos_token_id": int,
    "tokenizer.ggml.unknown_token_id": int, "tokenizer.ggml.padding_token_id": int,
    "tokenizer.ggml.add_bos_token": bool, "tokenizer.ggml.add_eos_token": bool,
    "tokenizer.ggml.add_space_prefix": bool,
}


def read_vocab(path):
    import gguf
    reader = gguf.GGUFReader(path)
    out = {"format": "hybridlm-gguf-vocab"}
    for key, kind in KEYS.items():
        field = reader.fields.get(key)
        if field is None:
            continue
        value = field.contents()
        out[key] = list(value) if kind is list else kind(value)
    unknown = sorted(k for k in reader.fields if k.startswith("tokenizer.ggml.") and k not in KEYS)
    return out, unknown


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("out")
    a = ap.parse_args()
    vocab, unknown = read_vocab(a.gguf)
    if "tokenizer.ggml.model" not in vocab:
        sys.exit(f"{a.gguf}: no tokenizer.ggml.model key")
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    print(f"{a.out}: {vocab['tokenizer.ggml.model']} vocabulary of {len(vocab.get('tokenizer.ggml.tokens', []))} tokens"
          + (f" (not carried: {', '.join(unknown)})" if unknown else ""))


if __name__ == "__main__":
    main()
