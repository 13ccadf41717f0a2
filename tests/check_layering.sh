#!/usr/bin/env bash
# The layering rule of docs/design.md ("Modules and layering"): a module uses only the modules below it.
#
# The top CMakeLists.txt links each module's static library only against the libraries below it, but that does
# not enforce the rule: static libraries are linked lazily, so an upward #include of a header-only declaration,
# or of a symbol that some later library on the link line happens to provide, still builds. This script checks
# the rule where it is written down: in the #include lines.
#
# Usage:
#   tests/check_layering.sh [SRC_DIR]    check SRC_DIR (default: src/ampipe of this repository)
#   tests/check_layering.sh --self-test  build small trees in a temporary directory, one clean and one with planted
#                                        violations, and check that this script passes the first and reports exactly
#                                        the planted lines for the second (so the check itself can fail)
# CTest: layering.includes (the check) and layering.self_test (tests/CMakeLists.txt).
#
# What is checked, in every SRC_DIR/<module>/*.{h,hpp,cpp,cc} and SRC_DIR/*.cpp (main.cpp):
#   - `#include "ampipe/<other>/..."` (or <...>) where <other> is not <module> and not in ALLOWED[<module>];
#   - an #include of "ampipe/<file>" that names no module;
#   - a module directory that is missing from ALLOWED below (add a new module there, in its place in the order);
#   - <mpi.h> outside comm/ (only the communication engine talks to MPI) and <dnnl.hpp> outside kernels/gemm.*
#     (oneDNN is wrapped once, in kernels/gemm).
# Each violation is one line `path:line: <what>` (paths relative to SRC_DIR's parent's parent, i.e. the repository
# root for the default SRC_DIR), and the exit code is 1. No violation: one summary line, exit code 0.
set -uo pipefail

# ---- The allowed map: for each module, the modules below it that it may include (its own module always). ------
# Order, bottom to top (the DEPS of each ampipe_module() in the top CMakeLists.txt):
#   core                     everything else builds on it
#   kernels, comm            both use core only; they must not use each other (compute knows no MPI, MPI no math)
#   model                    kernels, core (stages know no lanes, no MPI: the schedule decides)
#   schedule                 model, comm, kernels, core
#   sim                      schedule and below (cost model, simulator of a Plan; may not exist yet)
#   train                    sim, schedule, model, comm, kernels, core
#   cli                      everything below
#   main (src/ampipe/*.cpp)  everything (it should need only cli)
declare -A ALLOWED=(
  [core]=""
  [kernels]="core"
  [comm]="core"
  [model]="kernels core"
  [schedule]="model comm kernels core"
  [sim]="schedule model comm kernels core"
  [train]="sim schedule model comm kernels core"
  [cli]="train sim schedule model comm kernels core"
  [main]="cli train sim schedule model comm kernels core"
)

# check SRC_DIR: prints one line per violation; returns 1 if there was any.
check() {
  local src=$1
  if [[ ! -d $src ]]; then
    echo "check_layering.sh: $src is not a directory"
    return 2
  fi
  src=$(cd "$src" && pwd)
  local root
  root=$(cd "$src/../.." && pwd)
  local violations=0 files=0 dir module f rel line num text other
  local -a sources
  for dir in "$src"/*/; do
    module=$(basename "$dir")
    if [[ -z ${ALLOWED[$module]+set} ]]; then
      echo "${dir#"$root"/}: module '$module' is not in the layering map of tests/check_layering.sh (add it in its place in the order)"
      violations=$((violations + 1))
    fi
  done
  shopt -s nullglob
  sources=("$src"/*/*.h "$src"/*/*.hpp "$src"/*/*.cpp "$src"/*/*.cc "$src"/*.cpp "$src"/*.h)
  shopt -u nullglob
  for f in "${sources[@]}"; do
    files=$((files + 1))
    rel=${f#"$root"/}
    if [[ $(dirname "$f") == "$src" ]]; then module=main; else module=$(basename "$(dirname "$f")"); fi
    [[ -z ${ALLOWED[$module]+set} ]] && continue  # reported above
    while IFS= read -r line; do
      num=${line%%:*}
      text=${line#*:}
      if [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"\<]ampipe/([^/\"\>]+)/ ]]; then
        other=${BASH_REMATCH[1]}
        [[ $other == "$module" ]] && continue
        if [[ -z ${ALLOWED[$other]+set} ]]; then
          echo "$rel:$num: includes $other, which is not a module of the layering map (in tests/check_layering.sh)"
          violations=$((violations + 1))
        elif [[ " ${ALLOWED[$module]} " != *" $other "* ]]; then
          echo "$rel:$num: includes $other, which is not below $module ($module may use: ${ALLOWED[$module]:-nothing})"
          violations=$((violations + 1))
        fi
      elif [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"\<]ampipe/[^/\"\>]+[\"\>] ]]; then
        echo "$rel:$num: includes a header of src/ampipe/ itself, which belongs to no module"
        violations=$((violations + 1))
      elif [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"\<]mpi\.h[\"\>] && $module != comm ]]; then
        echo "$rel:$num: includes <mpi.h> outside comm/ (only the communication engine talks to MPI)"
        violations=$((violations + 1))
      elif [[ $text =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"\<]dnnl ]] &&
           [[ $rel != */kernels/gemm.h && $rel != */kernels/gemm.cpp ]]; then
        echo "$rel:$num: includes oneDNN outside kernels/gemm.{h,cpp} (oneDNN is wrapped once, there)"
        violations=$((violations + 1))
      fi
    done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include' "$f")
  done
  if [[ $violations -gt 0 ]]; then
    echo "layering: $violations violation(s) in $files files under ${src#"$root"/}/ (rule: a module uses only those below it; docs/design.md)"
    return 1
  fi
  echo "layering: $files files under ${src#"$root"/}/, no violations"
  return 0
}

# Builds a tiny tree under $1/src/ampipe: one header per module that includes every module it may use.
make_clean_tree() {
  local src=$1/src/ampipe m o
  for m in core kernels comm model schedule train cli; do
    mkdir -p "$src/$m"
    {
      echo "#pragma once"
      for o in ${ALLOWED[$m]}; do [[ $o == sim ]] || echo "#include \"ampipe/$o/$o.h\""; done
      echo "#include <vector>"
    } >"$src/$m/$m.h"
    printf '#include "ampipe/%s/%s.h"\n' "$m" "$m" >"$src/$m/$m.cpp"
  done
  printf '#include "ampipe/cli/cli.h"\nint main() { return 0; }\n' >"$src/main.cpp"
  printf '#pragma once\n#include <mpi.h>\n' >"$src/comm/engine.h"
  printf '#pragma once\n#include <dnnl.hpp>\n' >"$src/kernels/gemm.h"
}

self_test() {
  local here tmp out rc expected
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  make_clean_tree "$tmp/clean"
  out=$(bash "$here/check_layering.sh" "$tmp/clean/src/ampipe")
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "self-test FAILED: the clean tree was rejected (exit $rc):"; echo "$out"; return 1
  fi
  make_clean_tree "$tmp/bad"
  local src=$tmp/bad/src/ampipe
  echo '#include "ampipe/comm/group.h"' >>"$src/kernels/kernels.cpp"         # sideways: kernels must not use comm
  echo '  #  include <ampipe/kernels/gemm.h>' >>"$src/comm/comm.cpp"          # sideways the other way, spaced
  echo '#include "ampipe/schedule/plan.h"' >>"$src/model/model.h"            # upward
  echo '#include "ampipe/train/trainer.h"' >>"$src/core/core.h"              # upward from the bottom
  echo '#include "ampipe/cli/app.h"' >>"$src/schedule/schedule.cpp"          # upward by several
  echo '#include "ampipe/nosuch/x.h"' >>"$src/train/train.h"                 # not a module
  echo '#include "ampipe/loose.h"' >>"$src/cli/cli.cpp"                      # belongs to no module
  echo '#include <mpi.h>' >>"$src/schedule/schedule.h"                       # MPI outside comm
  echo '#include "dnnl.hpp"' >>"$src/kernels/kernels.h"                      # oneDNN outside gemm
  echo '// #include "ampipe/cli/app.h" is fine in a comment' >>"$src/core/core.cpp"
  mkdir -p "$src/newmod" && echo '#pragma once' >"$src/newmod/x.h"           # a module not in the map
  expected=$(cat <<'EOF'
src/ampipe/newmod/: module 'newmod' is not in the layering map of tests/check_layering.sh (add it in its place in the order)
src/ampipe/core/core.h:3: includes train, which is not below core (core may use: nothing)
src/ampipe/kernels/kernels.h:4: includes oneDNN outside kernels/gemm.{h,cpp} (oneDNN is wrapped once, there)
src/ampipe/model/model.h:5: includes schedule, which is not below model (model may use: kernels core)
src/ampipe/schedule/schedule.h:7: includes <mpi.h> outside comm/ (only the communication engine talks to MPI)
src/ampipe/train/train.h:8: includes nosuch, which is not a module of the layering map (in tests/check_layering.sh)
src/ampipe/cli/cli.cpp:2: includes a header of src/ampipe/ itself, which belongs to no module
src/ampipe/comm/comm.cpp:2: includes kernels, which is not below comm (comm may use: core)
src/ampipe/kernels/kernels.cpp:2: includes comm, which is not below kernels (kernels may use: core)
src/ampipe/schedule/schedule.cpp:2: includes cli, which is not below schedule (schedule may use: model comm kernels core)
layering: 10 violation(s) in 18 files under src/ampipe/ (rule: a module uses only those below it; docs/design.md)
EOF
)
  out=$(bash "$here/check_layering.sh" "$src")
  rc=$?
  if [[ $rc -ne 1 ]]; then
    echo "self-test FAILED: the tree with planted violations gave exit $rc, expected 1:"; echo "$out"; return 1
  fi
  if [[ $(sort <<<"$out") != $(sort <<<"$expected") ]]; then
    echo "self-test FAILED: reported lines differ from the planted violations (- expected, + reported):"
    diff <(sort <<<"$expected") <(sort <<<"$out")
    return 1
  fi
  echo "self-test ok: the clean tree passes; all 10 planted violations are reported, one line each, exit 1"
  return 0
}

if [[ ${1:-} == --self-test ]]; then
  self_test
  exit $?
fi
if [[ $# -gt 0 ]]; then
  check "$1"
else
  check "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/src/ampipe"
fi
exit $?
