#!/usr/bin/env python3
"""Evaluates an `ampipe train` checkpoint in PyTorch: the validation loss that `ampipe train` logs.

    python3 tools/torch_eval.py --load CKPT_DIR [--iteration N] [--eval-iters 4] [--test] [--init] ...

The model is tools/torch_gpt_moe.py (written from docs/layer.md and docs/training.md, not from the C++). The model
and routing settings, the data path, the split, the batch sizes and the seed are read from the checkpoint's
metadata.json ("config", the run's flags; "saved_with", its world size); the flags below override them, for a
checkpoint evaluated with other settings (as `ampipe train --load CKPT --skip-train ...` would). Tensor, sequence
and context parallelism are not recorded in a checkpoint: with token drops their routing differs (each rank routes
its own rows), so give --tensor-model-parallel-size / --sequence-parallel / --context-parallel-size as the run had.

Prints, as `ampipe train` does,
    validation loss at iteration N | lm loss value: X | lm loss PPL: Y |
and the share of (token, expert) choices that the capacity dropped. --init evaluates the checkpoint's model shape
with the initial weights of `ampipe train` (Philox, docs/layer.md §8) instead of the saved ones.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
except ImportError:
    sys.exit("torch_eval.py: PyTorch is not installed (Debian: apt-get install python3-torch, or scripts/setup.sh)")
import torch_gpt_moe as tg  # noqa: E402


def fail(msg: str):
    sys.exit(f"torch_eval.py: error: {msg}")


def checkpoint_dir(load: str, iteration: int | None) -> str:
    """DIR/iter_NNNNNNN of the marker's iteration (or of --iteration); a path that is itself an iter_ directory."""
    if os.path.exists(os.path.join(load, "metadata.json")):
        return load
    if iteration is None:
        marker = os.path.join(load, "latest_checkpointed_iteration.txt")
        try:
            iteration = int(open(marker).read().strip())
        except (OSError, ValueError) as e:
            fail(f"--load {load}: no checkpoint marker ({e})")
    sub = os.path.join(load, f"iter_{iteration:07d}")
    if not os.path.isdir(sub):
        fail(f"--load {load}: no checkpoint of iteration {iteration} ({sub})")
    return sub


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--load", required=True, help="an `ampipe train --save` directory, or one of its iter_ dirs")
    ap.add_argument("--iteration", type=int, help="the checkpoint's iteration (default: the latest)")
    ap.add_argument("--eval-iters", type=int, default=4, help="global batches per evaluation (ampipe's default 4)")
    ap.add_argument("--test", action="store_true", help="also the test split's loss (when --split gives one)")
    ap.add_argument("--init", action="store_true", help="the initial weights of `ampipe train`, not the saved ones")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--hf", metavar="DIR",
                    help="evaluate the Hugging Face model of DIR (tools/hf_moe.py, Hugging Face's names and maths) "
                         "on the checkpoint's data instead of the checkpoint's tensors (for `ampipe convert`)")
    g = ap.add_argument_group("overrides of the checkpoint's config (default: the checkpoint's value)")
    g.add_argument("--data-path")
    g.add_argument("--split")
    g.add_argument("--seed", type=int)
    g.add_argument("--micro-batch-size", type=int)
    g.add_argument("--global-batch-size", type=int)
    g.add_argument("--world-size", type=int, help="ranks of the evaluating run (default: the saving run's)")
    g.add_argument("--ampipe-degree", type=int)
    g.add_argument("--moe-train-capacity-factor", type=float)
    g.add_argument("--moe-min-capacity", type=int)
    g.add_argument("--moe-no-drop", action="store_true", default=None)
    g.add_argument("--no-use-rts", action="store_true", default=None)
    g.add_argument("--rotary-base", type=int, help="RoPE's base (a check that the rotation matters)")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--context-parallel-size", type=int, default=1)
    a = ap.parse_args(argv)

    t0 = time.time()
    sub = checkpoint_dir(a.load, a.iteration)
    try:
        meta = json.load(open(os.path.join(sub, "metadata.json")))
    except (OSError, ValueError) as e:
        fail(f"{sub}/metadata.json: {e}")
    if meta.get("format") != "ampipe train checkpoint":
        fail(f"{sub}/metadata.json is not the metadata of an ampipe train checkpoint")
    cfg = dict(meta.get("config", {}))
    for key in ("data_path", "split", "seed", "micro_batch_size", "global_batch_size", "ampipe_degree",
                "moe_train_capacity_factor", "moe_min_capacity", "moe_no_drop", "no_use_rts", "rotary_base"):
        v = getattr(a, key)
        if v is not None:
            cfg[key] = v
    if cfg.get("bf16"):
        print("torch_eval.py: note: the checkpoint was trained with --bf16; this evaluates in "
              f"{a.dtype} (ampipe's bf16 GEMMs give a different loss)", file=sys.stderr)

    dtype = torch.float64 if a.dtype == "float64" else torch.float32
    state, _ = tg.read_safetensors(os.path.join(sub, "model.safetensors"), dtype)
    vocab = state["embedding.word_embeddings.weight"].shape[0]  # the padded vocabulary V (docs/training.md)
    if "padded_vocab_size" in cfg and cfg["padded_vocab_size"] != "" and int(cfg["padded_vocab_size"]) != vocab:
        fail(f"{sub}: metadata.json records padded_vocab_size {cfg['padded_vocab_size']}, but model.safetensors' "
             f"token embedding has {vocab} rows")
    mc = tg.ModelConfig.from_checkpoint(cfg, vocab)
    tp = a.tensor_model_parallel_size
    mc.sequence_parallel_size = tp if a.sequence_parallel else 1
    mc.context_parallel_size = a.context_parallel_size
    if a.context_parallel_size > 1:
        print("torch_eval.py: note: the routing groups of --context-parallel-size > 1 follow docs/layer.md §11 and "
              "have not been checked against `ampipe train`, which does not run context parallelism yet",
              file=sys.stderr)
    model = tg.GptMoE(mc).to(dtype)
    if a.init:
        model.init_like_ampipe()
    else:
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            fail(f"{sub}/model.safetensors does not match the model of its config: missing {missing}, "
                 f"unexpected {unexpected}")
    model.eval()
    if a.hf:  # the same data through the Hugging Face model (a converted checkpoint's original)
        import hf_moe
        model = hf_moe.load(a.hf, dtype)

    tokens = tg.load_tokens(cfg.get("data_path", ""))
    if cfg.get("tokenizer_model") and not (cfg.get("data_path") and open(cfg["data_path"], "rb").read(4) ==
                                           tg.TOKEN_FILE_MAGIC.to_bytes(4, "little")):
        fail("the run tokenized plain text with a SentencePiece model; tokenize it with `ampipe preprocess` and "
             "pass the token file with --data-path")
    if tokens.size and int(tokens.max()) >= vocab:
        fail(f"the data holds token id {int(tokens.max())}, outside the checkpoint's vocabulary of {vocab}")
    split = cfg.get("split") or "0.95,0.05,0"
    splits = tg.Splits(tokens, mc.seq_length, split)
    b = int(cfg.get("micro_batch_size", 1))
    world = a.world_size or int(meta.get("saved_with", {}).get("world_size", 1))
    dp = world // (tp * a.context_parallel_size)
    G = int(cfg.get("global_batch_size", 0)) or b * dp
    iters = a.eval_iters
    if iters * G > splits.n_valid:  # as ampipe train: capped to what the split holds, with a note
        fit = splits.n_valid // G
        if fit < 1:
            fail(f"--eval-iters {iters}: the validation split holds {splits.n_valid} sequences, fewer than one "
                 f"global batch of {G}")
        print(f"torch_eval.py: note: --eval-iters {iters} needs {iters * G} validation sequences, the validation "
              f"split holds {splits.n_valid}: evaluating on {fit} global batches", file=sys.stderr)
        iters = fit

    print(f"torch_eval.py: {sub}{' (initial weights)' if a.init else ''}: GPT-MoE L={mc.num_layers} "
          f"s={mc.seq_length} h={mc.hidden_size} F={mc.ffn_hidden_size} heads={mc.num_attention_heads} "
          f"E={mc.num_experts} top-{mc.moe_router_topk} V={vocab} {'SwiGLU' if mc.swiglu else 'GeLU'} "
          f"{'untied' if mc.untie_embeddings_and_output_weights else 'tied'} | "
          f"{'no drop' if mc.moe_no_drop else f'capacity factor {mc.moe_train_capacity_factor}'}"
          f"{', random token selection' if mc.use_rts and mc.moe_router_topk == 1 else ''} | routing groups per micro-batch: "
          f"{len(tg.routing_groups(mc, b))} | {iters} x {G} validation sequences, micro-batch {b} | "
          f"torch {torch.__version__}, {a.dtype}")
    stats = tg.RoutingStats(per_layer_dropped=[0] * mc.num_layers)
    it = 0 if a.init else meta.get("iteration", 0)  # the initial weights are the model of iteration 0
    vl = tg.evaluate(model, splits, iters, G, b, stats=stats)
    print(f" validation loss at iteration {it} | lm loss value: {vl:.6E} | lm loss PPL: "
          f"{math.exp(min(vl, 20.0)):.4E} |")
    print(f" token drops: {100.0 * stats.dropped / max(stats.choices, 1):.2f}% of {stats.choices} choices "
          f"(per layer: {' '.join(str(d) for d in stats.per_layer_dropped)}) | aux loss (sum over layers, mean "
          f"over micro-batches): {stats.aux_loss / (iters * G // b):.4E} |")
    if a.test:
        t_iters = min(iters, splits.n_test // G)  # as ampipe: --eval-iters after the validation cap
        if t_iters > 0:
            tl = tg.evaluate(model, splits, t_iters, G, b, test=True)
            print(f" test loss at iteration {it} | lm loss value: {tl:.6E} | lm loss PPL: "
                  f"{math.exp(min(tl, 20.0)):.4E} |")
        else:
            print(f" no test evaluation: the test split holds {splits.n_test} sequences, fewer than one global "
                  f"batch of {G}")
    print(f"torch_eval.py: done in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
