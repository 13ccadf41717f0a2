#!/usr/bin/env bash
# Usage: train_summary.sh AMPIPE ITERS
# The end-of-run summary of an ITERS-iteration run: "lm loss A -> B (mean of the first / last W iterations)" with
# W = 10 from 20 iterations on, else ITERS / 2, so the two windows never overlap; A and B equal the means of the
# logged per-iteration losses (printed with 7 digits; the summary with 3 decimals).
set -u
bin=$1
iters=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$bin" train --num-experts 4 --num-layers 1 --hidden-size 64 --train-iters "$iters" --log-interval 1 --eval-interval 0 >"$out" 2>&1 ||
  { cat "$out"; exit 1; }
w=$(( iters >= 20 ? 10 : iters / 2 ))
summary=$(grep -Eo "lm loss [0-9.]+ -> [0-9.]+ \(mean of the first / last [0-9]+ iterations\)" "$out")
[ -n "$summary" ] || { echo "no summary of two windows:"; cat "$out"; exit 1; }
echo "summary: $summary"
grep -Eo "lm loss: [0-9.E+-]+" "$out" | awk '{print $3}' >"$out.losses"
awk -v w="$w" -v n="$iters" -v s="$summary" '
  { l[NR] = $1 + 0 }
  END {
    if (NR != n) { print "expected " n " logged losses, got " NR; exit 1 }
    split(s, f, " ");  # lm loss A -> B (mean of the first / last W iterations)
    a = 0; b = 0
    for (i = 1; i <= w; ++i) { a += l[i] / w; b += l[n - w + i] / w }
    if (f[12] != w) { print "window " f[12] ", expected " w; exit 1 }
    if (f[3] - a > 0.0006 || a - f[3] > 0.0006 || f[5] - b > 0.0006 || b - f[5] > 0.0006) {
      printf "means of the log %.4f -> %.4f, summary %s -> %s\n", a, b, f[3], f[5]; exit 1
    }
    printf "ok: first %d %.4f, last %d %.4f\n", w, a, w, b
  }' "$out.losses"
rc=$?
rm -f "$out.losses"
exit $rc
