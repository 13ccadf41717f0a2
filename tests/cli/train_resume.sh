#!/usr/bin/env bash
# Usage: train_resume.sh AMPIPE CASE
# Resume, finetune and evaluation-only runs of `ampipe train` from a checkpoint of a small model (docs/training.md,
# "Checkpoints"). Each case prints what it checked; any failed check exits 1.
set -u
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
small=(--num-experts 4 --hidden-size 64 --num-layers 1 --eval-iters 1 --log-interval 1)
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$dir/out"; exit 1; }
run() { "$bin" train "$@" >"$dir/out" 2>&1; }
expect() { grep -Eq -- "$1" "$dir/out" || fail "output does not match /$1/"; echo "ok: /$1/"; }
expect_text() { grep -Fq -- "$1" "$dir/out" || fail "output does not contain \"$1\""; echo "ok: \"$1\""; }
# A checkpoint at iteration 4 of a 4-iteration run (evaluated at its end).
run "${small[@]}" --train-iters 4 --eval-interval 4 --save "$dir/ck" || fail "the first run failed"
valid_loss=$(grep -Eo 'validation loss at iteration 4 \| lm loss value: [0-9.E+-]+' "$dir/out" | awk '{print $NF}')
[ -n "$valid_loss" ] || fail "the first run printed no validation loss"
meta=$dir/ck/iter_0000004/metadata.json
case $case_name in
  config_from_metadata)  # the checkpoint's own metadata.json is a --config
    run --config "$meta" --load "$dir/ck" --train-iters 6 || fail "--config metadata.json failed"
    expect "resumed from .* at iteration 4"
    expect "iteration +6/ +6"
    # --train-samples on the command line replaces the file's train_iters (not "both given")
    run --config "$meta" --load "$dir/ck" --train-samples 32 || fail "--config metadata.json --train-samples failed"
    expect "iteration +8/ +8"
    ;;
  changed_settings_are_said)  # another --data-path and global batch: one note each
    run "${small[@]}" --load "$dir/ck" --train-iters 5 --data-path /usr/share/common-licenses/GPL-3 \
        --global-batch-size 8 --eval-interval 0 || fail "the resume failed"
    expect "note: --load .* \(iteration 4\): this run changes --data-path \(the bundled corpus\) -> /usr/share/common-licenses/GPL-3"
    expect "note: --load .* \(iteration 4\): this run changes --global-batch-size 0 -> 8"
    ;;
  use_checkpoint_args)  # the model flags come from the checkpoint, not from the defaults (2 layers, h 128)
    run --load "$dir/ck" --use-checkpoint-args --train-iters 5 --eval-interval 0 || fail "the resume failed"
    expect "note: --use-checkpoint-args: --hidden-size 128 -> 64"
    expect "GPT-MoE L=1 s=128 h=64 "
    expect "iteration +5/ +5"
    ;;
  finetune)  # the model of iteration 4, from iteration 0 with a fresh optimizer
    run "${small[@]}" --load "$dir/ck" --finetune --train-iters 2 --eval-interval 0 || fail "--finetune failed"
    expect "finetuning the model of .* \(iteration 4\)"
    expect "iteration +1/ +2 \| consumed samples: +4 "
    ;;
  no_load_optim)  # the optimizer file is not needed, and without the flag its absence is an error
    rm "$dir/ck/iter_0000004/optimizer.safetensors"
    run "${small[@]}" --load "$dir/ck" --train-iters 5 --eval-interval 0 && fail "a missing optimizer file loaded"
    expect "optimizer.safetensors: the file is missing"
    run "${small[@]}" --load "$dir/ck" --no-load-optim --train-iters 5 --eval-interval 0 || fail "--no-load-optim failed"
    expect "resumed from .* at iteration 4 \(the model only"
    expect "iteration +5/ +5"
    ;;
  skip_train)  # evaluation only: the validation loss of the training run's end, exactly
    run "${small[@]}" --load "$dir/ck" --skip-train || fail "--skip-train failed"
    expect_text "validation loss at iteration 4 | lm loss value: $valid_loss "
    expect "done: no iteration trained \(--skip-train"
    if grep -Eq "iteration +[0-9]+/" "$dir/out"; then fail "--skip-train trained"; fi
    ;;
  at_train_iters)  # a checkpoint already at --train-iters: still the evaluation and the summary
    run "${small[@]}" --load "$dir/ck" --train-iters 4 --eval-interval 4 || fail "the resume failed"
    expect_text "validation loss at iteration 4 | lm loss value: $valid_loss "
    expect "done: no iteration trained \(--train-iters 4 reached"
    ;;
  exit_interval)  # Megatron's --exit-interval: the first iteration divisible by it, from iteration 0 (6, not 4 + 3)
    run "${small[@]}" --load "$dir/ck" --train-iters 10 --exit-interval 3 --eval-interval 0 || fail "the resume failed"
    expect "iteration +6/ +10"
    if grep -Eq "iteration +7/" "$dir/out"; then fail "trained past iteration 6"; fi
    ;;
  trace_after_resume)  # --trace-iteration K counts in this run: iteration 4 + 1
    run "${small[@]}" --load "$dir/ck" --train-iters 6 --eval-interval 0 --trace "$dir/t.json" --trace-iteration 1 ||
      fail "the resume failed"
    expect "trace of iteration 5 written"
    [ -s "$dir/t.json" ] || fail "no trace file"
    # a K beyond what this run trains (iterations 5..6) is refused, not silently skipped
    run "${small[@]}" --load "$dir/ck" --train-iters 6 --eval-interval 0 --trace "$dir/t2.json" --trace-iteration 3 &&
      fail "--trace-iteration 3 of a 2-iteration run was accepted"
    expect "error: --trace-iteration 3 is invalid for this run: it trains iterations 5..6"
    ;;
  schedule_from_checkpoint)  # Megatron's --use-checkpoint-opt_param-scheduler: the checkpoint's schedule (a linear
    # decay over its 4 iterations: lr 0 at iteration 5); --override-opt-param-scheduler: this run's (0.2 x 0.01)
    run "${small[@]}" --load "$dir/ck" --train-iters 5 --eval-interval 0 --lr 0.01 --lr-decay-style linear \
        --use-checkpoint-opt_param-scheduler || fail "the resume failed"
    expect "note: --use-checkpoint-opt-param-scheduler: --lr 0.01 -> "
    expect "note: --use-checkpoint-opt-param-scheduler: --lr-decay-iters 0 -> 4 \(from the checkpoint\)"
    expect "iteration +5/ +5 .*learning rate: 0.000000E\+00 "
    run "${small[@]}" --load "$dir/ck" --train-iters 5 --eval-interval 0 --lr 0.01 --lr-decay-style linear \
        --override-opt-param-scheduler || fail "the resume failed"
    expect "iteration +5/ +5 .*learning rate: 2.000000E-03 "
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
