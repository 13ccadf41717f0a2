"""CTest checks of `ampipe train --tensorboard-dir` and the expert-load statistics (docs/training.md).

Usage: check_tensorboard.py CASE WORKDIR AMPIPE [MPIRUN ARGS...]
  events   one rank: the event file's name, both CRCs of every record, file_version first, and the scalars at their
           steps equal to the log lines; the expert loads add up (kept + dropped = tokens x top-k per layer), their
           max/mean is the max over the mean, and the log's token drops (an independent count) equals them.
  drops    a configuration whose drops are known exactly (2 experts, top-2, capacity factor 0.5: every expert gets
           one choice of every token and keeps half of them): dropped 50% in every layer, balanced load.
  layouts  (with MPIRUN) the expert loads of iteration 1 are the same on one rank, on tp 2 (the tp ranks route the
           same tokens: counted once), on tp 2 with sequence parallelism (each routes its rows: summed) and on ep 2.
Reads the files with tfevents.py, an independent reader.
"""
import glob
import math
import os
import re
import shutil
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tfevents  # noqa: E402

SMALL = ["--num-experts", "4", "--moe-model-type", "deepspeed_moe", "--num-layers", "2", "--hidden-size", "32", "--ffn-hidden-size", "64", "--num-attention-heads", "2",
         "--seq-length", "32", "--micro-batch-size", "2", "--lr-warmup-iters", "1"]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def close(a, b, rel, abs_tol=0.0):
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), abs_tol)


def run(cmd, tbdir):
    if os.path.exists(tbdir):
        shutil.rmtree(tbdir)
    p = subprocess.run(cmd + ["--tensorboard-dir", tbdir], capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(f"exit code {p.returncode}: {' '.join(cmd)}")
    files = glob.glob(os.path.join(tbdir, "events.out.tfevents.*"))
    check(len(files) == 1, f"one event file in {tbdir}, found {files}")
    return p.stdout, files[0]


def log_points(out):
    """{iteration: {field: value}} of the log lines, and {iteration: [per-layer dicts]}."""
    logs, layers, last = {}, {}, None
    for line in out.splitlines():
        m = re.search(r"\biteration\s+(\d+)/\s*\d+ \|", line)
        if m:
            last = int(m.group(1))
            d = {}
            for key, pat in [("tokens/s", r"tokens/s: ([0-9.]+)"), ("lr", r"learning rate: ([0-9.E+-]+)"),
                             ("lm loss", r"lm loss: ([0-9.E+-]+)"), ("aux loss", r"aux loss: ([0-9.E+-]+)"),
                             ("drops", r"token drops: ([0-9.]+)%"), ("grad-norm", r"grad norm: ([0-9.]+)"),
                             ("worst", r"expert load max/mean: ([0-9.]+) \(layer (\d+)\) \| most dropped: ([0-9.]+)% \(layer (\d+)\)")]:
                mm = re.search(pat, line)
                check(mm is not None, f"log line has {key}: {line}")
                if mm:
                    d[key] = tuple(float(x) for x in mm.groups()) if key == "worst" else float(mm.group(1))
            logs[last] = d
            layers[last] = []
        m = re.match(r"\s*moe layer (\d+): max/mean load: ([0-9.]+) \| dropped: ([0-9.]+)% of (\d+) choices \| "
                     r"tokens per expert: ([0-9 ]+) \|", line)
        if m:
            layers[last].append({"imbalance": float(m.group(2)), "dropped": float(m.group(3)),
                                 "choices": int(m.group(4)), "tokens": [int(x) for x in m.group(5).split()]})
    return logs, layers


# Megatron's log line keys, in its order (megatron/training/training.py, training_log), as a log parser reads them.
MEGATRON_KEYS = ["consumed samples", "elapsed time per iteration (ms)", "throughput per GPU (TFLOP/s/GPU)",
                 "learning rate", "global batch size", "lm loss", "loss scale", "grad norm",
                 "number of skipped iterations", "number of nan iterations"]


def check_megatron_log_line(out, G):
    lines = [l for l in out.splitlines() if re.search(r"\biteration\s+\d+/\s*\d+ \|", l)]
    check(len(lines) > 0, "no log line")
    for line in lines:
        check(re.match(r"^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration\s+\d+/\s*\d+ \|", line) is not None,
              f"Megatron's timestamp and iteration first: {line}")
        fields = {}
        for part in line.split("|")[1:]:
            if ":" in part:
                k, v = part.rsplit(":", 1)
                fields[k.strip()] = v.strip()
        keys = [k for k in fields if k in MEGATRON_KEYS]
        check(keys == MEGATRON_KEYS, f"Megatron's keys in its order: {keys}")
        pos = [list(fields).index(k) for k in MEGATRON_KEYS if k in fields]
        check(pos == list(range(len(pos))), f"Megatron's keys before this engine's: {list(fields)}")
        it = int(re.search(r"iteration\s+(\d+)/", line).group(1))
        check(int(fields.get("consumed samples", -1)) == it * G, f"consumed samples at {it}: {fields.get('consumed samples')}")
        check(int(fields.get("global batch size", -1)) == G, f"global batch size {fields.get('global batch size')}")
        check(float(fields.get("loss scale", -1)) == 1.0, "loss scale 1.0")
        check(fields.get("number of skipped iterations") == "0" and fields.get("number of nan iterations") == "0",
              "no skipped or NaN iteration")


def validations(out):
    return {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"validation loss at iteration (\d+) \| lm loss value: ([0-9.E+-]+)", out)}


def moe_of(sc, step, layers, experts):
    got = []
    for i in range(layers):
        def at(tag):
            vals = [v for s, v in sc.get(tag, []) if s == step]
            check(len(vals) == 1, f"one {tag} at step {step}, got {vals}")
            return vals[0] if vals else float("nan")
        got.append({"imbalance": at(f"moe/layer{i}/load_imbalance"), "dropped": at(f"moe/layer{i}/dropped_fraction"),
                    "tokens": [at(f"moe/layer{i}/expert{e}_tokens") for e in range(experts)]})
    return got


def check_loads(got, choices, what):
    for i, l in enumerate(got):
        kept = sum(l["tokens"])
        dropped = round(l["dropped"] * choices)
        check(kept + dropped == choices, f"{what} layer {i}: kept {kept} + dropped {dropped} != {choices} choices")
        mean = kept / len(l["tokens"])
        check(close(l["imbalance"], max(l["tokens"]) / mean, 1e-6),
              f"{what} layer {i}: max/mean {l['imbalance']} vs {max(l['tokens']) / mean}")


def case_events(work, ampipe):
    iters, interval, G, s, k, E, L = 6, 2, 8, 32, 2, 4, 2
    cmd = [ampipe, "train"] + SMALL + ["--global-batch-size", str(G), "--train-iters", str(iters), "--log-interval",
                                        str(interval), "--eval-interval", "3", "--eval-iters", "1",
                                        "--moe-train-capacity-factor", "1.0", "--moe-per-layer-logging"]
    out, path = run(cmd, os.path.join(work, "tb"))
    name = os.path.basename(path)
    check(re.fullmatch(r"events\.out\.tfevents\.\d+\." + re.escape(socket.gethostname()), name) is not None,
          f"file name {name}")
    evs = tfevents.events(path)  # raises on a bad CRC
    check(evs[0]["file_version"] == "brain.Event:2", f"first record's file_version {evs[0]['file_version']}")
    check(all(e["file_version"] is None for e in evs[1:]), "file_version only in the first record")
    check(all(e["wall_time"] and e["wall_time"] > 1.5e9 for e in evs), "wall times are unix seconds")
    sc = tfevents.scalars(path)
    logs, per_layer = log_points(out)
    check(sorted(logs) == [2, 4, 6], f"log points {sorted(logs)}")
    # Megatron's tags (training_log), each also against the consumed samples, then this engine's
    megatron = ["lm loss", "learning-rate", "batch-size", "loss-scale", "grad-norm"]
    for tag in megatron + ["aux loss", "tokens/s", "throughput", "iteration-time", "exposed communication ms",
                           "moe/dropped_fraction"]:
        check([s for s, _ in sc.get(tag, [])] == [2, 4, 6], f"{tag} at steps 2, 4, 6: {sc.get(tag)}")
    for tag in megatron:
        check([s for s, _ in sc.get(tag + " vs samples", [])] == [2 * G, 4 * G, 6 * G],
              f"{tag} vs samples at {2 * G}, {4 * G}, {6 * G}: {sc.get(tag + ' vs samples')}")
        check(dict(sc.get(tag + " vs samples", [])).get(2 * G) == dict(sc.get(tag, [])).get(2),
              f"{tag} vs samples holds the value of {tag}")
    check(all(v == G for _, v in sc.get("batch-size", [])), f"batch-size {sc.get('batch-size')} is {G}")
    check(all(v == 1.0 for _, v in sc.get("loss-scale", [])), "loss-scale 1 (bf16/fp32: no loss scaling)")
    check_megatron_log_line(out, G)
    for step, d in logs.items():
        v = {tag: dict(sc.get(tag, [])).get(step, float("nan")) for tag in sc}
        check(close(v["lm loss"], d["lm loss"], 2e-6), f"lm loss {v['lm loss']} vs log {d['lm loss']}")
        check(close(v["aux loss"], d["aux loss"], 2e-4), f"aux loss {v['aux loss']} vs log {d['aux loss']}")
        check(close(v["learning-rate"], d["lr"], 2e-6), f"learning-rate {v['learning-rate']} vs log {d['lr']}")
        check(close(v["grad-norm"], d["grad-norm"], 0, 6e-5), f"grad-norm {v['grad-norm']} vs log {d['grad-norm']}")
        check(close(v["tokens/s"], d["tokens/s"], 1e-6, 0.51), f"tokens/s {v['tokens/s']} vs log {d['tokens/s']}")
        check(v["throughput"] > 0 and v["exposed communication ms"] >= 0, "throughput > 0, exposed ms >= 0")
        got = moe_of(sc, step, L, E)
        check_loads(got, interval * G * s * k, f"step {step}")
        layers = per_layer[step]
        check(len(layers) == L, f"{L} per-layer lines at {step}")
        for i, l in enumerate(layers):
            check(l["choices"] == interval * G * s * k, f"layer {i} choices {l['choices']}")
            check([float(t) for t in l["tokens"]] == got[i]["tokens"], f"layer {i} log tokens {l['tokens']} vs "
                  f"events {got[i]['tokens']}")
            check(close(l["dropped"], 100 * got[i]["dropped"], 0, 0.006), f"layer {i} dropped {l['dropped']}%")
        # The log's token drops (slots -1 over all choices, counted per iteration and all-reduced separately) is
        # the drop share over every layer: here the mean over layers (equal choices per layer and iteration).
        mean_drop = sum(g["dropped"] for g in got) / L
        check(close(d["drops"], 100 * mean_drop, 0, 0.006), f"token drops {d['drops']}% vs {100 * mean_drop}%")
        check(close(v["moe/dropped_fraction"], mean_drop, 1e-5, 1e-7), "moe/dropped_fraction")
        worst = max(range(L), key=lambda i: got[i]["imbalance"])
        check(int(d["worst"][1]) == worst and close(d["worst"][0], got[worst]["imbalance"], 0, 6e-4),
              f"worst layer {d['worst']} vs {worst}")
        most = max(range(L), key=lambda i: got[i]["dropped"])
        check(close(d["worst"][2], 100 * got[most]["dropped"], 0, 0.006) and
              got[int(d["worst"][3])]["dropped"] == got[most]["dropped"], f"most dropped {d['worst']} vs {most}")
    check(any(g > 0 for step in logs for g in [x["dropped"] for x in moe_of(sc, step, L, E)]),
          "capacity factor 1.0 drops some choices (else the drop checks are vacuous)")
    vals = validations(out)
    check(sorted(vals) == [3, 6], f"validations at {sorted(vals)}")
    for step, loss in vals.items():
        got = dict(sc.get("lm loss validation", [])).get(step)
        check(got is not None and close(got, loss, 2e-6), f"lm loss validation at {step}: {got} vs {loss}")
        ppl = dict(sc.get("lm loss validation ppl", [])).get(step)
        check(ppl is not None and close(ppl, math.exp(loss), 1e-5), f"ppl at {step}")


def case_drops(work, ampipe):
    G, s = 4, 32
    cmd = [ampipe, "train"] + SMALL + ["--global-batch-size", str(G), "--train-iters", "2", "--log-interval", "1",
                                        "--eval-interval", "0", "--num-experts", "2", "--moe-router-topk", "2",
                                        "--moe-train-capacity-factor", "0.5", "--moe-min-capacity", "1",
                                        "--ampipe-degree", "2", "--use-flash-attn", "--moe-per-layer-logging"]
    out, path = run(cmd, os.path.join(work, "tb_drops"))
    sc = tfevents.scalars(path)
    logs, per_layer = log_points(out)
    for step in (1, 2):
        for i, l in enumerate(moe_of(sc, step, 2, 2)):
            check(l["dropped"] == 0.5, f"step {step} layer {i}: dropped {l['dropped']}, expected exactly 0.5")
            check(l["tokens"] == [G * s / 2] * 2, f"step {step} layer {i}: tokens {l['tokens']}, expected {G * s / 2}")
            check(l["imbalance"] == 1.0, f"step {step} layer {i}: max/mean {l['imbalance']}")
        check(logs[step]["drops"] == 50.0 and logs[step]["worst"][2] == 50.0, f"log at {step}: {logs[step]}")
        check(all(l["dropped"] == 50.0 for l in per_layer[step]), f"per-layer lines at {step}")


def case_layouts(work, ampipe, mpirun):
    G, s, k = 4, 32, 2
    base = ["train"] + SMALL + ["--global-batch-size", str(G), "--train-iters", "2", "--log-interval", "1",
                                "--eval-interval", "0", "--moe-train-capacity-factor", "4"]
    runs = {"one rank": [ampipe] + base,
            "tp 2": mpirun + ["-np", "2", ampipe] + base + ["--tensor-model-parallel-size", "2"],
            "tp 2 sp": mpirun + ["-np", "2", ampipe] + base + ["--tensor-model-parallel-size", "2",
                                                               "--sequence-parallel", "--ampipe-degree", "2",
                                                               "--use-flash-attn"],
            "ep 2": mpirun + ["-np", "2", ampipe] + base + ["--expert-model-parallel-size", "2"]}
    first = {}
    for name, cmd in runs.items():
        _, path = run(cmd, os.path.join(work, "tb_" + name.replace(" ", "_")))
        sc = tfevents.scalars(path)
        for step in (1, 2):
            got = moe_of(sc, step, 2, 4)
            check_loads(got, G * s * k, f"{name} step {step}")
            check(all(l["dropped"] == 0 for l in got), f"{name}: capacity factor 4 drops nothing")
        first[name] = [l["tokens"] for l in moe_of(sc, 1, 2, 4)]
    for name, t in first.items():
        check(t == first["one rank"], f"{name}: iteration 1 expert loads {t} vs one rank {first['one rank']}")


def main():
    case, work, ampipe = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    if case == "events":
        case_events(work, ampipe)
    elif case == "drops":
        case_drops(work, ampipe)
    elif case == "layouts":
        case_layouts(work, ampipe, sys.argv[4:])
    else:
        sys.exit(f"unknown case {case}")
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print(f"ok: {case}")


if __name__ == "__main__":
    main()
