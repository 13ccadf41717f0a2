#!/usr/bin/env bash
# Pipeline parallelism across a rate-limited link (issue 24's speed check; docs/training.md, "Pipeline
# parallelism"): two stages in two network namespaces joined by a veth pair shaped with tbf (bench/netns/netns.sh),
# `ampipe train --pipeline-model-parallel-size 2`, K micro-batches, one traced iteration per link setting, in one
# run: unshaped first, then each rate. From each trace (every rank's lanes):
#   step      the traced iteration, first to last record of any rank
#   bubble    1 - (both stages' compute lane busy, the pp waits excluded) / (2 x step), against (P-1)/(K+P-1)
#   sends     the activations and gradients one stage sends, on the wire at the shaped rate (bytes x 8 / rate: a send
#             op completes once its bytes are in the socket, so its own duration understates it), and how much of
#             that the step shows: hidden = 1 - (step - unshaped step) / (one stage's sends on the wire)
# Usage (root): BUILD=build RATES="400mbit 200mbit" bash bench/pipeline_bubble.sh [extra ampipe train flags]
set -uo pipefail  # not -e: netns.sh's teardown tolerates failing deletes
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RATES=${RATES:-"400mbit"}
K=${K:-4}
OUT=${OUT:-bench/results/pipeline-bubble}
NETNS_PREFIX=${NETNS_PREFIX:-ampipe_pp} NETNS_SUBNET=${NETNS_SUBNET:-10.78.0} NETNS_WHO=pipeline_bubble.sh
. bench/netns/netns.sh
netns_require_root
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
netns_setup none
FLAGS=(--num-layers 4 --seq-length 2048 --hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 8
       --num-experts 4 --moe-router-topk 2 --disable-bias-linear --bf16 --use-flash-attn
       --pipeline-model-parallel-size 2 --micro-batch-size 1 --global-batch-size "$K"
       --train-iters 2 --trace-iteration 2 --eval-iters 0 --log-interval 1 "$@")
run() {  # $1: label
  netns_mpirun "$PWD/$BUILD/ampipe" train "${FLAGS[@]}" --trace "$OUT/trace-$1.json" > "$OUT/log-$1.txt" 2>&1
}
run unshaped
for r in $RATES; do
  netns_set_rate "$r"
  run "$r"
done
python3 - "$OUT" "$K" unshaped $RATES <<'EOF'
import json, sys
out, K, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
P = 2

def union(iv):
    iv = sorted(iv)
    total, end = 0.0, None
    start = None
    for a, b in iv:
        if end is None or a > end:
            if end is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    return total + (end - start if end is not None else 0.0)

def measure(label):
    ev = [e for e in json.load(open(f"{out}/trace-{label}.json"))["traceEvents"] if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in ev)
    t1 = max(e["ts"] + e["dur"] for e in ev)
    lanes = {e["args"]["name"]: e["tid"] for e in json.load(open(f"{out}/trace-{label}.json"))["traceEvents"]
             if e.get("name") == "thread_name"}
    busy, sends = [], []
    for r in range(P):
        comp = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["pid"] == r and e["tid"] == lanes["compute"]
                and e["cat"] == "compute" and not e["name"].startswith("pp.wait")]
        busy.append(union(comp))
        sends.append(sum(e["args"]["bytes"] for e in ev if e["pid"] == r and e["cat"] == "send"
                         and e["name"].startswith(("pp.activation", "pp.grad"))))
    step = t1 - t0
    return step, 1 - sum(busy) / (P * step), sends

def rate_bps(label):  # "100mbit" -> bits per second
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, f in units.items():
        if label.endswith(u):
            return float(label[: -len(u)]) * f
    return None

res = {l: measure(l) for l in labels}
base = res["unshaped"][0]
ideal = (P - 1) / (K + P - 1)
lines = [f"pipeline bubble, pp 2, K {K} micro-batches ((P-1)/(K+P-1) = {100 * ideal:.1f}%)",
         f"{'link':>10} {'step ms':>10} {'bubble':>8} {'vs ideal':>9} {'wire ms (stage 0, 1)':>22} {'hidden':>7}"]
for l in labels:
    step, bubble, sends = res[l]
    bps = rate_bps(l)
    wire = [8 * b / bps * 1e6 if bps else 0.0 for b in sends]  # microseconds, as the trace
    # a step no longer than the unshaped one (within the machine's noise): every send hidden
    hidden = min(1.0, 1 - (step - base) / max(wire)) if bps and max(wire) > 0 else float("nan")
    lines.append(f"{l:>10} {step / 1e3:10.1f} {100 * bubble:7.1f}% {bubble / ideal:9.2f} "
                 f"{wire[0] / 1e3:10.1f} {wire[1] / 1e3:10.1f} {hidden:7.2f}")
print("\n".join(lines))
open(f"{out}/summary.txt", "w").write("\n".join(lines) + "\n")
EOF
