#!/usr/bin/python3
"""Plots for bench/ampipe_sweep.sh results (Debian python3 + matplotlib).

  /usr/bin/python3 bench/plot_sweep.py [SWEEP_DIR] [--config reduced] [--images docs/images] [--table]

Writes
  <images>/ampipe_sweep_<config>.png     step time (and speed-up over degree 1) against degree, one line per link rate
  <images>/ampipe_timeline_<config>.png  degree 1 above degree 2 from the Chrome trace at the comm ~ compute rate:
                                         rows = lanes (compute, ep) per rank; red = compute blocked on a wait
and with --table prints a markdown table of every run (step ms per degree, comm alone, compute, hidden, speed-up, RSS).
"""
import argparse
import glob
import json
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load_runs(cfg_dir):
    runs = []
    for p in glob.glob(os.path.join(cfg_dir, "*.json")):
        if os.path.basename(p).startswith("trace"):
            continue
        d = json.load(open(p))
        if "results" not in d:
            continue
        name = os.path.splitext(os.path.basename(p))[0]
        link = d.get("link", {})
        f = link.get("target_comm_over_compute")
        d["_name"] = name
        d["_label"] = "no rate limit (veth)" if name == "unshaped" else f"tbf {link.get('tbf_rate', '?')} (target comm={f}x comp)"
        d["_order"] = -1 if name == "unshaped" else (f if f is not None else 1e9)
        runs.append(d)
    runs.sort(key=lambda d: d["_order"])
    return runs


def table(runs):
    lines = ["| link | degree | step ms (median, min..max) | compute ms | comm alone ms | comm/comp | exposed ms | hidden | speed-up | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for d in runs:
        for r in d["results"]:
            ratio = r["comm_alone_ms"] / r["compute_ms"] if r["compute_ms"] else 0
            lines.append(f"| {d['_label']} | {r['degree']} | {r['step_ms']:.0f} ({r['step_ms_min']:.0f}..{r['step_ms_max']:.0f}) | "
                         f"{r['compute_ms']:.0f} | {r['comm_alone_ms']:.0f} | {ratio:.2f} | {r['exposed_ms']:.0f} | "
                         f"{r['hidden_fraction']:.2f} | {r['speedup']:.2f} | {r['peak_rss_bytes'] / 2**20:.0f} |")
    return "\n".join(lines)


def plot_sweep(runs, cfg, path):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for d in runs:
        degs = [r["degree"] for r in d["results"]]
        step = [r["step_ms"] / 1e3 for r in d["results"]]
        lo = [r["step_ms"] / 1e3 - r["step_ms_min"] / 1e3 for r in d["results"]]
        hi = [r["step_ms_max"] / 1e3 - r["step_ms"] / 1e3 for r in d["results"]]
        line = a1.errorbar(degs, step, yerr=[lo, hi], marker="o", capsize=3, label=d["_label"])
        a2.plot(degs, [r["speedup"] for r in d["results"]], marker="o", color=line[0].get_color())
    c = runs[0]["config"] if runs else {}
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xticks([1, 2, 4, 8])
        a.set_xticklabels(["1", "2", "4", "8"])
        a.set_xlabel("--ampipe-degree M")
        a.grid(alpha=0.3)
    a1.set_ylabel("step time s (median; bars min..max)")
    a1.set_ylim(bottom=0)
    a2.set_ylabel("speed-up over degree 1")
    a2.axhline(1.0, color="k", lw=0.8)
    a1.legend(fontsize=7)
    fig.suptitle(f"ampipe bench-layer, 2 ranks ep=2 in 2 netns over veth+tbf ({cfg}: s={c.get('seq_length')} "
                 f"h={c.get('hidden_size')} F={c.get('ffn_hidden_size')} E={c.get('num_experts')} "
                 f"top-{c.get('moe_router_topk')} bf16)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# Compute-lane colours: (legend label, colour, substrings of the task name), first match wins. Stage names as
# since Plan v2 (src/ampipe/model/stage.h) and as in the traces recorded before it (bench/results/): there the
# residual_ln2 stage had an older name (the second key below) and the weighted sum was "combine". On the compute
# lane "combine" is therefore always the weighted sum: since Plan v2 combine is the all-to-all, which runs on the
# ep lane (coloured by chunk, not by this table). Waits are coloured by category.
STAGE_COLORS = [("wait", "#d62728", ()), ("attention", "#1f77b4", ("attention",)), ("ln1_qkv", "#17becf", ("qkv",)),
                ("out_proj", "#9467bd", ("proj",)), ("residual_ln2", "#c5b0d5", ("residual_ln2", "bdal")),
                ("experts", "#2ca02c", ("expert",)), ("gate", "#bcbd22", ("gate",)),
                ("weighted_sum", "#8c564b", ("weighted_sum", "combine")), ("dispatch", "#e377c2", ("dispatch",))]


def color_for(ev):
    if ev.get("cat") == "wait":
        return "#d62728"
    n = ev["name"].lower()
    for _, col, keys in STAGE_COLORS[1:]:
        if any(k in n for k in keys):
            return col
    return "#aaaaaa"


def plot_timeline(trace_path, path, degrees=(1, 2)):
    evs = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    steps = {}
    for e in evs:
        m = re.match(r"bench\.step degree=(\d+)", e["name"])
        if m and e.get("cat") == "step":
            steps.setdefault(int(m.group(1)), {})[e["pid"]] = (e["ts"], e["ts"] + e["dur"])
    degrees = [m for m in degrees if m in steps]
    if not degrees:
        raise SystemExit(f"{trace_path}: no 'bench.step degree=M' records (trace from an older ampipe?)")
    span = max(max(t1 - t0 for t0, t1 in steps[m].values()) for m in degrees) / 1e6
    ranks = sorted({e["pid"] for e in evs})
    fig, axes = plt.subplots(len(degrees), 1, figsize=(12, 1.2 + 1.5 * len(degrees) * len(ranks) / 2), sharex=True)
    if len(degrees) == 1:
        axes = [axes]
    for ax, m in zip(axes, degrees):
        rows, labels = [], []
        for rk in ranks:
            for lane, lname in ((0, "compute"), (1, "ep a2a")):
                rows.append((rk, lane))
                labels.append(f"rank {rk} {lname}")
        t_ref = min(t0 for t0, _ in steps[m].values())
        t_lo, t_hi = t_ref, max(t1 for _, t1 in steps[m].values())
        exposed = {rk: 0.0 for rk in ranks}
        for e in evs:
            if e.get("cat") == "step" or e["ts"] + e["dur"] < t_lo or e["ts"] > t_hi:
                continue
            key = (e["pid"], e["tid"])
            if key not in rows:
                continue
            y = len(rows) - 1 - rows.index(key)
            x0, w = (e["ts"] - t_ref) / 1e6, e["dur"] / 1e6
            if e["tid"] == 0:
                ax.broken_barh([(x0, w)], (y - 0.4, 0.8), facecolors=color_for(e), edgecolor="none")
                if e.get("cat") == "wait":
                    exposed[e["pid"]] += w
            else:
                ch = e.get("args", {}).get("chunk", 0)
                col = plt.cm.Oranges(0.45 + 0.5 * ((ch % 8) / 8))
                ax.broken_barh([(x0, w)], (y - 0.4, 0.8), facecolors=col, edgecolor="k", linewidth=0.3)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(list(reversed(labels)), fontsize=8)
        dur = (t_hi - t_lo) / 1e6
        ax.set_title(f"degree {m}: step {dur:.2f} s; exposed wait (red) "
                     + ", ".join(f"rank {rk} {exposed[rk]:.2f} s" for rk in ranks), fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlim(0, span * 1.01)
    axes[-1].set_xlabel("seconds since the step's start (forward then backward)")
    handles = [matplotlib.patches.Patch(color=c, label=k) for k, c, _ in STAGE_COLORS] + \
              [matplotlib.patches.Patch(color=plt.cm.Oranges(0.7), label="ep all-to-all (shade = chunk)")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dir", nargs="?", default=os.path.join(here, "results", "sweep"))
    ap.add_argument("--config", action="append", help="configuration subdirectories (default: all)")
    ap.add_argument("--images", default=os.path.join(os.path.dirname(here), "docs", "images"))
    ap.add_argument("--table", action="store_true", help="print markdown tables")
    a = ap.parse_args()
    os.makedirs(a.images, exist_ok=True)
    cfgs = a.config or sorted(d for d in os.listdir(a.sweep_dir) if os.path.isdir(os.path.join(a.sweep_dir, d)))
    for cfg in cfgs:
        cdir = os.path.join(a.sweep_dir, cfg)
        runs = load_runs(cdir)
        if not runs:
            continue
        out = os.path.join(a.images, f"ampipe_sweep_{cfg}.png")
        plot_sweep(runs, cfg, out)
        print("wrote", out)
        tr = os.path.join(cdir, "trace_rate_1x.json")
        if os.path.exists(tr):
            out = os.path.join(a.images, f"ampipe_timeline_{cfg}.png")
            plot_timeline(tr, out)
            print("wrote", out)
        if a.table:
            print(f"\n### {cfg}\n\n{table(runs)}\n")


if __name__ == "__main__":
    main()
