#!/bin/bash
# Simulator accuracy on this machine (docs/simulator.md, "Accuracy on this machine"): for the judged layer
# (h 1024, s 4096, F 4096, 8 heads, E 4, top-2, capacity factor 1, bf16, EP 2 on 2 ranks) at several link rates,
# compare `ampipe simulate`'s prediction, made on the profile `ampipe calibrate` measured over that same link, with
# `ampipe bench-layer`'s measured step, degree by degree, and `--ampipe-degree auto`'s choice with the best measured
# degree. Nothing is fitted to the bench-layer measurements: the profile is calibrate's output, used as written.
#
#   bench/sim_accuracy.sh [OUTDIR]            (root; default OUTDIR bench/results/sim-accuracy)
#
# Steps (two ranks, one per network namespace, joined by a tbf-shaped veth: bench/netns/netns.sh):
#   1. an unshaped run (veth, no tbf) of bench-layer at degrees 1 and 8 with --trace (OUTDIR/unshaped.json,
#      trace_unshaped.json): the degree-1 compute time C of the layer (COMP_MS overrides it), and the per-stage
#      compute of step 5;
#   2. the all-to-all bytes each rank sends per step (as bench/ampipe_sweep.sh: 4 all-to-alls of E*Cap*h*2 bytes,
#      (ep-1)/ep of them off-rank) and, per factor f in FACTORS, the tbf rate r_f = bytes*8 / (f*C) / EFF, so that
#      comm alone ~ f x compute;
#   3. per rate: shape the link; `ampipe calibrate` on the 2 ranks over the shaped link (-> profile_<f>.json: compute
#      rates, task overhead, compute slowdown during all-to-all, link latency and bandwidth); `ampipe simulate` on it
#      with --ampipe-degree auto (-> sim_auto_<f>.json), then with DEGREES and auto's choice (-> sim_<f>.json)
#      (simulate needs no MPI: it runs outside the namespaces); `ampipe bench-layer` with the same degrees,
#      interleaved (-> bench_<f>.json);
#   4. OUTDIR/table.md and OUTDIR/summary.json: per rate and degree the measured step (median, min..max), the
#      predicted step, the error, and auto's choice against the best measured degree. The predicted step is what
#      bench-layer times, the forward + backward of the layer of one micro-batch: simulate's layers_s less its
#      config.dp_allreduce_s (with one micro-batch layers_s also holds the data-parallel gradient all-reduce, dp 2
#      here, which the simulator runs as a phase of its own after the last backward: exactly additive). The LM head
#      and the optimizer are outside layers_s (they are in step_s);
#   5. OUTDIR/stage_compare.txt, a diagnostic: the compute per stage of the unshaped trace against the simulator's
#      (the first rate's profile with compute_slowdown_during_comm set to 0, as the unshaped link hardly
#      communicates; profile_diag.json, sim_trace_diag_<M>.json). It is not used for the judged numbers.
# The capacity factor is passed explicitly: bench-layer's default is 1.0, simulate's (train's) 1.25.
# Environment: BUILD=build FACTORS="0.25 1 2" DEGREES=1,2,4,8 WARMUP=1 ITERS=3 EFF=0.9 COMP_MS= (ms; empty = measure)
set -u
HERE=$(dirname "$(readlink -f "$0")")
ROOT=$(dirname "$HERE")
OUT=${1:-$ROOT/bench/results/sim-accuracy}
mkdir -p "$OUT" && OUT=$(readlink -f "$OUT")
BUILD=${BUILD:-build}
AMPIPE=$(readlink -f "$ROOT/$BUILD/ampipe" 2>/dev/null || true)
FACTORS=${FACTORS:-"0.25 1 2"}
DEGREES=${DEGREES:-1,2,4,8}
WARMUP=${WARMUP:-1} ITERS=${ITERS:-3} EFF=${EFF:-0.9} COMP_MS=${COMP_MS:-}
PY=/usr/bin/python3

NETNS_PREFIX=ampipe_sa NETNS_SUBNET=10.79.0 NETNS_WHO=sim_accuracy.sh
. "$HERE/netns/netns.sh"
netns_require_root
[ -x "${AMPIPE:-}" ] || netns_skip "$BUILD/ampipe not built (cmake -S . -B $BUILD -G Ninja && ninja -C $BUILD ampipe)"
[ -x $PY ] || netns_skip "$PY is missing"

# The judged layer: bench-layer's flags, and simulate's (train's flags: one layer, one micro-batch per rank).
LAYER=(--disable-bias-linear --hidden-size 1024 --ffn-hidden-size 4096 --num-attention-heads 8 --num-experts 4 --moe-router-topk 2
       --moe-train-capacity-factor 1 --bf16 --seq-length 4096 --micro-batch-size 1 --expert-model-parallel-size 2)
SIM=(--num-layers 1 --use-flash-attn --global-batch-size 2 --world-size 2)

read -r BYTES < <($PY - "${LAYER[@]}" <<'PYEOF'
import math, sys
a = sys.argv[1:]
def g(flag, d):
    return float(a[a.index(flag) + 1]) if flag in a else d
s, b, h = g('--seq-length', 64), g('--micro-batch-size', 1), g('--hidden-size', 64)
E, k, ep = g('--num-experts', 4), g('--moe-router-topk', 2), g('--expert-model-parallel-size', 1)
cap = max(4, math.ceil(k * s * b * g('--moe-train-capacity-factor', 1.0) / E))
print(int(4 * (ep - 1) / ep * E * cap * h * (2 if '--bf16' in a else 4)))
PYEOF
)

simulate() {  # profile degrees json
  "$AMPIPE" simulate "${LAYER[@]}" "${SIM[@]}" --profile "$1" --ampipe-degree "$2" --json "$3" 2>&1 |
    tee "${3%.json}.txt"
  return "${PIPESTATUS[0]}"
}
chosen() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['chosen_degree'])" "$1"; }

netns_setup none
echo "sim_accuracy.sh: $AMPIPE; ranks in $NS0/$NS1 ($IP0, $IP1); results in $OUT"
echo "sim_accuracy.sh: machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== unshaped: bench-layer --ampipe-degree 1,8 --warmup 1 --iters 2 --trace"
netns_mpirun "$AMPIPE" bench-layer "${LAYER[@]}" --ampipe-degree 1,8 --warmup 1 --iters 2 \
  --json "$OUT/unshaped.json" --trace "$OUT/trace_unshaped.json" 2>&1 | tee "$OUT/unshaped.txt"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "sim_accuracy.sh: unshaped run failed" >&2; exit 1; }
[ -n "$COMP_MS" ] ||
  COMP_MS=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['results'][0]['compute_ms'])" "$OUT/unshaped.json")
echo "sim_accuracy.sh: all-to-all bytes per rank per step = $BYTES; degree-1 compute = $COMP_MS ms; EFF = $EFF"

for f in $FACTORS; do
  rate=$($PY -c "print(max(1, round($BYTES * 8 / ($f * $COMP_MS / 1e3) / $EFF / 1e3)))")kbit
  echo "== factor $f: tbf rate $rate (comm alone ~ $f x compute)"
  netns_set_rate "$rate" || { echo "sim_accuracy.sh: tc failed for $rate" >&2; exit 1; }
  echo "$rate" > "$OUT/rate_$f.txt"
  echo "-- calibrate (2 ranks over the shaped link)"
  netns_mpirun "$AMPIPE" calibrate --out "$OUT/profile_$f.json" --name "calibrated over tbf $rate (sim_accuracy.sh)" \
    2>&1 | tee "$OUT/calibrate_$f.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "sim_accuracy.sh: calibrate at $rate failed" >&2; exit 1; }
  echo "-- simulate --ampipe-degree auto (profile_$f.json)"
  simulate "$OUT/profile_$f.json" auto "$OUT/sim_auto_$f.json" || exit 1
  degs=$($PY -c "import sys; print(','.join(str(d) for d in sorted({int(x) for x in sys.argv[1:] if x})))" \
         ${DEGREES//,/ } "$(chosen "$OUT/sim_auto_$f.json")")
  echo "-- simulate --ampipe-degree $degs"
  simulate "$OUT/profile_$f.json" "$degs" "$OUT/sim_$f.json" || exit 1
  echo "-- bench-layer --ampipe-degree $degs --warmup $WARMUP --iters $ITERS"
  netns_mpirun "$AMPIPE" bench-layer "${LAYER[@]}" --ampipe-degree "$degs" --warmup "$WARMUP" --iters "$ITERS" \
    --json "$OUT/bench_$f.json" 2>&1 | tee "$OUT/bench_$f.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "sim_accuracy.sh: bench-layer at $rate failed" >&2; exit 1; }
done
netns_set_rate none

$PY - "$OUT" "$DEGREES" $FACTORS <<'PYEOF'
import json, sys
out, judged, factors = sys.argv[1], {int(d) for d in sys.argv[2].split(",")}, sys.argv[3:]
load = lambda p: json.load(open(f"{out}/{p}"))

# simulate's layers_s = the layers of the micro-batches, the last one followed by the data-parallel gradient
# all-reduce (a phase of its own, sim/simulator.cpp): take it out, and the LM head and optimizer out of compute_s.
def layers_only(c, cfg):
    ar, nmb = cfg["dp_allreduce_s"], cfg["micro_batches"]
    step = c["layers_s"] - ar
    comp = c["compute_s"] - nmb * cfg["head_s"] - cfg["optimizer_s"]
    return {"step_ms": 1e3 * step, "compute_ms": 1e3 * comp, "comm_ms": 1e3 * (c["comm_s"] - ar),
            "exposed_ms": 1e3 * (step - comp)}

rows = ["| link (comm/comp target) | degree | measured step ms, median (min..max) | predicted ms | error | "
        "measured compute / comm alone / exposed ms | predicted compute / comm / exposed ms |", "|" + "---|" * 7]
auto_rows = ["| link | profile: link, slowdown during comm | best measured | auto picks | its measured step vs best | "
             "predicted ms by degree |", "|" + "---|" * 6]
summary = {"points": [], "auto": []}
for f in factors:
    rate = open(f"{out}/rate_{f}.txt").read().strip()
    link = f"tbf {float(rate.rstrip('kbit')) / 1e3:.1f} Mbit/s ({f}x)"
    sim, auto, prof = load(f"sim_{f}.json"), load(f"sim_auto_{f}.json"), load(f"profile_{f}.json")
    pred = {c["ampipe_degree"]: layers_only(c, sim["config"]) for c in sim["configs"]}
    meas = {r["degree"]: r for r in load(f"bench_{f}.json")["results"]}
    for M, r in sorted(meas.items()):
        c = pred[M]
        err = c["step_ms"] / r["step_ms"] - 1
        rows.append(f"| {link} | {M}{'' if M in judged else ' (auto)'} | {r['step_ms']:.0f} ({r['step_ms_min']:.0f}.."
                    f"{r['step_ms_max']:.0f}) | {c['step_ms']:.0f} | {100 * err:+.1f}%"
                    f"{'' if abs(err) <= 0.10 else ' **miss**'} | {r['compute_ms']:.0f} / {r['comm_alone_ms']:.0f} / "
                    f"{r['exposed_ms']:.0f} | {c['compute_ms']:.0f} / {c['comm_ms']:.0f} / {c['exposed_ms']:.0f} |")
        summary["points"].append({"factor": float(f), "rate": rate, "degree": M, "judged_degree": M in judged,
                                  "measured_ms": r["step_ms"], "measured_min_ms": r["step_ms_min"],
                                  "measured_max_ms": r["step_ms_max"], "predicted": c, "error": err})
    best = min(meas.values(), key=lambda r: r["step_ms"])
    ch = auto["chosen_degree"]
    ratio = meas[ch]["step_ms"] / best["step_ms"]
    l = prof["links"]["intra"]
    by_degree = ", ".join(f"{c['ampipe_degree']}: {layers_only(c, auto['config'])['step_ms']:.0f}"
                          for c in auto["configs"])
    auto_rows.append(f"| {link} | {1e3 * l['gbps']:.1f} MB/s, {l['latency_us']:.0f} us; "
                     f"{prof.get('compute_slowdown_during_comm', 0):.2f} | degree {best['degree']}, "
                     f"{best['step_ms']:.0f} ms | degree {ch} | {meas[ch]['step_ms']:.0f} ms, {100 * (ratio - 1):+.1f}%"
                     f"{'' if ratio <= 1.05 else ' **miss**'} | {by_degree} |")
    summary["auto"].append({"factor": float(f), "rate": rate, "best_degree": best["degree"],
                            "best_ms": best["step_ms"], "auto_degree": ch, "auto_over_best": ratio})
summary["all_within_10pct"] = all(abs(p["error"]) <= 0.10 for p in summary["points"] if p["judged_degree"])
summary["auto_within_5pct"] = all(a["auto_over_best"] <= 1.05 for a in summary["auto"])
text = "\n".join(rows) + "\n\n" + "\n".join(auto_rows) + "\n"
open(f"{out}/table.md", "w").write(text)
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(text)
print(f"sim_accuracy.sh: every point of degrees {sorted(judged)} within 10%: {summary['all_within_10pct']}; "
      f"auto within 5% of the best measured at every rate: {summary['auto_within_5pct']}")
PYEOF

# 5. Diagnostic: per-stage compute, unshaped trace vs the simulator with no slowdown (not part of the judged numbers).
first=${FACTORS%% *}
$PY -c "import json,sys; p=json.load(open(sys.argv[1])); p['compute_slowdown_during_comm']=0.0; \
p['name']+=' [diagnostic: slowdown 0]'; json.dump(p, open(sys.argv[2],'w'), indent=2)" \
  "$OUT/profile_$first.json" "$OUT/profile_diag.json"
for M in 1 8; do
  "$AMPIPE" simulate "${LAYER[@]}" "${SIM[@]}" --profile "$OUT/profile_diag.json" --ampipe-degree $M \
    --trace "$OUT/sim_trace_diag_$M.json" > /dev/null || exit 1
done
$PY - "$OUT" <<'PYEOF' | tee "$OUT/stage_compare.txt"
import collections, json, sys
out = sys.argv[1]
X = [e for e in json.load(open(f"{out}/trace_unshaped.json"))["traceEvents"] if e.get("ph") == "X"]
pid0 = min(e["pid"] for e in X)
stage = lambda name: ".".join(name.split(".")[1:3])  # L0.fwd.experts.c3 -> fwd.experts
print("Compute per stage (all chunks), judged layer, unshaped veth: bench-layer --trace (rank 0, last repetition)")
print("against the simulator on profile_diag.json (the first rate's calibrated profile, slowdown during comm 0).")
for M in (1, 8):
    s = [e for e in X if e.get("cat") == "step" and e["pid"] == pid0
         and e["name"].startswith(f"bench.step degree={M} ")][0]
    meas, sim = collections.OrderedDict(), collections.OrderedDict()
    for e in X:
        if e["pid"] == pid0 and s["ts"] <= e["ts"] <= s["ts"] + s["dur"] and e.get("cat") == "compute":
            meas[stage(e["name"])] = meas.get(stage(e["name"]), 0) + e["dur"] / 1e3
    for e in json.load(open(f"{out}/sim_trace_diag_{M}.json"))["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "compute":
            sim[stage(e["name"])] = sim.get(stage(e["name"]), 0) + e["dur"] / 1e3
    print(f"\ndegree {M}: measured step {s['dur'] / 1e3:.0f} ms")
    print(f"{'stage':22s} {'measured ms':>12s} {'simulated ms':>13s} {'sim/meas':>9s}")
    for k in meas:
        print(f"{k:22s} {meas[k]:12.1f} {sim.get(k, 0):13.1f} {sim.get(k, 0) / meas[k] if meas[k] else 0:9.2f}")
    tm, ts = sum(meas.values()), sum(sim.get(k, 0) for k in meas)
    print(f"{'total':22s} {tm:12.1f} {ts:13.1f} {ts / tm:9.2f}")
PYEOF
echo "sim_accuracy.sh: done ($OUT)"
