"""Independent float64 numpy re-implementation of one ampipe MoE layer, written from docs/layer.md.

Everything here follows the text of docs/layer.md (section numbers in the comments), not the C++:
Philox-4x32-10 in numpy uint64 arithmetic, the parameter init and the layer-check inputs, and the layer's
forward and a hand-derived reverse-mode backward in float64. Only numpy is used.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, replace

import numpy as np

# ----------------------------------------------------------------------------------------- safetensors (§10)


def read_safetensors(path):
    """Returns ({name: float64 array}, metadata). Supports F32 and BF16."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        buf = data[b:e]
        if info["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4").astype(np.float64)
        elif info["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            raise ValueError(f"{path}: {name}: unsupported dtype {info['dtype']}")
        out[name] = a.reshape(info["shape"])
    return out, meta


# ---------------------------------------------------------------------------------------------- Philox (§3)

MASK32 = np.uint64(0xFFFFFFFF)
M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)

PURPOSE = dict(attn_dropout=1, mlp_dropout=2, gate_jitter=3, gate_rsample=4, gate_rts=5, attn_prob_dropout=6,
               init=16, data=17)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Vectorised Philox-4x32-10; all inputs broadcastable arrays of values < 2^32 (held in uint64)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0), np.uint64(k1)
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    for _ in range(10):
        p0 = M0 * c0  # < 2^64: exact in uint64
        p1 = M1 * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & MASK32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & MASK32
        k0 = (k0 + W0) & MASK32
        k1 = (k1 + W1) & MASK32
    return c0, c1, c2, c3


def philox_u32(seed, layer, purpose, token, feature):
    """Word (feature & 3) of Philox(counter = (feature >> 2, token lo, layer << 8 | purpose, token hi),
    key = (seed lo, seed hi)). token/feature: broadcastable integer arrays."""
    token = np.asarray(token, dtype=np.uint64)
    feature = np.asarray(feature, dtype=np.uint64)
    token, feature = np.broadcast_arrays(token, feature)
    w = philox4x32_10(feature >> np.uint64(2), token & MASK32, np.uint64((layer << 8) | purpose),
                      token >> np.uint64(32), seed & 0xFFFFFFFF, seed >> 32)
    sel = (feature & np.uint64(3)).astype(np.int64)
    return np.choose(sel, w)


def philox_uniform(seed, layer, purpose, token, feature):
    """(w >> 8) * 2^-24, exact; in [0, 1)."""
    return (philox_u32(seed, layer, purpose, token, feature) >> np.uint64(8)).astype(np.float64) * 2.0 ** -24


def philox_normal_f32(seed, layer, purpose, token, feature):
    """Box-Muller over uniforms at features 2f and 2f+1; computed in double, rounded to float32."""
    feature = np.asarray(feature, dtype=np.uint64)
    u1 = 1.0 - philox_uniform(seed, layer, purpose, token, np.uint64(2) * feature)
    u2 = philox_uniform(seed, layer, purpose, token, np.uint64(2) * feature + np.uint64(1))
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)


# --------------------------------------------------------------------------------------------- config (§1)


@dataclass
class Cfg:
    s: int = 64
    b: int = 1
    G: int = 0
    h: int = 64
    F: int = 256
    n: int = 4
    E: int = 4
    k: int = 2
    cf: float = 1.0
    min_cap: int = 4
    no_drop: bool = False
    rts: bool = True
    noisy: str = "None"
    swiglu: bool = False
    p: float = 0.0
    pa: float = 0.0  # --attention-dropout on the attention probabilities
    norm: str = "LayerNorm"  # --normalization: LayerNorm or RMSNorm (no biases)
    eps: float = 1e-5  # --norm-epsilon
    g: int = 0  # --num-query-groups with --group-query-attention (0: n, multi-head attention)
    rope: bool = False  # --position-embedding-type rope
    qk_norm: bool = False  # --qk-layernorm: q, k normalised per head over d channels (before RoPE)
    qkv_bias: bool = False  # --add-qkv-bias: qkv = xn Wqkv^T + b (b [(n + 2g)d], id 15)
    bias_linear: bool = False  # --add-bias-linear: proj, the experts' and the dense MLP's fc1/fc2 (ids 17..21), QKV
    shared_gate: bool = False  # --moe-shared-expert-gate: mlp * sigmoid(ln2 . g), g = mlp.gate.weight [1, h] (id 16)
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    rotary_interleaved: bool = False
    router: str = "deepspeed_moe"  # --moe-model-type: deepspeed_moe or megatron_moe (Megatron-Core's dropless top-k)
    pre_softmax: bool = False  # --moe-router-pre-softmax
    topk_scale: float = 0.0  # --moe-router-topk-scaling-factor (0: none)
    aux_type: str = "aux_loss"  # --moe-router-load-balancing-type: aux_loss, seq_aux_loss, sinkhorn or none
    score: str = "softmax"  # --moe-router-score-function: softmax or sigmoid
    router_groups: int = 0  # --moe-router-num-groups (0: no group-limited routing)
    group_topk: int = 0  # --moe-router-group-topk
    zc: float = 0.0  # --moe-z-loss-coeff (megatron_moe): z = zc * mean_t logsumexp(logits_t)^2
    ecf: float = -1.0  # --moe-expert-capacity-factor (megatron_moe; < 0: none): C = ceil(S k / E * ecf) per chunk
    pad: bool = False  # --moe-pad-expert-input-to-capacity: the same numbers, every expert's rows padded to C
    drop_policy: str = "probs"  # --moe-token-drop-policy: probs (keep the largest weights) or position (the first)
    Fm: int = 0  # the dense MLP's F (§6.11): a shared expert beside the experts, or with E = 0 a dense layer's FFN
    seed: int = 1234
    coeff: float = 0.01
    M: int = 1
    std: float = 0.02
    layer: int = 0

    @property
    def d(self):
        return self.h // self.n

    @property
    def groups(self):
        return self.g if self.g > 0 else self.n

    @property
    def T(self):
        return self.s * self.b

    @property
    def F1(self):
        return 2 * self.F if self.swiglu else self.F

    @property
    def F1m(self):
        return 2 * self.Fm if self.swiglu else self.Fm


PARAM_NAMES = ["ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.proj.weight", "ln2.weight", "ln2.bias",
               "moe.gate.weight", "moe.experts.fc1.weight", "moe.experts.fc2.weight", "mlp.fc1.weight",
               "mlp.fc2.weight",
               "attn.q_layernorm.weight", "attn.q_layernorm.bias", "attn.k_layernorm.weight", "attn.k_layernorm.bias",
               "attn.qkv.bias", "mlp.gate.weight",
               "attn.proj.bias", "moe.experts.fc1.bias", "moe.experts.fc2.bias", "mlp.fc1.bias", "mlp.fc2.bias"]
QK_NORMS = PARAM_NAMES[11:15]
LINEAR_BIASES = PARAM_NAMES[17:22]


def param_names(c: Cfg):
    """The block's parameters: RMSNorm has no biases; the q, k norms (ids 11..14) only with --qk-layernorm, listed
    after attn.qkv.weight; a dense layer (E = 0) no router and experts, a block without the dense MLP (Fm = 0) no
    mlp.*. The ids (init tokens) stay their PARAM_NAMES index."""
    names = PARAM_NAMES[:3] + (["attn.qkv.bias"] if c.qkv_bias or c.bias_linear else []) + \
        (QK_NORMS if c.qk_norm else []) + PARAM_NAMES[3:11] + \
        (["mlp.gate.weight"] if c.shared_gate and c.E > 0 and c.Fm > 0 else [])
    if c.bias_linear:  # each right after its weight
        for b in LINEAR_BIASES:
            names.insert(names.index(b[:-4] + "weight") + 1, b)
    return [n for n in names if not (c.norm == "RMSNorm" and n.endswith(".bias") and n != "attn.qkv.bias"
                                     and n not in LINEAR_BIASES)
            and not (c.E == 0 and n.startswith("moe.")) and not (c.Fm == 0 and n.startswith("mlp."))]


def param_shapes(c: Cfg):
    h = c.h
    kv = c.groups * c.d  # k and v rows each (grouped-query attention: g heads)
    return {"ln1.weight": (h,), "ln1.bias": (h,), "attn.qkv.weight": (h + 2 * kv, h), "attn.proj.weight": (h, h),
            "ln2.weight": (h,), "ln2.bias": (h,), "moe.gate.weight": (c.E, h),
            "moe.experts.fc1.weight": (c.E, c.F1, h), "moe.experts.fc2.weight": (c.E, h, c.F),
            "mlp.fc1.weight": (c.F1m, h), "mlp.fc2.weight": (h, c.Fm),
            "attn.qkv.bias": (h + 2 * kv,), "mlp.gate.weight": (1, h), "attn.proj.bias": (h,),
            "moe.experts.fc1.bias": (c.E, c.F1), "moe.experts.fc2.bias": (c.E, h), "mlp.fc1.bias": (c.F1m,),
            "mlp.fc2.bias": (h,), **{name: (c.d,) for name in QK_NORMS}}


def init_params(c: Cfg):
    """§8: LN weights 1, biases 0, matrices float32(std) * philox_normal(init, token = parameter id)."""
    out = {}
    for name in param_names(c):
        pid = PARAM_NAMES.index(name)
        shape = param_shapes(c)[name]
        if name.endswith(".bias"):  # every bias
            out[name] = np.zeros(shape)
        elif len(shape) == 1:  # the norms' gains
            out[name] = np.ones(shape)
        else:
            z = philox_normal_f32(c.seed, c.layer, PURPOSE["init"], pid, np.arange(int(np.prod(shape))))
            out[name] = (np.float32(c.std) * z).astype(np.float32).astype(np.float64).reshape(shape)
    return out


def make_inputs(c: Cfg):
    """§9: x (id 0) and grad_y (id 1), [s, G, h], element (i, g, j) = philox_normal(data, id, (i*G+g)*h+j)."""
    shape = (c.s, c.G, c.h)
    idx = np.arange(c.s * c.G * c.h)
    x = philox_normal_f32(c.seed, 0, PURPOSE["data"], 0, idx).astype(np.float64).reshape(shape)
    gy = philox_normal_f32(c.seed, 0, PURPOSE["data"], 1, idx).astype(np.float64).reshape(shape)
    return x, gy


# ---------------------------------------------------------------------------------------------- pieces (§4)


def layernorm_fwd(x, g, b, eps=1e-5):
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mu) * rstd
    return xhat * g + b, (xhat, rstd)


def layernorm_bwd(dy, g, ctx):
    xhat, rstd = ctx
    gg = dy * g
    dx = rstd * (gg - gg.mean(axis=1, keepdims=True) - xhat * (gg * xhat).mean(axis=1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def rmsnorm_fwd(x, g, eps=1e-5):
    """§4.1: y = x / sqrt(mean(x^2) + eps) * g (no mean, no bias)."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
    xhat = x * rstd
    return xhat * g, (xhat, rstd)


def rmsnorm_bwd(dy, g, ctx):
    xhat, rstd = ctx
    gg = dy * g
    dx = rstd * (gg - xhat * (gg * xhat).mean(axis=1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), None


def norm_fwd(c: Cfg, x, W, which):
    if c.norm == "RMSNorm":
        return rmsnorm_fwd(x, W[which + ".weight"], c.eps)
    return layernorm_fwd(x, W[which + ".weight"], W[which + ".bias"], c.eps)


def norm_bwd(c: Cfg, dy, W, which, ctx, grads):
    """Adds the norm's parameter gradients to grads; returns dx."""
    if c.norm == "RMSNorm":
        dx, dg, _ = rmsnorm_bwd(dy, W[which + ".weight"], ctx)
    else:
        dx, dg, db = layernorm_bwd(dy, W[which + ".weight"], ctx)
        grads[which + ".bias"] = db
    grads[which + ".weight"] = dg
    return dx


def dropout_mask(c: Cfg, purpose, token0, rows, cols):
    """§5: m[r, j] = (u >= p32) * scale32 with u keyed (purpose, token0 + r, j)."""
    if c.p == 0.0:
        return np.ones((rows, cols))
    p32 = np.float32(c.p)
    scale = float(np.float32(1.0) / (np.float32(1.0) - p32))
    u = philox_uniform(c.seed, c.layer, PURPOSE[purpose], (token0 + np.arange(rows))[:, None], np.arange(cols)[None, :])
    return np.where(u >= float(p32), scale, 0.0)


_erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_grad(x):
    Phi = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
    return Phi + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def act_fwd(c: Cfg, h1):
    if c.swiglu:  # [a | g] halves (the experts' F, or the dense MLP's)
        F = h1.shape[1] // 2
        a, g = h1[:, :F], h1[:, F:]
        return a * sigmoid(a) * g
    return gelu(h1)


def act_bwd(c: Cfg, h1, dact):
    if c.swiglu:
        F = h1.shape[1] // 2
        a, g = h1[:, :F], h1[:, F:]
        sa = sigmoid(a)
        return np.concatenate([dact * g * sa * (1.0 + a * (1.0 - sa)), dact * a * sa], axis=1)
    return dact * gelu_grad(h1)


def capacity(S, E, k, cf, min_cap):
    """§6.4: ceil(float32(float32(S/E) * float32(k*cf))), then >= min_cap, then <= S."""
    prod = np.float32(np.float32(S / E) * np.float32(k * cf))
    C = int(math.ceil(float(prod)))
    C = max(C, min_cap)
    return min(C, S)


def softmax_rows(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


# ------------------------------------------------------------------------------------------------ the gate (§6)


def top_k_rows(scores, k):
    """The k largest of each row, largest first; ties: the lower expert first."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


def routing_top_k(c: Cfg, scores):
    """§6.10: the routing choices, group-limited with --moe-router-num-groups / --moe-router-group-topk: a group's
    score is the sum of its k/g largest scores; the g best groups are kept, the k choices made among their experts."""
    if c.group_topk == 0:
        return top_k_rows(scores, c.k)
    S, E = scores.shape
    per = E // c.router_groups
    grouped = scores.reshape(S, c.router_groups, per)
    gscore = -np.sort(-grouped, axis=2)[:, :, :c.k // c.group_topk].sum(axis=2)
    keep = top_k_rows(gscore, c.group_topk)
    mask = np.zeros((S, c.router_groups), dtype=bool)
    mask[np.arange(S)[:, None], keep] = True
    masked = np.where(np.repeat(mask, per, axis=1), scores, -np.inf)
    return top_k_rows(masked, c.k)


def sinkhorn_top_k(logits, k):
    """§6.10, sinkhorn balancing: Megatron's sinkhorn (tolerance 1e-4) over the router call's tokens, and the k
    largest entries of each row of the normalised matrix (ties: the lower expert)."""
    cost = np.exp(logits)
    S, E = cost.shape
    d0, d1 = np.ones(S), np.ones(E)
    d1_old, error = d1, 1e9
    while error > 1e-4:
        d0 = (1.0 / S) / ((cost * d1[None, :]).sum(axis=1) + 1e-8)
        d1 = (1.0 / E) / ((cost * d0[:, None]).sum(axis=0) + 1e-8)
        error = np.abs(d1_old - d1).mean()
        d1_old = d1
    return top_k_rows(d0[:, None] * cost * d1[None, :], k)


def megatron_gate_chunk(c: Cfg, xin, Wg):
    """§6.10: Megatron-Core's router (topk_routing_with_score_function). softmax: the k largest logits (pre-softmax:
    the k largest probabilities), weights the softmax over those k logits (pre-softmax: their probabilities);
    sigmoid: the k largest s = sigmoid(logits), weights s / sum of the chosen s (k > 1); times the scaling factor;
    nothing dropped unless a capacity factor is given (then each expert keeps min(S, ceil(S k / E f)) of them). P holds the aux losses' scores (the softmax, or s / sum s); their counts are the top-k of P
    (the routing choices when routing is neither grouped nor sigmoid)."""
    S, E, k = xin.shape[0], c.E, c.k
    logits = xin @ Wg.T
    rows = np.arange(S)[:, None]
    sf = c.topk_scale if c.topk_scale > 0 else 1.0
    s = None
    if c.score == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-logits))
        P = s / (s.sum(axis=1, keepdims=True) + 1e-20)
        choice = sinkhorn_top_k(logits, k) if c.aux_type == "sinkhorn" else routing_top_k(c, s)
        sel = s[rows, choice]
        w = sel / (sel.sum(axis=1, keepdims=True) + 1e-20) if k > 1 else sel
    else:
        P = softmax_rows(logits)
        choice = sinkhorn_top_k(logits, k) if c.aux_type == "sinkhorn" else routing_top_k(c, P if c.pre_softmax else logits)
        w = P[rows, choice] if c.pre_softmax else softmax_rows(logits[rows, choice])
    aux_choice = top_k_rows(P, k) if (c.score == "sigmoid" or c.group_topk > 0) else choice
    kept = np.ones((S, k), dtype=bool)
    C = None
    if c.ecf >= 0:  # Megatron's capacity (apply_router_token_dropping) over this chunk's S tokens
        C = min(S, math.ceil((S * k / E) * c.ecf))
        for e in range(E):
            ts, ci = np.nonzero(choice == e)  # token order (a token chooses e at most once)
            if len(ts) <= C:
                continue
            # keep the C largest weights (ties: the earlier token), or the C earliest tokens
            order = sorted(range(len(ts)), key=lambda j: (-w[ts[j], ci[j]], ts[j]) if c.drop_policy == "probs"
                           else ts[j])
            for j in order[C:]:
                kept[ts[j], ci[j]] = False
    counts = np.bincount(choice[kept], minlength=E)
    if C is None or not c.pad:
        C = int(counts.max())
    mx = logits.max(axis=1)
    lse = mx + np.log(np.exp(logits - mx[:, None]).sum(axis=1))
    return dict(xg=xin, noise=np.ones_like(xin), P=P, choice=choice, kept=kept,
                slot=np.zeros((S, k), dtype=np.int64), w=w * sf, q=w, sf=sf, C=C, counts=counts, S=S,
                lse=lse, s=s, logits=logits, aux_counts=np.bincount(aux_choice.ravel(), minlength=E),
                aux_choice=aux_choice)


def gate_chunk(c: Cfg, xin, Wg, token0):
    """Routes one chunk. Returns a dict with the noisy input, probs, choices, slots, kept flags and weights."""
    if c.router == "megatron_moe":
        return megatron_gate_chunk(c, xin, Wg)
    S, E, k = xin.shape[0], c.E, c.k
    toks = token0 + np.arange(S)
    if c.noisy == "Jitter":
        u = philox_uniform(c.seed, c.layer, PURPOSE["gate_jitter"], toks[:, None], np.arange(c.h)[None, :])
        noise = (1.0 - 1e-2) + 2.0 * 1e-2 * u
    else:
        noise = np.ones_like(xin)
    xg = xin * noise
    logits = xg @ Wg.T
    P = softmax_rows(logits)
    # choices (§6.3): argmax with the lower index on ties (np.argmax returns the first maximum)
    if c.noisy == "RSample" and k == 1:
        w = philox_u32(c.seed, c.layer, PURPOSE["gate_rsample"], toks[:, None], np.arange(E)[None, :])
        uu = ((w >> np.uint64(8)).astype(np.float64) + 0.5) * 2.0 ** -24
        e1 = np.argmax(logits + (-np.log(-np.log(uu))), axis=1)
    else:
        e1 = np.argmax(P, axis=1)
    choice = [e1]
    if k == 2:
        P2 = P.copy()
        P2[np.arange(S), e1] = -np.inf
        choice.append(np.argmax(P2, axis=1))
    choice = np.stack(choice, axis=1)  # [S, k]
    first_count = np.bincount(e1, minlength=E)
    second_count = np.bincount(choice[:, 1], minlength=E) if k == 2 else np.zeros(E, dtype=np.int64)
    if c.no_drop:
        C = int((first_count + second_count).max())
    else:
        C = capacity(S, E, k, c.cf, c.min_cap)
    kept = np.zeros((S, k), dtype=bool)
    slot = -np.ones((S, k), dtype=np.int64)
    if k == 1:
        keep = np.ones(S, dtype=bool)
        if c.rts:
            pri = philox_uniform(c.seed, c.layer, PURPOSE["gate_rts"], toks, 0)
        for e in range(E):
            ts = np.nonzero(e1 == e)[0]  # token order
            if len(ts) <= C:
                continue
            if c.rts:
                order = sorted(ts.tolist(), key=lambda t: (-pri[t], t))
                for t in order[C:]:
                    keep[t] = False
            else:
                keep[ts[C:]] = False
        for e in range(E):
            ts = np.nonzero((e1 == e) & keep)[0]
            slot[ts, 0] = np.arange(len(ts))
        kept[:, 0] = keep
        wts = np.where(keep, P[np.arange(S), e1], 0.0)[:, None]
    else:
        run1 = np.zeros(E, dtype=np.int64)
        run2 = np.zeros(E, dtype=np.int64)
        for t in range(S):
            a, bb = choice[t]
            slot[t, 0] = run1[a]
            run1[a] += 1
            slot[t, 1] = first_count[bb] + run2[bb]
            run2[bb] += 1
        kept = slot < C
        slot[~kept] = -1
        pk = np.where(kept, P[np.arange(S)[:, None], choice], 0.0)
        den = np.maximum(pk.sum(axis=1), float(np.finfo(np.float32).eps))
        wts = pk / den[:, None]
    return dict(xg=xg, noise=noise, P=P, choice=choice, kept=kept, slot=slot, w=wts, C=C,
                first_count=first_count, S=S)


# -------------------------------------------------------------------------------------- forward + backward (§7)


def attention_dropout_mask(c: Cfg, token_base):
    """§5: the attention probabilities' mask [b, n, s(query), s(key)]: u keyed (attn_prob_dropout, token = the query's
    token_base + i*b + batch, feature = head*s + key position)."""
    s, b, n = c.s, c.b, c.n
    if c.pa == 0.0:
        return np.ones((b, n, s, s))
    p32 = np.float32(c.pa)
    scale = float(np.float32(1.0) / (np.float32(1.0) - p32))
    tok = (np.uint64(token_base) + np.arange(s, dtype=np.uint64)[None, None, :, None] * np.uint64(b)
           + np.arange(b, dtype=np.uint64)[:, None, None, None])
    feat = (np.arange(n, dtype=np.uint64)[None, :, None, None] * np.uint64(s)
            + np.arange(s, dtype=np.uint64)[None, None, None, :])
    tok, feat = np.broadcast_arrays(tok, feat)
    u = philox_uniform(c.seed, c.layer, PURPOSE["attn_prob_dropout"], tok, feat)
    return np.where(u >= float(p32), scale, 0.0)


def rope_cos_sin(c: Cfg):
    """§4.4: Megatron's rotary table: inv_freq = 1 / base^(arange(0, r, 2) / r) and the angles pos * inv_freq in
    float32 (as Megatron computes them), their cos and sin [s, r/2] in float64."""
    r = int(c.d * c.rotary_percent) if c.rotary_percent < 1.0 else c.d
    inv = (np.float32(1.0) / (np.float32(c.rotary_base) ** (np.arange(0, r, 2, dtype=np.float32) / np.float32(r))))
    ang = np.outer(np.arange(c.s, dtype=np.float32), inv.astype(np.float32)).astype(np.float32)
    return r, np.cos(ang.astype(np.float64)), np.sin(ang.astype(np.float64))


def rope_rotate(c: Cfg, t, inverse=False):
    """t [b, heads, s, d]: the first r channels rotated as Megatron's rotate_half (pairs (i, i + r/2)) or, with
    --rotary-interleaved, pairs (2i, 2i+1); inverse: by -angle (the transpose, for the gradient)."""
    if not c.rope:
        return t
    r, cos, sin = rope_cos_sin(c)
    if inverse:
        sin = -sin
    out = t.copy()
    if c.rotary_interleaved:
        lo, hi = t[..., 0:r:2], t[..., 1:r:2]
        out[..., 0:r:2] = lo * cos - hi * sin
        out[..., 1:r:2] = hi * cos + lo * sin
    else:
        lo, hi = t[..., :r // 2], t[..., r // 2:r]
        out[..., :r // 2] = lo * cos - hi * sin
        out[..., r // 2:r] = hi * cos + lo * sin
    return out


def qk_norm_fwd(c: Cfg, qkv, W):
    """--qk-layernorm (§4.5): the q columns [T, n*d] as [T*n, d] and the k columns [T, g*d] as [T*g, d], each row
    normalised by the block's norm with the [d] weights of attn.q_layernorm / attn.k_layernorm."""
    if not c.qk_norm:
        return qkv, None
    h, kv, d = c.h, c.groups * c.d, c.d
    out, ctx = qkv.copy(), []
    for which, lo, hi in (("attn.q_layernorm", 0, h), ("attn.k_layernorm", h, h + kv)):
        part = qkv[:, lo:hi].reshape(-1, d)
        y, nc = norm_fwd(c, part, W, which)
        out[:, lo:hi] = y.reshape(qkv.shape[0], hi - lo)
        ctx.append(nc)
    return out, ctx


def qk_norm_bwd(c: Cfg, dqkv, W, ctx, grads):
    if not c.qk_norm:
        return dqkv
    h, kv, d = c.h, c.groups * c.d, c.d
    out = dqkv.copy()
    for (which, lo, hi), nc in zip((("attn.q_layernorm", 0, h), ("attn.k_layernorm", h, h + kv)), ctx):
        dx = norm_bwd(c, dqkv[:, lo:hi].reshape(-1, d), W, which, nc, grads)
        out[:, lo:hi] = dx.reshape(dqkv.shape[0], hi - lo)
    return out


def attention_fwd(c: Cfg, qkv, token_base=0):
    s, b, n, d, h = c.s, c.b, c.n, c.d, c.h
    g = c.groups
    kv = g * d
    q = qkv[:, :h].reshape(s, b, n, d).transpose(1, 2, 0, 3)  # [b, n, s, d]
    kk = qkv[:, h:h + kv].reshape(s, b, g, d).transpose(1, 2, 0, 3)  # [b, g, s, d]
    v = qkv[:, h + kv:].reshape(s, b, g, d).transpose(1, 2, 0, 3)
    q, kk = rope_rotate(c, q), rope_rotate(c, kk)
    # grouped-query attention: query head i reads K, V head i // (n / g)
    kk, v = np.repeat(kk, n // g, axis=1), np.repeat(v, n // g, axis=1)
    sc = q @ kk.transpose(0, 1, 3, 2) / math.sqrt(d)
    mask = np.tril(np.ones((s, s), dtype=bool))
    sc = np.where(mask, sc, -np.inf)
    Pm = np.exp(sc - sc.max(axis=-1, keepdims=True))
    Pm = Pm / Pm.sum(axis=-1, keepdims=True)
    am = attention_dropout_mask(c, token_base)
    o = (Pm * am) @ v  # [b, n, s, d]
    return o.transpose(2, 0, 1, 3).reshape(s * b, h), (q, kk, v, Pm, am)


def attention_bwd(c: Cfg, dout, ctx):
    s, b, n, d, h = c.s, c.b, c.n, c.d, c.h
    q, kk, v, Pm, am = ctx
    do = dout.reshape(s, b, n, d).transpose(1, 2, 0, 3)
    dv = (Pm * am).transpose(0, 1, 3, 2) @ do
    dP = (do @ v.transpose(0, 1, 3, 2)) * am  # the gradient of the undropped probabilities
    dS = Pm * (dP - (dP * Pm).sum(axis=-1, keepdims=True)) / math.sqrt(d)
    dq = dS @ kk
    dk = dS.transpose(0, 1, 3, 2) @ q
    g = c.groups  # the query heads of a group add their K, V gradients
    dk = dk.reshape(b, g, n // g, s, d).sum(axis=2)
    dv = dv.reshape(b, g, n // g, s, d).sum(axis=2)
    dq, dk = rope_rotate(c, dq, inverse=True), rope_rotate(c, dk, inverse=True)
    back = lambda t: t.transpose(2, 0, 1, 3).reshape(s * b, t.shape[1] * d)
    return np.concatenate([back(dq), back(dk), back(dv)], axis=1)


def layer_micro_batch(c: Cfg, W, x, gy, token_base):
    """One micro-batch. x, gy: [s, b, h]. Returns y [s,b,h], l_aux, dx [s,b,h], {param: grad} (not averaged),
    and routing info. Loss = <gy, y> + coeff * l_aux."""
    T, h, E, k = c.T, c.h, c.E, c.k
    X = x.reshape(T, h)
    # attention block
    xn, ln1c = norm_fwd(c, X, W, "ln1")
    B = lambda name: W[name] if name in W else 0.0  # a bias, or none
    qkv_lin = xn @ W["attn.qkv.weight"].T + B("attn.qkv.bias")
    qkv, qkc = qk_norm_fwd(c, qkv_lin, W)
    attn, actx = attention_fwd(c, qkv, token_base)
    proj = attn @ W["attn.proj.weight"].T + B("attn.proj.bias")
    m1 = dropout_mask(c, "attn_dropout", token_base, T, h)
    ln_in = X + proj * m1
    ln2, ln2c = norm_fwd(c, ln_in, W, "ln2")
    # MoE, chunk by chunk
    Sc = T // c.M
    W1, W2 = (W["moe.experts.fc1.weight"], W["moe.experts.fc2.weight"]) if E > 0 else (None, None)
    b1 = W.get("moe.experts.fc1.bias", np.zeros((max(E, 1), c.F1)))
    b2 = W.get("moe.experts.fc2.bias", np.zeros((max(E, 1), h)))
    moe = np.zeros((T, h))
    gates, Sp, Sm = [], np.zeros(E), np.zeros(E)
    SpB, SmB = np.zeros((c.b, E)), np.zeros((c.b, E))  # seq_aux_loss: per sequence of the micro-batch
    for ch in range(c.M if E > 0 else 0):
        r0 = ch * Sc
        g = gate_chunk(c, ln2[r0:r0 + Sc], W["moe.gate.weight"], token_base + r0)
        g["r0"] = r0
        # expert outputs of every kept choice
        g["h1"], g["act"], g["fout"] = {}, {}, {}
        for t in range(Sc):
            for i in range(k):
                if not g["kept"][t, i]:
                    continue
                e = g["choice"][t, i]
                xr = ln2[r0 + t]
                h1 = W1[e] @ xr + b1[e]
                a = act_fwd(c, h1[None, :])[0]
                f = W2[e] @ a + b2[e]
                g["h1"][(t, i)], g["act"][(t, i)], g["fout"][(t, i)] = h1, a, f
                moe[r0 + t] += g["w"][t, i] * f
        Sp += g["P"].sum(axis=0)
        if c.router == "megatron_moe":  # §6.10: every choice counts, over k; none: no aux loss
            Sm += g["aux_counts"] / k if c.aux_type == "aux_loss" else 0.0
            seq = (r0 + np.arange(Sc)) % c.b  # token r = position * b + sequence
            g["seq"] = seq
            for t in range(Sc):
                SpB[seq[t]] += g["P"][t]
                SmB[seq[t], g["aux_choice"][t]] += 1.0 / k
        else:
            Sm += np.bincount(g["choice"][:, 0], minlength=E)
        gates.append(g)
    N = float(T)
    l_aux = E * np.sum((Sp / N) * (Sm / N))
    seq_aux = c.router == "megatron_moe" and c.aux_type == "seq_aux_loss"
    if seq_aux:  # each sequence's aux loss over its s tokens, averaged over the b sequences
        l_aux = E * np.sum((SpB / c.s) * (SmB / c.s)) / c.b
    if c.Fm > 0:  # §6.11: the dense MLP on every token, added to the experts' output before dropout and residual
        mh1 = ln2 @ W["mlp.fc1.weight"].T + B("mlp.fc1.bias")
        mact = act_fwd(c, mh1)
        mlp_y = mact @ W["mlp.fc2.weight"].T + B("mlp.fc2.bias")
        gated = c.shared_gate and c.E > 0
        sg = 1.0 / (1.0 + np.exp(-(ln2 @ W["mlp.gate.weight"].T))) if gated else np.ones((T, 1))  # [T, 1]
        moe = moe + sg * mlp_y
    m2 = dropout_mask(c, "mlp_dropout", token_base, T, h)
    Y = ln_in + moe * m2

    # ------------------------------------------------------------------ backward
    grads = {n_: np.zeros(param_shapes(c)[n_]) for n_ in param_names(c)}
    dY = gy.reshape(T, h)
    d_ln_in = dY.copy()
    d_moe = dY * m2
    d_ln2 = np.zeros((T, h))
    if c.Fm > 0:
        d_mlp = d_moe * sg
        if gated:  # d logit_t = <d_moe_t, mlp_t> s_t (1 - s_t)
            dz = (d_moe * mlp_y).sum(axis=1, keepdims=True) * sg * (1.0 - sg)
            grads["mlp.gate.weight"] += dz.T @ ln2
            d_ln2 += dz @ W["mlp.gate.weight"]
        grads["mlp.fc2.weight"] += d_mlp.T @ mact
        dmh1 = act_bwd(c, mh1, d_mlp @ W["mlp.fc2.weight"])
        grads["mlp.fc1.weight"] += dmh1.T @ ln2
        if c.bias_linear:
            grads["mlp.fc2.bias"] += d_mlp.sum(axis=0)
            grads["mlp.fc1.bias"] += dmh1.sum(axis=0)
        d_ln2 += dmh1 @ W["mlp.fc1.weight"]
    daux = c.coeff * E * Sm / (N * N)  # d(coeff*l_aux)/d probs[t, e], every token
    for g in gates:
        r0, S = g["r0"], g["S"]
        dW = np.zeros((S, k))
        for (t, i), f in g["fout"].items():
            e = g["choice"][t, i]
            dm = d_moe[r0 + t]
            dW[t, i] = dm @ f
            df = g["w"][t, i] * dm
            grads["moe.experts.fc2.weight"][e] += np.outer(df, g["act"][(t, i)])
            dact = W2[e].T @ df
            dh1 = act_bwd(c, g["h1"][(t, i)][None, :], dact[None, :])[0]
            grads["moe.experts.fc1.weight"][e] += np.outer(dh1, ln2[r0 + t])
            if c.bias_linear:
                grads["moe.experts.fc2.bias"][e] += df
                grads["moe.experts.fc1.bias"][e] += dh1
            d_ln2[r0 + t] += W1[e].T @ dh1
        P = g["P"]
        dP = np.tile(daux, (S, 1))
        if seq_aux:
            dP = c.coeff * E * SmB[g["seq"]] / (c.s * c.s * c.b)
        rows = np.arange(S)
        if c.router == "megatron_moe" and c.score == "sigmoid":
            sg = g["s"]
            D = sg.sum(axis=1, keepdims=True) + 1e-20
            ds = (dP - (dP * P).sum(axis=1, keepdims=True)) / D  # q = s / D
            sel = sg[rows[:, None], g["choice"]]
            if k == 1:
                ds[rows, g["choice"][:, 0]] += g["sf"] * dW[:, 0]
            else:
                Dk = sel.sum(axis=1, keepdims=True) + 1e-20
                u = sel / Dk
                dsel = g["sf"] * (dW - (dW * u).sum(axis=1, keepdims=True)) / Dk
                for i in range(k):
                    ds[rows, g["choice"][:, i]] += dsel[:, i]
            dlog = ds * sg * (1.0 - sg)
            if c.zc > 0:
                dlog += c.zc * 2.0 * g["lse"][:, None] * softmax_rows(g["logits"]) / N
            grads["moe.gate.weight"] += dlog.T @ g["xg"]
            d_ln2[r0:r0 + S] += dlog @ W["moe.gate.weight"]
            continue
        if c.router == "megatron_moe" and c.pre_softmax:
            for i in range(k):
                dP[rows, g["choice"][:, i]] += g["sf"] * dW[:, i]
        elif c.router == "megatron_moe":
            pass  # the weights are a softmax over the chosen logits: added to dlog below
        elif k == 1:
            kp = g["kept"][:, 0]
            dP[rows[kp], g["choice"][kp, 0]] += dW[kp, 0]
        else:
            kept = g["kept"]
            pk = np.where(kept, P[rows[:, None], g["choice"]], 0.0)
            ssum = pk.sum(axis=1)
            eps = float(np.finfo(np.float32).eps)
            for t in range(S):
                if ssum[t] >= eps:
                    dot = np.sum(np.where(kept[t], dW[t] * g["w"][t], 0.0))
                    for i in range(2):
                        if kept[t, i]:
                            dP[t, g["choice"][t, i]] += (dW[t, i] - dot) / ssum[t]
                else:
                    for i in range(2):
                        if kept[t, i]:
                            dP[t, g["choice"][t, i]] += dW[t, i] / eps
        dlog = P * (dP - (P * dP).sum(axis=1, keepdims=True))
        if c.router == "megatron_moe" and not c.pre_softmax:  # w = sf * softmax(chosen logits)
            q, gw = g["q"], g["sf"] * dW
            dsel = q * (gw - (q * gw).sum(axis=1, keepdims=True))
            for i in range(k):
                dlog[rows, g["choice"][:, i]] += dsel[:, i]
        if c.router == "megatron_moe" and c.zc > 0:  # d z / d logits = zc * 2 lse P / N
            dlog += c.zc * 2.0 * g["lse"][:, None] * P / N
        grads["moe.gate.weight"] += dlog.T @ g["xg"]
        d_ln2[r0:r0 + S] += (dlog @ W["moe.gate.weight"]) * g["noise"]
    dx2 = norm_bwd(c, d_ln2, W, "ln2", ln2c, grads)
    d_ln_in += dx2
    dX = d_ln_in.copy()
    d_proj = d_ln_in * m1
    grads["attn.proj.weight"] += d_proj.T @ attn
    if c.bias_linear:
        grads["attn.proj.bias"] += d_proj.sum(axis=0)
    d_attn = d_proj @ W["attn.proj.weight"]
    dqkv = qk_norm_bwd(c, attention_bwd(c, d_attn, actx), W, qkc, grads)
    grads["attn.qkv.weight"] += dqkv.T @ xn
    if c.qkv_bias or c.bias_linear:
        grads["attn.qkv.bias"] += dqkv.sum(axis=0)
    dxn = dqkv @ W["attn.qkv.weight"]
    dx1 = norm_bwd(c, dxn, W, "ln1", ln1c, grads)
    dX += dx1
    s, b = c.s, c.b
    dropped = int(sum((~g["kept"]).sum() for g in gates))
    return Y.reshape(s, b, h), l_aux, dX.reshape(s, b, h), grads, dict(dropped=dropped, C=[g["C"] for g in gates])


def run_layer(c: Cfg, W, x_full, gy_full):
    """§9: all G/b micro-batches. Returns y [s,G,h], aux [G/b], dx [s,G,h] and param grads of the mean loss, info."""
    if c.router == "megatron_moe" and c.aux_type == "sinkhorn":
        # §6.10: sinkhorn routing scores with sigmoid for top-1 and the full softmax otherwise; its weights are the
        # chosen scores (the pre-softmax weights), unscaled, with no groups
        c = replace(c, score="sigmoid" if c.k == 1 else "softmax", pre_softmax=c.k > 1, topk_scale=0.0,
                    router_groups=0, group_topk=0)
    nmb = c.G // c.b
    y = np.zeros_like(x_full)
    dx = np.zeros_like(x_full)
    aux = np.zeros(nmb)
    grads = {n_: np.zeros(param_shapes(c)[n_]) for n_ in param_names(c)}
    infos = []
    for m in range(nmb):
        sl = slice(m * c.b, (m + 1) * c.b)
        ym, am, dxm, gm, info = layer_micro_batch(c, W, x_full[:, sl, :], gy_full[:, sl, :], m * c.T)
        y[:, sl, :], dx[:, sl, :], aux[m] = ym, dxm, am
        for n_ in param_names(c):
            grads[n_] += gm[n_]
        infos.append(info)
    for n_ in param_names(c):
        grads[n_] /= nmb
    dx /= nmb  # the loss is the mean over micro-batches: every gradient, x's too, carries 1/nmb
    return y, aux, dx, grads, infos
