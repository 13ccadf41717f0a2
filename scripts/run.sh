#!/usr/bin/env bash
# Sets everything up, builds, and runs the main job on its embedded default configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec ./build/ampipe layer-check "$@"
