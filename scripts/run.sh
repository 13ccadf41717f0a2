#!/usr/bin/env bash
# Sets everything up, builds, and runs the main job: `ampipe train` on 2 local ranks with its embedded default (a
# small GPT-MoE, 2 layers of 4 experts, on the bundled corpus; AMPipe degree 2 with expert parallelism 2; 300
# iterations, about a minute on 2 cores), ending with a summary of where the loss went and how fast it ran, a
# checkpoint in out/main-job/ and the loss curves as out/main-job/loss.png.
# Extra arguments are passed to `ampipe train` (e.g. --train-iters 50, --data-path FILE, --save DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The checkpoint and the loss curves (PNG: training loss blue, validation orange) go to out/main-job/.
# Every setting of the run is spelled out (flags left out take Megatron's defaults).
exec mpirun -np 2 --bind-to none --mca btl self,vader ./build/ampipe train \
  --num-layers 2 --disable-bias-linear --hidden-size 128 --ffn-hidden-size 256 --num-attention-heads 4 --seq-length 128 \
  --micro-batch-size 4 --num-experts 4 --moe-router-topk 2 --moe-train-capacity-factor 1.25 --moe-aux-loss-coeff 0.01 \
  --hidden-dropout 0 --attention-dropout 0 \
  --train-iters 300 --lr 1.5e-3 --min-lr 1.5e-4 --lr-warmup-iters 30 --lr-decay-style cosine --weight-decay 0.1 \
  --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 --seed 1234 \
  --valid-fraction 0.05 --eval-interval 100 --eval-iters 4 --log-interval 20 \
  --ampipe-degree 2 --moe-model-type deepspeed_moe --use-flash-attn --expert-model-parallel-size 2 \
  --save out/main-job --loss-plot out/main-job/loss.png "$@"
