#!/usr/bin/env bash
# Usage: checkpoint_fault.sh AMPIPE CASE REGEX
# Saves a 4-iteration checkpoint (iterations 2 and 4), damages it as CASE says, and checks that `ampipe train --load`
# refuses it with exit code 2 and one line matching REGEX, and that the refused load changed no file of the
# checkpoint directory (nor the user's file beside it).
set -u
ampipe=$1
case=$2
regex=$3
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
shape=(--num-experts 4 --seq-length 32 --hidden-size 32 --ffn-hidden-size 64 --num-attention-heads 2 --micro-batch-size 2
       --eval-interval 0 --log-interval 100)
"$ampipe" train "${shape[@]}" --train-iters 4 --save "$d/ckpt" --save-interval 2 >/dev/null 2>"$d/err" ||
  { echo "the setup run failed:"; cat "$d/err"; exit 1; }
echo "the user's notes" > "$d/ckpt/notes.txt"
i4=$d/ckpt/iter_0000004
size() { stat -c %s "$1"; }
case $case in
  flip_byte)       # one bit of the last data byte of the model file
    off=$(( $(size "$i4/model.safetensors") - 1 ))
    b=$(od -An -tu1 -j "$off" -N1 "$i4/model.safetensors" | tr -d ' ')
    printf "$(printf '\\%03o' $(( b ^ 1 )))" | dd of="$i4/model.safetensors" bs=1 seek="$off" conv=notrunc status=none ;;
  other_iteration) cp "$d/ckpt/iter_0000002/model.safetensors" "$i4/model.safetensors" ;;
  truncated)       truncate -s $(( $(size "$i4/optimizer.safetensors") / 2 )) "$i4/optimizer.safetensors" ;;
  header_length)   printf '\xff\xff\xff\xff\xff\xff\xff\x7f' | dd of="$i4/model.safetensors" conv=notrunc status=none ;;
  consumed_negative) sed -i 's/"consumed_samples": [0-9]*/"consumed_samples": -100/' "$i4/metadata.json" ;;
  steps_huge)      sed -i 's/"optimizer_steps": [0-9]*/"optimizer_steps": 99999999999999999999/' "$i4/metadata.json" ;;
  meta_other_iteration) cp "$d/ckpt/iter_0000002/metadata.json" "$i4/metadata.json" ;;
  meta_garbage)    echo '{"iteration": ' > "$i4/metadata.json" ;;
  marker_garbage)  echo 'four' > "$d/ckpt/latest_checkpointed_iteration.txt" ;;
  marker_missing_dir) echo 3 > "$d/ckpt/latest_checkpointed_iteration.txt" ;;
  model_missing)   rm "$i4/model.safetensors" ;;
  model_is_dir)    rm "$i4/model.safetensors" && mkdir "$i4/model.safetensors" ;;
  # issue 27: the manifest records every file of the iteration, metadata.json included, and its own checksum
  meta_heads|meta_heads_args) sed -i 's/"num_attention_heads": 2/"num_attention_heads": 4/' "$i4/metadata.json" ;;
  manifest_edited) sed -i 's/"iteration": 4/"iteration": 5/' "$i4/manifest.json" ;;
  manifest_missing) rm "$i4/manifest.json" ;;
  *) echo "unknown case $case"; exit 1 ;;
esac
extra=()
[ "$case" = meta_heads_args ] && extra=(--use-checkpoint-args)
before=$(cd "$d/ckpt" && find . -type f | sort | xargs sha256sum)
"$(dirname "$0")/../cli/expect_error.sh" "$regex" "$ampipe" train "${shape[@]}" --train-iters 6 --load "$d/ckpt" "${extra[@]}" || exit 1
after=$(cd "$d/ckpt" && find . -type f | sort | xargs sha256sum)
[ "$before" = "$after" ] || { echo "the refused load changed files:"; diff <(echo "$before") <(echo "$after"); exit 1; }
