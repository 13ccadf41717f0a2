#!/usr/bin/env python3
"""Compares two `ampipe layer-check --export` directories tensor by tensor.

Usage: compare_exports.py DIR_A DIR_B [--rtol 1e-5]

Every file (params, inputs, outputs, grads) must hold the same tensor names with the same shapes, and every
tensor must agree to a relative error max|a-b|/max|b| <= rtol. This is how two ways of splitting the work (EP size,
AMPipe degree, micro-batches per rank) are shown to compute the same layer.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layer_numpy import read_safetensors as load_safetensors  # noqa: E402

FILES = ["params", "inputs", "outputs", "grads"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()
    bad = 0
    for f in FILES:
        ta, _ = load_safetensors(os.path.join(args.a, f + ".safetensors"))
        tb, _ = load_safetensors(os.path.join(args.b, f + ".safetensors"))
        if sorted(ta) != sorted(tb):
            print(f"{f}: tensor names differ: {sorted(ta)} vs {sorted(tb)}")
            bad += 1
            continue
        for name in sorted(ta):
            x, y = ta[name], tb[name]
            if x.shape != y.shape:
                print(f"{f}.{name}: shapes differ {x.shape} vs {y.shape}")
                bad += 1
                continue
            den = max(float(abs(y).max()) if y.size else 0.0, 1e-30)
            err = float(abs(x - y).max()) / den if x.size else 0.0
            ok = err <= args.rtol
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {f}.{name} {list(x.shape)} rel err {err:.2e}")
    print("exports agree" if bad == 0 else f"{bad} tensors differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
