#!/usr/bin/env bash
# The distributed optimizer's parameter all-gathers under the next forward (--overlap-param-gather; issue 24;
# docs/training.md, "Distributed optimizer"): dp 2 across two network namespaces joined by a veth pair shaped with
# tbf (bench/netns/netns.sh), `ampipe train --use-distributed-optimizer --overlap-grad-reduce`, with and without
# --overlap-param-gather, alternated over ROUNDS rounds in one run at one link rate. The figure is the mean ms per
# iteration over iterations 2..N (the first gathers nothing: the parameters are whole at the start). What the flag can
# hide at most: every layer's gather but the first's, under the first micro-batch's forward of the layers before it.
# Usage (root): BUILD=build ROUNDS=3 RATE=200mbit bash bench/param_gather_overlap.sh [extra ampipe train flags]
set -uo pipefail  # not -e: netns.sh's teardown tolerates failing deletes
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-3}
RATE=${RATE:-400mbit}
ITERS=${ITERS:-5}
NETNS_PREFIX=${NETNS_PREFIX:-ampipe_pg} NETNS_SUBNET=${NETNS_SUBNET:-10.79.0} NETNS_WHO=param_gather_overlap.sh
. bench/netns/netns.sh
netns_require_root
netns_setup "$RATE"
FLAGS=(--num-layers 8 --seq-length 1024 --max-position-embeddings 1024 --hidden-size 256 --ffn-hidden-size 1024
       --num-attention-heads 4 --num-experts 4 --moe-router-topk 2 --disable-bias-linear --use-flash-attn
       --micro-batch-size 1 --global-batch-size 4 --train-iters "$ITERS" --eval-iters 0 --log-interval 1
       --lr 0.001 --use-distributed-optimizer --overlap-grad-reduce "$@")
echo "# $(lscpu | grep 'Model name' | sed 's/ \+/ /g'), $(nproc) cores; dp 2 across the veth at $RATE"
for r in $(seq "$ROUNDS"); do
  for overlap in 0 1; do
    extra=()
    [ "$overlap" = 1 ] && extra=(--overlap-param-gather)
    ms=$(netns_mpirun "$PWD/$BUILD/ampipe" train "${FLAGS[@]}" "${extra[@]}" 2>&1 |
         grep -o "elapsed time per iteration (ms): [0-9.]*" | tail -n +2 | awk '{s += $NF} END {printf "%.1f", s / NR}')
    echo "round $r  overlap-param-gather $overlap  ms/iteration $ms"
  done
done
