#!/usr/bin/env bash
# Runs `ampipe layer-check --export DIR <flags>` and checks the export against the float64 numpy reference
# (tests/reference/check_export.py, an implementation of docs/layer.md).
#
# Usage: run_check.sh WORK_DIR AMPIPE [LAUNCHER ARGS... AMPIPE] -- [layer-check flags...]
#   Everything before `--` is the command that runs ampipe (the binary alone, or e.g. `mpirun -np 2 ampipe`);
#   everything after it goes both to `ampipe layer-check` and to check_export.py.
# Exits 77 (CTest SKIP_RETURN_CODE) when no python3 with numpy is available.
set -euo pipefail
dir=$1; shift
launch=()
while [[ $# -gt 0 && $1 != "--" ]]; do launch+=("$1"); shift; done
[[ $# -gt 0 ]] && shift  # the `--`
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import numpy' >/dev/null 2>&1; then py=$cand; break; fi
done
if [[ -z $py ]]; then echo "run_check.sh: no python3 with numpy found; skipping"; exit 77; fi
rm -rf "$dir"
"${launch[@]}" layer-check --export "$dir" "$@"
"$py" "$here/check_export.py" "$dir" "$@"
