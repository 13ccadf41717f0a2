#!/usr/bin/env bash
# Usage: torch_loader.sh CASE [MPIRUN... --] AMPIPE
# The PyTorch loader (tools/torch_eval.py, tools/torch_gpt_moe.py): a tiny `ampipe train` run saves checkpoints and
# logs its validation loss (fp32); the loader, a PyTorch model written from docs/layer.md and docs/training.md,
# loads each checkpoint and evaluates the same validation sequences; the two losses must agree to 1e-4 relative.
# Every case also checks that the comparison can fail: two checkpoints of different iterations (or the trained
# and the initial weights) must give losses further apart than the tolerance, and the loader must agree with each.
#   top2_degree2_drops  top-2 GeLU, tied head, AMPipe degree 2, capacity factor 0.75 (tokens dropped in every
#                       evaluation: the loader must report drops), dropout 0.1 and Jitter in training (off in
#                       evaluation); checkpoints at iterations 3 and 6. The loader at --ampipe-degree 1 (each
#                       micro-batch routed as one group) must NOT match: the routing groups matter
#   top1_rts_tokens     top-1 with random token selection and drops, SwiGLU, untied head, degree 4, micro-batch 4,
#                       an llm.c token file (V 384) with --split 90,5,5: the validation and the test loss
#   initial_weights     `ampipe train --skip-train` (no --load: the initial weights) against the loader's --init
#                       (ampipe's Philox initialisation), then both against the trained checkpoint
#   mixtral_like        RMSNorm, rotary embeddings (base 500000, Llama 3 scaling off), grouped-query attention (4 query
#                       heads, 2 K, V heads), SwiGLU, untied head, Megatron-Core's dropless top-3 router over 4
#                       experts, degree 2, attention dropout in training; the loader with another --rotary-base must
#                       NOT match
#   sp2_drops           2 ranks, tensor parallel 2 with sequence parallelism (each tp rank routes its own rows),
#                       drops: the loader with --tensor-model-parallel-size 2 --sequence-parallel
# Exit 77 (CTest's skip) with a message when no python3 can import torch (scripts/setup.sh installs python3-torch).
set -u
case_name=$1
shift
launch=()
if [ $# -gt 1 ]; then
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
fi
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../../tools

py=
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch" >/dev/null 2>&1; then py=$cand; break; fi
done
if [ -z "$py" ]; then
  echo "torch_loader.sh: skipped: PyTorch is not installed (python3 -c 'import torch' failed); scripts/setup.sh" \
       "installs Debian's python3-torch"
  exit 77
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.out; do [ -e "$f" ] && { echo "--- $f:"; cat "$f"; }; done; exit 1; }
small=(--num-layers 2 --seq-length 32 --hidden-size 32 --ffn-hidden-size 48 --num-attention-heads 4
       --num-experts 4 --log-interval 1 --eval-iters 3)
train() { "${launch[@]}" "$bin" train "${small[@]}" "$@" >"$dir/ampipe.out" 2>&1 || fail "ampipe train $* failed"; }
# logged NAME ITER: the loss `ampipe train` logged ("validation" or "test") at iteration ITER
logged() {
  local v
  v=$(grep -Eo "$1 loss at iteration $2 \| lm loss value: [0-9.E+-]+" "$dir/ampipe.out" | awk '{print $NF}')
  [ -n "$v" ] || fail "ampipe train logged no $1 loss at iteration $2"
  echo "$v"
}
# loader OUT ARGS...: runs the loader into $dir/OUT.out; prints its validation (or, with OUT test*, test) loss
loader() {
  local out=$1 what=validation
  shift
  case $out in test*) what=test ;; esac
  "$py" "$tools/torch_eval.py" --eval-iters 3 "$@" >"$dir/$out.out" 2>&1 || fail "torch_eval.py $* failed"
  local v
  v=$(grep -Eo "$what loss at iteration [0-9]+ \| lm loss value: [0-9.E+-]+" "$dir/$out.out" | awk '{print $NF}')
  [ -n "$v" ] || fail "torch_eval.py $* printed no $what loss"
  echo "$v"
}
# same WHAT A B: |A - B| / |A| <= 1e-4
same() {
  "$py" -c "import sys; a, b = float(sys.argv[2]), float(sys.argv[3]); r = abs(a - b) / abs(a)
print(f'{sys.argv[1]}: ampipe {a:.6e}, torch {b:.6e}, relative difference {r:.2e}', 'ok' if r <= 1e-4 else 'FAIL (> 1e-4)')
sys.exit(r > 1e-4)" "$@" || fail "$1 differs"
}
# differ WHAT A B: |A - B| / |A| > 1e-3 (the comparison above can tell the two apart)
differ() {
  "$py" -c "import sys; a, b = float(sys.argv[2]), float(sys.argv[3]); r = abs(a - b) / abs(a)
print(f'{sys.argv[1]}: {a:.6e} vs {b:.6e}, relative difference {r:.2e}', 'ok (> 1e-3)' if r > 1e-3 else 'FAIL (<= 1e-3)')
sys.exit(r <= 1e-3)" "$@" || fail "$1: the losses are too close for the comparison to mean anything"
}
drops_seen() {
  grep -Eq "token drops: [0-9.]*[1-9][0-9.]*% of" "$dir/$1.out" || fail "the loader dropped no token in $1"
  echo "$1: $(grep -Eo 'token drops: [0-9.]+% of [0-9]+ choices' "$dir/$1.out")"
}

case $case_name in
  top2_degree2_drops)
    train --moe-model-type deepspeed_moe --micro-batch-size 2 --global-batch-size 4 --moe-router-topk 2 --moe-train-capacity-factor 0.75 \
          --ampipe-degree 2 --use-flash-attn --hidden-dropout 0.1 --noisy-gate-policy Jitter --init-method-std 0.2 \
          --train-iters 6 --eval-interval 3 --save-interval 3 --save "$dir/ck"
    a3=$(logged validation 3); a6=$(logged validation 6)
    t3=$(loader it3 --load "$dir/ck" --iteration 3); t6=$(loader it6 --load "$dir/ck")
    same "validation loss, iteration 3" "$a3" "$t3"
    same "validation loss, iteration 6" "$a6" "$t6"
    drops_seen it6
    differ "iterations 3 and 6" "$a3" "$a6"
    m1=$(loader it6_m1 --load "$dir/ck" --ampipe-degree 1)
    differ "iteration 6 routed per chunk (ampipe) vs per micro-batch (loader --ampipe-degree 1)" "$a6" "$m1"
    ;;
  top1_rts_tokens)
    # An llm.c token file: 256 int32 header words (magic 20240520, version 1, count), uint16 ids; the GPL-3 text
    # with upper-case letters moved to ids 265..290, so the vocabulary is 384 (291 rounded up to 128).
    "$py" - "$dir/tokens.bin" <<'EOF' || fail "could not write the token file"
import struct, sys
t = open("/usr/share/common-licenses/GPL-3", "rb").read()
ids = [c + 200 if 65 <= c <= 90 else c for c in t]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)))
    f.write(struct.pack(f"<{len(ids)}H", *ids))
EOF
    train --moe-model-type deepspeed_moe --micro-batch-size 4 --global-batch-size 8 --moe-router-topk 1 --moe-train-capacity-factor 0.6 \
          --moe-min-capacity 1 --ampipe-degree 4 --use-flash-attn --swiglu --untie-embeddings-and-output-weights \
          --noisy-gate-policy RSample --init-method-std 0.2 --data-path "$dir/tokens.bin" --split 90,5,5 --train-iters 8 \
          --eval-interval 4 --save-interval 4 --save "$dir/ck"
    grep -q "V=384" "$dir/ampipe.out" || fail "expected the vocabulary 384"
    a4=$(logged validation 4); a8=$(logged validation 8); at=$(logged test 8)
    t4=$(loader it4 --load "$dir/ck" --iteration 4); t8=$(loader it8 --load "$dir/ck")
    tt=$(loader test8 --load "$dir/ck" --test)
    same "validation loss, iteration 4" "$a4" "$t4"
    same "validation loss, iteration 8" "$a8" "$t8"
    same "test loss, iteration 8" "$at" "$tt"
    drops_seen it8
    differ "iterations 4 and 8" "$a4" "$a8"
    norts=$(loader it8_norts --load "$dir/ck" --no-use-rts)
    differ "iteration 8 with random token selection (ampipe) vs token order (loader --no-use-rts)" "$a8" "$norts"
    ;;
  initial_weights)
    flags=(--moe-model-type deepspeed_moe --micro-batch-size 2 --global-batch-size 4 --moe-router-topk 1
           --moe-train-capacity-factor 0.75
           --swiglu --untie-embeddings-and-output-weights --seed 77)
    train "${flags[@]}" --skip-train
    a0=$(logged validation 0)
    train "${flags[@]}" --train-iters 5 --eval-interval 5 --save "$dir/ck"
    a5=$(logged validation 5)
    t0=$(loader init --load "$dir/ck" --init); t5=$(loader it5 --load "$dir/ck")
    same "validation loss, initial weights" "$a0" "$t0"
    same "validation loss, iteration 5" "$a5" "$t5"
    differ "initial weights and iteration 5" "$a0" "$a5"
    ;;
  qkv_bias)  # Qwen2-style: --add-qkv-bias (the bias trained away from its zero init) with RMSNorm, RoPE, GQA
    train --micro-batch-size 2 --global-batch-size 4 --moe-model-type megatron_moe --moe-router-topk 2 \
          --add-qkv-bias --ampipe-degree 2 --use-flash-attn --normalization RMSNorm --position-embedding-type rope \
          --group-query-attention --num-query-groups 2 --swiglu --init-method-std 0.2 --lr 0.03 --train-iters 6 \
          --eval-interval 6 --save "$dir/ck"
    a6=$(logged validation 6)
    t6=$(loader it6 --load "$dir/ck")
    same "validation loss, iteration 6" "$a6" "$t6"
    ;;
  bias_linear)  # --add-bias-linear (every bias trained away from its zero init): block 0 dense, GeLU, LayerNorm
    train --micro-batch-size 2 --global-batch-size 4 --moe-model-type megatron_moe --moe-router-topk 2 \
          --add-bias-linear --first-k-dense-replace 1 --moe-grouped-gemm --ampipe-degree 2 --use-flash-attn \
          --init-method-std 0.2 --lr 0.03 --train-iters 6 --eval-interval 6 --save "$dir/ck"
    a6=$(logged validation 6)
    t6=$(loader it6 --load "$dir/ck")
    same "validation loss, iteration 6" "$a6" "$t6"
    ;;
  mixtral_like)
    train --micro-batch-size 2 --global-batch-size 4 --moe-model-type megatron_moe \
          --moe-router-topk 3 --moe-aux-loss-coeff 0.01 --ampipe-degree 2 \
          --use-flash-attn --normalization RMSNorm --norm-epsilon 1e-6 --position-embedding-type rope \
          --rotary-base 500000 --group-query-attention --num-query-groups 2 --swiglu \
          --untie-embeddings-and-output-weights --attention-dropout 0.1 --init-method-std 0.2 --train-iters 6 \
          --eval-interval 6 --save "$dir/ck"
    a6=$(logged validation 6)
    t6=$(loader it6 --load "$dir/ck")
    same "validation loss, iteration 6" "$a6" "$t6"
    b=$(loader it6_base --load "$dir/ck" --rotary-base 10000)
    differ "iteration 6 with RoPE base 500000 (ampipe) vs 10000 (loader --rotary-base 10000)" "$a6" "$b"
    ;;
  sp2_drops)
    [ ${#launch[@]} -gt 0 ] || fail "sp2_drops needs MPIRUN... --"
    launch+=(-np 2)
    train --moe-model-type deepspeed_moe --micro-batch-size 2 --moe-train-capacity-factor 0.75 --ampipe-degree 2 --use-flash-attn \
          --tensor-model-parallel-size 2 --sequence-parallel --train-iters 6 --eval-interval 6 --save "$dir/ck"
    a6=$(logged validation 6)
    t6=$(loader sp2 --load "$dir/ck" --tensor-model-parallel-size 2 --sequence-parallel)
    same "validation loss, iteration 6, tp 2 with sequence parallelism" "$a6" "$t6"
    drops_seen sp2
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
echo "ok: $case_name"
