#!/usr/bin/env bash
# Sets everything up, builds, and runs every test (unit tests and the multi-rank tests under mpirun).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 900 "$@"
