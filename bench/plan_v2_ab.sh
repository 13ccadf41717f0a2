#!/usr/bin/env bash
# A/B of two ampipe binaries in one run (issue "Plan v2"): the same commands, alternated, so that the machine's
# drift hits both alike. Usage:
#   git worktree add /tmp/ampipe-before <commit> && (cd /tmp/ampipe-before && bash scripts/build.sh)
#   bash bench/plan_v2_ab.sh /tmp/ampipe-before/build/ampipe build/ampipe [ROUNDS] > bench/results/plan-v2/ab.txt
# Reports, per binary: single-rank bf16 layer rate at h 1024, s 2048 and 4096 (degree 1); the peak RSS of a 4-layer
# bench-layer (degrees 1,2,4, s 2048); and, with 2 ranks and EP 2, the judged layer's compute time at degrees 1
# and 8 (h 1024, s 4096, F 4096, E 4, top-2, bf16).
set -euo pipefail
A=${1:?before binary}; B=${2:?after binary}; ROUNDS=${3:-3}
LAYER="--disable-bias-linear --hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 8 --num-experts 4 --moe-router-topk 2 --bf16"
MPI="mpirun --oversubscribe --bind-to none --mca btl self,vader -np 2"
[ "$(id -u)" = 0 ] && MPI="$MPI --allow-run-as-root"
echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), $(date -u +%F)"
echo "# before: $A"; echo "# after:  $B"
for r in $(seq "$ROUNDS"); do
  for which in before after; do
    bin=$A; [ "$which" = after ] && bin=$B
    for s in 2048 4096; do
      "$bin" bench-layer $LAYER --seq-length "$s" --ampipe-degree 1 --warmup 1 --iters 3 --json /tmp/ab.json >/dev/null
      python3 -c "import json;r=json.load(open('/tmp/ab.json'))['results'][0];print('round $r $which rate s=$s', 'tflops=%.4f'%r['tflops'], 'step_ms=%.1f'%r['step_ms'])"
    done
    "$bin" bench-layer $LAYER --seq-length 2048 --num-layers 4 --ampipe-degree 1,2,4 --warmup 0 --iters 1 \
      --json /tmp/ab.json >/dev/null
    python3 -c "import json;r=json.load(open('/tmp/ab.json'))['results'];print('round $r $which peak4layers', 'peak_MiB=%.1f'%(max(x['peak_rss_bytes'] for x in r)/2**20))"
    $MPI "$bin" bench-layer $LAYER --seq-length 4096 --expert-model-parallel-size 2 --ampipe-degree 1,8 --warmup 1 \
      --iters 2 --json /tmp/ab.json >/dev/null
    python3 -c "import json;r=json.load(open('/tmp/ab.json'))['results'];d={x['degree']:x for x in r};print('round $r $which ep2 compute_ms', 'M1=%.1f'%d[1]['compute_ms'], 'M8=%.1f'%d[8]['compute_ms'], 'ratio=%.3f'%(d[8]['compute_ms']/d[1]['compute_ms']), 'step M1=%.1f M8=%.1f'%(d[1]['step_ms'],d[8]['step_ms']))"
  done
done
