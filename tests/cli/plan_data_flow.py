"""`ampipe plan --json`: every compute task carries its stage's reads and writes, and every collective's send buffer
is written by an earlier compute task of the Plan (its receive buffer read by a later one) -- the stage input/output
table and the seams, as printed. Usage: plan_data_flow.py PLAN_JSON"""
import json
import sys

plan = json.load(open(sys.argv[1]))
tasks = plan["tasks"]
compute = [t for t in tasks if t["collective"] is None]
assert compute and all("reads" in t and "writes" in t for t in compute), "a compute task without reads/writes"
by_name = {t["name"]: t for t in tasks}
# a hand-checked stage: the forward out-projection reads the attention output and writes the projection
op = by_name["L0.fwd.out_proj.c0"]
assert op["reads"] == ["attn"] and op["writes"] == ["proj"], op
checked = 0
for t in tasks:
    c = t["collective"]
    if c is None:
        continue
    earlier = [u for u in tasks[: t["id"]] if u["collective"] is None]
    later = [u for u in tasks[t["id"] + 1 :] if u["collective"] is None]
    assert any(c["send"] in u["writes"] for u in earlier), f'{t["name"]} sends {c["send"]}, written by no earlier task'
    assert any(c["recv"] in u["reads"] for u in later), f'{t["name"]} receives {c["recv"]}, read by no later task'
    checked += 1
assert checked > 0
print(f"plan data flow: {len(compute)} compute tasks, {checked} collectives checked")
