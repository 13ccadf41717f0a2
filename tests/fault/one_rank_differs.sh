#!/usr/bin/env bash
# Usage: one_rank_differs.sh AMPIPE CASE EXIT REGEX BOUND_S MPIEXEC [MPIEXEC FLAGS...]
# Two ranks whose start-up inputs differ (each runs in its own directory, so one path names a different file on each
# rank, as on two nodes): rank 1's flags, files, checkpoint, marker or subcommand differ as CASE says. Passes when the
# job exits with code EXIT within BOUND_S seconds, prints exactly one "ampipe: error:" line (OpenMPI's own banner
# aside) matching REGEX and no backtrace, and changed no file of either rank's directory.
set -u
ampipe=$(realpath "$1") case=$2 want_rc=$3 regex=$4 bound=$5
shift 5
mpi=("$@")
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/r0" "$d/r1"
shape=(--num-experts 4 --seq-length 32 --hidden-size 32 --ffn-hidden-size 64 --num-attention-heads 2
       --micro-batch-size 2 --eval-interval 0 --log-interval 100 --startup-timeout 3)
# A checkpoint at iteration 4 (and 2) in both directories, for the cases that load one.
checkpoint() {
  "$ampipe" train "${shape[@]}" --train-iters 4 --save "$d/r0/ckpt" --save-interval 2 >/dev/null 2>"$d/err" ||
    { echo "the setup run failed:"; cat "$d/err"; exit 1; }
  cp -r "$d/r0/ckpt" "$d/r1/ckpt"
}
r0=("$ampipe" train "${shape[@]}" --train-iters 2)
r1=("${r0[@]}")
case $case in
  flag)               r1+=(--hidden-size 31) ;;  # after the shape: the last value wins
  unknown_flag)       r1+=(--hidden-sise 32) ;;
  data_missing)       cp "$(dirname "$0")/../../docs/design.md" "$d/r0/data.txt"
                      r0+=(--data-path data.txt); r1+=(--data-path data.txt) ;;
  config_bad_rank1)   echo '{"moe_router_topk": 2}' > "$d/r0/cfg.json"; echo '{"moe_router_topk": 7}' > "$d/r1/cfg.json"
                      r0+=(--config cfg.json); r1+=(--config cfg.json) ;;
  ckpt_truncated)     checkpoint
                      truncate -s 1000 "$d/r1/ckpt/iter_0000004/optimizer.safetensors"
                      r0=("$ampipe" train "${shape[@]}" --train-iters 6 --load ckpt); r1=("${r0[@]}") ;;
  ckpt_flipped)       checkpoint
                      f=$d/r1/ckpt/iter_0000004/model.safetensors; off=$(( $(stat -c %s "$f") - 1 ))
                      printf '\x55' | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
                      r0=("$ampipe" train "${shape[@]}" --train-iters 6 --load ckpt); r1=("${r0[@]}") ;;
  ckpt_meta_edited)   checkpoint  # rank 1's metadata.json says another head count (the same tensor shapes)
                      sed -i 's/"num_attention_heads": 2/"num_attention_heads": 4/' "$d/r1/ckpt/iter_0000004/metadata.json"
                      r0=("$ampipe" train "${shape[@]}" --train-iters 6 --load ckpt --use-checkpoint-args); r1=("${r0[@]}") ;;
  manifests_differ)   checkpoint  # rank 1's copy of iteration 4 is another run's (another seed): a valid checkpoint
                      rm -rf "$d/r1/ckpt"
                      "$ampipe" train "${shape[@]}" --train-iters 4 --save "$d/r1/ckpt" --save-interval 2 --seed 5 \
                        >/dev/null 2>"$d/err" || { echo "the setup run failed:"; cat "$d/err"; exit 1; }
                      r0=("$ampipe" train "${shape[@]}" --train-iters 6 --load ckpt); r1=("${r0[@]}") ;;
  markers_differ)     checkpoint
                      echo 2 > "$d/r1/ckpt/latest_checkpointed_iteration.txt"
                      r0=("$ampipe" train "${shape[@]}" --train-iters 6 --load ckpt); r1=("${r0[@]}") ;;
  marker_missing)     checkpoint
                      rm "$d/r1/ckpt/latest_checkpointed_iteration.txt"
                      r0=("$ampipe" train "${shape[@]}" --train-iters 6 --load ckpt); r1=("${r0[@]}") ;;
  subcommand)         r1=("$ampipe" plan) ;;
  help)               r1=("$ampipe" train --help) ;;
  version)            r1=("$ampipe" --version) ;;
  stuck)              mkfifo "$d/r1/cfg.json"; echo '{}' > "$d/r0/cfg.json"  # rank 1 blocks reading its --config
                      r0+=(--config cfg.json); r1+=(--config cfg.json) ;;
  not_ampipe)         r1=(sleep 30) ;;
  layer_check_flag)   r0=("$ampipe" layer-check --num-experts 4 --startup-timeout 3); r1=("${r0[@]}" --hidden-size 31) ;;
  bench_layer_flag)   r0=("$ampipe" bench-layer --num-experts 4 --iters 1 --warmup 0 --ampipe-degree 1 --startup-timeout 3)
                      r1=("${r0[@]}" --hidden-size 31) ;;
  *) echo "unknown case $case"; exit 1 ;;
esac
before=$(cd "$d" && find r0 r1 -type f | sort | xargs -r sha256sum)
start=$(date +%s.%N)
timeout $(( bound + 30 )) "${mpi[@]}" -np 1 -wdir "$d/r0" "${r0[@]}" : -np 1 -wdir "$d/r1" "${r1[@]}" \
  >"$d/out" 2>"$d/err" </dev/null
rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
# The error lines, OpenMPI's banners (between dashed rules, and MPI_ABORT's) left out.
errors=$(grep -c '^ampipe: error:' "$d/err")
fail() { echo "$case: $*"; echo "--- stderr:"; cat "$d/err"; exit 1; }
[ "$rc" -eq "$want_rc" ] || fail "expected exit code $want_rc, got $rc after ${took} s"
[ "$errors" -eq 1 ] || fail "expected one 'ampipe: error:' line, got $errors"
grep '^ampipe: error:' "$d/err" | grep -Eq -- "$regex" || fail "the error line does not match /$regex/"
! grep -Eq 'internal check failed|Aborted|backtrace|Segmentation' "$d/err" || fail "a dump"
(( $(echo "$took <= $bound" | bc) )) || fail "took ${took} s, more than the bound of ${bound} s"
after=$(cd "$d" && find r0 r1 -type f ! -name err ! -name out | sort | xargs -r sha256sum)
[ "$before" = "$after" ] || fail "files changed: $(diff <(echo "$before") <(echo "$after"))"
echo "ok ($case, ${took} s): $(grep '^ampipe: error:' "$d/err")"
