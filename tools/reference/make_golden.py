#!/usr/bin/python3
"""Writes tests/data/golden_<case>.safetensors from the float64 PyTorch reference (model.py).

Per case: metadata "config" (docs/model.md schema) and "optimizer"; tensors input_ids / targets
(I32 [B, T]), every parameter (F32, the starting values), logits (F32 [B, T, V]), loss (F32 [1], mean
CE), grad.<name> (F32) for every parameter, losses (F32 [10]: losses[k] = loss after k AdamW steps on
the same batch). Everything is computed in float64 from the float32-rounded parameters and stored
as float32.

Before writing, the reference checks itself: autograd gradients vs central finite differences,
torch.optim.AdamW vs a hand-written AdamW following docs/model.md, a few published test vectors, and
a read-back of every file. Run: /usr/bin/python3 tools/reference/make_golden.py [--check-only] [case ...]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M  # noqa: E402
import safetensors_io  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_DIR = os.path.join(ROOT, "tests", "data")

OPTIMIZER = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0}
N_STEPS = 10

_BASE = {"vocab_size": 61, "d_model": 32, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16, "d_ff": 48,
         "max_seq_len": 64, "window": 5, "rope_theta": 10000.0, "norm_eps": 1e-6, "chunk_size": 8,
         "mamba_d_state": 16, "mamba_expand": 2}

# name -> (config overrides, B, T, seed)
CASES = {
    "swa_nope": (dict(_BASE, n_layers=4, pattern="SSSF",
                      layer_types={"F": {"rope": False}, "S": {"rope": True, "window": 5}}), 2, 16, 101),
    # 3 layers (not 4) keeps the file under 300 KB with the larger K/V projections.
    "full_rope_qknorm": (dict(_BASE, n_layers=3, pattern="F", n_kv_heads=2,
                              layer_types={"F": {"rope": True, "qk_norm": True}}), 2, 16, 102),
    "lightning": (dict(_BASE, n_layers=2, pattern="LF", layer_types={"F": {"rope": True}}), 2, 20, 103),
    "mamba2": (dict(_BASE, n_layers=2, pattern="MF",
                    layer_types={"F": {"rope": True}, "M": {"head_dim": 16}}), 2, 20, 104),
    "gdn": (dict(_BASE, n_layers=2, pattern="GF",
                 layer_types={"F": {"rope": True}, "G": {"head_dim": 16}}), 2, 20, 105),
}


def make_batch(cfg, B, T, seed):
    g = torch.Generator().manual_seed(seed + 7919)
    ids = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    targets = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    return ids, targets


def loss_and_grads(cfg, P, ids, targets):
    leaves = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    logits = M.forward(cfg, leaves, ids)
    loss = M.loss_fn(logits, targets)
    loss.backward()
    return logits.detach(), loss.detach(), {n: t.grad.detach() for n, t in leaves.items()}


def train_curve_torch(cfg, P, ids, targets, opt):
    """losses[k] = loss after k optimizer steps (torch.optim.AdamW, clip_grad_norm_ first)."""
    params = {n: t.clone().requires_grad_(True) for n, t in P.items()}
    wd = set(M.weight_decay_names(cfg))
    groups = [{"params": [p for n, p in params.items() if n in wd], "weight_decay": opt["weight_decay"]},
              {"params": [p for n, p in params.items() if n not in wd], "weight_decay": 0.0}]
    adamw = torch.optim.AdamW(groups, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    losses = []
    for _ in range(N_STEPS):
        adamw.zero_grad(set_to_none=True)
        loss = M.loss_fn(M.forward(cfg, params, ids), targets)
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), opt["grad_clip"])
        adamw.step()
    return losses


def train_curve_manual(cfg, P, ids, targets, opt):
    """The same curve from the formulas in docs/model.md (no torch.optim)."""
    params = {n: t.clone() for n, t in P.items()}
    wd = set(M.weight_decay_names(cfg))
    m = {n: torch.zeros_like(t) for n, t in params.items()}
    v = {n: torch.zeros_like(t) for n, t in params.items()}
    b1, b2, lr = opt["beta1"], opt["beta2"], opt["lr"]
    losses = []
    for step in range(1, N_STEPS + 1):
        _, loss, grads = loss_and_grads(cfg, params, ids, targets)
        losses.append(loss.item())
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        if norm > opt["grad_clip"]:
            grads = {n: g * (opt["grad_clip"] / (norm + 1e-6)) for n, g in grads.items()}
        for n, p in params.items():
            g = grads[n]
            if n in wd:
                p = p - lr * opt["weight_decay"] * p
            m[n] = b1 * m[n] + (1 - b1) * g
            v[n] = b2 * v[n] + (1 - b2) * g * g
            p = p - lr * (m[n] / (1 - b1 ** step)) / (torch.sqrt(v[n] / (1 - b2 ** step)) + opt["eps"])
            params[n] = p
    return losses


def check_fd(cfg, P, ids, targets, grads, seed, per_tensor=2, eps=1e-6):
    """Central finite differences of the float64 loss vs autograd, a few entries of every tensor."""
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    for name, t in P.items():
        flat = t.view(-1)
        for _ in range(per_tensor):
            i = int(torch.randint(0, flat.numel(), (1,), generator=g))
            old = flat[i].item()
            flat[i] = old + eps
            lp = M.loss_fn(M.forward(cfg, P, ids), targets).item()
            flat[i] = old - eps
            lm = M.loss_fn(M.forward(cfg, P, ids), targets).item()
            flat[i] = old
            fd = (lp - lm) / (2 * eps)
            ag = grads[name].view(-1)[i].item()
            err = abs(fd - ag)
            worst = max(worst, err)
            if err > 1e-8 + 1e-6 * abs(ag):
                raise AssertionError(f"finite-difference check failed: {name}[{i}] autograd {ag:.6e} fd {fd:.6e}")
    return worst


def check_test_vectors():
    s = M.lightning_slopes(8, 0, 4)
    want = torch.tensor([2.0 ** -(h + 1) for h in range(8)], dtype=M.DT) * (1 + 1e-5)
    assert torch.allclose(s, want, rtol=1e-12), s
    f = [float(M.lightning_slopes(8, l, 4)[0] / 0.5) for l in range(4)]
    assert np.allclose(f, [1.00001, 0.666678, 0.333346, 1.3e-5], atol=2e-6), f
    dt = torch.tensor(0.01, dtype=M.DT)
    assert abs(float(dt + torch.log(-torch.expm1(-dt))) - (-4.600166)) < 1e-6
    # SWA: row t of the mask has min(t+1, W) keys; RoPE is relative.
    cfg = M.make_config(dict(_BASE, n_layers=1, pattern="S", layer_types={"S": {"rope": True, "window": 5}}))
    T, W = 9, 5
    allowed = [[(s <= t and s > t - W) for s in range(T)] for t in range(T)]
    assert [sum(r) for r in allowed] == [min(t + 1, W) for t in range(T)]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 12, 1, 16, generator=g, dtype=M.DT)
    k = torch.randn(1, 12, 1, 16, generator=g, dtype=M.DT)
    qs, ks = q[:, 3:4].expand(1, 12, 1, 16), k[:, 1:2].expand(1, 12, 1, 16)
    rq, rk = M.rope(qs.contiguous(), 10000.0), M.rope(ks.contiguous(), 10000.0)
    d1 = (rq[0, 5, 0] * rk[0, 3, 0]).sum()
    d2 = (rq[0, 9, 0] * rk[0, 7, 0]).sum()
    assert abs(float(d1 - d2)) < 1e-12
    del cfg


def check_mixer_forms():
    """Each mixer against a second, differently written formulation (forward values, float64)."""
    g = torch.Generator().manual_seed(5)
    B, T, H, d = 2, 13, 3, 5
    rn = lambda *s: torch.randn(*s, generator=g, dtype=M.DT)  # noqa: E731
    # Lightning: recurrence vs masked decay form.
    q, k, v = rn(B, T, H, d), rn(B, T, H, d), rn(B, T, H, d)
    lam = torch.exp(-M.lightning_slopes(H, 1, 4))
    e1 = (M.lightning_recurrent_core(q, k, v, lam) - M.lightning_parallel_core(q, k, v, lam)).abs().max()
    # Mamba-2: recurrence vs the quadratic (SSD) form.
    nh, hp, N = 3, 4, 6
    xs, Bm, Cm = rn(B, T, nh, hp), rn(B, T, N), rn(B, T, N)
    dt = torch.nn.functional.softplus(rn(B, T, nh))
    A, Dp = -torch.exp(rn(nh)), rn(nh)
    e2 = (M.ssd_recurrent_core(xs, dt, A, Bm, Cm, Dp) - M.ssd_parallel_core(xs, dt, A, Bm, Cm, Dp)).abs().max()
    # Gated DeltaNet: fla-layout update vs the V x K matrix form of docs/model.md.
    k = k / k.norm(dim=-1, keepdim=True)
    beta, gg = torch.sigmoid(rn(B, T, H)), -torch.rand(B, T, H, generator=g, dtype=M.DT)
    e3 = (M.gdn_recurrent_core(q, k, v, beta, gg) - M.gdn_matrix_core(q, k, v, beta, gg)).abs().max()
    # Attention (F and S, GQA, QK-norm, RoPE) vs a per-token loop.
    cfg = M.make_config(dict(_BASE, n_layers=2, pattern="SF", n_heads=4, n_kv_heads=2,
                             layer_types={"S": {"rope": True, "window": 4, "qk_norm": True},
                                          "F": {"rope": False}}))
    P = M.init_params(cfg, 9, perturb_constants=True)
    x = rn(B, T, cfg["d_model"])
    e4 = 0.0
    for i, letter in enumerate("SF"):
        pre = f"model.layers.{i}.self_attn."
        e4 = max(e4, float((M.attention(cfg, P, pre, x, letter) - M.attention_loop(cfg, P, pre, x, letter))
                           .abs().max()))
    # The mixers in the model call the same recurrences as the *_recurrent_core functions.
    errs = [float(e1), float(e2), float(e3), e4]
    assert max(errs) < 1e-12, errs
    print(f"mixer forms agree: lightning {errs[0]:.1e}, mamba2 {errs[1]:.1e}, gdn {errs[2]:.1e}, "
          f"attention {errs[3]:.1e}")


def run_case(name, check_only):
    overrides, B, T, seed = CASES[name]
    cfg = M.make_config(overrides)
    P = M.init_params(cfg, seed, perturb_constants=True)
    ids, targets = make_batch(cfg, B, T, seed)

    logits, loss, grads = loss_and_grads(cfg, P, ids, targets)
    worst_fd = check_fd(cfg, P, ids, targets, grads, seed)
    losses = train_curve_torch(cfg, P, ids, targets, OPTIMIZER)
    manual = train_curve_manual(cfg, P, ids, targets, OPTIMIZER)
    assert abs(losses[0] - loss.item()) < 1e-14
    assert max(abs(a - b) for a, b in zip(losses, manual)) < 1e-10, (losses, manual)
    assert losses[-1] < losses[0], losses
    n_params = sum(t.numel() for t in P.values())
    print(f"{name}: {n_params} params, loss {loss.item():.6f} (ln V = {math.log(cfg['vocab_size']):.6f}), "
          f"losses[9] {losses[-1]:.6f}, worst |fd - autograd| {worst_fd:.2e}, "
          f"torch vs manual AdamW {max(abs(a - b) for a, b in zip(losses, manual)):.1e}")
    if check_only:
        return

    tensors = {"input_ids": ids.to(torch.int32).numpy(), "targets": targets.to(torch.int32).numpy(),
               "logits": logits.float().numpy(), "loss": loss.reshape(1).float().numpy(),
               "losses": torch.tensor(losses, dtype=M.DT).float().numpy()}
    for n, t in P.items():
        tensors[n] = t.float().numpy()
        tensors["grad." + n] = grads[n].float().numpy()
    meta = {"config": M.config_json(cfg), "optimizer": json.dumps(OPTIMIZER, sort_keys=True),
            "generator": "tools/reference/make_golden.py (float64 PyTorch reference, stored as F32)",
            "losses": "losses[k] = mean CE after k AdamW steps on this batch (torch.optim.AdamW, "
                      "clip_grad_norm_ first, weight decay on >=2-D tensors except the embedding)"}
    path = os.path.join(OUT_DIR, f"golden_{name}.safetensors")
    os.makedirs(OUT_DIR, exist_ok=True)
    safetensors_io.write(path, tensors, meta)

    back, meta_back = safetensors_io.read(path)
    assert set(back) == set(tensors) and meta_back == meta
    for n, a in tensors.items():
        assert back[n].dtype == a.dtype and np.array_equal(back[n], a), n
    # The stored F32 parameters are exactly the ones the reference computed from.
    for n, t in P.items():
        assert np.array_equal(back[n].astype(np.float64), t.numpy()), n
    size = os.path.getsize(path)
    assert size < 300_000, f"{path}: {size} bytes"
    print(f"  wrote {os.path.relpath(path, ROOT)} ({size} bytes)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help=f"cases to generate (default all: {', '.join(CASES)})")
    ap.add_argument("--check-only", action="store_true", help="run the self-checks, write nothing")
    args = ap.parse_args()
    for c in args.cases:
        if c not in CASES:
            ap.error(f"unknown case {c!r}; known: {', '.join(CASES)}")
    torch.set_num_threads(1)  # deterministic and polite on a shared machine
    check_test_vectors()
    check_mixer_forms()
    for name in args.cases or CASES:
        run_case(name, args.check_only)


if __name__ == "__main__":
    main()
