"""The GPT-MoE of `ampipe train` in PyTorch, written from docs/layer.md and docs/training.md.

What is here (each piece cites the section of the docs it follows):
  * read_safetensors: the safetensors format (docs/layer.md §10) without the `safetensors` package;
  * Philox-4x32-10 (docs/layer.md §3) in numpy uint64 arithmetic: the keys of random token selection and of the
    initialisation;
  * GptMoE: token + learned position embedding (or rotary embeddings, or none), pre-LN MoE blocks (docs/layer.md §4-§7;
    a shared expert, gated or not, beside the routed experts, and dense blocks: §6.11), final LayerNorm, LM head
    (tied or untied), cross-entropy (docs/training.md "Model"). Its state_dict keys are the checkpoint's tensor
    names, so `model.load_state_dict(read_safetensors(".../model.safetensors")[0])` loads an `ampipe train` checkpoint;
  * the DeepSpeed-MoE gate of docs/layer.md §6 (top-1 / top-2, capacity per routing group, random token selection,
    first-come-first-served slots, the top-2 renormalisation), in evaluation mode only: no dropout, no gate noise
    (Jitter, RSample), as `ampipe train` evaluates (docs/training.md "Data");
  * the data: the bundled corpus or --data-path (plain text, byte-level; llm.c token files), the --split and the
    validation / test samples (docs/training.md "Data", src/ampipe/train/text_data.h).

Activations use ampipe's [s, b, h] layout: token t = position * b + sequence is row t of a micro-batch, and row t of
micro-batch m has the global index m * s * b + t that keys random token selection.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ------------------------------------------------------------------------------------------ safetensors


def read_safetensors(path: str, dtype=torch.float32):
    """({name: tensor}, metadata) of a safetensors file: an 8-byte little-endian header length N, a JSON header of
    N bytes ({name: {dtype, shape, data_offsets}}, "__metadata__"), then the raw little-endian data. F32 and BF16."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file ({len(raw)} bytes)")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} runs past the end of the file ({len(raw)} bytes)")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        if info["dtype"] == "F32":
            a = np.frombuffer(data[b:e], dtype="<f4").astype(np.float32)
        elif info["dtype"] == "BF16":
            a = (np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name}: dtype {info['dtype']} is not supported (F32, BF16)")
        out[name] = torch.from_numpy(a.reshape(info["shape"]).copy()).to(dtype)
    return out, meta


# ------------------------------------------------------------------------------- Philox (docs/layer.md §3)

_MASK32 = np.uint64(0xFFFFFFFF)
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
PURPOSE = dict(attn_dropout=1, mlp_dropout=2, gate_jitter=3, gate_rsample=4, gate_rts=5, init=16, data=17)
MODEL_KEY_LAYER = 0xFFFFFF  # the Philox layer field of the embedding-level parameters (src/ampipe/train/gpt_model.h)


def philox_u32(seed: int, layer: int, purpose: int, token, feature) -> np.ndarray:
    """Word (feature & 3) of Philox-4x32-10(counter (feature >> 2, token lo, layer << 8 | purpose, token hi),
    key (seed lo, seed hi)); token and feature broadcast (numpy integer arrays)."""
    token, feature = np.broadcast_arrays(np.asarray(token, dtype=np.uint64), np.asarray(feature, dtype=np.uint64))
    c0, c1 = feature >> np.uint64(2), token & _MASK32
    c2 = np.full(c0.shape, ((layer << 8) | purpose) & 0xFFFFFFFF, dtype=np.uint64)
    c3 = token >> np.uint64(32)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(10):
        p0 = _M0 * c0  # < 2^64: exact in uint64
        p1 = _M1 * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _MASK32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _MASK32
        k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
    return np.choose((feature & np.uint64(3)).astype(np.int64), (c0, c1, c2, c3))


def philox_uniform(seed, layer, purpose, token, feature) -> np.ndarray:
    """(u32 >> 8) * 2^-24: a multiple of 2^-24 in [0, 1), exact in float32 and float64."""
    return (philox_u32(seed, layer, purpose, token, feature) >> np.uint64(8)).astype(np.float64) * 2.0 ** -24


def philox_normal_f32(seed, layer, purpose, token, count: int) -> np.ndarray:
    """Normals f = 0..count-1 (Box-Muller, cosine branch, uniforms at features 2f and 2f+1, float64 rounded to
    float32)."""
    f = np.arange(count, dtype=np.uint64)
    u1 = 1.0 - philox_uniform(seed, layer, purpose, token, np.uint64(2) * f)
    u2 = philox_uniform(seed, layer, purpose, token, np.uint64(2) * f + np.uint64(1))
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).astype(np.float32)


# ------------------------------------------------------------------------------------------------ the model


@dataclass
class ModelConfig:
    """The model and routing settings, named as `ampipe train`'s flags (metadata.json's "config" keys)."""
    num_layers: int = 2
    seq_length: int = 128
    hidden_size: int = 128
    ffn_hidden_size: int = 256        # the experts' F (--moe-ffn-hidden-size; --ffn-hidden-size without it)
    dense_ffn_hidden_size: int = 0    # a dense block's F_m (--ffn-hidden-size; 0: ffn_hidden_size)
    # docs/layer.md §6.11: the shared expert's F_m (0: none) and its gate (mlp.gate.weight [1, h]); the dense blocks
    # (--moe-layer-freq: an integer k, blocks 0, k, 2k, ... have experts, or a list of one 0/1 per block;
    # --first-k-dense-replace K: the first K blocks dense; no experts at all: every block dense)
    moe_shared_expert_intermediate_size: int = 0
    moe_shared_expert_gate: bool = False
    moe_layer_freq: str = "1"
    first_k_dense_replace: int = 0
    num_attention_heads: int = 4
    num_experts: int = 4
    vocab_size: int = 256  # the model's V: the checkpoint's padded_vocab_size (its token embedding's rows)
    moe_router_topk: int = 2
    moe_train_capacity_factor: float = 1.25
    moe_min_capacity: int = 4
    moe_no_drop: bool = False
    use_rts: bool = True
    swiglu: bool = False
    untie_embeddings_and_output_weights: bool = False
    init_method_std: float = 0.02
    seed: int = 1234
    layernorm_epsilon: float = 1e-5   # --norm-epsilon
    normalization: str = "LayerNorm"  # --normalization: LayerNorm or RMSNorm (weight only)
    num_query_groups: int = 0         # grouped-query attention: K, V heads (0: num_attention_heads)
    qk_layernorm: bool = False        # --qk-layernorm: q, k of every head normalised over d (before RoPE)
    add_qkv_bias: bool = False        # --add-qkv-bias: the QKV projection's bias (state_dict attn.qkv.bias)
    add_bias_linear: bool = False     # --add-bias-linear: QKV, proj, the experts' and dense MLPs' fc1/fc2 biases
    moe_model_type: str = "deepspeed_moe"  # or megatron_moe: Megatron-Core's dropless top-k router
    moe_router_pre_softmax: bool = False
    moe_router_topk_scaling_factor: float = 0.0
    position_embedding_type: str = "learned_absolute"  # learned_absolute, rope or none
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    rotary_interleaved: bool = False
    rotary_seq_len_interpolation_factor: int = 0
    use_rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    # Routing groups of one micro-batch (docs/layer.md §6 and §11): the gate routes each AMPipe chunk of each
    # rank's rows with its own capacity. The checkpoint does not record tp, sp or cp (see routing_groups).
    ampipe_degree: int = 1
    sequence_parallel_size: int = 1   # --tensor-model-parallel-size with --sequence-parallel, else 1
    context_parallel_size: int = 1

    @staticmethod
    def from_checkpoint(config: dict, vocab_size: int) -> "ModelConfig":
        c = ModelConfig(vocab_size=vocab_size)
        for k in ("num_layers", "seq_length", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_experts",
                  "moe_router_topk", "moe_min_capacity", "seed", "ampipe_degree",
                  "moe_shared_expert_intermediate_size", "first_k_dense_replace"):
            if k in config:
                setattr(c, k, int(config[k]))
        # metadata.json: ffn_hidden_size is the dense blocks' F, moe_ffn_hidden_size the experts'
        if config.get("moe_ffn_hidden_size"):
            c.dense_ffn_hidden_size = c.ffn_hidden_size
            c.ffn_hidden_size = int(config["moe_ffn_hidden_size"])
        if "moe_layer_freq" in config:
            c.moe_layer_freq = str(config["moe_layer_freq"])
        if "moe_shared_expert_gate" in config:
            c.moe_shared_expert_gate = bool(config["moe_shared_expert_gate"])
        for k in ("moe_train_capacity_factor", "init_method_std"):
            if k in config:
                setattr(c, k, float(config[k]))
        for k in ("moe_no_drop", "swiglu", "untie_embeddings_and_output_weights", "qk_layernorm", "add_qkv_bias",
                  "add_bias_linear"):
            if k in config:
                setattr(c, k, bool(config[k]))
        if "no_use_rts" in config:
            c.use_rts = not bool(config["no_use_rts"])
        if "norm_epsilon" in config:
            c.layernorm_epsilon = float(config["norm_epsilon"])
        if "normalization" in config:
            c.normalization = str(config["normalization"])
        if config.get("group_query_attention"):
            c.num_query_groups = int(config["num_query_groups"])
        for k in ("position_embedding_type", "moe_model_type"):
            if k in config:
                setattr(c, k, str(config[k]))
        if "moe_router_pre_softmax" in config:
            c.moe_router_pre_softmax = bool(config["moe_router_pre_softmax"])
        if "moe_router_topk_scaling_factor" in config:
            c.moe_router_topk_scaling_factor = float(config["moe_router_topk_scaling_factor"])
        for k in ("rotary_base", "rotary_percent", "rope_scaling_factor"):
            if k in config:
                setattr(c, k, float(config[k]))
        for k in ("rotary_interleaved", "use_rope_scaling"):
            if k in config:
                setattr(c, k, bool(config[k]))
        if config.get("rotary_seq_len_interpolation_factor"):
            c.rotary_seq_len_interpolation_factor = int(config["rotary_seq_len_interpolation_factor"])
        return c


def _list_expr(text: str):
    """A Megatron --moe-layer-freq list expression ("[1,0]*2", "([0]+[1]*3)"): lists of ints, + and * only."""
    import ast

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.List):
            return [ev(e) for e in n.elts]
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return n.value
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Mult)):
            a, b = ev(n.left), ev(n.right)
            return a + b if isinstance(n.op, ast.Add) else a * b
        raise ValueError(f"--moe-layer-freq {text!r}: not a list expression of [...], + and *")

    v = ev(ast.parse(text, mode="eval"))
    if not isinstance(v, list):
        raise ValueError(f"--moe-layer-freq {text!r} is not a list")
    return v


def moe_layers(c: ModelConfig):
    """One flag per block (True: experts), docs/training.md: --moe-layer-freq k (block i has experts iff i % k == 0)
    or its 0/1 list, then the first --first-k-dense-replace blocks dense; no experts: every block dense."""
    if c.num_experts == 0:
        return [False] * c.num_layers
    f = c.moe_layer_freq.strip()
    if f.isdigit():
        moe = [i % int(f) == 0 for i in range(c.num_layers)]
    else:
        v = _list_expr(f)
        if len(v) != c.num_layers:
            raise ValueError(f"--moe-layer-freq {f} has {len(v)} entries for {c.num_layers} layers")
        moe = [x == 1 for x in v]
    return [m and i >= c.first_k_dense_replace for i, m in enumerate(moe)]


def capacity(S: int, E: int, k: int, cf: float, min_cap: int) -> int:
    """docs/layer.md §6.4: ceil(fp32(fp32(S/E) * fp32(k*cf))), at least min_cap, at most S (DeepSpeed's _capacity)."""
    prod = np.float32(np.float32(S / E) * np.float32(k * cf))
    if not prod < np.float32(S):
        return S
    return min(max(int(math.ceil(float(prod))), min_cap), S)


class RMSNorm(nn.Module):
    """docs/layer.md §4.1: y = x / sqrt(mean(x^2) + eps) * weight (Megatron-Core's RMSNorm; no bias)."""

    def __init__(self, h: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def make_norm(c: "ModelConfig", h: int) -> nn.Module:
    if c.normalization == "RMSNorm":
        return RMSNorm(h, c.layernorm_epsilon)
    if c.normalization != "LayerNorm":
        raise ValueError(f"normalization {c.normalization!r} is not LayerNorm or RMSNorm")
    return nn.LayerNorm(h, eps=c.layernorm_epsilon)


class _Weight(nn.Module):
    """One named weight (so that the state_dict key ends in ".weight", as the checkpoint's names do), and a bias
    of `bias_shape` (".bias") when given."""

    def __init__(self, *shape, bias_shape=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(*shape))
        if bias_shape is not None:
            self.bias = nn.Parameter(torch.zeros(*bias_shape))

    def add_bias(self, y, e=None):
        """y plus the bias (expert e's row of it), or y without one."""
        if not hasattr(self, "bias"):
            return y
        return y + (self.bias if e is None else self.bias[e])


def rope_cos_sin(c: ModelConfig, s: int):
    """docs/layer.md §4.4, as Megatron-Core's RotaryEmbedding builds it: r = int(d * rotary_percent) channels,
    inv_freq = 1 / base^(arange(0, r, 2) / r) in float32 (Llama 3's scaling applied to it when set), positions
    0..s-1 (divided by the interpolation factor), freqs = outer(positions, inv_freq), emb = [freqs, freqs] (or each
    frequency twice in a row, interleaved); returns (r, cos(emb), sin(emb)) [s, r]."""
    d = c.hidden_size // c.num_attention_heads
    r = int(d * c.rotary_percent) if c.rotary_percent < 1.0 else d
    inv = 1.0 / (torch.tensor(c.rotary_base, dtype=torch.float32) ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
    if c.use_rope_scaling:  # Llama 3.x: factor, low 1, high 4, original context 8192
        low_wl, high_wl = 8192 / 1.0, 8192 / 4.0
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > low_wl, inv / c.rope_scaling_factor, inv)
        smooth = (8192 / wl - 1.0) / (4.0 - 1.0)
        mid = (1 - smooth) * scaled / c.rope_scaling_factor + smooth * scaled
        inv = torch.where(~(wl < high_wl) & ~(wl > low_wl), mid, scaled)
    pos = torch.arange(s, dtype=torch.float32)
    if c.rotary_seq_len_interpolation_factor:
        pos = pos * (1 / c.rotary_seq_len_interpolation_factor)
    freqs = torch.outer(pos, inv)
    emb = torch.repeat_interleave(freqs, 2, dim=-1) if c.rotary_interleaved else torch.cat((freqs, freqs), dim=-1)
    return r, torch.cos(emb), torch.sin(emb)


def rope_apply(c: ModelConfig, t, cos_sin):
    """t [b, heads, s, d]: t * cos + rotate_half(t) * sin on the first r channels (Megatron's _rotate_half: halves
    [-x2, x1], or interleaved pairs (-x[2i+1], x[2i])); the rest passes through."""
    r, cos, sin = cos_sin
    x, rest = t[..., :r], t[..., r:]
    if c.rotary_interleaved:
        rot = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).reshape(x.shape)
    else:
        rot = torch.cat((-x[..., r // 2:], x[..., :r // 2]), dim=-1)
    return torch.cat((x * cos + rot * sin, rest), dim=-1)


class Attention(nn.Module):
    """docs/layer.md §4.2: causal self-attention, qkv columns [q | k | v] (q: n heads; k, v: g heads with
    grouped-query attention, query head i reading K, V head i // (n/g)), head i in columns [i*d, (i+1)*d) of each;
    RoPE on q and k (docs/layer.md §4.4); scale 1/sqrt(d); no bias, no attention dropout (evaluation)."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        h = c.hidden_size
        self.c = c
        self.n = c.num_attention_heads
        self.g = c.num_query_groups or self.n
        self.qkv = nn.Linear(h, h + 2 * self.g * (h // self.n), bias=c.add_qkv_bias or c.add_bias_linear)
        if c.qk_layernorm:  # docs/layer.md §4.5: [d] weights shared by the heads (state_dict attn.q_layernorm.*)
            self.q_layernorm = make_norm(c, h // self.n)
            self.k_layernorm = make_norm(c, h // self.n)
        self.proj = nn.Linear(h, h, bias=c.add_bias_linear)

    def forward(self, x):  # x [s, b, h]
        s, b, h = x.shape
        n, g, d = self.n, self.g, h // self.n
        qkv = self.qkv(x)
        q = qkv[..., :h].reshape(s, b, n, d).permute(1, 2, 0, 3)  # [b, n, s, d]
        k, v = (qkv[..., h + i * g * d:h + (i + 1) * g * d].reshape(s, b, g, d).permute(1, 2, 0, 3) for i in range(2))
        if self.c.qk_layernorm:
            q, k = self.q_layernorm(q), self.k_layernorm(k)
        if self.c.position_embedding_type == "rope":
            cs = rope_cos_sin(self.c, s)
            q, k = rope_apply(self.c, q, cs), rope_apply(self.c, k, cs)
        k, v = k.repeat_interleave(n // g, dim=1), v.repeat_interleave(n // g, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        p = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        o = (p @ v).permute(2, 0, 1, 3).reshape(s, b, h)
        return self.proj(o)


class DenseMLP(nn.Module):
    """docs/layer.md §6.11: the block's dense MLP of F_m, mlp = act(x2 W1m^T) W2m^T on every row (act as the
    experts': GeLU, or SwiGLU with fc1 rows [0, F_m) the SiLU branch, [F_m, 2F_m) the linear one); with the gate
    (--moe-shared-expert-gate) its output times s_t = sigmoid(x2_t . g) in fp32, g = mlp.gate.weight [1, h]."""

    def __init__(self, c: ModelConfig, Fm: int, gated: bool):
        super().__init__()
        h = c.hidden_size
        self.swiglu = c.swiglu
        F1m = 2 * Fm if c.swiglu else Fm
        self.fc1 = _Weight(F1m, h, bias_shape=(F1m,) if c.add_bias_linear else None)
        self.fc2 = _Weight(h, Fm, bias_shape=(h,) if c.add_bias_linear else None)
        self.gated = gated
        if gated:
            self.gate = _Weight(1, h)

    def forward(self, x):  # x [T, h]
        h1 = self.fc1.add_bias(x @ self.fc1.weight.t())
        if self.swiglu:
            a, g = h1.chunk(2, dim=-1)
            act = F.silu(a) * g
        else:
            act = F.gelu(h1)
        out = self.fc2.add_bias(act @ self.fc2.weight.t())
        if self.gated:
            out = torch.sigmoid((x.float() @ self.gate.weight.float().t())).to(out.dtype) * out
        return out


class Experts(nn.Module):
    """docs/layer.md §2, §4.3, §6.8: fc1 [E, F, h] (GeLU, exact erf form) or [E, 2F, h] (SwiGLU: rows [0, F) the
    SiLU branch, [F, 2F) the linear branch), fc2 [E, h, F]."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        E, h, Fh = c.num_experts, c.hidden_size, c.ffn_hidden_size
        self.swiglu = c.swiglu
        F1 = 2 * Fh if c.swiglu else Fh
        self.fc1 = _Weight(E, F1, h, bias_shape=(E, F1) if c.add_bias_linear else None)
        self.fc2 = _Weight(E, h, Fh, bias_shape=(E, h) if c.add_bias_linear else None)

    def forward(self, e: int, rows):
        h1 = self.fc1.add_bias(rows @ self.fc1.weight[e].t(), e)
        if self.swiglu:
            a, g = h1.chunk(2, dim=-1)
            act = F.silu(a) * g
        else:
            act = F.gelu(h1)
        return self.fc2.add_bias(act @ self.fc2.weight[e].t(), e)


@dataclass
class RoutingStats:
    choices: int = 0   # (token, k) choices routed
    dropped: int = 0   # of them, those that found their expert's capacity full
    aux_loss: float = 0.0  # sum over layers and micro-batches of l_aux (docs/layer.md §6.7, no coefficient)
    per_layer_dropped: list = field(default_factory=list)


class MoE(nn.Module):
    """docs/layer.md §6 in evaluation mode: gate input = LN2 output (no jitter), logits = x Wg^T, fp-softmax; first
    choice argmax (ties -> lower index; no RSample in evaluation), second choice argmax over the others; capacity
    per routing group; top-1 drops by random token selection (or token order), top-2 first-come-first-served with all
    first choices queued before the second ones; combine weights p (top-1) or p_i / max(p1 + p2, eps) (top-2)."""

    def __init__(self, c: ModelConfig, layer_index: int):
        super().__init__()
        self.c = c
        self.layer_index = layer_index
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.experts = Experts(c)

    def route(self, x, tokens):
        """One routing group: x [S, h] (rows in the group's token order), tokens [S] their global indices (int64).
        Returns (choice [S, k], kept [S, k], weight [S, k], probs [S, E])."""
        c = self.c
        S, E, k = x.shape[0], c.num_experts, c.moe_router_topk
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1)
        rows = torch.arange(S)
        if c.moe_model_type == "megatron_moe":  # docs/layer.md §6.10: Megatron-Core's dropless top-k router
            scores = probs if c.moe_router_pre_softmax else logits
            choice = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]  # ties: lower index
            weight = probs.gather(1, choice) if c.moe_router_pre_softmax else torch.softmax(logits.gather(1, choice), -1)
            weight = weight * (c.moe_router_topk_scaling_factor or 1.0)
            return choice, torch.ones_like(choice, dtype=torch.bool), weight, probs
        e1 = probs.argmax(dim=-1)  # the first maximum: ties -> lower index
        choice = [e1]
        if k == 2:
            masked = probs.clone()
            masked[rows, e1] = float("-inf")
            choice.append(masked.argmax(dim=-1))
        choice = torch.stack(choice, dim=1)
        first_count = torch.bincount(e1, minlength=E)
        if c.moe_no_drop:
            C = S * k  # the largest load of the group: nothing is dropped
        else:
            C = capacity(S, E, k, c.moe_train_capacity_factor, c.moe_min_capacity)
        if k == 1:
            # Keep the C tokens of an over-full expert with the highest priority (RTS: uniform(gate_rts, token, 0),
            # descending, ties -> lower token), or the first C in token order without RTS.
            if c.use_rts:
                pri = philox_uniform(c.seed, self.layer_index, PURPOSE["gate_rts"], tokens.numpy(), 0)
                order = torch.sort(torch.from_numpy(-pri), stable=True).indices
            else:
                order = rows
            ranked = F.one_hot(e1[order], E).cumsum(dim=0)[rows, e1[order]] - 1
            rank = torch.empty_like(ranked)
            rank[order] = ranked
            kept = (rank < C)[:, None]
            weight = torch.where(kept[:, 0], probs[rows, e1], torch.zeros((), dtype=probs.dtype))[:, None]
        else:
            e2 = choice[:, 1]
            slot1 = F.one_hot(e1, E).cumsum(dim=0)[rows, e1] - 1
            slot2 = first_count[e2] + F.one_hot(e2, E).cumsum(dim=0)[rows, e2] - 1
            kept = torch.stack([slot1 < C, slot2 < C], dim=1)
            p = torch.where(kept, probs.gather(1, choice), torch.zeros((), dtype=probs.dtype))
            eps = torch.finfo(torch.float32).eps
            weight = p / p.sum(dim=1, keepdim=True).clamp(min=eps)
        return choice, kept, weight, probs

    def forward(self, x, groups, token_base: int, stats: RoutingStats | None = None):
        """x [T, h], the LN2 output of one micro-batch; groups: index tensors of the rows of each routing group."""
        c = self.c
        T, E = x.shape[0], c.num_experts
        out = torch.zeros_like(x)
        sum_probs = torch.zeros(E, dtype=torch.float64)
        first = torch.zeros(E, dtype=torch.float64)
        dropped = 0
        for idx in groups:
            choice, kept, weight, probs = self.route(x[idx], token_base + idx)
            sum_probs += probs.double().sum(dim=0)
            first += torch.bincount(choice[:, 0], minlength=E).double()
            dropped += int((~kept).sum())
            for e in range(E):
                sel = (choice == e) & kept  # [S, k]: a token chooses an expert at most once
                tok, which = sel.nonzero(as_tuple=True)
                if tok.numel() == 0:
                    continue
                rows = idx[tok]
                out.index_add_(0, rows, weight[tok, which][:, None] * self.experts(e, x[rows]))
        if stats is not None:
            stats.choices += T * c.moe_router_topk
            stats.dropped += dropped
            stats.aux_loss += float(E * ((sum_probs / T) * (first / T)).sum())
            stats.per_layer_dropped[self.layer_index] += dropped
        return out


class Block(nn.Module):
    """docs/layer.md §7 in evaluation mode (both dropouts are the identity):
    ln_in = x + proj(attn(LN1(x))); y = ln_in + MoE(LN2(ln_in)) (+ the shared expert's mlp(LN2(ln_in)), §6.11);
    a dense block (§6.11): y = ln_in + mlp(LN2(ln_in)), the MLP of the dense F_m, no router, no shared expert."""

    def __init__(self, c: ModelConfig, layer_index: int, has_experts: bool = True):
        super().__init__()
        h = c.hidden_size
        self.ln1 = make_norm(c, h)
        self.attn = Attention(c)
        self.ln2 = make_norm(c, h)
        self.has_experts = has_experts
        if has_experts:
            self.moe = MoE(c, layer_index)
            if c.moe_shared_expert_intermediate_size > 0:
                self.mlp = DenseMLP(c, c.moe_shared_expert_intermediate_size, c.moe_shared_expert_gate)
        else:
            self.mlp = DenseMLP(c, c.dense_ffn_hidden_size or c.ffn_hidden_size, False)

    def forward(self, x, groups, token_base, stats=None):  # x [s, b, h]
        s, b, h = x.shape
        ln_in = x + self.attn(self.ln1(x))
        x2 = self.ln2(ln_in).reshape(s * b, h)
        out = self.moe(x2, groups, token_base, stats) if self.has_experts else torch.zeros_like(x2)
        if hasattr(self, "mlp"):
            out = out + self.mlp(x2)
        return ln_in + out.reshape(s, b, h)


def routing_groups(c: ModelConfig, b: int):
    """The rows of one micro-batch ([s, b] layout: row = position * b + sequence) that each routing group holds, in
    the group's token order. The gate routes each AMPipe chunk of each rank's rows with its own capacity
    (docs/layer.md §6, §11):
      * context parallelism of size C: cp rank r holds the position blocks r ("A") and 2C-1-r ("B") of s/(2C)
        positions each, chunk c of its rows being [A_c ; B_c], the c-th of M sub-blocks of each half;
      * AMPipe degree M: without cp, chunk c holds positions [c*s/M, (c+1)*s/M);
      * sequence parallelism of size t: each tp rank routes its own sub-block of 1/t of every chunk's positions.
    So there are C*M*t groups of s/(C*M*t) positions (s*b/(C*M*t) rows) each; with C = 1 each is a contiguous
    range of rows."""
    s, M, t, C = c.seq_length, c.ampipe_degree, c.sequence_parallel_size, c.context_parallel_size
    if s % (2 * C * M * t if C > 1 else M * t):
        raise ValueError(f"--seq-length {s} does not split into the routing groups of --ampipe-degree {M}, "
                         f"context parallel size {C} and sequence parallel size {t}")
    groups = []
    for r in range(C):
        if C == 1:
            local = torch.arange(s)  # the rank's positions in its row order, chunk by chunk
        else:
            sb, ln = s // (2 * C), s // (2 * C * M)
            local = torch.cat([torch.cat([torch.arange(r * sb + ch * ln, r * sb + (ch + 1) * ln),
                                          torch.arange((2 * C - 1 - r) * sb + ch * ln,
                                                       (2 * C - 1 - r) * sb + (ch + 1) * ln)]) for ch in range(M)])
        sub = s // (C * M * t)
        for ch in range(M):
            for q in range(t):
                pos = local[(ch * t + q) * sub:(ch * t + q + 1) * sub]
                groups.append((pos[:, None] * b + torch.arange(b)[None, :]).reshape(-1))
    return groups


class Embedding(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.learned = c.position_embedding_type == "learned_absolute"  # rope, none: no table
        if self.learned:
            self.position_embeddings = nn.Embedding(c.seq_length, c.hidden_size)

    def forward(self, tokens):  # tokens [s, b] -> [s, b, h]: wte[token] (+ wpe[position])
        if not self.learned:
            return self.word_embeddings(tokens)
        pos = torch.arange(tokens.shape[0])
        return self.word_embeddings(tokens) + self.position_embeddings(pos)[:, None, :]


class GptMoE(nn.Module):
    """docs/training.md "Model": embedding -> num_layers blocks -> final LayerNorm -> LM head (the token embedding
    unless untied) -> softmax cross-entropy, the mean over the micro-batch's tokens."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.c = c
        self.embedding = Embedding(c)
        self.layers = nn.ModuleList(Block(c, i, m) for i, m in enumerate(moe_layers(c)))
        self.final_layernorm = make_norm(c, c.hidden_size)
        if c.untie_embeddings_and_output_weights:
            self.output_layer = _Weight(c.vocab_size, c.hidden_size)

    def lm_head(self):
        return (self.output_layer if self.c.untie_embeddings_and_output_weights
                else self.embedding.word_embeddings).weight

    @torch.no_grad()
    def logits(self, tokens, token_base: int = 0, stats: RoutingStats | None = None):
        """The LM head's output [s, b, V] for tokens [s, b] int64."""
        groups = routing_groups(self.c, tokens.shape[1])
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x, groups, token_base, stats)
        return self.final_layernorm(x) @ self.lm_head().t()

    @torch.no_grad()
    def loss(self, tokens, targets, token_base: int, stats: RoutingStats | None = None) -> float:
        """Mean cross-entropy over the s*b tokens of one micro-batch (tokens, targets [s, b] int64)."""
        s, b = tokens.shape
        logits = self.logits(tokens, token_base, stats)
        return float(F.cross_entropy(logits.reshape(s * b, -1), targets.reshape(-1), reduction="mean"))

    @torch.no_grad()
    def init_like_ampipe(self):
        """The initial weights of `ampipe train` (docs/layer.md §8, src/ampipe/train/gpt_model.h): LayerNorms 1 / 0;
        layer i's matrices fp32(std) * normal(key (seed, layer i, init), token = parameter id 2, 3, 6, 7, 8); the
        word, position and output embeddings fp32(std * normal(key (seed, layer 0xFFFFFF, init), id 1, 2, 3))."""
        c = self.c
        std32 = np.float32(c.init_method_std)

        def fill(t, layer, pid, layer_rule):
            z = philox_normal_f32(c.seed, layer, PURPOSE["init"], pid, t.numel())
            w = (std32 * z).astype(np.float32) if layer_rule else (c.init_method_std * z.astype(np.float64)).astype(
                np.float32)
            t.copy_(torch.from_numpy(w.reshape(tuple(t.shape))).to(t.dtype))

        for name, p in self.named_parameters():
            if name.endswith(".bias"):  # every bias: the norms' and the linear layers'
                p.fill_(0.0)
            elif "layernorm" in name or ".ln" in name:
                p.fill_(1.0)
        for i, layer in enumerate(self.layers):
            params = [(2, layer.attn.qkv.weight), (3, layer.attn.proj.weight)]
            if layer.has_experts:
                params += [(6, layer.moe.gate.weight), (7, layer.moe.experts.fc1.weight),
                           (8, layer.moe.experts.fc2.weight)]
            if hasattr(layer, "mlp"):
                params += [(9, layer.mlp.fc1.weight), (10, layer.mlp.fc2.weight)]
                if layer.mlp.gated:
                    params.append((16, layer.mlp.gate.weight))
            for pid, p in params:
                fill(p, i, pid, True)
        fill(self.embedding.word_embeddings.weight, MODEL_KEY_LAYER, 1, False)
        if self.embedding.learned:
            fill(self.embedding.position_embeddings.weight, MODEL_KEY_LAYER, 2, False)
        if c.untie_embeddings_and_output_weights:
            fill(self.output_layer.weight, MODEL_KEY_LAYER, 3, False)


# -------------------------------------------------------------------------------------------------- the data

BUNDLED_CORPUS_DIR = "/usr/share/common-licenses"
TOKEN_FILE_MAGIC, TOKEN_FILE_HEADER_INTS = 20240520, 256


def load_tokens(data_path: str) -> np.ndarray:
    """The token stream of `ampipe train --data-path` (docs/training.md "Data"): an llm.c token file (recognised by
    its magic number: 256 int32 header words, magic 20240520, version 1, count n, then n uint16 ids), plain text
    (byte-level: token = byte), or with no path the bundled corpus (the regular files of /usr/share/common-licenses,
    symlinks skipped, in name order, each followed by a newline). Text tokenized by a SentencePiece model is not
    supported: tokenize it with `ampipe preprocess` and pass the token file."""
    if data_path:
        with open(data_path, "rb") as f:
            raw = f.read()
        if len(raw) >= 4 and struct.unpack("<i", raw[:4])[0] == TOKEN_FILE_MAGIC:
            hdr = np.frombuffer(raw[:4 * TOKEN_FILE_HEADER_INTS], dtype="<i4")
            if hdr[1] != 1 or len(raw) != 4 * TOKEN_FILE_HEADER_INTS + 2 * int(hdr[2]):
                raise ValueError(f"{data_path}: not a version-1 llm.c token file of {hdr[2]} tokens")
            return np.frombuffer(raw[4 * TOKEN_FILE_HEADER_INTS:], dtype="<u2").astype(np.int64)
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    names = sorted(n for n in os.listdir(BUNDLED_CORPUS_DIR)
                   if os.path.isfile(os.path.join(BUNDLED_CORPUS_DIR, n))
                   and not os.path.islink(os.path.join(BUNDLED_CORPUS_DIR, n)))
    text = b"".join(open(os.path.join(BUNDLED_CORPUS_DIR, n), "rb").read() + b"\n" for n in names)
    return np.frombuffer(text, dtype=np.uint8).astype(np.int64)


class Splits:
    """--split train,valid,test (weights): the validation split is the floor(n * valid / sum) tokens after the
    training split, the test split the floor(n * test / sum) after it; a sample is a window of s + 1 tokens at stride
    s, validation / test sample j is window j mod N of its split, unshuffled (src/ampipe/train/text_data.cpp)."""

    def __init__(self, tokens: np.ndarray, s: int, split: str):
        w = [float(x) for x in split.split(",")] + [0.0, 0.0]
        total = w[0] + w[1] + w[2]
        n = len(tokens)
        self.tokens, self.s = tokens, s
        self.n_valid_tokens = int(float(n) * (w[1] / total))
        n_test_tokens = int(float(n) * (w[2] / total))
        self.n_train_tokens = n - self.n_valid_tokens - n_test_tokens
        self.n_valid = (self.n_valid_tokens - 1) // s
        self.n_test = (n_test_tokens - 1) // s if n_test_tokens > 0 else 0

    def sample(self, j: int, test: bool = False):
        if test:
            start = self.n_train_tokens + self.n_valid_tokens + (j % self.n_test) * self.s
        else:
            start = self.n_train_tokens + (j % self.n_valid) * self.s
        w = self.tokens[start:start + self.s + 1]
        return w[:-1], w[1:]


def evaluate(model: GptMoE, splits: Splits, eval_iters: int, global_batch: int, micro_batch: int,
             test: bool = False, stats: RoutingStats | None = None) -> float:
    """`ampipe train`'s evaluation (src/ampipe/train/trainer.cpp, Trainer::evaluate): the mean over eval_iters *
    global_batch / micro_batch micro-batches of their mean cross-entropy; micro-batch m holds samples [m*b, (m+1)*b)
    of the split, sample m*b + bb in column bb of the [s, b] layout, and its token 0 has the global index m*b*s."""
    s, b = splits.s, micro_batch
    n_micro = eval_iters * global_batch // b
    total = 0.0
    for m in range(n_micro):
        tok = np.empty((s, b), dtype=np.int64)
        tgt = np.empty((s, b), dtype=np.int64)
        for bb in range(b):
            tok[:, bb], tgt[:, bb] = splits.sample(m * b + bb, test)
        total += model.loss(torch.from_numpy(tok), torch.from_numpy(tgt), m * b * s, stats)
    return total / n_micro
