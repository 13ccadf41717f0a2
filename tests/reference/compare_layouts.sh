#!/usr/bin/env bash
# Exports the same layer computed two ways and compares them tensor by tensor (compare_exports.py):
#   compare_layouts.sh WORK_DIR "<command A>" "<command B>" -- [common layer-check flags]
# Each command runs layer-check with its own flags, e.g. "/path/ampipe layer-check --ampipe-degree 4" or
# "mpirun -np 2 /path/ampipe layer-check --expert-model-parallel-size 2"; the common flags follow.
# Exits 77 (CTest SKIP_RETURN_CODE) when no python3 with numpy is available.
set -euo pipefail
dir=$1 a=$2 b=$3
shift 3
[[ ${1:-} == "--" ]] && shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import numpy' >/dev/null 2>&1; then py=$cand; break; fi
done
if [[ -z $py ]]; then echo "compare_layouts.sh: no python3 with numpy found; skipping"; exit 77; fi
rm -rf "$dir"
# shellcheck disable=SC2086  # the launcher prefixes are word lists on purpose
$a --export "$dir/a" "$@"
# shellcheck disable=SC2086
$b --export "$dir/b" "$@"
"$py" "$here/compare_exports.py" "$dir/a" "$dir/b"
