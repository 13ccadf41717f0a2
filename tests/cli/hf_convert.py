#!/usr/bin/env python3
"""Helpers of tests/cli/hf_convert.sh (`ampipe convert`):

  make DIR --arch mixtral|qwen2|qwen3 [--dtype f32|bf16] [--shards N] [--vocab V] [--layers L] [--tied]
       [--no-norm-topk-prob] [--config-key KEY=JSON ...] [--drop-tensor NAME] [--bad-shape NAME]
      a tiny Hugging Face model directory written by hand (config.json, model.safetensors or N shards with
      model.safetensors.index.json), random weights (numpy, seeded). Qwen2-MoE: q/k/v biases, the shared expert
      (F 48) and its gate; Qwen: the dense layers that config.json's decoder_sparse_step / mlp_only_layers (set with
      --config-key) make, their MLP of intermediate_size (40 for Qwen2-MoE, 64 for Qwen3-MoE)
  compare A B        every tensor of Hugging Face directory A is in B with the same dtype, shape and bytes, and B has
                     no other; config.json's keys of A have the same values in B
  logits HF CKPT     the logits of tools/hf_moe.py on HF against tools/torch_gpt_moe.py on the ampipe checkpoint CKPT
                     (its first V columns), on two random sequences: prints the max abs difference; fails above 1e-5
  tokens FILE V N    an llm.c token file of N random ids < V
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import hf_moe  # noqa: E402  (tools/hf_moe.py: the safetensors reader and the Hugging Face reference)


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if dtype == "bf16":  # round to nearest even
            u = a.view(np.uint32).astype(np.uint64)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            raw = u.tobytes()
        else:
            raw = a.tobytes()
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_dir(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = ["model.safetensors"] if os.path.exists(os.path.join(d, "model.safetensors")) else \
        sorted(set(json.load(open(index))["weight_map"].values()))
    t = {}
    for f in files:
        t.update(hf_moe.read_safetensors_raw(os.path.join(d, f)))
    return json.load(open(os.path.join(d, "config.json"))), t


def make(a):
    rng = np.random.default_rng(a.seed)
    mixtral, qwen2 = a.arch == "mixtral", a.arch == "qwen2"
    h, n, g, F, E, L, V = 32, 4, 2, 24, 4, a.layers, a.vocab
    d = h // n
    arch = {"mixtral": ("MixtralForCausalLM", "mixtral"), "qwen2": ("Qwen2MoeForCausalLM", "qwen2_moe"),
            "qwen3": ("Qwen3MoeForCausalLM", "qwen3_moe")}[a.arch]
    cfg = {"architectures": [arch[0]], "model_type": arch[1], "vocab_size": V, "hidden_size": h,
           "num_hidden_layers": L, "num_attention_heads": n, "num_key_value_heads": g, "hidden_act": "silu",
           "max_position_embeddings": 64, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True,
           "tie_word_embeddings": a.tied, "rope_theta": 1000000.0, "attention_dropout": 0.0,
           "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001, "output_router_logits": False,
           "torch_dtype": "bfloat16" if a.dtype == "bf16" else "float32", "bos_token_id": 1, "eos_token_id": 2}
    if mixtral:
        cfg.update({"intermediate_size": F, "num_local_experts": E, "sliding_window": None,
                    "router_jitter_noise": 0.0})
    elif qwen2:  # as Qwen1.5-MoE's config.json: a sliding_window size that use_sliding_window false leaves unused
        cfg.update({"intermediate_size": 40, "moe_intermediate_size": F, "shared_expert_intermediate_size": 48,
                    "num_experts": E, "norm_topk_prob": not a.no_norm_topk_prob, "use_sliding_window": False,
                    "sliding_window": 4096, "max_window_layers": L, "decoder_sparse_step": 1,
                    "mlp_only_layers": [], "rope_scaling": None})
    else:
        cfg.update({"intermediate_size": 64, "moe_intermediate_size": F, "num_experts": E, "head_dim": d,
                    "norm_topk_prob": not a.no_norm_topk_prob, "attention_bias": False, "use_sliding_window": False,
                    "sliding_window": None, "max_window_layers": L, "decoder_sparse_step": 1, "mlp_only_layers": [],
                    "rope_scaling": None})
    qkv_bias = qwen2  # decided before --config-key, so that qkv_bias false can be tested against stored biases
    for kv in a.config_key:
        k, v = kv.split("=", 1)
        cfg[k] = json.loads(v)
    w = lambda *shape, std=0.2: rng.normal(0, std, size=shape).astype(np.float32)
    norm = lambda m: (1 + 0.3 * rng.normal(size=(m,))).astype(np.float32)
    t = {"model.embed_tokens.weight": w(V, h, std=1.0), "model.norm.weight": norm(h)}
    if not a.tied:
        t["lm_head.weight"] = w(V, h)
    # Hugging Face's Qwen rule: layer i has experts unless listed in mlp_only_layers or (i + 1) % step != 0
    step, only = cfg.get("decoder_sparse_step") or 1, set(cfg.get("mlp_only_layers") or [])
    sparse = [mixtral or (i not in only and (i + 1) % step == 0) for i in range(L)]

    def swiglu(pre, Fm):
        t[pre + "gate_proj.weight"] = w(Fm, h)
        t[pre + "up_proj.weight"] = w(Fm, h)
        t[pre + "down_proj.weight"] = w(h, Fm)

    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = w(n * d, h)
        t[p + "self_attn.k_proj.weight"] = w(g * d, h)
        t[p + "self_attn.v_proj.weight"] = w(g * d, h)
        t[p + "self_attn.o_proj.weight"] = w(h, n * d)
        if qkv_bias:
            t[p + "self_attn.q_proj.bias"] = w(n * d)
            t[p + "self_attn.k_proj.bias"] = w(g * d)
            t[p + "self_attn.v_proj.bias"] = w(g * d)
        if a.arch == "qwen3":
            t[p + "self_attn.q_norm.weight"] = norm(d)
            t[p + "self_attn.k_norm.weight"] = norm(d)
        if not sparse[i]:
            swiglu(p + "mlp.", cfg["intermediate_size"])
            continue
        moe = p + ("block_sparse_moe." if mixtral else "mlp.")
        if qwen2:
            swiglu(moe + "shared_expert.", cfg["shared_expert_intermediate_size"])
            t[moe + "shared_expert_gate.weight"] = w(1, h, std=1.0)
        t[moe + "gate.weight"] = w(E, h, std=1.0)
        for e in range(E):
            names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
            t[f"{moe}experts.{e}.{names[0]}.weight"] = w(F, h)
            t[f"{moe}experts.{e}.{names[1]}.weight"] = w(F, h)
            t[f"{moe}experts.{e}.{names[2]}.weight"] = w(h, F)
    if a.drop_tensor:
        del t[a.drop_tensor]
    if a.bad_shape:
        t[a.bad_shape] = t[a.bad_shape][:-1]
    os.makedirs(a.dir, exist_ok=True)
    json.dump(cfg, open(os.path.join(a.dir, "config.json"), "w"), indent=2)
    names = sorted(t)
    if a.shards <= 1:
        write_safetensors(os.path.join(a.dir, "model.safetensors"), t, a.dtype)
        return 0
    wm = {}
    for s in range(a.shards):
        fn = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
        part = {nm: t[nm] for nm in names[s::a.shards]}
        write_safetensors(os.path.join(a.dir, fn), part, a.dtype)
        wm.update({nm: fn for nm in part})
    json.dump({"metadata": {"total_size": 0}, "weight_map": wm},
              open(os.path.join(a.dir, "model.safetensors.index.json"), "w"), indent=2)
    return 0


def compare(a):
    ca, ta = read_dir(a.a)
    cb, tb = read_dir(a.b)
    bad = [k for k in ca if cb.get(k) != ca[k]]
    if bad:
        print("compare: config.json differs in " + ", ".join(f"{k}: {ca[k]!r} -> {cb.get(k)!r}" for k in bad))
        return 1
    if set(ta) != set(tb):
        print(f"compare: tensors only in {a.a}: {sorted(set(ta) - set(tb))}, only in {a.b}: {sorted(set(tb) - set(ta))}")
        return 1
    for k in sorted(ta):
        if ta[k] != tb[k]:
            print(f"compare: tensor {k} differs: {ta[k][:2]} vs {tb[k][:2]}"
                  f"{'' if ta[k][:2] != tb[k][:2] else ' (same dtype and shape, other bytes)'}")
            return 1
    print(f"compare: {len(ta)} tensors bit-exact ({sorted({v[0] for v in ta.values()})}), config.json's "
          f"{len(ca)} keys the same")
    return 0


def logits(a):
    import torch
    import torch_gpt_moe as tg
    hf = hf_moe.load(a.hf)
    sub = a.ckpt
    marker = os.path.join(sub, "latest_checkpointed_iteration.txt")
    if os.path.exists(marker):
        sub = os.path.join(sub, f"iter_{int(open(marker).read()):07d}")
    meta = json.load(open(os.path.join(sub, "metadata.json")))
    state, _ = tg.read_safetensors(os.path.join(sub, "model.safetensors"))
    vocab = state["embedding.word_embeddings.weight"].shape[0]
    mc = tg.ModelConfig.from_checkpoint(meta["config"], vocab)
    model = tg.GptMoE(mc)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        print(f"logits: the checkpoint does not load: missing {missing}, unexpected {unexpected}")
        return 1
    model.eval()
    V = hf.w["model.embed_tokens.weight"].shape[0]
    rng = np.random.default_rng(7)
    tok = torch.from_numpy(rng.integers(0, V, size=(2, a.seq)).astype(np.int64))  # [b, s]
    ref = hf.logits(tok)                                                          # [b, s, V]
    got = model.logits(tok.t().contiguous()).permute(1, 0, 2)[..., :V]            # [s, b, V'] -> [b, s, V]
    diff = float((ref - got).abs().max())
    scale = float(ref.abs().max())
    print(f"logits: {tuple(ref.shape)}, max |hf_moe - torch_gpt_moe| = {diff:.3e} (max |logit| {scale:.3e})",
          "ok" if diff <= 1e-5 * max(1.0, scale) else "FAIL (> 1e-5)")
    if hasattr(mc, "vocab_size") and vocab > V:
        pad = float(model.logits(tok.t().contiguous())[..., V:].abs().max())
        print(f"logits: the {vocab - V} padding columns are {pad:.1e} (zero rows)")
    return 0 if diff <= 1e-5 * max(1.0, scale) else 1


def tokens(a):
    rng = np.random.default_rng(11)
    ids = rng.integers(0, a.vocab, size=a.count).astype(np.uint16)
    with open(a.file, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, a.count, *([0] * 253)))
        f.write(ids.tobytes())
    return 0


def main(argv):
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--arch", choices=["mixtral", "qwen2", "qwen3"], required=True)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    m.add_argument("--shards", type=int, default=1)
    m.add_argument("--vocab", type=int, default=256)
    m.add_argument("--tied", action="store_true")
    m.add_argument("--no-norm-topk-prob", action="store_true")
    m.add_argument("--config-key", action="append", default=[])
    m.add_argument("--drop-tensor")
    m.add_argument("--bad-shape")
    m.add_argument("--seed", type=int, default=3)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    lg = sub.add_parser("logits")
    lg.add_argument("hf")
    lg.add_argument("ckpt")
    lg.add_argument("--seq", type=int, default=16)
    t = sub.add_parser("tokens")
    t.add_argument("file")
    t.add_argument("vocab", type=int)
    t.add_argument("count", type=int)
    a = ap.parse_args(argv)
    return {"make": make, "compare": compare, "logits": logits, "tokens": tokens}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
