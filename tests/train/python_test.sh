#!/usr/bin/env bash
# Usage: python_test.sh SCRIPT ARGS...: runs a Python test with python3, or exits 77 (CTest's skip) without one.
command -v python3 >/dev/null 2>&1 || { echo "no python3: skipped"; exit 77; }
exec python3 "$@"
