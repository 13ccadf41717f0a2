#!/usr/bin/env bash
# Usage: expect_error.sh REGEX COMMAND...
# Passes when COMMAND exits with code 2 and prints exactly one line on stderr that matches REGEX (bad user input
# gets one clear line naming the flag or file, the value and the rule; docs/design.md, "Errors").
set -u
regex=$1
shift
err=$(mktemp)
"$@" >/dev/null 2>"$err"
rc=$?
lines=$(grep -c . "$err")
if [ "$rc" -ne 2 ]; then
  echo "expected exit code 2, got $rc; stderr:"; cat "$err"; rm -f "$err"; exit 1
fi
if [ "$lines" -ne 1 ]; then
  echo "expected one line on stderr, got $lines:"; cat "$err"; rm -f "$err"; exit 1
fi
if ! grep -Eq -- "$regex" "$err"; then
  echo "stderr does not match /$regex/:"; cat "$err"; rm -f "$err"; exit 1
fi
echo "ok: $(cat "$err")"
rm -f "$err"
