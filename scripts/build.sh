#!/usr/bin/env bash
# Installs the Debian packages (scripts/setup.sh) and builds everything into build/ (Release, Ninja).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build
