#!/usr/bin/env bash
# --ampipe-degree auto weighs the whole setting (docs/simulator.md, "auto"): at every degree the given flags are
# among the settings weighed, so what it chooses is predicted no slower than the given flags at any listed degree,
# it names the pipe-experts and tp-sp overlap flags it chose and a runner-up that is no faster.
# Usage: simulate_auto_setting.sh AMPIPE PROFILE
set -euo pipefail
ampipe=$1
profile=$2
flags=(--world-size 16 --nodes 2 --use-flash-attn --num-experts 4 --seq-length 8192 --hidden-size 4096
       --num-attention-heads 32 --num-layers 2 --micro-batch-size 1 --global-batch-size 4
       --tensor-model-parallel-size 8 --sequence-parallel --expert-model-parallel-size 2 --bf16
       --moe-model-type deepspeed_moe --moe-train-capacity-factor 1.1)
auto=$("$ampipe" simulate --profile "$profile" "${flags[@]}" --ampipe-degree auto)
listed=$("$ampipe" simulate --profile "$profile" "${flags[@]}" --ampipe-degree 1,2,4,8)
python3 - "$auto" "$listed" <<'PY'
import re, sys
auto, listed = sys.argv[1], sys.argv[2]
chosen = re.search(r"^chosen: degree (\d+), (.+) \(([0-9.]+) ms per iteration", auto, re.M)
runner = re.search(r"^runner-up: degree (\d+), (.+) \(([0-9.]+) ms per iteration", auto, re.M)
assert chosen and runner, auto
rows = [float(m.group(1)) for m in re.finditer(r"^ +\d+ +([0-9.]+) ", listed, re.M)]
assert len(rows) == 4, listed
assert float(chosen.group(3)) <= min(rows) + 1e-9, (chosen.group(0), rows)
assert float(runner.group(3)) >= float(chosen.group(3)), (runner.group(0), chosen.group(0))
assert (runner.group(1), runner.group(2)) != (chosen.group(1), chosen.group(2))
assert re.search(r"pipe-experts", chosen.group(2)) and re.search(r"tp-sp", chosen.group(2)), chosen.group(0)
for M in (1, 2, 4, 8, 16):
    assert re.search(rf"^  degree {M} setting: .+ \(the fastest of \d+ weighed\)$", auto, re.M), (M, auto)
print("ok:", chosen.group(0), "|", runner.group(0), "| given flags:", min(rows), "ms")
PY
