#!/usr/bin/env bash
# The interleaved pipeline schedule against 1F1B (issue 24; docs/training.md, "Pipeline parallelism"): two stages on
# this machine's cores (mpirun -np 2, one OpenMP thread each), 8 layers, K micro-batches, fp32, in one run with the
# schedules alternated over ROUNDS rounds: 1F1B, then 2 and 4 virtual stages per rank. The figure is the mean ms per
# iteration over iterations 3-6. Ideal makespans in micro-batch times: K + P - 1 (1F1B) and K + (P - 1) / v.
# Usage: BUILD=build ROUNDS=2 K=4 bash bench/pipeline_interleaved.sh [extra ampipe train flags]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-2}
K=${K:-4}
FLAGS=(--num-experts 4 --num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 512
       --max-position-embeddings 512 --micro-batch-size 1 --global-batch-size "$K" --train-iters 6 --log-interval 1
       --eval-iters 0 --lr 0.001 --disable-bias-linear --hidden-dropout 0 --attention-dropout 0
       --pipeline-model-parallel-size 2 "$@")
echo "# $(lscpu | grep 'Model name' | sed 's/ \+/ /g'), $(nproc) cores; K=$K"
for r in $(seq "$ROUNDS"); do
  for v in 1 2 4; do
    extra=()
    [ "$v" -gt 1 ] && extra=(--num-virtual-stages-per-pipeline-rank "$v")
    ms=$(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 \
           "$BUILD/ampipe" train "${FLAGS[@]}" "${extra[@]}" 2>&1 |
         grep -o "elapsed time per iteration (ms): [0-9.]*" | tail -4 | awk '{s += $NF} END {printf "%.1f", s / NR}')
    echo "round $r  virtual stages $v  ms/iteration $ms"
  done
done
