#!/usr/bin/env bash
# Usage: bench_json_units.sh AMPIPE
# bench-layer --json: every *_ms field is in milliseconds; step_ms is the median of step_ms_all, and step_ms_min /
# step_ms_max its extremes (step_ms_all was once stored in seconds next to step_ms in milliseconds).
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$1" bench-layer --ampipe-degree 1,2 --iters 3 --warmup 0 --json "$dir/b.json" >/dev/null
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
python3 - "$dir/b.json" <<'PY'
import json, statistics, sys
res = json.load(open(sys.argv[1]))["results"]
assert res, "no results"
for r in res:
    all_ms = r["step_ms_all"]
    assert len(all_ms) == 3, all_ms
    assert abs(statistics.median(all_ms) - r["step_ms"]) <= 1e-9 * r["step_ms"], (all_ms, r["step_ms"])
    assert min(all_ms) == r["step_ms_min"] and max(all_ms) == r["step_ms_max"], r
    print(f"ok: degree {r['degree']}: step_ms {r['step_ms']:.3f} = median of {all_ms}")
PY
