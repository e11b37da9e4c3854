"""Independent PyTorch reference of the hybridlm model (docs/model.md), float64, llm.c style.

Every mixer is written in its plainest form: softmax attention with an explicit mask, and Lightning,
Mamba-2 and Gated DeltaNet as token-by-token recurrences. This file is the oracle the C++ engine is
compared against (through tools/reference/make_golden.py), so it favours obviousness over speed.

Parameters are a dict name -> float64 tensor, named exactly as in docs/model.md.
"""
import copy
import json
import math
from collections import OrderedDict

import torch
import torch.nn.functional as Fn

DT = torch.float64

# ---------------------------------------------------------------------------------------------
# Config (schema of docs/model.md; unknown keys are errors, as in the engine)

DEFAULTS = {
    "d_model": 256, "n_layers": 8, "n_heads": 4, "n_kv_heads": 4, "head_dim": 64, "d_ff": 768,
    "vocab_size": 4096, "max_seq_len": 1024, "pattern": "SSSF", "window": 128, "rope_theta": 10000.0,
    "norm_eps": 1e-6, "chunk_size": 64, "mamba_d_state": 64, "mamba_expand": 2,
    "layer_types": {"F": {"rope": False}, "S": {"rope": True, "window": 128}},
}
LAYER_KEYS = {"rope", "window", "n_heads", "n_kv_heads", "head_dim", "qk_norm"}
LETTERS = "FSLMG"


def make_config(overrides):
    """Full config dict from defaults + overrides (layer_types replaced as a whole when given)."""
    cfg = copy.deepcopy(DEFAULTS)
    for k, v in overrides.items():
        if k not in DEFAULTS:
            raise ValueError(f"config: unknown key {k!r}")
        cfg[k] = copy.deepcopy(v)
    for letter, opts in cfg["layer_types"].items():
        if letter not in LETTERS:
            raise ValueError(f"config: unknown layer type {letter!r}")
        for k in opts:
            if k not in LAYER_KEYS:
                raise ValueError(f"config: unknown key layer_types.{letter}.{k}")
    for ch in cfg["pattern"]:
        if ch not in LETTERS:
            raise ValueError(f"config: unknown layer letter {ch!r} in pattern")
    return cfg


def layer_letter(cfg, i):
    p = cfg["pattern"]
    return p[i % len(p)]


def layer_opts(cfg, letter):
    """Per-type options with top-level defaults filled in."""
    o = cfg["layer_types"].get(letter, {})
    return {
        "rope": o.get("rope", True),
        "window": o.get("window", cfg["window"]),
        "n_heads": o.get("n_heads", cfg["n_heads"]),
        "n_kv_heads": o.get("n_kv_heads", cfg["n_kv_heads"]),
        "head_dim": o.get("head_dim", cfg["head_dim"]),
        "qk_norm": o.get("qk_norm", False),
    }


def mamba_dims(cfg):
    o = layer_opts(cfg, "M")
    di = cfg["mamba_expand"] * cfg["d_model"]
    P = o["head_dim"]
    assert di % P == 0, "mamba: expand*d_model must be a multiple of head_dim"
    return di, P, di // P, cfg["mamba_d_state"]  # d_inner, head dim, heads, state size


# ---------------------------------------------------------------------------------------------
# Parameters: names, shapes, init kinds

def param_specs(cfg):
    """OrderedDict name -> (shape, init kind). Init kinds: normal, normal_out, one, zero, conv,
    mamba_dt_bias, mamba_A_log, gdn_A_log."""
    D, V, Fd = cfg["d_model"], cfg["vocab_size"], cfg["d_ff"]
    s = OrderedDict()
    s["model.embed_tokens.weight"] = ([V, D], "normal")
    for i in range(cfg["n_layers"]):
        L = layer_letter(cfg, i)
        o = layer_opts(cfg, L)
        H, Hkv, hd = o["n_heads"], o["n_kv_heads"], o["head_dim"]
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = ([D], "one")
        if L in "FS":
            a = p + "self_attn."
            s[a + "q_proj.weight"] = ([H * hd, D], "normal")
            s[a + "k_proj.weight"] = ([Hkv * hd, D], "normal")
            s[a + "v_proj.weight"] = ([Hkv * hd, D], "normal")
            s[a + "o_proj.weight"] = ([D, H * hd], "normal_out")
            if o["qk_norm"]:
                s[a + "q_norm.weight"] = ([hd], "one")
                s[a + "k_norm.weight"] = ([hd], "one")
        elif L == "L":
            a = p + "linear_attn."
            for n in ("q_proj", "k_proj", "v_proj", "output_gate"):
                s[a + n + ".weight"] = ([H * hd, D], "normal")
            s[a + "norm.weight"] = ([H * hd], "one")
            s[a + "o_proj.weight"] = ([D, H * hd], "normal_out")
        elif L == "M":
            di, P, nh, N = mamba_dims(cfg)
            a = p + "mixer."
            s[a + "in_proj.weight"] = ([2 * di + 2 * N + nh, D], "normal")
            s[a + "conv1d.weight"] = ([di + 2 * N, 1, 4], "conv")
            s[a + "conv1d.bias"] = ([di + 2 * N], "zero")
            s[a + "dt_bias"] = ([nh], "mamba_dt_bias")
            s[a + "A_log"] = ([nh], "mamba_A_log")
            s[a + "D"] = ([nh], "one")
            s[a + "norm.weight"] = ([di], "one")
            s[a + "out_proj.weight"] = ([D, di], "normal_out")
        elif L == "G":
            a = p + "linear_attn."
            for n in ("q_proj", "k_proj", "v_proj"):
                s[a + n + ".weight"] = ([H * hd, D], "normal")
            for n in ("q_conv1d", "k_conv1d", "v_conv1d"):
                s[a + n + ".weight"] = ([H * hd, 1, 4], "conv")
            s[a + "b_proj.weight"] = ([H, D], "normal")
            s[a + "a_proj.weight"] = ([H, D], "normal")
            s[a + "A_log"] = ([H], "gdn_A_log")
            s[a + "dt_bias"] = ([H], "mamba_dt_bias")
            s[a + "g_proj.weight"] = ([H * hd, D], "normal")
            s[a + "o_norm.weight"] = ([hd], "one")
            s[a + "o_proj.weight"] = ([D, H * hd], "normal_out")
        s[p + "post_attention_layernorm.weight"] = ([D], "one")
        s[p + "mlp.gate_proj.weight"] = ([Fd, D], "normal")
        s[p + "mlp.up_proj.weight"] = ([Fd, D], "normal")
        s[p + "mlp.down_proj.weight"] = ([D, Fd], "normal_out")
    s["model.norm.weight"] = ([D], "one")
    s["lm_head.weight"] = ([V, D], "normal")
    return s


def init_params(cfg, seed, perturb_constants=False):
    """docs/model.md initialisation from a torch.Generator, rounded to float32 (the files store F32,
    so the reference must start from exactly the stored values), returned as float64.

    perturb_constants: move values the init sets to constants (norm weights 1, Mamba-2 D 1, conv
    bias 0) to 1 + U(-0.2, 0.2) / U(-0.1, 0.1), so a kernel that ignores one of them is caught."""
    g = torch.Generator().manual_seed(seed)
    std_out = 0.02 / math.sqrt(2 * cfg["n_layers"])
    out = OrderedDict()
    for name, (shape, kind) in param_specs(cfg).items():
        n = math.prod(shape)
        if kind == "normal":
            t = torch.randn(n, generator=g, dtype=DT) * 0.02
        elif kind == "normal_out":
            t = torch.randn(n, generator=g, dtype=DT) * std_out
        elif kind == "one":
            t = torch.ones(n, dtype=DT)
            if perturb_constants:
                t = t + (torch.rand(n, generator=g, dtype=DT) * 2 - 1) * 0.2
        elif kind == "zero":
            t = torch.zeros(n, dtype=DT)
            if perturb_constants:
                t = t + (torch.rand(n, generator=g, dtype=DT) * 2 - 1) * 0.1
        elif kind == "conv":  # U(-1/sqrt(kernel), 1/sqrt(kernel)), kernel 4
            t = (torch.rand(n, generator=g, dtype=DT) * 2 - 1) * 0.5
        elif kind == "mamba_dt_bias":  # dt ~ logU[1e-3, 0.1], floor 1e-4; dt_bias = softplus^-1(dt)
            u = torch.rand(n, generator=g, dtype=DT)
            dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            t = dt + torch.log(-torch.expm1(-dt))
        elif kind == "mamba_A_log":  # A ~ U[1, 16]
            t = torch.log(1 + 15 * torch.rand(n, generator=g, dtype=DT))
        elif kind == "gdn_A_log":  # A ~ U[0, 16]; keep A away from exactly 0 (log)
            t = torch.log((16 * torch.rand(n, generator=g, dtype=DT)).clamp(min=1e-4))
        else:
            raise AssertionError(kind)
        out[name] = t.reshape(shape).float().double()
    return out


def weight_decay_names(cfg):
    """Tensors with >= 2 dims except the embedding (docs/model.md)."""
    return [n for n, (shape, _) in param_specs(cfg).items()
            if len(shape) >= 2 and n != "model.embed_tokens.weight"]


# ---------------------------------------------------------------------------------------------
# Building blocks

def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def silu(x):
    return x * torch.sigmoid(x)


def rope(x, theta):
    """Half-split RoPE on x [B, T, H, hd], positions 0..T-1."""
    T, hd = x.shape[1], x.shape[3]
    half = hd // 2
    inv_freq = theta ** (-2.0 * torch.arange(half, dtype=DT) / hd)  # [hd/2]
    ang = torch.arange(T, dtype=DT)[:, None] * inv_freq[None, :]   # [T, hd/2]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def causal_conv4(u, w, b=None):
    """Depthwise causal conv, kernel 4: y_t[c] = b[c] + sum_j w[c,0,j] u_{t-3+j}[c] (zero before 0).
    u [B, T, C], w [C, 1, 4]."""
    B, T, C = u.shape
    up = torch.cat([torch.zeros(B, 3, C, dtype=u.dtype), u], dim=1)  # [B, T+3, C]
    y = sum(w[:, 0, j] * up[:, j:j + T, :] for j in range(4))
    return y if b is None else y + b


def lightning_slopes(H, layer, n_layers):
    """MiniMax decay rates s_h (lambda_h = exp(-s_h))."""
    base = 2.0 ** (-8.0 / H)
    factor = 1 - layer / (n_layers - 1 + 1e-5) + 1e-5
    return torch.tensor([base ** (h + 1) * factor for h in range(H)], dtype=DT)


def softplus(x):
    return Fn.softplus(x)


# ---------------------------------------------------------------------------------------------
# Recurrent cores (the oracles), one token at a time

def lightning_recurrent_core(q, k, v, lam):
    """S_t = lam S_{t-1} + k_t v_t^T (S is K x V), o_t = S_t^T q_t, no scale; q, k, v [B, T, H, d], lam [H]."""
    B, T, H, d = q.shape
    S = torch.zeros(B, H, d, d, dtype=DT)
    outs = []
    for t in range(T):
        S = lam[None, :, None, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(outs, dim=1)


def ssd_recurrent_core(xs, dt, A, Bm, Cm, Dp):
    """h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T (h is P x N per head), y_t = h_t C_t + D x_t;
    xs [B, T, nh, P], dt [B, T, nh], A/D [nh], Bm/Cm [B, T, N] (one group)."""
    B, T, nh, hp = xs.shape
    h = torch.zeros(B, nh, hp, Bm.shape[-1], dtype=DT)
    ys = []
    for t in range(T):
        a = torch.exp(dt[:, t] * A)
        h = a[:, :, None, None] * h + dt[:, t, :, None, None] * xs[:, t, :, :, None] * Bm[:, t, None, None, :]
        ys.append(torch.einsum("bhpn,bn->bhp", h, Cm[:, t]) + Dp[None, :, None] * xs[:, t])
    return torch.stack(ys, dim=1)


def gdn_recurrent_core(q, k, v, beta, g):
    """The fla-layout recurrence used by gated_deltanet(); q, k, v [B, T, H, d], beta/g [B, T, H]."""
    B, T, H, d = q.shape
    S = torch.zeros(B, H, d, d, dtype=DT)
    outs = []
    for t in range(T):
        S = torch.exp(g[:, t])[:, :, None, None] * S  # decay before the delta read
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))  # reads the updated state
    return torch.stack(outs, dim=1)


# ---------------------------------------------------------------------------------------------
# Mixers: x [B, T, D] (already normalised) -> [B, T, D]

def attention(cfg, P, pre, x, letter):
    o = layer_opts(cfg, letter)
    B, T, _ = x.shape
    H, Hkv, hd = o["n_heads"], o["n_kv_heads"], o["head_dim"]
    q = (x @ P[pre + "q_proj.weight"].T).view(B, T, H, hd)
    k = (x @ P[pre + "k_proj.weight"].T).view(B, T, Hkv, hd)
    v = (x @ P[pre + "v_proj.weight"].T).view(B, T, Hkv, hd)
    if o["qk_norm"]:  # before RoPE (Qwen3)
        q = rmsnorm(q, P[pre + "q_norm.weight"], 1e-6)
        k = rmsnorm(k, P[pre + "k_norm.weight"], 1e-6)
    if o["rope"]:
        q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
    k = k.repeat_interleave(H // Hkv, dim=2)  # query head h reads kv head h // (H/Hkv)
    v = v.repeat_interleave(H // Hkv, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)  # [B, H, T, T]
    t_idx = torch.arange(T)[:, None]
    s_idx = torch.arange(T)[None, :]
    allowed = s_idx <= t_idx
    if letter == "S":  # W keys including the current one: t-W+1 .. t
        allowed = allowed & (s_idx > t_idx - o["window"])
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1)
    out = torch.einsum("bhts,bshd->bthd", p, v).reshape(B, T, H * hd)
    return out @ P[pre + "o_proj.weight"].T


def lightning(cfg, P, pre, x, layer):
    o = layer_opts(cfg, "L")
    B, T, _ = x.shape
    H, hd = o["n_heads"], o["head_dim"]
    q = silu(x @ P[pre + "q_proj.weight"].T).view(B, T, H, hd)
    k = silu(x @ P[pre + "k_proj.weight"].T).view(B, T, H, hd)
    v = silu(x @ P[pre + "v_proj.weight"].T).view(B, T, H, hd)
    lam = torch.exp(-lightning_slopes(H, layer, cfg["n_layers"]))  # [H]
    y = lightning_recurrent_core(q, k, v, lam).reshape(B, T, H * hd)
    y = rmsnorm(y, P[pre + "norm.weight"], 1e-6) * torch.sigmoid(x @ P[pre + "output_gate.weight"].T)
    return y @ P[pre + "o_proj.weight"].T


def mamba2(cfg, P, pre, x):
    B, T, _ = x.shape
    di, hp, nh, N = mamba_dims(cfg)
    zxbcdt = x @ P[pre + "in_proj.weight"].T
    z, xBC, dt = torch.split(zxbcdt, [di, di + 2 * N, nh], dim=-1)
    xBC = silu(causal_conv4(xBC, P[pre + "conv1d.weight"], P[pre + "conv1d.bias"]))
    xs, Bm, Cm = torch.split(xBC, [di, N, N], dim=-1)
    xs = xs.reshape(B, T, nh, hp)
    dt = softplus(dt + P[pre + "dt_bias"])  # [B, T, nh]
    A = -torch.exp(P[pre + "A_log"])        # [nh]
    Dp = P[pre + "D"]
    y = ssd_recurrent_core(xs, dt, A, Bm, Cm, Dp).reshape(B, T, di)
    y = rmsnorm(y * silu(z), P[pre + "norm.weight"], 1e-5)  # gate before norm
    return y @ P[pre + "out_proj.weight"].T


def gated_deltanet(cfg, P, pre, x):
    o = layer_opts(cfg, "G")
    B, T, _ = x.shape
    H, hd = o["n_heads"], o["head_dim"]
    q = silu(causal_conv4(x @ P[pre + "q_proj.weight"].T, P[pre + "q_conv1d.weight"])).view(B, T, H, hd)
    k = silu(causal_conv4(x @ P[pre + "k_proj.weight"].T, P[pre + "k_conv1d.weight"])).view(B, T, H, hd)
    v = silu(causal_conv4(x @ P[pre + "v_proj.weight"].T, P[pre + "v_conv1d.weight"])).view(B, T, H, hd)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * hd ** -0.5  # L2 norm, then scale
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    beta = torch.sigmoid(x @ P[pre + "b_proj.weight"].T)  # [B, T, H]
    g = -torch.exp(P[pre + "A_log"]) * softplus(x @ P[pre + "a_proj.weight"].T + P[pre + "dt_bias"])
    y = gdn_recurrent_core(q, k, v, beta, g)  # [B, T, H, V]
    y = rmsnorm(y, P[pre + "o_norm.weight"], 1e-5) * silu(x @ P[pre + "g_proj.weight"].T).view(B, T, H, hd)
    return y.reshape(B, T, H * hd) @ P[pre + "o_proj.weight"].T


# ---------------------------------------------------------------------------------------------
# The model

def forward(cfg, P, ids):
    """ids [B, T] (long) -> logits [B, T, V]."""
    eps = cfg["norm_eps"]
    x = P["model.embed_tokens.weight"][ids]
    for i in range(cfg["n_layers"]):
        L = layer_letter(cfg, i)
        p = f"model.layers.{i}."
        h = rmsnorm(x, P[p + "input_layernorm.weight"], eps)
        if L in "FS":
            m = attention(cfg, P, p + "self_attn.", h, L)
        elif L == "L":
            m = lightning(cfg, P, p + "linear_attn.", h, i)
        elif L == "M":
            m = mamba2(cfg, P, p + "mixer.", h)
        else:
            m = gated_deltanet(cfg, P, p + "linear_attn.", h)
        x = x + m
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps)
        mlp = (silu(h @ P[p + "mlp.gate_proj.weight"].T) * (h @ P[p + "mlp.up_proj.weight"].T))
        x = x + mlp @ P[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, P["model.norm.weight"], eps)
    return x @ P["lm_head.weight"].T


def loss_fn(logits, targets):
    """Mean cross-entropy over all B*T positions."""
    V = logits.shape[-1]
    return Fn.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def config_json(cfg):
    return json.dumps(cfg, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# Second formulations, only to check the ones above (make_golden.py compares them)

def attention_loop(cfg, P, pre, x, letter):
    """Per (b, t, h) loop over the allowed keys, GQA by explicit index h // (H / Hkv)."""
    o = layer_opts(cfg, letter)
    B, T, _ = x.shape
    H, Hkv, hd = o["n_heads"], o["n_kv_heads"], o["head_dim"]
    q = (x @ P[pre + "q_proj.weight"].T).view(B, T, H, hd)
    k = (x @ P[pre + "k_proj.weight"].T).view(B, T, Hkv, hd)
    v = (x @ P[pre + "v_proj.weight"].T).view(B, T, Hkv, hd)
    if o["qk_norm"]:
        q = rmsnorm(q, P[pre + "q_norm.weight"], 1e-6)
        k = rmsnorm(k, P[pre + "k_norm.weight"], 1e-6)
    if o["rope"]:
        q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
    out = torch.zeros(B, T, H, hd, dtype=DT)
    for b in range(B):
        for t in range(T):
            lo = max(0, t - o["window"] + 1) if letter == "S" else 0
            for h in range(H):
                kh = h // (H // Hkv)
                sc = torch.stack([q[b, t, h] @ k[b, s, kh] for s in range(lo, t + 1)]) / math.sqrt(hd)
                w = torch.exp(sc - sc.max())
                w = w / w.sum()
                out[b, t, h] = sum(w[j] * v[b, lo + j, kh] for j in range(t + 1 - lo))
    return out.reshape(B, T, H * hd) @ P[pre + "o_proj.weight"].T


def lightning_parallel_core(q, k, v, lam):
    """o_t = sum_{s<=t} lam^(t-s) (q_t . k_s) v_s; q, k, v [B, T, H, d], lam [H]."""
    T = q.shape[1]
    t_idx = torch.arange(T, dtype=DT)
    dist = t_idx[:, None] - t_idx[None, :]                          # [T, T]
    decay = torch.where(dist >= 0, lam[:, None, None] ** dist.clamp(min=0), torch.zeros((), dtype=DT))
    return torch.einsum("bthd,bshd,hts,bshe->bthe", q, k, decay, v)


def ssd_parallel_core(xs, dt, A, Bm, Cm, Dp):
    """Mamba-2 as a masked quadratic form: y_t = sum_{s<=t} exp(sum_{r=s+1..t} dt_r A) dt_s (C_t.B_s) x_s
    + D x_t; xs [B, T, nh, P], dt [B, T, nh], Bm/Cm [B, T, N]."""
    T = xs.shape[1]
    a = dt * A                                   # [B, T, nh]
    cs = torch.cumsum(a, dim=1)                  # inclusive
    seg = cs[:, :, None, :] - cs[:, None, :, :]  # [B, t, s, nh] = sum_{r=s+1..t} a_r
    mask = (torch.arange(T)[:, None] >= torch.arange(T)[None, :])[None, :, :, None]
    L = torch.where(mask, torch.exp(torch.where(mask, seg, torch.zeros((), dtype=DT))), torch.zeros((), dtype=DT))
    cb = torch.einsum("btn,bsn->bts", Cm, Bm)
    y = torch.einsum("btsh,bts,bsh,bshp->bthp", L, cb, dt, xs)
    return y + Dp[None, None, :, None] * xs


def gdn_matrix_core(q, k, v, beta, g):
    """docs/model.md literally: S_t = exp(g_t) S_{t-1} (I - beta k k^T) + beta v k^T (S is V x K),
    o_t = S_t q_t."""
    B, T, H, d = q.shape
    eye = torch.eye(d, dtype=DT)
    out = torch.zeros(B, T, H, d, dtype=DT)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(d, d, dtype=DT)
            for t in range(T):
                kk, vv, bt = k[b, t, h], v[b, t, h], beta[b, t, h]
                S = torch.exp(g[b, t, h]) * S @ (eye - bt * torch.outer(kk, kk)) + bt * torch.outer(vv, kk)
                out[b, t, h] = S @ q[b, t, h]
    return out
