#!/usr/bin/env bash
# The simulator against `ampipe train` on every parallel layout (issue 26's validation harness; docs/simulator.md,
# "Accuracy by layout"): for each layout and link rate, `ampipe simulate` on a profile `ampipe calibrate` measured on
# this machine (nothing fitted to the training runs) predicts the iteration, and `ampipe train` measures it (the mean
# of iterations 3-6) with the same flags. Two network namespaces joined by a tbf-shaped veth stand for two nodes
# (bench/netns/netns.sh): a 2-rank layout puts one rank in each, the 4-rank one two (its tp pair inside a
# namespace, over loopback TCP). The profile: links.intra from calibrate on two ranks inside one namespace, links.inter
# and everything else from calibrate on one rank per namespace over the shaped link; simulate runs with --nodes 2.
# A 4-rank layout shares this machine's cores two ranks to a core: its compute rates, task overhead and slowdown come
# from calibrate on 4 ranks (two per namespace), as a profile describes the devices a layout runs on.
# Routing has a fixed capacity (deepspeed_moe, factor 1): a dropless router's step depends on its imbalance, which
# simulate costs as balanced.
#   bench/sim_layouts.sh [OUTDIR]     (root; default OUTDIR bench/results/sim-layouts)
# Environment: BUILD=build RATES="1gbit 200mbit" LAYOUTS="ep2 tp2_sp_overlap cp2 pp2 tp2_ep2"
set -u
HERE=$(dirname "$(readlink -f "$0")")
ROOT=$(dirname "$HERE")
OUT=${1:-$ROOT/bench/results/sim-layouts}
mkdir -p "$OUT" && OUT=$(readlink -f "$OUT")
AMPIPE=$(readlink -f "$ROOT/${BUILD:-build}/ampipe" 2>/dev/null || true)
RATES=${RATES:-"1gbit 200mbit"}
LAYOUTS=${LAYOUTS:-"ep2 tp2_sp_overlap cp2 pp2 tp2_ep2"}
NETNS_PREFIX=ampipe_sl NETNS_SUBNET=10.81.0 NETNS_WHO=sim_layouts.sh
# NETNS_BURST (netns.sh's default 256 KB) sets how far tbf departs from a link: with 256 KB a tensor-parallel message
# of a few hundred KiB passes at the veth's own speed, several times the shaped rate (tp 2 + SP at 1 Gbit/s: 1490 ms
# per iteration); with 32 KB (2612 ms) TCP moves the training's medium messages slower than calibrate's bulk rate.
# No link model (latency + bytes / bandwidth) has either; both runs are in bench/results/sim-layouts.
NETNS_MPI_EXTRA="-x OMP_NUM_THREADS=1 ${NETNS_MPI_EXTRA:-}"
. "$HERE/netns/netns.sh"
netns_require_root
[ -x "${AMPIPE:-}" ] || netns_skip "${BUILD:-build}/ampipe not built"

MODEL=(--num-layers 4 --hidden-size 256 --ffn-hidden-size 1024 --num-attention-heads 4 --seq-length 1024
       --max-position-embeddings 1024 --num-experts 4 --moe-router-topk 2 --moe-model-type deepspeed_moe
       --moe-train-capacity-factor 1 --disable-bias-linear --hidden-dropout 0 --attention-dropout 0 --micro-batch-size 1
       --use-flash-attn)
layout_flags() {  # $1: layout -> "ranks|flags"
  case $1 in
    ep2) echo "2|--expert-model-parallel-size 2 --ampipe-degree 2 --global-batch-size 8" ;;
    tp2_sp_overlap) echo "2|--tensor-model-parallel-size 2 --sequence-parallel --ampipe-degree 2 --ampipe-tp-sp-comm-overlap --global-batch-size 4" ;;
    cp2) echo "2|--context-parallel-size 2 --ampipe-degree 2 --global-batch-size 4" ;;
    pp2) echo "2|--pipeline-model-parallel-size 2 --global-batch-size 4" ;;
    tp2_ep2) echo "4|--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 --ampipe-degree 2 --global-batch-size 8" ;;
    *) echo "sim_layouts.sh: unknown layout $1" >&2; exit 2 ;;
  esac
}

netns_setup none
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)" |
  tee "$OUT/machine.txt"
echo "-- calibrate links.intra: two ranks inside one namespace (loopback TCP)"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ip netns exec "$NS0" mpirun -np 2 --mca pml ob1 \
  --mca btl tcp,self --bind-to none -x OMP_NUM_THREADS=1 "$AMPIPE" calibrate --out "$OUT/profile_intra.json" \
  > "$OUT/calibrate_intra.txt" 2>&1 || { echo "sim_layouts.sh: intra calibrate failed" >&2; exit 1; }
for rate in $RATES; do
  netns_set_rate "$rate" || exit 1
  echo "-- $rate: calibrate over the link, merged with links.intra"
  netns_mpirun "$AMPIPE" calibrate --out "$OUT/profile_inter_$rate.json" > "$OUT/calibrate_$rate.txt" 2>&1 ||
    { echo "sim_layouts.sh: calibrate at $rate failed" >&2; exit 1; }
  need4=0
  for layout in $LAYOUTS; do [ "$(layout_flags "$layout" | cut -d'|' -f1)" = 4 ] && need4=1; done
  if [ "$need4" = 1 ]; then
    echo "-- $rate: calibrate on 4 ranks (two per namespace) for the 4-rank layouts' compute"
    netns_mpirun_n 2 "$AMPIPE" calibrate --out "$OUT/profile_4ranks_$rate.json" > "$OUT/calibrate_4ranks_$rate.txt" \
      2>&1 || { echo "sim_layouts.sh: 4-rank calibrate at $rate failed" >&2; exit 1; }
  fi
  for ranks in 2 4; do
    compute="$OUT/profile_inter_$rate.json"
    [ "$ranks" = 4 ] && compute="$OUT/profile_4ranks_$rate.json"
    [ -f "$compute" ] || continue
    python3 - "$compute" "$OUT/profile_inter_$rate.json" "$OUT/profile_intra.json" "$OUT/profile_${ranks}r_$rate.json" \
      "$ranks" <<'PY'
import json, sys
p, inter, intra = (json.load(open(f)) for f in sys.argv[1:4])
p["links"] = {"intra": intra["links"]["intra"], "inter": inter["links"]["intra"]}
p["devices_per_node"] = int(sys.argv[5]) // 2
p["name"] += " + links.intra of two ranks in one namespace, links.inter of one rank per namespace"
json.dump(p, open(sys.argv[4], "w"), indent=2)
PY
  done
  for layout in $LAYOUTS; do
    IFS='|' read -r ranks flags < <(layout_flags "$layout")
    # shellcheck disable=SC2206
    extra=($flags)
    tag="${layout}_$rate"
    "$AMPIPE" simulate --profile "$OUT/profile_${ranks}r_$rate.json" --world-size "$ranks" --nodes 2 "${MODEL[@]}" "${extra[@]}" \
      --json "$OUT/sim_$tag.json" > "$OUT/sim_$tag.txt" 2>&1 || { echo "sim_layouts.sh: simulate $tag failed" >&2; exit 1; }
    if [ "$ranks" = 2 ]; then
      netns_mpirun "$AMPIPE" train "${MODEL[@]}" "${extra[@]}" --train-iters 6 --eval-iters 0 --log-interval 1 \
        --lr 0.001 > "$OUT/train_$tag.txt" 2>&1
    else
      netns_mpirun_n 2 "$AMPIPE" train "${MODEL[@]}" "${extra[@]}" --train-iters 6 --eval-iters 0 --log-interval 1 \
        --lr 0.001 > "$OUT/train_$tag.txt" 2>&1
    fi || { echo "sim_layouts.sh: train $tag failed" >&2; tail -3 "$OUT/train_$tag.txt" >&2; exit 1; }
    echo "   $tag done"
  done
done
netns_set_rate none
python3 - "$OUT" "$RATES" "$LAYOUTS" <<'PY'
import json, re, sys
out, rates, layouts = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rows = ["| layout | link | measured ms (iterations 3-6) | predicted ms | error |", "|---|---|---|---|---|"]
points = []
for layout in layouts:
    for rate in rates:
        tag = f"{layout}_{rate}"
        ms = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", open(f"{out}/train_{tag}.txt").read())]
        meas = sum(ms[2:]) / len(ms[2:])
        pred = 1e3 * json.load(open(f"{out}/sim_{tag}.json"))["configs"][0]["step_s"]
        err = pred / meas - 1
        points.append({"layout": layout, "rate": rate, "measured_ms": meas, "iterations_ms": ms, "predicted_ms": pred,
                       "error": err})
        rows.append(f"| {layout} | {rate} | {meas:.0f} ({min(ms[2:]):.0f}..{max(ms[2:]):.0f}) | {pred:.0f} | "
                    f"{100 * err:+.1f}%{'' if abs(err) <= 0.10 else ' **miss**'} |")
text = "\n".join(rows) + "\n"
open(f"{out}/table.md", "w").write(text)
json.dump({"points": points, "all_within_10pct": all(abs(p["error"]) <= 0.10 for p in points)},
          open(f"{out}/summary.json", "w"), indent=2)
print(text)
PY
echo "sim_layouts.sh: done ($OUT)"
