#!/usr/bin/env bash
# Usage: vocab_size.sh AMPIPE CASE [MPIRUN...]
# Megatron's vocabulary flags through `ampipe train` (docs/training.md, "Vocabulary"; train/vocab_size.h). The shapes
# are read from the checkpoint's model.safetensors header (python3, no packages). Each case prints what it checked.
#   padding     --make-vocab-size-divisible-by 100 pads the bundled corpus's 256 bytes to 300 (Megatron's log line,
#               V=300, a [300, h] token embedding); --padded-vocab-size 384 with an untied head: [384, h] embedding
#               and output layer, and no padding line (Megatron logs only a padding it computes)
#   tp2         (MPIRUN: mpirun ... -np 2) tp 2 with the default divisor: --vocab-size 300 -> a multiple of 128 x 2
#               = 512, trains and saves [512, h]; a resume at tp 1 (which pads 300 to 384) is refused with one
#               line, --use-checkpoint-args takes the checkpoint's 512 and resumes
#   token_file  an llm.c token file with ids up to 499: V=512 by default; --vocab-size 400 is refused naming the
#               file and the id; --vocab-size 600 gives 640
#   tokenizer   GPT2BPETokenizer (a 259-id vocab.json): --vocab-size 200 refused naming the tokenizer; 1000 has no
#               effect (a note) and V stays 259 padded to 384
set -u
bin=$1
case_=$2
shift 2
mpirun=("$@")
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
[ -x "$py" ] || { echo "no python3: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
small=(--num-experts 4 --num-layers 1 --hidden-size 64 --seq-length 64 --train-iters 2 --log-interval 1
       --eval-interval 0)
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$dir/out"; exit 1; }
run() { "$@" >"$dir/out" 2>&1 || fail "failed: $*"; }
expect() { grep -Eq -- "$1" "$dir/out" || fail "output does not match /$1/"; echo "ok: /$1/"; }
expect_text() { grep -Fq -- "$1" "$dir/out" || fail "output does not contain \"$1\""; echo "ok: \"$1\""; }
no_text() { if grep -Fq -- "$1" "$dir/out"; then fail "output contains \"$1\""; fi; echo "ok: no \"$1\""; }
# The shape of tensor $2 in the model.safetensors of checkpoint directory $1's iteration $3, as "[rows, cols]".
shape() {
  "$py" - "$1/iter_$(printf %07d "$3")/model.safetensors" "$2" <<'EOF'
import json, struct, sys
f = open(sys.argv[1], 'rb')
n = struct.unpack('<Q', f.read(8))[0]
print(json.loads(f.read(n))[sys.argv[2]]['shape'])
EOF
}
expect_shape() {
  got=$(shape "$1" "$2" "$3")
  [ "$got" = "$4" ] || fail "$2 of $1 is $got, expected $4"
  echo "ok: $2 $got"
}
refused() {  # REGEX COMMAND...: exit code 2 and one line (expect_error.sh)
  bash "$here/expect_error.sh" "$@" || fail "not refused as expected: ${*:2}"
}

case $case_ in
  padding)
    run "$bin" train "${small[@]}" --make-vocab-size-divisible-by 100 --save "$dir/a"
    expect_text " > padded vocab (size: 256) with 44 dummy tokens (new size: 300)"
    expect " V=300 "
    expect_shape "$dir/a" embedding.word_embeddings.weight 2 "[300, 64]"
    run "$bin" train "${small[@]}" --padded-vocab-size 384 --untie-embeddings-and-output-weights --save "$dir/b"
    expect " V=384 "
    no_text "padded vocab"
    expect_shape "$dir/b" embedding.word_embeddings.weight 2 "[384, 64]"
    expect_shape "$dir/b" output_layer.weight 2 "[384, 64]"
    ;;
  tp2)
    run "${mpirun[@]}" "$bin" train "${small[@]}" --tensor-model-parallel-size 2 --vocab-size 300 --save "$dir/ck"
    expect_text " > padded vocab (size: 300) with 212 dummy tokens (new size: 512)"
    expect " V=512 .* tp=2 "
    expect "iteration +2/ +2 .*lm loss: [0-9]"
    expect_shape "$dir/ck" embedding.word_embeddings.weight 2 "[512, 64]"
    refused "^ampipe: error: --load $dir/ck \(iteration 2\): the checkpoint's model has a vocabulary of 512 rows \(--padded-vocab-size\), this run's has 384 \(the vocabulary 300 padded to a multiple of --make-vocab-size-divisible-by 128 x --tensor-model-parallel-size 1\): pass --padded-vocab-size 512, or --use-checkpoint-args" \
      "$bin" train "${small[@]}" --vocab-size 300 --train-iters 3 --load "$dir/ck"
    run "$bin" train "${small[@]}" --vocab-size 300 --train-iters 3 --load "$dir/ck" --use-checkpoint-args
    expect_text "note: --use-checkpoint-args: --padded-vocab-size (padded from the vocabulary) -> 512 (from the checkpoint)"
    expect "resumed from .* at iteration 2"
    expect "iteration +3/ +3 "
    ;;
  token_file)
    "$py" - "$dir/t.bin" <<'EOF'
import struct, sys
ids = [(i * 37) % 500 for i in range(20000)]  # every id 0..499 (37 is prime to 500)
open(sys.argv[1], 'wb').write(struct.pack('<256i', 20240520, 1, len(ids), *([0] * 253)) +
                              struct.pack('<%dH' % len(ids), *ids))
EOF
    run "$bin" train "${small[@]}" --data-path "$dir/t.bin"
    expect_text " > padded vocab (size: 500) with 12 dummy tokens (new size: 512)"
    refused "^ampipe: error: --vocab-size 400 is smaller than the vocabulary the data need, 500 ids \(--data-path $dir/t.bin holds token id 499\)" \
      "$bin" train "${small[@]}" --data-path "$dir/t.bin" --vocab-size 400
    run "$bin" train "${small[@]}" --data-path "$dir/t.bin" --vocab-size 600
    expect_text " > padded vocab (size: 600) with 40 dummy tokens (new size: 640)"
    expect " V=640 "
    ;;
  tokenizer)
    "$py" - "$dir" <<'EOF'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256)); cs = bs[:]; n = 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256 + n); n += 1
v = {chr(c): i for i, c in enumerate(cs)}; v[chr(0x120) + 't'] = 256; v[chr(0x120) + 'th'] = 257; v['<|endoftext|>'] = 258
json.dump(v, open(sys.argv[1] + '/vocab.json', 'w'))
open(sys.argv[1] + '/merges.txt', 'w').write('#version: 0.2\n' + chr(0x120) + ' t\n' + chr(0x120) + 't h\n')
EOF
    tok=(--tokenizer-type GPT2BPETokenizer --vocab-file "$dir/vocab.json" --merge-file "$dir/merges.txt")
    refused "^ampipe: error: --vocab-size 200 is smaller than the vocabulary the data need, 259 ids \(the tokenizer is GPT2BPETokenizer" \
      "$bin" train "${small[@]}" "${tok[@]}" --vocab-size 200
    run "$bin" train "${small[@]}" "${tok[@]}" --vocab-size 1000
    expect_text "note: --vocab-size 1000 has no effect with --tokenizer-type GPT2BPETokenizer: the vocabulary is the tokenizer's 259 ids"
    expect_text " > padded vocab (size: 259) with 125 dummy tokens (new size: 384)"
    expect " V=384 "
    ;;
  *) echo "unknown case $case_"; exit 2 ;;
esac
