#!/usr/bin/env bash
# Usage: bench_cp_ring.sh MPIEXEC [MPI FLAGS...] -- AMPIPE
# bench-layer with context parallelism (cp 2, EP 2 on two ranks): the ring's time alone and the all-to-alls' are
# reported apart, each lane's exposed time is at most the step's exposed time (they are parts of it), the per-lane
# hidden fractions are 1 - exposed / alone, the JSON config names the cp size, and --trace still holds the last
# repetition of every degree. On one rank (cp 1) the ring's fields are 0.
set -eu
mpi=()
while [ "$1" != "--" ]; do mpi+=("$1"); shift; done
shift
ampipe=$1
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
layer=(--seq-length 256 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --num-experts 4
  --moe-router-topk 2 --warmup 1 --iters 2)
"${mpi[@]}" -np 2 "$ampipe" bench-layer "${layer[@]}" --context-parallel-size 2 --expert-model-parallel-size 2 \
  --ampipe-degree 1,2,4 --json "$dir/cp.json" --trace "$dir/cp.trace.json" > "$dir/cp.txt"
"$ampipe" bench-layer "${layer[@]}" --ampipe-degree 1,2 --json "$dir/one.json" > "$dir/one.txt"
grep -q 'cp=2 ep=2' "$dir/cp.txt" && grep -q 'ring hid' "$dir/cp.txt" && grep -q 'a2a hid' "$dir/cp.txt"
python3 - "$dir" <<'PY'
import json, os, sys
d = sys.argv[1]
doc = json.load(open(os.path.join(d, "cp.json")))
assert doc["config"]["context_parallel_size"] == 2, doc["config"]
assert [r["degree"] for r in doc["results"]] == [1, 2, 4], doc["results"]
for r in doc["results"]:
    assert r["comm_cp_ring_alone_ms"] > 0 and r["comm_alone_ms"] > 0, r
    parts = r["exposed_ep_ms"] + r["exposed_cp_ring_ms"] + r["exposed_tp_ms"]
    assert parts <= 1.1 * r["exposed_ms"] + 1.0, (parts, r["exposed_ms"])
    assert r["exposed_tp_ms"] == 0 and r["tp_hidden_fraction"] == 0, r
    for lane, alone, exposed in (("ep", "comm_alone_ms", "exposed_ep_ms"),
                                 ("cp_ring", "comm_cp_ring_alone_ms", "exposed_cp_ring_ms")):
        want = 1 - r[exposed] / r[alone]
        assert abs(r[lane + "_hidden_fraction"] - want) < 1e-9, (lane, r)
        assert r[lane + "_hidden_fraction"] <= 1, r
    print(f"ok: degree {r['degree']}: ring {r['comm_cp_ring_alone_ms']:.2f} ms alone, hidden "
          f"{r['cp_ring_hidden_fraction']:.2f}; all-to-all {r['comm_alone_ms']:.2f} ms, hidden "
          f"{r['ep_hidden_fraction']:.2f}")
trace = json.load(open(os.path.join(d, "cp.trace.json")))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
steps = sorted({e["name"] for e in events if e.get("name", "").startswith("bench.step")})
assert len(steps) == 3, steps
assert any(e.get("name", "").startswith("L0.fwd.cp_ring") for e in events), "no ring step in the trace"
one = json.load(open(os.path.join(d, "one.json")))
for r in one["results"]:
    assert r["comm_cp_ring_alone_ms"] == 0 and r["cp_ring_hidden_fraction"] == 0, r
print("ok: trace has", steps, "and cp 1 reports no ring")
PY
