#!/usr/bin/env bash
# Usage: bad_file.sh AMPIPE CASE REGEX
# Writes the bad file CASE names into a temporary directory, runs the command that reads it, and checks (as
# tests/cli/expect_error.sh) exit code 2 and one stderr line matching REGEX, within the CTest timeout, and that the
# run changed no file of that directory.
set -u
ampipe=$1 case=$2 regex=$3
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
here=$(dirname "$0")
deep() { python3 -c "import sys; n=100000; sys.stdout.write('{\"$1\": ' + '['*n + ']'*n + '}')"; }
case $case in
  token_file_memory)  # issue 27, item 4: a 64 MiB llm.c token file (sparse: no disk) under --memory-limit 128M and
                     # a 1 GB address-space limit: refused from its size before a byte is read, never std::bad_alloc
                     { printf '\x88\xd8\x34\x01\x01\x00\x00\x00\x00\xfe\xff\x01'; head -c 1012 /dev/zero; } > "$d/tok.bin"
                     truncate -s 67108864 "$d/tok.bin"; ulimit -v 1000000
                     cmd=(train --num-experts 4 --data-path "$d/tok.bin" --memory-limit 128M) ;;
  config_nul)        printf '{"hidden_size": 32}\0{"bogus_key": 1} {"lr": 5}' > "$d/c.json"
                     cmd=(train --num-experts 4 --config "$d/c.json") ;;
  config_trailing)   printf '{"hidden_size": 32} {"lr": 5}' > "$d/c.json"
                     cmd=(train --num-experts 4 --config "$d/c.json") ;;
  config_deep)       deep hidden_size > "$d/c.json"; cmd=(train --num-experts 4 --config "$d/c.json") ;;
  config_deep_simulate) deep hidden_size > "$d/c.json"
                     cmd=(simulate --num-experts 4 --profile "$here/../cli/sim_profile.json" --config "$d/c.json") ;;
  profile_deep)      deep devices_per_node > "$d/p.json"; cmd=(simulate --num-experts 4 --profile "$d/p.json") ;;
  config_lr_empty)   echo '{"lr": []}' > "$d/c.json"; cmd=(train --num-experts 4 --config "$d/c.json") ;;
  config_lr_list)    echo '{"lr": [0.1, 0.2]}' > "$d/c.json"; cmd=(train --num-experts 4 --config "$d/c.json") ;;
  config_nested_list) echo '{"data_path": [["a"]]}' > "$d/c.json"; cmd=(train --num-experts 4 --config "$d/c.json") ;;
  config_key_config) echo '{"config": "other.json"}' > "$d/c.json"; cmd=(train --num-experts 4 --config "$d/c.json") ;;
  preprocess_own_input)  # the text mode writes PREFIX.bin: the input itself
                     cp "$here/../../docs/design.md" "$d/x.bin"
                     cmd=(preprocess --input "$d/x.bin" --output-prefix "$d/x" --vocab-size 300) ;;
  preprocess_own_input_json)  # the JSON mode writes PREFIX_text_document.bin / .idx
                     echo '{"text": "a b c"}' > "$d/x_text_document.idx"
                     cmd=(preprocess --input "$d/x_text_document.idx" --json-keys text --output-prefix "$d/x") ;;
  split_empty)       cmd=(train --num-experts 4 --split "") ;;  # (CTest drops an empty argument: given here)
  trace_fifo)        mkfifo "$d/t.json"  # no process reads it: opening it for writing would block rank 0 for good
                     cmd=(train --num-experts 4 --train-iters 2 --trace "$d/t.json" --trace-iteration 1) ;;
  *) echo "unknown case $case"; exit 1 ;;
esac
before=$(cd "$d" && find . -type f | sort | xargs -r sha256sum)
"$here/../cli/expect_error.sh" "$regex" timeout 50 "$ampipe" "${cmd[@]}" || exit 1
after=$(cd "$d" && find . -type f | sort | xargs -r sha256sum)
[ "$before" = "$after" ] || { echo "files changed:"; diff <(echo "$before") <(echo "$after"); exit 1; }
