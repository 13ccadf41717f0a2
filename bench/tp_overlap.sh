#!/bin/bash
# Tensor-parallel overlap benchmark (docs/ampipe-benchmark.md, "Tensor and sequence parallelism"): `ampipe bench-layer`
# with tp 2 and sequence parallelism, bf16, degrees 1, 2, 4 crossed with --ampipe-tp-sp-comm-overlap off / on in one
# interleaved run, over a veth pair between two network namespaces shaped with tbf (bench/netns/netns.sh).
#
#   bench/tp_overlap.sh [OUTDIR]     (root; default OUTDIR bench/results/tp-overlap)
#
# Two placements:
#   tp-across-link   2 ranks, one per namespace: the tp group itself crosses the shaped link (ep 1), the case the
#                    overlap is judged on (tp collectives on the slow link, comm about equal to compute);
#   tp-in-node       4 ranks, two per namespace: each tp group inside a namespace (shared memory), expert parallelism
#                    2 across the link, as tp inside a node and EP across nodes on a cluster.
# For each, a probe run at PROBE_RATE measures compute (degree 1) and the collectives on the link alone; the link
# is then re-shaped so that they take about as long as the compute (rate = PROBE_RATE x comm / compute), and the
# measured run follows. Environment: BUILD=build-bench PROBE_RATE=1000 (mbit) WARMUP=1 ITERS=3 PLACEMENTS="..."
# LAYER="..." (the layer flags).
set -u
HERE=$(dirname "$(readlink -f "$0")")
ROOT=$(dirname "$HERE")
OUT=${1:-$ROOT/bench/results/tp-overlap}
mkdir -p "$OUT" && OUT=$(readlink -f "$OUT")
BUILD=${BUILD:-build-bench}
AMPIPE=$(readlink -f "$ROOT/$BUILD/ampipe" 2>/dev/null || true)
PROBE_RATE=${PROBE_RATE:-1000} WARMUP=${WARMUP:-1} ITERS=${ITERS:-3}
PLACEMENTS=${PLACEMENTS:-"tp-across-link tp-in-node"}
LAYER=${LAYER:-"--seq-length 4096 --micro-batch-size 1 --disable-bias-linear --hidden-size 1024 --ffn-hidden-size 2048
  --num-attention-heads 16 --num-experts 4 --moe-router-topk 2 --bf16"}
PY=/usr/bin/python3

NETNS_PREFIX=ampipe_tp NETNS_SUBNET=10.80.0 NETNS_WHO=tp_overlap.sh
. "$HERE/netns/netns.sh"
netns_require_root
[ -x "${AMPIPE:-}" ] || netns_skip "$BUILD/ampipe not built (cmake -S . -B $BUILD -G Ninja && ninja -C $BUILD ampipe)"
[ -x $PY ] || netns_skip "$PY is missing"

json_get() {  # file expr over r (results) and d (document)
  $PY -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['results']; print($2)" "$1"
}

run() {  # placement json degrees warmup iters
  local placement=$1 json=$2 degs=$3 wu=$4 it=$5
  # shellcheck disable=SC2086
  case "$placement" in
    tp-across-link)
      netns_mpirun "$AMPIPE" bench-layer $LAYER --tensor-model-parallel-size 2 --sequence-parallel \
        --ampipe-degree "$degs" --tp-overlap-sweep 0,1 --warmup "$wu" --iters "$it" --json "$json" ;;
    tp-in-node)
      netns_mpirun_n 2 "$AMPIPE" bench-layer $LAYER --tensor-model-parallel-size 2 --sequence-parallel \
        --expert-model-parallel-size 2 --ampipe-degree "$degs" --tp-overlap-sweep 0,1 --warmup "$wu" --iters "$it" \
        --json "$json" ;;
  esac
}

netns_setup "${PROBE_RATE}mbit"
{
  echo "# tp overlap benchmark, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; layer: $(echo $LAYER)"
} > "$OUT/summary.txt"
for placement in $PLACEMENTS; do
  netns_set_rate "${PROBE_RATE}mbit"
  probe="$OUT/$placement.probe.json"
  run "$placement" "$probe" 1 0 1 > "$OUT/$placement.probe.txt" 2>&1 || { cat "$OUT/$placement.probe.txt"; exit 1; }
  # the collectives that cross the link: tp's across it, the all-to-alls with tp inside the namespaces
  field=$([ "$placement" = tp-across-link ] && echo comm_tp_alone_ms || echo comm_alone_ms)
  rate=$(json_get "$probe" "max(10, int($PROBE_RATE * r[0]['$field'] / r[0]['compute_ms']))")
  netns_set_rate "${rate}mbit"
  run "$placement" "$OUT/$placement.json" 1,2,4 "$WARMUP" "$ITERS" > "$OUT/$placement.txt" 2>&1 ||
    { cat "$OUT/$placement.txt"; exit 1; }
  { echo; echo "## $placement: link ${rate} mbit (probe at ${PROBE_RATE} mbit)"; grep -A20 '^ampipe bench-layer' "$OUT/$placement.txt"; } \
    >> "$OUT/summary.txt"
done
cat "$OUT/summary.txt"
