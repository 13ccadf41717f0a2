#!/usr/bin/env bash
# Compute threads per rank (issue 25; docs/performance.md, "Threads"): the judged bf16 layer (h 1024, s 4096, F 4096,
# 8 heads, E 4, top-2, capacity factor 1, hidden dropout 0.1) forward + backward at 1 and 2 OpenMP threads, next to
# the bf16 GEMM rate at the same thread counts, all in one bench_layer run (wall-clock rates: run it on an otherwise
# idle machine); then `ampipe bench-layer` (the CLI's own set-up, one rank) at 1 and 2 threads, alternated over
# ROUNDS rounds. Writes to stdout; bench/results/threads/summary.txt holds a run.
# Usage: BUILD=build ROUNDS=2 MIN_TIME=8 bash bench/threads.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-2}
MIN_TIME=${MIN_TIME:-8}
isa=$(grep -o 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "# $(lscpu | grep 'Model name' | sed 's/ \+/ /g'), $(nproc) cores, ${isa}load average $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/bench/bench_layer" --benchmark_filter='BM_Gemm/m:4096/bf16:1|BM_Layer/s:4096/bf16:1/M:1' \
  --benchmark_min_time="$MIN_TIME" 2>&1 | grep -E '^BM_|^Stage|inside GEMMs'
FLAGS=(--seq-length 4096 --hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 8 --num-experts 4
       --moe-router-topk 2 --hidden-dropout 0.1 --bf16 --ampipe-degree 1 --warmup 1 --iters 3)
for r in $(seq "$ROUNDS"); do
  for t in 1 2; do
    ms=$(OMP_NUM_THREADS=$t "$BUILD/ampipe" bench-layer "${FLAGS[@]}" 2>&1 | awk '$1 == "1" && NF > 10 {print $3}')
    echo "round $r  ampipe bench-layer  threads $t  step ms $ms"
  done
done
