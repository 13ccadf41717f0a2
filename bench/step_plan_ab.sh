#!/usr/bin/env bash
# A/B of two ampipe binaries on the training step (issue "the whole training step as data"): `ampipe train` on the
# judged layer (bf16, h 1024, s 4096, F 4096, E 4, top-2, one layer), one rank and two ranks with EP 2, the two
# binaries alternated in each round so that the machine's drift hits both alike. Usage:
#   git worktree add /tmp/ampipe-before <commit> && (cd /tmp/ampipe-before && bash scripts/build.sh)
#   bash bench/step_plan_ab.sh /tmp/ampipe-before/build/ampipe build/ampipe [ROUNDS]
# Prints per round and binary the mean ms per iteration over iterations 2-4 and the single rank's peak RSS.
set -euo pipefail
A=${1:?before binary}; B=${2:?after binary}; ROUNDS=${3:-2}
ARGS="train --bf16 --use-flash-attn --disable-bias-linear --hidden-size 1024 --seq-length 4096 --max-position-embeddings 4096
      --ffn-hidden-size 4096 --num-attention-heads 8 --num-experts 4 --moe-router-topk 2 --micro-batch-size 1
      --num-layers 1 --train-iters 4 --log-interval 1 --eval-interval 0"
MPI="mpirun --bind-to none -np 2"
[ "$(id -u)" = 0 ] && MPI="$MPI --allow-run-as-root"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ms() { grep -Eo 'per iteration \(ms\): [0-9.]+' "$log" | tail -3 | awk '{s += $4} END {printf "%.1f", s / NR}'; }
echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), $(date -u +%F)"
for r in $(seq "$ROUNDS"); do
  for which in before after; do
    bin=$A; [ "$which" = after ] && bin=$B
    # shellcheck disable=SC2086
    /usr/bin/time -f "peak RSS %M KB" "$bin" $ARGS --global-batch-size 1 >"$log" 2>&1
    echo "round $r $which 1 rank:  $(ms) ms/iter, $(grep -o 'peak RSS [0-9]* KB' "$log")"
    # shellcheck disable=SC2086
    $MPI "$bin" $ARGS --global-batch-size 2 --expert-model-parallel-size 2 >"$log" 2>&1
    echo "round $r $which 2 ranks: $(ms) ms/iter"
  done
done
