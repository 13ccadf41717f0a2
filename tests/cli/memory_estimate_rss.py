#!/usr/bin/env python3
"""The start-up memory estimate of `ampipe train` against the peak resident set of the same run.

Usage: memory_estimate_rss.py AMPIPE

The banner line `memory: estimated peak TOTAL (process now (code, MPI, data) NOW, parameters ..., ...)` gives the
estimate; NOW is the resident set measured when the estimate was made (code, libraries, MPI, the corpus), the rest
is modelled from the shapes. The run's peak resident set (getrusage of the child) minus NOW must be within 0.5x and
2x of the modelled part. They can differ because: pages the allocator reserves but the run never touches are not
resident (fewer bytes), oneDNN's primitive caches and scratchpads, thread stacks, the allocator's own slack and
the trace / log strings are not modelled (more bytes), and the RSS is counted in pages. The configuration is
chosen so the modelled part is several times NOW, so the bound tests the model, not the measurement.
"""
import re
import resource
import subprocess
import sys

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse(text):
    number, unit = text.split()
    return float(number) * UNITS[unit]


def main():
    ampipe = sys.argv[1]
    cmd = [ampipe, "train", "--num-experts", "4", "--num-layers", "2", "--seq-length", "128", "--micro-batch-size", "4",
           "--hidden-size", "256", "--ffn-hidden-size", "1024", "--num-attention-heads", "4", "--num-experts", "8",
           "--train-iters", "3", "--lr-warmup-iters", "0", "--eval-interval", "0", "--log-interval", "1"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
    if run.returncode != 0:
        print(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
        return 1
    line = next((l for l in run.stdout.splitlines() if "memory: estimated peak" in l), None)
    if line is None:
        print(f"no memory line in the banner:\n{run.stdout}")
        return 1
    m = re.search(r"estimated peak ([\d.]+ \w+) \((.*)\) per rank", line)
    total = parse(m.group(1))
    now = parse(re.search(r"process now \([^)]*\) ([\d.]+ \w+)", m.group(2)).group(1))
    modelled, grown = total - now, peak - now
    ratio = grown / modelled
    print(line.strip())
    print(f"estimate {total / 2**20:.1f} MiB = in use at the check {now / 2**20:.1f} MiB + modelled "
          f"{modelled / 2**20:.1f} MiB; measured peak RSS {peak / 2**20:.1f} MiB, grown {grown / 2**20:.1f} MiB; "
          f"grown / modelled = {ratio:.2f}; peak / estimate = {peak / total:.2f}")
    if modelled < 2 * now:
        print("the modelled part must dominate the measured start (pick a larger configuration)")
        return 1
    if not 0.5 <= ratio <= 2.0:
        print("grown / modelled is outside [0.5, 2]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
