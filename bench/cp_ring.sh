#!/bin/bash
# Context-parallel ring benchmark: `ampipe bench-layer` with cp 2 (ring attention over load-balanced halves, the K/V
# ring on the cp lane) and EP 2 over the same two ranks, bf16, degrees 1, 2, 4, 8 in one interleaved run, two ranks
# one per network namespace (bench/netns/netns.sh), so the ring's send_recvs and the all-to-alls share one shaped
# veth link, as two nodes would share their network.
#
#   bench/cp_ring.sh [OUTDIR]     (root; default OUTDIR bench/results/cp-ring)
#
# A probe run at PROBE_RATE measures the compute of degree 1 and the ring's and the all-to-alls' communication, each
# alone on the link; the link is then re-shaped so that ring + all-to-all take about as long as the compute
# (rate = PROBE_RATE x (ring + all-to-all) / compute, as bench/tp_overlap.sh does), and the measured run follows.
# bench-layer reports the ring's and the all-to-alls' time alone and each one's hidden fraction (1 - compute's
# wait on it / its time alone) next to the step, the speed-up over degree 1 and the overall hidden fraction.
# Writes OUTDIR/{probe,cp-ring}.{json,txt}, OUTDIR/summary.md (the markdown table) and prints the summary.
# Environment: BUILD=build-bench PROBE_RATE=1000 (mbit) WARMUP=1 ITERS=3 DEGREES=1,2,4,8 LAYER="..." (layer flags).
# Timings are only worth reporting on an otherwise idle machine: the summary records how many compiler processes
# (cc1plus) were running when the measured run started and when it ended.
set -u
HERE=$(dirname "$(readlink -f "$0")")
ROOT=$(dirname "$HERE")
OUT=${1:-$ROOT/bench/results/cp-ring}
mkdir -p "$OUT" && OUT=$(readlink -f "$OUT")
BUILD=${BUILD:-build-bench}
AMPIPE=$(readlink -f "$ROOT/$BUILD/ampipe" 2>/dev/null || true)
PROBE_RATE=${PROBE_RATE:-1000} WARMUP=${WARMUP:-1} ITERS=${ITERS:-3} DEGREES=${DEGREES:-1,2,4,8}
LAYER=${LAYER:-"--seq-length 8192 --micro-batch-size 1 --disable-bias-linear --hidden-size 1024 --ffn-hidden-size 2048
  --num-attention-heads 16 --num-experts 4 --moe-router-topk 2 --bf16"}
PY=/usr/bin/python3

NETNS_PREFIX=ampipe_cp NETNS_SUBNET=10.81.0 NETNS_WHO=cp_ring.sh
. "$HERE/netns/netns.sh"
netns_require_root
[ -x "${AMPIPE:-}" ] || netns_skip "$BUILD/ampipe not built (cmake -S . -B $BUILD -G Ninja && ninja -C $BUILD ampipe)"
[ -x $PY ] || netns_skip "$PY is missing"

json_get() {  # file expr over r (results) and d (document)
  $PY -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['results']; print($2)" "$1"
}

run() {  # json degrees warmup iters
  # shellcheck disable=SC2086
  netns_mpirun "$AMPIPE" bench-layer $LAYER --context-parallel-size 2 --expert-model-parallel-size 2 \
    --ampipe-degree "$2" --warmup "$3" --iters "$4" --json "$1"
}

netns_setup "${PROBE_RATE}mbit"
probe="$OUT/probe.json"
run "$probe" 1 0 1 > "$OUT/probe.txt" 2>&1 || { cat "$OUT/probe.txt"; exit 1; }
# the link's two users: the all-to-alls (ep) and the K/V ring (cp), each timed alone
rate=$(json_get "$probe" \
  "max(10, int($PROBE_RATE * (r[0]['comm_alone_ms'] + r[0]['comm_cp_ring_alone_ms']) / r[0]['compute_ms']))")
netns_set_rate "${rate}mbit"
busy=$(pgrep -c cc1plus || true)
run "$OUT/cp-ring.json" "$DEGREES" "$WARMUP" "$ITERS" > "$OUT/cp-ring.txt" 2>&1 || { cat "$OUT/cp-ring.txt"; exit 1; }
busy="$busy/$(pgrep -c cc1plus || true)"

$PY - "$OUT/cp-ring.json" "$rate" "$PROBE_RATE" "$busy" "$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores" \
  "$(echo $LAYER)" "$WARMUP" "$ITERS" > "$OUT/summary.md" <<'PYEOF'
import json, sys, datetime
path, rate, probe, busy, cpu, layer, warmup, iters = sys.argv[1:9]
d = json.load(open(path))
r = d["results"]
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
print(f"# Context-parallel ring benchmark, {now}\n")
print(f"- CPU: {cpu}; compiler processes running at the start / end of the measured run: {busy}"
      + ("" if busy == "0/0" else " (timings NOT valid: the machine was busy)"))
print(f"- layer: `{layer}` --context-parallel-size 2 --expert-model-parallel-size 2")
print(f"- 2 ranks, one per network namespace; cp 2 and EP 2 share one veth link shaped to {rate} mbit "
      f"(probe at {probe} mbit: ring + all-to-all alone about equal to degree 1's compute)")
print(f"- {warmup} warm-up + {iters} timed repetitions per degree, interleaved; medians\n")
print("| degree | step ms | speed-up | compute ms | all-to-all alone ms | ring alone ms | exposed ms "
      "| a2a exposed ms | ring exposed ms | hidden | a2a hidden | ring hidden |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for x in r:
    print(f"| {x['degree']} | {x['step_ms']:.1f} | {x['speedup']:.3f} | {x['compute_ms']:.1f} "
          f"| {x['comm_alone_ms']:.1f} | {x['comm_cp_ring_alone_ms']:.1f} | {x['exposed_ms']:.1f} "
          f"| {x['exposed_ep_ms']:.1f} | {x['exposed_cp_ring_ms']:.1f} | {x['hidden_fraction']:.2f} "
          f"| {x['ep_hidden_fraction']:.2f} | {x['cp_ring_hidden_fraction']:.2f} |")
best = max(r, key=lambda x: x["speedup"])
print(f"\nBest degree {best['degree']}: {best['speedup']:.3f}x degree 1's step in the same run "
      f"(target >= 1.25x); its ring hidden fraction {best['cp_ring_hidden_fraction']:.2f}, "
      f"all-to-all hidden fraction {best['ep_hidden_fraction']:.2f}.")
print("\nhidden: (compute + all-to-all + ring alone - step) / min(compute, all-to-all + ring); a2a / ring hidden: "
      "1 - (compute's wait on that lane's tasks) / (its time alone).")
PYEOF
{ echo; echo '```'; grep -A10 '^ampipe bench-layer' "$OUT/cp-ring.txt"; echo '```'; } >> "$OUT/summary.md"
cat "$OUT/summary.md"
