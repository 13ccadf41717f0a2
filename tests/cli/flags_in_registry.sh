#!/usr/bin/env bash
# Usage: flags_in_registry.sh SRC_CLI_DIR | --self-test
# Every flag of the ampipe binary is declared once, in src/ampipe/cli/flag_registry.cpp (docs/design.md, section 3,
# "cli/"): prints one line per CLI11 option made or changed anywhere else in SRC_CLI_DIR (file:line: the code) and
# fails. --self-test plants such a declaration in a copy of a small tree and checks that it is found.
set -u
# CLI11's calls that make, drop or re-describe an option (a method call: `.add_option(`, `->description(`, ...)
pattern='(\.|->)(add_option|add_option_function|add_flag|add_flag_function|add_flag_callback|remove_option|description|set_config)[[:space:]]*[<(]'
check() {
  local dir=$1 found=0
  while IFS= read -r hit; do
    echo "$hit: a flag declared outside flag_registry.cpp (add it to the registry)"
    found=1
  done < <(grep -nE "$pattern" "$dir"/*.cpp "$dir"/*.h 2>/dev/null | grep -v '^[^:]*/flag_registry\.\(cpp\|h\):')
  return $found
}
if [ "${1:-}" = "--self-test" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  printf 'void f(CLI::App& app) { app.add_option("--x", x, "x"); }\n' > "$tmp/flag_registry.cpp"
  printf 'int y;\n' > "$tmp/plan.cpp"
  check "$tmp" >/dev/null || { echo "self-test: the registry itself was reported"; exit 1; }
  printf 'void g(CLI::App& app) { app.add_flag("--y", y, "y"); }\n' >> "$tmp/plan.cpp"
  out=$(check "$tmp") && { echo "self-test: a flag in plan.cpp was not reported"; exit 1; }
  echo "$out" | grep -q 'plan.cpp:2:' || { echo "self-test: wrong report: $out"; exit 1; }
  echo "ok: self-test"
  exit 0
fi
check "$1" || exit 1
echo "ok: every flag is declared in flag_registry.cpp"
