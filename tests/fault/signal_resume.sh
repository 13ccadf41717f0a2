#!/usr/bin/env bash
# Usage: signal_resume.sh AMPIPE [LAUNCHER...]
# SIGTERM during `ampipe train` (train/stop_signal.h): the run finishes the current iteration on every rank, saves a
# checkpoint, prints one line and exits with 143; the checkpoint loads and training resumes from it; a file of the
# user's beside the checkpoint is left as it was. With a LAUNCHER (mpirun ... -np 2), only ONE rank gets the signal:
# the other must stop after the same iteration (no rank left behind).
set -u
ampipe=$1
shift
launcher=("$@")
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
shape=(--num-experts 4 --seq-length 32 --hidden-size 32 --ffn-hidden-size 64 --num-attention-heads 2 --micro-batch-size 2
       --eval-interval 0 --log-interval 1)
[ ${#launcher[@]} -gt 0 ] && shape+=(--expert-model-parallel-size 2)
echo "the user's notes" > "$d/notes.txt"
"${launcher[@]}" "$ampipe" train "${shape[@]}" --train-iters 5000 --save "$d/ckpt" >"$d/out" 2>"$d/err" &
pid=$!
for _ in $(seq 600); do
  grep -Eq "iteration +2/" "$d/out" && break
  sleep 0.1
done
grep -Eq "iteration +2/" "$d/out" || { echo "training did not reach iteration 2"; cat "$d/out" "$d/err"; kill "$pid"; exit 1; }
if [ ${#launcher[@]} -gt 0 ]; then
  target=$(pgrep -P "$pid" | head -1)  # one rank process of this launcher
  [ -n "$target" ] || { echo "no rank process under the launcher $pid"; kill "$pid"; exit 1; }
else
  target=$pid
fi
kill -TERM "$target"
wait "$pid"
rc=$?
[ "$rc" -eq 143 ] || { echo "expected exit code 143 (128 + SIGTERM), got $rc"; cat "$d/err"; exit 1; }
lines=$(grep -c '^ampipe:' "$d/err")
[ "$lines" -eq 1 ] || { echo "expected one ampipe line on stderr, got $lines:"; cat "$d/err"; exit 1; }
if grep -Eq 'terminate called|Signal:|backtrace|Segmentation|Abort' "$d/err"; then
  echo "a crash report on stderr:"; cat "$d/err"; exit 1
fi
line=$(grep '^ampipe:' "$d/err")
re="^ampipe: stopped by SIGTERM after iteration ([0-9]+) of 5000 on every rank: checkpoint saved to $d/ckpt/iter_[0-9]{7}; resume with --load $d/ckpt$"
[[ "$line" =~ $re ]] || { echo "unexpected line: $line"; exit 1; }
it=${BASH_REMATCH[1]}
[ "$(cat "$d/ckpt/latest_checkpointed_iteration.txt")" = "$it" ] || { echo "the marker does not say $it"; exit 1; }
# Resume: the checkpoint loads and two more iterations run.
"${launcher[@]}" "$ampipe" train "${shape[@]}" --train-iters $((it + 2)) --load "$d/ckpt" >"$d/out2" 2>"$d/err2"
rc=$?
[ "$rc" -eq 0 ] || { echo "resume failed with $rc:"; cat "$d/err2"; exit 1; }
grep -q "resumed from $d/ckpt at iteration $it" "$d/out2" || { echo "no resume line:"; cat "$d/out2"; exit 1; }
grep -Eq "iteration +$((it + 2))/" "$d/out2" || { echo "iteration $((it + 2)) did not run:"; cat "$d/out2"; exit 1; }
[ "$(cat "$d/notes.txt")" = "the user's notes" ] || { echo "the user's file changed"; exit 1; }
echo "ok: $line; resumed to iteration $((it + 2))"
