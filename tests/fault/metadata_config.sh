#!/usr/bin/env bash
# Usage: metadata_config.sh AMPIPE MPIEXEC [MPIEXEC FLAGS...] -- LAYOUT FLAGS...
# Issue 27, item 3: a checkpoint's metadata.json is a --config for any layout and degree. Saves 2 iterations on 2
# ranks with the LAYOUT FLAGS (an AMPipe degree and tp or ep > 1), then trains from `--config metadata.json` alone
# (plus --load and --train-iters): the run must start (every flag the layout needs is in the metadata), print the
# saved layout in its banner, resume at iteration 2 without a note that it changes a setting (but --train-iters),
# and leave the checkpoint's files unchanged.
set -u
ampipe=$1
shift
mpi=()
while [ "$1" != "--" ]; do mpi+=("$1"); shift; done
shift
layout=("$@")
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
shape=(--num-experts 4 --seq-length 32 --hidden-size 32 --ffn-hidden-size 64 --num-attention-heads 2
       --micro-batch-size 2 --eval-interval 0 --log-interval 1)
fail() { echo "metadata_config: $*"; for f in "$d"/err*; do echo "--- $f:"; cat "$f"; done; exit 1; }
"${mpi[@]}" -np 2 "$ampipe" train "${shape[@]}" "${layout[@]}" --train-iters 2 --save "$d/ck" \
  >"$d/out1" 2>"$d/err1" </dev/null || fail "the saving run failed"
meta=$d/ck/iter_0000002/metadata.json
before=$(cd "$d/ck" && find . -type f | sort | xargs sha256sum)
"${mpi[@]}" -np 2 "$ampipe" train --config "$meta" --load "$d/ck" --train-iters 3 \
  >"$d/out2" 2>"$d/err2" </dev/null || fail "the run from --config $meta failed"
banner=$(grep '^ampipe train: GPT-MoE' "$d/out1")
[ -n "$banner" ] || fail "no banner in the saving run"
[ "$banner" = "$(grep '^ampipe train: GPT-MoE' "$d/out2")" ] || fail "the banners differ: $banner vs $(grep '^ampipe train: GPT-MoE' "$d/out2")"
grep -q 'resumed from .* at iteration 2' "$d/out2" || fail "not resumed at iteration 2"
grep -q 'iteration  *3/  *3' "$d/out2" || fail "iteration 3 not trained"
! grep -v 'changes --train-iters 2 -> 3' "$d/err2" | grep -q 'this run changes' || fail "the run from the metadata changes a setting: $(grep 'this run changes' "$d/err2")"
after=$(cd "$d/ck" && find . -type f | sort | xargs sha256sum)
[ "$before" = "$after" ] || fail "the checkpoint changed"
echo "ok: $banner"
