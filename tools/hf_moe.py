#!/usr/bin/env python3
"""A PyTorch forward of Hugging Face's Mixtral (MixtralForCausalLM), Qwen2-MoE (Qwen2MoeForCausalLM) and Qwen3-MoE
(Qwen3MoeForCausalLM), read from a Hugging Face model directory (config.json, model.safetensors or its shards) under
Hugging Face's tensor names.

Written from Hugging Face's model documentation and modeling_mixtral.py / modeling_qwen2_moe.py /
modeling_qwen3_moe.py (their maths, not their code), independently of ampipe: the reference `ampipe convert`'s tests
compare ampipe against (transformers itself needs a newer PyTorch than Debian's). Inference only (no dropout, no
cache):

    embed_tokens -> per layer: x += o_proj(attention(input_layernorm(x)));  x += mlp(post_attention_layernorm(x))
    -> norm -> lm_head (the embedding with tie_word_embeddings)
    RMSNorm(x) = weight * x / sqrt(mean(x^2) + rms_norm_eps)
    attention: q, k, v = q_proj, k_proj, v_proj (num_key_value_heads K, V heads, repeated for the query heads;
               Qwen2-MoE: each with its bias, x W^T + b, unless qkv_bias is false; o_proj has none);
               Qwen3-MoE: q_norm, k_norm (RMSNorm over head_dim) on each head; RoPE (rotate_half, rope_theta,
               inv_freq = 1 / theta^(2i/d)) on q, k; causal softmax(q k^T / sqrt(d)) v
    swiglu(x; P) = P.down_proj(silu(P.gate_proj(x)) * P.up_proj(x))
    mlp: Mixtral: moe(x), every layer. Qwen: layer i is sparse (moe) iff i is not in mlp_only_layers and
         (i + 1) % decoder_sparse_step == 0 (num_experts > 0); a dense layer is swiglu(x; mlp.*) of
         intermediate_size
    moe: probs = softmax(gate(x)) (fp32); the num_experts_per_tok largest; weights renormalised to sum 1 (Mixtral
         always, Qwen with norm_topk_prob); out = sum_k w_k swiglu(x; experts.{e}) (Mixtral: w2(silu(w1 x) * w3 x));
         Qwen2-MoE adds the shared expert: out += sigmoid(x . shared_expert_gate) * swiglu(x; shared_expert)

    python3 tools/hf_moe.py DIR --tokens 1,2,3     prints the logits' shape and a checksum
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

_DTYPES = {"F32": np.float32, "BF16": "bf16", "F16": np.float16, "F64": np.float64}


def read_safetensors_raw(path: str) -> dict:
    """name -> (dtype, shape, the data's bytes), as the file holds them."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {name: (e["dtype"], tuple(e["shape"]), data[e["data_offsets"][0]:e["data_offsets"][1]])
            for name, e in header.items() if name != "__metadata__"}


def read_safetensors(path: str) -> dict:
    """name -> float32 torch tensor (bf16 widened exactly)."""
    out = {}
    for name, (dtype, shape, raw) in read_safetensors_raw(path).items():
        if dtype == "BF16":
            arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=_DTYPES[dtype]).astype(np.float32)
        out[name] = torch.from_numpy(arr.reshape(shape).copy())
    return out


def read_hf_dir(d: str):
    cfg = json.load(open(os.path.join(d, "config.json")))
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        files = ["model.safetensors"]
    else:
        index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
        files = sorted(set(index["weight_map"].values()))
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(d, f)))
    return cfg, w


class HfMoE:
    def __init__(self, cfg: dict, w: dict, dtype=torch.float32):
        arch = cfg["architectures"][0]
        if arch not in ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
            raise ValueError(f"architecture {arch}")
        self.mixtral = arch == "MixtralForCausalLM"
        self.qwen2 = arch == "Qwen2MoeForCausalLM"
        self.qwen3 = arch == "Qwen3MoeForCausalLM"
        self.cfg, self.dtype = cfg, dtype
        self.w = {k: v.to(dtype) for k, v in w.items()}
        self.h = cfg["hidden_size"]
        self.n = cfg["num_attention_heads"]
        self.g = cfg.get("num_key_value_heads", self.n)
        # Qwen2-MoE has no head_dim key: hidden_size / num_attention_heads
        self.d = (None if self.qwen2 else cfg.get("head_dim")) or self.h // self.n
        self.qkv_bias = self.qwen2 and cfg.get("qkv_bias", True) is not False
        L = cfg["num_hidden_layers"]
        step = cfg.get("decoder_sparse_step") or 1
        only = set(cfg.get("mlp_only_layers") or [])
        self.sparse = [True] * L if self.mixtral else \
            [i not in only and (i + 1) % step == 0 for i in range(L)]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta", 10000.0)
        self.E = cfg["num_local_experts"] if self.mixtral else cfg["num_experts"]
        self.k = cfg["num_experts_per_tok"]
        self.renorm = True if self.mixtral else bool(cfg.get("norm_topk_prob", False))
        self.tied = bool(cfg.get("tie_word_embeddings", False))

    def rms(self, x, weight):
        return weight * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps))

    def rope(self, t, s):  # t [b, heads, s, d]
        inv = 1.0 / (self.theta ** (torch.arange(0, self.d, 2, dtype=torch.int64).float() / self.d))
        freqs = torch.arange(s, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos().to(t.dtype), emb.sin().to(t.dtype)
        half = t.shape[-1] // 2
        rot = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
        return t * cos + rot * sin

    def attention(self, x, p):  # x [b, s, h]
        b, s, _ = x.shape
        n, g, d = self.n, self.g, self.d
        def proj(name, heads):
            y = x @ self.w[p + name + ".weight"].t()
            if self.qkv_bias:
                y = y + self.w[p + name + ".bias"]
            return y.view(b, s, heads, d)

        q, k, v = proj("q_proj", n), proj("k_proj", g), proj("v_proj", g)
        if self.qwen3:  # Qwen3: per-head RMSNorm of q and k before RoPE
            q, k = self.rms(q, self.w[p + "q_norm.weight"]), self.rms(k, self.w[p + "k_norm.weight"])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = self.rope(q, s), self.rope(k, s)
        k, v = k.repeat_interleave(n // g, dim=1), v.repeat_interleave(n // g, dim=1)
        sc = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        mask = torch.ones(s, s, dtype=torch.bool).tril()
        prob = torch.softmax(sc.masked_fill(~mask, float("-inf")).float(), dim=-1).to(q.dtype)
        o = (prob @ v).transpose(1, 2).reshape(b, s, n * d)
        return o @ self.w[p + "o_proj.weight"].t()

    def swiglu(self, x, pre):  # pre: the MLP's prefix (a Qwen expert, the shared expert, a dense layer's mlp.)
        a = x @ self.w[pre + "gate_proj.weight"].t()
        u = x @ self.w[pre + "up_proj.weight"].t()
        return (F.silu(a) * u) @ self.w[pre + "down_proj.weight"].t()

    def mlp(self, x, p, i):  # x [rows, h]: layer i's MLP block
        if not self.sparse[i]:
            return self.swiglu(x, p + "mlp.")
        out = self.moe(x, p)
        if self.qwen2:
            gate = torch.sigmoid(x @ self.w[p + "mlp.shared_expert_gate.weight"].t())  # [rows, 1]
            out = out + gate * self.swiglu(x, p + "mlp.shared_expert.")
        return out

    def moe(self, x, p):  # x [rows, h]
        pre = p + ("block_sparse_moe." if self.mixtral else "mlp.")
        probs = torch.softmax((x @ self.w[pre + "gate.weight"].t()).float(), dim=-1)
        top, idx = torch.topk(probs, self.k, dim=-1)
        if self.renorm:
            top = top / top.sum(-1, keepdim=True)
        top = top.to(x.dtype)
        out = torch.zeros_like(x)
        names = ("w1", "w3", "w2") if self.mixtral else ("gate_proj", "up_proj", "down_proj")
        for e in range(self.E):
            rows, slot = torch.nonzero(idx == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            ep = f"{pre}experts.{e}."
            xe = x[rows]
            a = xe @ self.w[ep + names[0] + ".weight"].t()
            u = xe @ self.w[ep + names[1] + ".weight"].t()
            y = (F.silu(a) * u) @ self.w[ep + names[2] + ".weight"].t()
            out.index_add_(0, rows, y * top[rows, slot][:, None])
        return out

    @torch.no_grad()
    def logits(self, tokens):  # tokens [b, s] int64 -> [b, s, V]
        x = self.w["model.embed_tokens.weight"][tokens]
        b, s, h = x.shape
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = x + self.attention(self.rms(x, self.w[p + "input_layernorm.weight"]), p + "self_attn.")
            y = self.mlp(self.rms(x, self.w[p + "post_attention_layernorm.weight"]).reshape(b * s, h), p, i)
            x = x + y.reshape(b, s, h)
        x = self.rms(x, self.w["model.norm.weight"])
        head = self.w["model.embed_tokens.weight"] if self.tied else self.w["lm_head.weight"]
        return x @ head.t()

    @torch.no_grad()
    def loss(self, tokens, targets, token_base=0, stats=None) -> float:
        """The interface of tools/torch_gpt_moe.py's GptMoE.loss: tokens, targets [s, b]; mean cross-entropy."""
        lg = self.logits(tokens.t().contiguous())  # [b, s, V]
        return float(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), targets.t().reshape(-1), reduction="mean"))


def load(d: str, dtype=torch.float32) -> HfMoE:
    cfg, w = read_hf_dir(d)
    return HfMoE(cfg, w, dtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--tokens", default="1,2,3,4")
    a = ap.parse_args(argv)
    m = load(a.dir)
    t = torch.tensor([[int(x) for x in a.tokens.split(",")]])
    lg = m.logits(t)
    print(f"logits {tuple(lg.shape)} sum {float(lg.sum()):.6e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
