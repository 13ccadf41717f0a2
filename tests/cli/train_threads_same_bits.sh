#!/usr/bin/env bash
# `ampipe train` gives the same bits at any compute thread count (core/parallel.h; docs/training.md, "Threads per
# rank"): three iterations at OMP_NUM_THREADS=1 and 2 save byte-identical model and optimizer states and log the
# same losses and gradient norms, for a GPT (LayerNorm, learned positions, DeepSpeed's gate, dropout, gradient
# clipping active) and a Llama-style model (RMSNorm, RoPE, grouped-query attention, SwiGLU, Megatron-Core's router,
# untied output layer, AMPipe degree 2). Every threaded loop splits into several pieces at these sizes (h 256, 256
# rows, V 256), so the embedding's backward, the cross-entropy, AdamW and the gradient norm are covered with the layers.
# Usage: train_threads_same_bits.sh AMPIPE
set -euo pipefail
ampipe=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128
        --micro-batch-size 2 --global-batch-size 4 --num-experts 4 --moe-router-topk 2 --train-iters 3
        --eval-iters 0 --log-interval 1 --lr 0.001 --clip-grad 0.5)
gpt=(--hidden-dropout 0.1 --attention-dropout 0.1)
llama=(--normalization RMSNorm --position-embedding-type rope --swiglu --group-query-attention --num-query-groups 2
       --moe-model-type megatron_moe --disable-bias-linear --untie-embeddings-and-output-weights --ampipe-degree 2
       --use-flash-attn)
for model in gpt llama; do
  declare -n flags=$model
  for t in 1 2; do
    OMP_NUM_THREADS=$t "$ampipe" train "${common[@]}" "${flags[@]}" --save "$dir/$model$t" > "$dir/$model$t.log" 2>&1 ||
      { cat "$dir/$model$t.log"; exit 1; }
    grep -q "threads: $t compute thread" "$dir/$model$t.log" || { echo "no threads line for $t"; exit 1; }
    grep -o "lm loss: [^|]*|[^|]*| grad norm: [^|]*" "$dir/$model$t.log" > "$dir/$model$t.losses"
  done
  [ "$(wc -l < "$dir/${model}1.losses")" = 3 ] || { echo "$model: expected 3 logged iterations"; exit 1; }
  diff "$dir/${model}1.losses" "$dir/${model}2.losses" || { echo "$model: losses differ between 1 and 2 threads"; exit 1; }
  for f in model.safetensors optimizer.safetensors; do
    cmp "$dir/${model}1/iter_0000003/$f" "$dir/${model}2/iter_0000003/$f" ||
      { echo "$model: $f differs between 1 and 2 threads"; exit 1; }
  done
  unset -n flags
done
echo "THREADS_SAME_BITS_OK"
