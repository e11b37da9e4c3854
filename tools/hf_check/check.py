#!/usr/bin/env python3
"""Cross-framework check of `hybridlm export --format hf` and `hybridlm import` against transformers.

Export: small hybridlm models of every exportable kind are trained for a few steps (so norm weights move
off 1), exported, loaded with AutoModelForCausalLM (no custom code), and their fp32 logits compared with
`hybridlm logits` on the same tokens, sequences longer than the sliding window included. The exported
tokenizers (byte, SentencePiece BPE) must give hybridlm's token ids. Import: random transformers models
(every weight drawn, norms included) are saved, imported, and compared the same way. Refusals are checked
to fail with a message that names the reason. Prints one line per case and exits 1 on any failure.
"""
import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile

# Everything is local: no hub access, no progress bars.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import (AutoModelForCausalLM, AutoTokenizer, BambaConfig, Gemma3TextConfig, Qwen3Config,  # noqa: E402
                          Qwen3NextConfig, SmolLM3Config)

TOL = 1e-4  # max abs logit difference accepted (fp32 on both sides; observed ~1e-6)
failures = []


def run(hlm, *args):
    p = subprocess.run([hlm, *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"hybridlm {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout


def report(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def hlm_logits(hlm, ckpt, ids, work):
    out = os.path.join(work, "logits.safetensors")
    run(hlm, "logits", "--ckpt", ckpt, "--tokens", " ".join(map(str, ids)), "--out", out, "--threads", "1")
    return load_file(out)["logits"]


def hf_logits(path_or_model, ids):
    m = path_or_model
    if isinstance(m, str):
        m = AutoModelForCausalLM.from_pretrained(m, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    with torch.no_grad():
        return m(torch.tensor([ids]), use_cache=False).logits[0].float()


def corpus_text():
    import json as j, textwrap
    return "\n\n".join(inspect.getsource(mod) for mod in (j.decoder, j.encoder, textwrap, argparse))


TEXTS = ["Hello, world!", "  two  spaces\tand a tab\nnew line", "digits 1234567890 and 3.14159",
         "unicode: naïve café, Ελληνικά, 日本語, emoji 🙂", "<eos> and <s> written as text", " leading space",
         "def f(x):\n    return x ** 2  # comment\n"]

# name, --set overrides, expected architecture (all trained with the byte tokenizer but the one marked SPM)
# Gemma 3's block (docs/model.md "Gemma 3"): QK-norm, a RoPE base for S layers of their own, the query scale from
# query_pre_attn_scalar (12, not head_dim 16), sandwich norms, GeGLU, embeddings scaled by sqrt(d_model).
GEMMA_BLOCK = ["pattern=SSSF", "layer_types.F.qk_norm=true", "layer_types.S.qk_norm=true",
               "layer_types.S.rope_theta=500.0", "layer_types.F.query_pre_attn_scalar=12",
               "layer_types.S.query_pre_attn_scalar=12", "mlp_activation=geglu_tanh", "sandwich_norm=true",
               "scale_embeddings=true"]
EXPORT_CASES = [
    ("SSSF swa-nope (S RoPE, F NoPE)", ["pattern=SSSF", "layer_types.F.rope=false"], "SmolLM3ForCausalLM"),
    ("SSSF swa-nope, SentencePiece BPE 400 (SPM)", ["pattern=SSSF", "layer_types.F.rope=false"],
     "SmolLM3ForCausalLM"),
    ("SSSF swa (RoPE everywhere)", ["pattern=SSSF"], "SmolLM3ForCausalLM"),
    ("SFSF S NoPE, F RoPE, window 5", ["pattern=SFSF", "window=5", "layer_types.S.rope=false"], "SmolLM3ForCausalLM"),
    ("F full RoPE, no GQA", ["pattern=F", "n_kv_heads=4"], "SmolLM3ForCausalLM"),
    ("F full NoPE", ["pattern=F", "layer_types.F.rope=false"], "SmolLM3ForCausalLM"),
    ("SSSF QK-norm (Qwen3)", ["pattern=SSSF", "layer_types.F.qk_norm=true", "layer_types.S.qk_norm=true"],
     "Qwen3ForCausalLM"),
    ("MMFM Mamba-2 + RoPE attention (Bamba)", ["pattern=MMFM", "layer_types.M.head_dim=16", "mamba_d_state=16",
                                                "norm_eps=1e-5"], "BambaForCausalLM"),
    ("GGGG Gated DeltaNet only (Qwen3Next)", ["pattern=GGGG", "layer_types.G.head_dim=16", "norm_eps=1e-5"],
     "Qwen3NextForCausalLM"),
    ("SSSF Gemma 3 block, tied", GEMMA_BLOCK + ["tie_embeddings=true"], "Gemma3ForCausalLM"),
    ("SSSF Gemma 3 block, untied, full RoPE 1e6", GEMMA_BLOCK + ["rope_theta=1000000.0"], "Gemma3ForCausalLM"),
]
REFUSED_EXPORTS = [
    ("QK-norm + NoPE", ["pattern=SSSF", "layer_types.F.rope=false", "layer_types.F.qk_norm=true",
                        "layer_types.S.qk_norm=true"], "NoPE"),
    ("QK-norm on F only", ["pattern=SSSF", "layer_types.F.qk_norm=true"], "QK-norm"),
    ("Mamba-2 hybrid, norm_eps 1e-6", ["pattern=MMMF", "layer_types.M.head_dim=16", "mamba_d_state=16"], "norm_eps"),
    ("Mamba-2 + SWA", ["pattern=MMSF", "layer_types.M.head_dim=16", "mamba_d_state=16", "norm_eps=1e-5"],
     "S layers next to M"),
    ("Gated DeltaNet hybrid", ["pattern=GGGF", "layer_types.G.head_dim=16"], "layer type G"),
    ("Gated DeltaNet only, norm_eps 1e-6", ["pattern=GGGG", "layer_types.G.head_dim=16"], "norm_eps"),
    ("Lightning hybrid", ["pattern=LLLF"], "layer type L"),
    ("Gemma 3 block without QK-norm", [s for s in GEMMA_BLOCK if "qk_norm" not in s], "qk_norm is off"),
    ("sandwich norms alone", ["pattern=SSSF", "sandwich_norm=true"], "has all three"),
]
SMALL = ["d_model=64", "n_layers=4", "n_heads=4", "n_kv_heads=2", "head_dim=16", "d_ff=96", "vocab_size=512",
         "max_seq_len=64", "window=8", "rope_theta=10000.0"]


def train_small(hlm, work, name, overrides, tokenizer="byte"):
    out = os.path.join(work, name)
    sets = []
    for s in SMALL + overrides:
        sets += ["--set", s]
    run(hlm, "train", *sets, "--data", os.path.join(work, "corpus.txt"), "--tokenizer", tokenizer, "--steps", "3",
        "--lr", "1e-2", "--warmup", "1", "--seq-len", "32", "--batch", "2", "--eval-every", "1000",
        "--eval-batches", "1", "--out", out, "--quiet", "--threads", "1")
    return out


def check_exports(hlm, work, ids):
    for i, (name, overrides, arch) in enumerate(EXPORT_CASES):
        try:
            spm = os.path.join(work, "spm.model")
            runs = train_small(hlm, work, f"export{i}", overrides, spm if "(SPM)" in name else "byte")
            hf = os.path.join(work, f"export{i}_hf")
            run(hlm, "export", "--ckpt", runs, "--format", "hf", "--out", hf)
            got_arch = json.load(open(os.path.join(hf, "config.json")))["architectures"][0]
            diff = (hlm_logits(hlm, runs, ids, work) - hf_logits(hf, ids)).abs().max().item()
            report(f"export {name}", got_arch == arch and diff < TOL,
                   f"{got_arch}, T={len(ids)}, max |logit diff| {diff:.2e}")
        except Exception as e:  # noqa: BLE001 - every case reports
            report(f"export {name}", False, str(e))
    for i, (name, overrides, reason) in enumerate(REFUSED_EXPORTS):
        try:
            runs = train_small(hlm, work, f"refused{i}", overrides)
            hf = os.path.join(work, f"refused{i}_hf")
            p = subprocess.run([hlm, "export", "--ckpt", runs, "--format", "hf", "--out", hf], capture_output=True,
                               text=True)
            msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
            report(f"refuse {name}", p.returncode != 0 and reason in msg and not os.path.exists(hf), msg[:160])
        except Exception as e:  # noqa: BLE001
            report(f"refuse {name}", False, str(e))


def check_tokenizers(hlm, work):
    # The folders exported above: export0 (byte tokenizer), export1 (the SentencePiece model).
    for spec, hf in [("byte", "export0_hf"), (os.path.join(work, "spm.model"), "export1_hf")]:
        label = "byte" if spec == "byte" else "SentencePiece BPE 400"
        try:
            tok = AutoTokenizer.from_pretrained(os.path.join(work, hf))
            bad = []
            for text in TEXTS:
                want = [int(x) for x in run(hlm, "tokenizer", "encode", "--tokenizer", spec, "--text", text).split()]
                got = tok.encode(text, add_special_tokens=False)
                if got != want:
                    bad.append(f"{text!r}: hf {got[:12]} hybridlm {want[:12]}")
                elif tok.decode(got) != text:
                    bad.append(f"{text!r}: hf decodes to {tok.decode(got)!r}")
            report(f"tokenizer {label} ({type(tok).__name__})", not bad,
                   f"{len(TEXTS)} texts encode to the same ids and decode back" if not bad else "; ".join(bad)[:400])
        except Exception as e:  # noqa: BLE001
            report(f"tokenizer {label}", False, str(e))


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms: around 1, not 1, so a missed or shifted norm weight shows
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))


IMPORT_BASE = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6,
                   pad_token_id=None, bos_token_id=None, eos_token_id=None)
IMPORT_CASES = [
    ("SmolLM3 sliding RoPE + full NoPE", SmolLM3Config, dict(
        layer_types=["sliding_attention"] * 3 + ["full_attention"], use_sliding_window=True, sliding_window=8,
        no_rope_layers=[1, 1, 1, 0], tie_word_embeddings=False), torch.float32),
    ("SmolLM3-3B style: all full, NoPE every 4th, tied", SmolLM3Config, dict(
        no_rope_layer_interval=4, tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                             "rope_theta": 50000.0}), torch.float32),
    ("Qwen3 sliding + full, QK-norm", Qwen3Config, dict(
        layer_types=["full_attention", "sliding_attention"] * 2, use_sliding_window=True, sliding_window=6,
        tie_word_embeddings=False), torch.float32),
    ("Qwen3 saved as bf16", Qwen3Config, dict(tie_word_embeddings=False), torch.bfloat16),
    ("Bamba Mamba-2 + attention", BambaConfig, dict(
        attn_layer_indices=[1, 3], mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_expand=2,
        mamba_chunk_size=16, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                 "partial_rotary_factor": 1.0}), torch.float32),
    ("Qwen3Next Gated DeltaNet only, dense MLP", Qwen3NextConfig, dict(
        layer_types=["linear_attention"] * 4, linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, num_experts=0, mlp_only_layers=[0, 1, 2, 3], rms_norm_eps=1e-5,
        tie_word_embeddings=False), torch.float32),
    ("Gemma 3 sliding + full, tied, local/global RoPE", Gemma3TextConfig, dict(
        layer_types=["sliding_attention"] * 3 + ["full_attention"], sliding_window=6, query_pre_attn_scalar=12,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}},
        tie_word_embeddings=True), torch.float32),
    ("Gemma 3 untied, saved as bf16", Gemma3TextConfig, dict(
        layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=5, tie_word_embeddings=False),
     torch.bfloat16),
]
QWEN3NEXT_CASE = len(IMPORT_CASES) - 3
GEMMA3_CASE = len(IMPORT_CASES) - 2
# Refusals name the key: edits of an imported folder (by case index), the edit, the text the message must hold.
IMPORT_REFUSALS = [
    ("rope_scaling", 0, {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
     "rope_type"),
    ("llama", 0, {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "model_type"),
    ("unknown key", 0, {"some_new_option": 1}, "some_new_option"),
    ("qwen3_next with a full-attention layer", QWEN3NEXT_CASE,
     {"layer_types": ["linear_attention"] * 3 + ["full_attention"]}, "layer_types[3]"),
    ("qwen3_next with experts", QWEN3NEXT_CASE, {"num_experts": 4, "mlp_only_layers": []}, "num_experts"),
    ("gemma3 with final logit soft-capping", GEMMA3_CASE, {"final_logit_softcapping": 30.0},
     "final_logit_softcapping"),
    ("gemma3 with linear RoPE scaling on full layers", GEMMA3_CASE,
     {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
     "rope_parameters.full_attention.rope_type"),
]


def check_imports(hlm, work, ids):
    ids = [i % IMPORT_BASE["vocab_size"] for i in ids]
    for i, (name, cls, extra, dtype) in enumerate(IMPORT_CASES):
        try:
            cfg = cls(**{**IMPORT_BASE, **extra})
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
            randomize(model, 100 + i)
            hf = os.path.join(work, f"import{i}_hf")
            model.to(dtype).save_pretrained(hf)
            want = hf_logits(hf, ids)  # read back in fp32: the weights as saved (bf16-rounded where saved so)
            runs = os.path.join(work, f"import{i}")
            run(hlm, "import", hf, "--out", runs)
            diff = (hlm_logits(hlm, runs, ids, work) - want).abs().max().item()
            pattern = json.load(open(os.path.join(runs, "checkpoints", "step_00000000", "config.json")))["pattern"]
            report(f"import {name}", diff < TOL, f"pattern {pattern}, T={len(ids)}, max |logit diff| {diff:.2e}")
        except Exception as e:  # noqa: BLE001
            report(f"import {name}", False, str(e))
    for name, base, edit, key in IMPORT_REFUSALS:
        hf = os.path.join(work, f"import_refused_{name.replace(' ', '_')}")
        shutil.copytree(os.path.join(work, f"import{base}_hf"), hf)
        c = json.load(open(os.path.join(hf, "config.json")))
        c.update(edit)
        json.dump(c, open(os.path.join(hf, "config.json"), "w"))
        p = subprocess.run([hlm, "import", hf, "--out", hf + "_run"], capture_output=True, text=True)
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        report(f"refuse import {name}", p.returncode != 0 and key in msg, msg[:160])


def check_bpe_tokenizers(hlm, work):
    """Byte-level BPE tokenizers saved by transformers (the files a downloaded SmolLM3 / Llama 3 / Qwen3 folder
    has): import keeps them, hybridlm encodes and decodes as transformers does, export writes them back."""
    from transformers import PreTrainedTokenizerFast
    from make_bpe_fixtures import TEXTS as FIXTURE_TEXTS, build
    texts = TEXTS + FIXTURE_TEXTS
    for family in ("gpt2", "llama3", "qwen2"):
        name = f"tokenizer byte-level BPE {family}: import, encode, decode, export"
        try:
            hf = os.path.join(work, f"bpe_{family}_hf")
            cfg = SmolLM3Config(**{**IMPORT_BASE, "vocab_size": 448, "tie_word_embeddings": False})
            AutoModelForCausalLM.from_config(cfg).save_pretrained(hf)
            PreTrainedTokenizerFast(tokenizer_object=build(family), eos_token="<|endoftext|>").save_pretrained(hf)
            runs = os.path.join(work, f"bpe_{family}")
            run(hlm, "import", hf, "--out", runs)
            spec = json.load(open(os.path.join(runs, "run.json"))).get("tokenizer", "")
            out = os.path.join(work, f"bpe_{family}_export")
            run(hlm, "export", "--ckpt", runs, "--format", "hf", "--out", out)
            bad = []
            for folder in (hf, out):
                tok = AutoTokenizer.from_pretrained(folder)
                for text in texts:
                    got = tok.encode(text, add_special_tokens=False)
                    mine = [int(x) for x in run(hlm, "tokenizer", "encode", "--tokenizer", spec, "--text", text).split()]
                    if got != mine:
                        bad.append(f"{folder}: {text!r}: hf {got[:12]} hybridlm {mine[:12]}")
                        continue
                    if not got:
                        continue
                    want = tok.decode(got, skip_special_tokens=True)
                    back = subprocess.run([hlm, "tokenizer", "decode", "--tokenizer", spec, "--ids",
                                           " ".join(map(str, got))], capture_output=True, check=True).stdout
                    if back.decode("utf-8", errors="replace") != want:  # bytes: keep "\r\n" as it is
                        bad.append(f"{text!r}: hf decodes to {want!r}, hybridlm to {back!r}")
            report(name, spec.endswith("tokenizer.json") and not bad,
                   f"{len(texts)} texts x (imported, re-exported): same ids and decodings" if not bad
                   else "; ".join(bad)[:600])
        except Exception as e:  # noqa: BLE001
            report(name, False, str(e))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hybridlm", required=True, help="path to the hybridlm binary")
    ap.add_argument("--keep", help="work folder to keep (default: a temporary one, removed)")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    work = a.keep or tempfile.mkdtemp(prefix="hf_check_")
    os.makedirs(work, exist_ok=True)
    os.environ["HLM_DATA_CACHE"] = os.path.join(work, "cache")  # prepared datasets stay in the work folder
    with open(os.path.join(work, "corpus.txt"), "w") as f:
        f.write(corpus_text())
    import transformers
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; work folder {work}", flush=True)
    run(a.hybridlm, "tokenizer", "train", "--data", os.path.join(work, "corpus.txt"), "--vocab-size", "400", "--out",
        os.path.join(work, "spm.model"))
    # 48 tokens: longer than every window (5, 6, 8); ids below 257, the byte tokenizer's vocabulary.
    ids = torch.randint(0, 257, (48,), generator=torch.Generator().manual_seed(1)).tolist()
    check_exports(a.hybridlm, work, ids)
    check_tokenizers(a.hybridlm, work)
    check_imports(a.hybridlm, work, ids)
    check_bpe_tokenizers(a.hybridlm, work)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    total = len(EXPORT_CASES) + len(REFUSED_EXPORTS) + 2 + len(IMPORT_CASES) + len(IMPORT_REFUSALS) + 3
    print(f"hf_check: {total - len(failures)} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
