#!/usr/bin/env bash
# `ampipe simulate` checks memory with the very estimate `ampipe train` prints in its banner (docs/simulator.md,
# "Memory per device"): for the same flags, every part of the banner's estimate but this process's own ("process
# now") and the data order (simulate reads no data) appears in simulate's memory line with the same value, at one
# rank and at a pipeline split's largest stage. The profile: tests/cli/sim_profile.json with a device memory.
# Usage: simulate_memory_matches_banner.sh AMPIPE PROFILE "MPIRUN (with its flags)"
set -euo pipefail
ampipe=$1
profile=$2
mpirun=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$profile" "$dir/profile.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["device_memory_gib"], p["memory_reserve_gib"] = 16.0, 0.5
json.dump(p, open(sys.argv[2], "w"))
PY
check() {  # $1: ranks; the rest: flags for both
  local ranks=$1
  shift
  # shellcheck disable=SC2086
  $mpirun -np "$ranks" "$ampipe" train --train-iters 1 --eval-iters 0 --log-interval 1 --ampipe-degree 2 "$@" \
    > "$dir/train.txt" 2>&1
  "$ampipe" simulate --profile "$dir/profile.json" --ampipe-degree 2 --world-size "$ranks" "$@" > "$dir/sim.txt" 2>&1
  python3 - "$dir/train.txt" "$dir/sim.txt" <<'PY'
import re, sys
banner = next(l for l in open(sys.argv[1]) if "memory: estimated peak" in l)
sim = next(l for l in open(sys.argv[2]) if "degree 2 memory per device:" in l)
def parts(line):
    inner = line[line.index("(") + 1:]
    return dict((m.group(1).strip(), m.group(2)) for m in
                re.finditer(r"([a-z][a-zA-Z0-9 +(),/-]*?) ([0-9.]+ [KMG]?i?B)(?:,|\))", inner))
b, s = parts(banner), parts(sim)
b.pop("process now (code, MPI, data)", None)
b.pop("data order", None)
assert b, banner
for name, v in b.items():
    assert s.get(name) == v, f"{name}: banner {v}, simulate {s.get(name)}\n{banner}{sim}"
assert "+ 512 MiB framework reserve" in sim and "of 16.0 GiB: fits" in sim, sim
print("ok:", ", ".join(f"{k} {v}" for k, v in b.items()))
PY
}
common=(--num-experts 4 --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128
        --max-position-embeddings 128 --use-flash-attn --micro-batch-size 1 --global-batch-size 4 --bf16)
check 1 "${common[@]}"
check 1 "${common[@]}" --recompute-granularity full --recompute-method uniform
check 2 "${common[@]}" --pipeline-model-parallel-size 2 --use-distributed-optimizer
