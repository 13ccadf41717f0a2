#!/usr/bin/env bash
# Usage: readme_claims.sh MPIRUN... -- AMPIPE
# The README's main job (2 ranks, --ampipe-degree 2 --use-flash-attn --expert-model-parallel-size 2, its model)
# for a few iterations: with --moe-no-drop, degree 2 logs the losses of degree 1 (fp32, only the summation
# order inside the chunked layers differs: 2e-5 relative on the 7-digit log values) and no token drop; at the
# default capacity factor the log reports a non-zero drop share.
set -u
mpirun=()
while [ "$1" != "--" ]; do mpirun+=("$1"); shift; done
shift
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# the main job's model (scripts/run.sh), with hidden dropout on: it is keyed by position, so degrees agree with it
job=(train --num-layers 2 --hidden-size 128 --ffn-hidden-size 256 --num-attention-heads 4 --seq-length 128
     --micro-batch-size 4 --num-experts 4 --moe-model-type deepspeed_moe --moe-train-capacity-factor 1.25
     --moe-aux-loss-coeff 0.01
     --use-flash-attn --expert-model-parallel-size 2 --train-iters 4 --log-interval 1 --eval-interval 0)
for M in 1 2; do
  "${mpirun[@]}" -np 2 "$bin" "${job[@]}" --ampipe-degree "$M" --moe-no-drop >"$dir/m$M" 2>&1 ||
    { cat "$dir/m$M"; exit 1; }
done
"${mpirun[@]}" -np 2 "$bin" "${job[@]}" --ampipe-degree 2 >"$dir/drop" 2>&1 || { cat "$dir/drop"; exit 1; }
losses() { grep -Eo "lm loss: [0-9.E+-]+" "$1" | awk '{print $3}'; }
drops() { grep -Eo "token drops: [0-9.]+%" "$1" | awk '{print $3}' | tr -d '%'; }
paste <(losses "$dir/m1") <(losses "$dir/m2") | awk '
  { n++; d = $1 - $2; if (d < 0) d = -d; if (d > 2e-5 * $1) { printf "iteration %d: degree 1 %s, degree 2 %s\n", n, $1, $2; bad = 1 } }
  END { if (n != 4) { print "expected 4 logged losses, got " n; exit 1 } if (bad) exit 1; print "ok: degree 2 = degree 1 over " n " iterations" }' ||
  { cat "$dir/m1" "$dir/m2"; exit 1; }
for f in m1 m2; do
  [ "$(drops "$dir/$f" | sort -u)" = "0.00" ] || { echo "--moe-no-drop logged drops:"; cat "$dir/$f"; exit 1; }
done
grep -q "AMPipe degree 2 equals degree 1 up to summation order: --moe-no-drop" "$dir/m2" || { cat "$dir/m2"; exit 1; }
drops "$dir/drop" | awk '$1 > 0 { found = 1 } END { exit found ? 0 : 1 }' ||
  { echo "no drop logged at the default capacity factor:"; cat "$dir/drop"; exit 1; }
grep -q "AMPipe degree 2 equals degree 1 only while no token is dropped" "$dir/drop" || { cat "$dir/drop"; exit 1; }
echo "ok: no drops with --moe-no-drop; drops logged at the default capacity ($(drops "$dir/drop" | tr '\n' ' ')%)"
