#!/usr/bin/env bash
# Usage: hf_convert.sh AMPIPE CASE [MPIRUN...]
# `ampipe convert` (train/hf_checkpoint.h) on tiny Hugging Face models written by hand (tests/cli/hf_convert.py make):
#   1. HF -> ampipe -> HF gives every tensor back bit for bit (dtype, shape, bytes) and config.json's keys;
#   2. the converted checkpoint's logits in tools/torch_gpt_moe.py (ampipe's layout) equal tools/hf_moe.py's (a
#      PyTorch forward of Hugging Face's Mixtral / Qwen2-MoE / Qwen3-MoE under its own names) to 1e-5;
#   3. `ampipe train --load CKPT --use-checkpoint-args --finetune --skip-train` logs the validation loss that
#      tools/torch_eval.py --hf (the Hugging Face model on the same validation sequences) computes, to 1e-5 relative.
# Cases:
#   mixtral         bf16 tensors in 3 shards with an index, grouped-query attention, untied head, vocabulary 256
#   qwen3           fp32, one file, q_norm / k_norm (--qk-layernorm), norm_topk_prob true, tied head, vocabulary 200
#                   (padded to 256 for the round trip; --make-vocab-size-divisible-by 8 for the loss, so that no
#                   padding column joins the softmax)
#   qwen3_no_norm   norm_topk_prob false (--moe-router-pre-softmax); ampipe evaluates it at AMPipe degree 2
#   qwen3_dense     a dense layer (mlp_only_layers [0]: --moe-layer-freq [0,1,1], its MLP of intermediate_size)
#   qwen2           Qwen2-MoE: bf16, q/k/v biases (--add-qkv-bias), the gated shared expert
#                   (--moe-shared-expert-intermediate-size, --moe-shared-expert-gate), grouped-query attention, a
#                   dense middle layer (mlp_only_layers [1]), norm_topk_prob false, untied head; the loss at AMPipe
#                   degree 1 and 2
#   qwen2_sparse_step  fp32, decoder_sparse_step 2 (layers 1 and 3 with experts), norm_topk_prob true, tied head
#   bad_inputs      each refusal: one line naming the file or config.json key, exit 2
#   layouts         (MPIRUN given) a converted Qwen3-MoE evaluated on 2 ranks at tp 2, ep 2 and cp 2, and a converted
#                   Qwen2-MoE (biases, gated shared expert, a dense layer) at tp 2 and ep 2, log the loss of one rank
#                   (the checkpoint holds full tensors; each layout takes its shards)
#   not_expressible ampipe checkpoints of models Hugging Face's three cannot express are refused naming the flag;
#                   ones trained from scratch with Qwen3-MoE's or Qwen2-MoE's architecture convert (config.json built
#                   from their flags)
# Exit 77 (CTest's skip) when no python3 can import numpy and torch.
set -u
bin=$1
case_name=$2
shift 2
launch=("$@")
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../../tools
py=
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import numpy, torch" >/dev/null 2>&1; then py=$cand; break; fi
done
if [ -z "$py" ]; then
  echo "hf_convert.sh: skipped: no python3 with numpy and torch (scripts/setup.sh installs python3-torch)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.out; do [ -e "$f" ] && { echo "--- $f:"; cat "$f"; }; done; exit 1; }
helper() { "$py" "$here/hf_convert.py" "$@"; }
convert() { "$bin" convert "$@" >"$dir/convert.out" 2>&1 || fail "ampipe convert $* failed"; cat "$dir/convert.out"; }
roundtrip() {  # roundtrip NAME MAKE-ARGS... : writes $dir/NAME, converts both ways, compares
  local name=$1
  shift
  helper make "$dir/$name" "$@" || fail "could not write the model"
  convert --load-dir "$dir/$name" --save-dir "$dir/$name.ck" --seq-length 16
  convert --load-dir "$dir/$name.ck" --save-dir "$dir/$name.back"
  helper compare "$dir/$name" "$dir/$name.back" || fail "the round trip is not exact"
  helper logits "$dir/$name" "$dir/$name.ck" || fail "the logits differ"
}
# loss NAME CKPT [TRAIN-FLAGS...]: ampipe's validation loss of CKPT against the Hugging Face model NAME's
loss() {
  local name=$1 ck=$2
  shift 2
  [ -e "$dir/tokens.bin" ] || helper tokens "$dir/tokens.bin" 200 2000
  local data=(--data-path "$dir/tokens.bin" --split 50,50,0 --micro-batch-size 2 --global-batch-size 2)
  "$bin" train --load "$ck" --use-checkpoint-args --finetune --skip-train "${data[@]}" --eval-iters 3 \
    --moe-model-type megatron_moe "$@" >"$dir/train.out" 2>&1 || fail "ampipe train --load $ck failed"
  local a t
  a=$(grep -Eo "validation loss at iteration 0 \| lm loss value: [0-9.E+-]+" "$dir/train.out" | awk '{print $NF}')
  [ -n "$a" ] || fail "ampipe train logged no validation loss"
  "$py" "$tools/torch_eval.py" --load "$ck" --hf "$dir/$name" "${data[@]}" --eval-iters 3 >"$dir/eval.out" 2>&1 ||
    fail "torch_eval.py --hf failed"
  t=$(grep -Eo "validation loss at iteration [0-9]+ \| lm loss value: [0-9.E+-]+" "$dir/eval.out" | awk '{print $NF}')
  [ -n "$t" ] || fail "torch_eval.py printed no validation loss"
  "$py" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); r = abs(a - b) / abs(a)
print(f'validation loss: ampipe {a:.8e}, Hugging Face model {b:.8e}, relative difference {r:.2e}', 'ok' if r <= 1e-5 else 'FAIL (> 1e-5)')
sys.exit(r > 1e-5)" "$a" "$t" || fail "the validation losses differ"
}
# meta CKPT STRING...: the converted checkpoint's metadata.json holds each STRING (its flags)
meta() {
  local m=$1/iter_0000000/metadata.json
  shift
  for want in "$@"; do grep -qF -- "$want" "$m" || fail "$m does not hold $want"; done
}
# refused MESSAGE-REGEX CONVERT-ARGS...: exit 2 and one error line matching
refused() {
  local re=$1
  shift
  "$bin" convert "$@" >"$dir/bad.out" 2>&1
  local rc=$?
  [ $rc -eq 2 ] || fail "ampipe convert $* exited $rc, expected 2"
  local lines
  lines=$(grep -c "ampipe: error:" "$dir/bad.out")
  [ "$lines" = 1 ] && grep -Eq -- "$re" "$dir/bad.out" || fail "expected one error line matching '$re'"
  echo "refused: $(grep 'ampipe: error:' "$dir/bad.out")"
}

# bad NAME MESSAGE-REGEX MAKE-ARGS...: a model written with MAKE-ARGS is refused with that line
bad() {
  local name=$1 re=$2
  shift 2
  helper make "$dir/$name" "$@" || fail "could not write the model"
  refused "$re" --load-dir "$dir/$name" --save-dir "$dir/o"
}

case $case_name in
  mixtral)
    roundtrip mx --arch mixtral --dtype bf16 --shards 3
    loss mx "$dir/mx.ck"
    ;;
  qwen3)
    roundtrip qw --arch qwen3 --tied --vocab 200
    grep -q '"qk_layernorm": true' "$dir/qw.ck/iter_0000000/metadata.json" || fail "the checkpoint is not --qk-layernorm"
    convert --load-dir "$dir/qw" --save-dir "$dir/qw.ck8" --seq-length 16 --make-vocab-size-divisible-by 8
    loss qw "$dir/qw.ck8"
    ;;
  qwen3_no_norm)
    roundtrip qn --arch qwen3 --no-norm-topk-prob
    grep -q '"moe_router_pre_softmax": true' "$dir/qn.ck/iter_0000000/metadata.json" ||
      fail "norm_topk_prob false is not --moe-router-pre-softmax"
    loss qn "$dir/qn.ck" --ampipe-degree 2 --use-flash-attn
    ;;
  qwen3_dense)
    roundtrip q3d --arch qwen3 --layers 3 --config-key 'mlp_only_layers=[0]'
    meta "$dir/q3d.ck" '"moe_layer_freq": "[0,1,1]"' '"ffn_hidden_size": 64' '"moe_ffn_hidden_size": 24'
    loss q3d "$dir/q3d.ck"
    ;;
  qwen2)
    roundtrip q2 --arch qwen2 --dtype bf16 --layers 3 --no-norm-topk-prob --config-key 'mlp_only_layers=[1]'
    meta "$dir/q2.ck" '"add_qkv_bias": true' '"moe_shared_expert_gate": true' \
      '"moe_shared_expert_intermediate_size": 48' '"moe_layer_freq": "[1,0,1]"' '"ffn_hidden_size": 40' \
      '"moe_router_pre_softmax": true' '"num_query_groups": 2'
    loss q2 "$dir/q2.ck"
    loss q2 "$dir/q2.ck" --ampipe-degree 2 --use-flash-attn
    ;;
  qwen2_sparse_step)
    roundtrip qs --arch qwen2 --layers 4 --tied --config-key 'decoder_sparse_step=2' --config-key 'qkv_bias=true'
    meta "$dir/qs.ck" '"moe_layer_freq": "[0,1,0,1]"' '"moe_router_pre_softmax": false'
    loss qs "$dir/qs.ck"
    ;;
  bad_inputs)
    refused "--load-dir .*/nothing: the directory does not exist" --load-dir "$dir/nothing" --save-dir "$dir/o"
    mkdir "$dir/empty"
    refused "--load-dir .*/empty: neither a Hugging Face model directory \(config.json\) nor an ampipe checkpoint" \
      --load-dir "$dir/empty" --save-dir "$dir/o"
    helper make "$dir/badjson" --arch mixtral
    echo "{" >"$dir/badjson/config.json"
    refused "badjson/config.json: not valid JSON" --load-dir "$dir/badjson" --save-dir "$dir/o"
    bad llama "\"architectures\" is \[\"LlamaForCausalLM\"\]: ampipe convert reads MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM only" \
      --arch mixtral --config-key 'architectures=["LlamaForCausalLM"]'
    bad sw "config.json: \"sliding_window\" is 4096: sliding-window attention is not implemented" \
      --arch mixtral --config-key 'sliding_window=4096'
    bad gelu "config.json: \"hidden_act\" is \"gelu\"" --arch qwen3 --config-key 'hidden_act="gelu"'
    bad shape "model.safetensors: tensor model.layers.1.self_attn.k_proj.weight is \[15, 32\], config.json's model needs \[16, 32\]" \
      --arch mixtral --bad-shape model.layers.1.self_attn.k_proj.weight
    bad missing "tensor model.layers.0.self_attn.q_norm.weight is missing" \
      --arch qwen3 --drop-tensor model.layers.0.self_attn.q_norm.weight
    bad nokey "config.json: key \"num_local_experts\" is missing" --arch mixtral --config-key 'num_local_experts=null'
    bad k5 "k5/config.json: the model cannot run here: --moe-router-topk 5 is larger than --num-experts 4" \
      --arch mixtral --config-key 'num_experts_per_tok=5'
    bad lt "\"layer_types\" holds \"sliding_attention\": every layer here has full attention" \
      --arch qwen3 --config-key 'layer_types=["full_attention","sliding_attention"]'
    bad f16 "\"torch_dtype\" is \"float16\"" --arch mixtral --config-key 'torch_dtype="float16"'
    # Qwen2-MoE: sliding-window attention, a layer index out of range, no layer with experts, a missing shared expert
    bad q2sw "config.json: \"use_sliding_window\" is true: sliding-window attention is not implemented" \
      --arch qwen2 --config-key 'use_sliding_window=true'
    bad q2only "config.json: \"mlp_only_layers\" holds 2: a layer index in \[0, num_hidden_layers 2\)" \
      --arch qwen2 --config-key 'mlp_only_layers=[2]'
    bad q2none "\"decoder_sparse_step\" 3 and \"mlp_only_layers\" \[\] leave no layer with experts" \
      --arch qwen2 --config-key 'decoder_sparse_step=3'
    bad q2shared "tensor model.layers.1.mlp.shared_expert_gate.weight is missing" \
      --arch qwen2 --drop-tensor model.layers.1.mlp.shared_expert_gate.weight
    # (make writes the biases before --config-key: qkv_bias false leaves them without a place)
    bad q2bias "tensor model.layers.0.self_attn.k_proj.bias has no place in the Qwen2MoeForCausalLM model" \
      --arch qwen2 --config-key 'qkv_bias=false'
    helper make "$dir/ok" --arch mixtral
    rm "$dir/ok/model.safetensors"
    refused "neither model.safetensors nor model.safetensors.index.json is there" --load-dir "$dir/ok" --save-dir "$dir/o"
    ;;
  layouts)
    [ ${#launch[@]} -gt 0 ] || fail "layouts needs MPIRUN..."
    helper tokens "$dir/tokens.bin" 256 2000
    val() { grep -Eo "validation loss at iteration 0 \| lm loss value: [0-9.E+-]+" "$dir/train.out" | awk '{print $NF}'; }
    # layouts NAME LAYOUT...: the converted NAME's loss on one rank, then on 2 ranks in each LAYOUT
    layouts() {
      local name=$1
      shift
      local data=(--load "$dir/$name.ck" --use-checkpoint-args --finetune --skip-train --data-path "$dir/tokens.bin"
                  --split 50,50,0 --micro-batch-size 2 --global-batch-size 4 --eval-iters 2 --moe-model-type megatron_moe)
      "$bin" train "${data[@]}" >"$dir/train.out" 2>&1 || fail "ampipe train (one rank) failed"
      local one layout
      one=$(val)
      for layout in "$@"; do
        # shellcheck disable=SC2086
        "${launch[@]}" -np 2 "$bin" train "${data[@]}" $layout >"$dir/train.out" 2>&1 ||
          fail "ampipe train $layout ($name) failed"
        "$py" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); r = abs(a - b) / abs(a)
print(f'validation loss, {sys.argv[3]}: {b:.6e} vs one rank {a:.6e}, relative difference {r:.1e}', 'ok' if r <= 1e-5 else 'FAIL')
sys.exit(r > 1e-5)" "$one" "$(val)" "$name $layout" || fail "$layout differs ($name)"
      done
    }
    helper make "$dir/ql" --arch qwen3 || fail "could not write the model"
    convert --load-dir "$dir/ql" --save-dir "$dir/ql.ck" --seq-length 16
    layouts ql "--tensor-model-parallel-size 2" "--expert-model-parallel-size 2" \
      "--context-parallel-size 2 --ampipe-degree 2 --use-flash-attn"
    # Qwen2-MoE: the q/k/v biases cut as the qkv rows, the shared expert's and the dense layer's MLP column/row
    # parallel, the shared expert's gate whole on every rank
    helper make "$dir/q2l" --arch qwen2 --layers 3 --no-norm-topk-prob --config-key 'mlp_only_layers=[1]' ||
      fail "could not write the model"
    convert --load-dir "$dir/q2l" --save-dir "$dir/q2l.ck" --seq-length 16
    layouts q2l "--tensor-model-parallel-size 2 --sequence-parallel" "--expert-model-parallel-size 2"
    ;;
  not_expressible)  # ampipe models Hugging Face's three cannot express: one line naming the flag
    small=(--num-layers 1 --seq-length 16 --hidden-size 32 --ffn-hidden-size 24 --num-attention-heads 4
           --num-experts 4 --train-iters 1 --eval-iters 0 --disable-bias-linear)
    "$bin" train "${small[@]}" --save "$dir/ln" >"$dir/train.out" 2>&1 || fail "ampipe train --save failed"
    refused "--load-dir .*/ln: --normalization LayerNorm \(they use RMSNorm\): Hugging Face's MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM cannot express it" \
      --load-dir "$dir/ln" --save-dir "$dir/o"
    "$bin" train "${small[@]}" --moe-model-type deepspeed_moe --normalization RMSNorm --swiglu --position-embedding-type rope \
      --save "$dir/ds" >"$dir/train.out" 2>&1 || fail "ampipe train --save failed"
    refused "--moe-model-type deepspeed_moe" --load-dir "$dir/ds" --save-dir "$dir/o"
    # trained from scratch with Megatron-Core's router and qk norms: a Qwen3-MoE with a config.json built from the flags
    "$bin" train "${small[@]}" --normalization RMSNorm --swiglu --position-embedding-type rope --qk-layernorm \
      --moe-model-type megatron_moe --untie-embeddings-and-output-weights --save "$dir/q" >"$dir/train.out" 2>&1 ||
      fail "ampipe train --save failed"
    convert --load-dir "$dir/q" --save-dir "$dir/q.hf"
    grep -q '"Qwen3MoeForCausalLM"' "$dir/q.hf/config.json" || fail "not written as Qwen3MoeForCausalLM"
    helper logits "$dir/q.hf" "$dir/q" || fail "the logits differ"
    # Qwen2-MoE's pieces without the rest: each refused naming the flag
    rms=("${small[@]}" --normalization RMSNorm --swiglu --position-embedding-type rope --moe-model-type megatron_moe)
    "$bin" train "${rms[@]/--disable-bias-linear/--add-bias-linear}" --qk-layernorm --save "$dir/bl" >"$dir/train.out" 2>&1 ||
      fail "ampipe train --save failed"
    refused "--add-bias-linear \(their linear layers have no biases but Qwen2-MoE's q/k/v\)" --load-dir "$dir/bl" --save-dir "$dir/o"
    "$bin" train "${rms[@]}" --moe-shared-expert-intermediate-size 16 --save "$dir/sh" >"$dir/train.out" 2>&1 ||
      fail "ampipe train --save failed"
    refused "a shared expert without --moe-shared-expert-gate \(Qwen2-MoE's shared expert is gated\)" \
      --load-dir "$dir/sh" --save-dir "$dir/o"
    "$bin" train "${rms[@]}" --add-qkv-bias --save "$dir/qb" >"$dir/train.out" 2>&1 || fail "ampipe train --save failed"
    refused "--add-qkv-bias without a gated shared expert" --load-dir "$dir/qb" --save-dir "$dir/o"
    "$bin" train "${rms[@]}" --moe-router-pre-softmax --save "$dir/ps" >"$dir/train.out" 2>&1 ||
      fail "ampipe train --save failed"
    refused "--moe-router-pre-softmax \(norm_topk_prob false\) without --qk-layernorm or a gated shared expert" \
      --load-dir "$dir/ps" --save-dir "$dir/o"
    # trained from scratch with Qwen2-MoE's pieces (q/k/v biases, a gated shared expert, a dense block of its own F,
    # grouped-query attention): a Qwen2-MoE, its dense layer in mlp_only_layers
    "$bin" train --num-layers 2 --seq-length 16 --hidden-size 32 --ffn-hidden-size 40 --moe-ffn-hidden-size 24 \
      --num-attention-heads 4 --group-query-attention --num-query-groups 2 --num-experts 4 --train-iters 1 \
      --eval-iters 0 --normalization RMSNorm --swiglu --position-embedding-type rope --moe-model-type megatron_moe \
      --add-qkv-bias --disable-bias-linear --moe-shared-expert-intermediate-size 16 --moe-shared-expert-gate \
      --moe-router-pre-softmax \
      --moe-layer-freq "[0,1]" --untie-embeddings-and-output-weights --save "$dir/q2" >"$dir/train.out" 2>&1 ||
      fail "ampipe train --save failed"
    convert --load-dir "$dir/q2" --save-dir "$dir/q2.hf"
    "$py" -c "import json, sys; c = json.load(open(sys.argv[1]))
want = {'architectures': ['Qwen2MoeForCausalLM'], 'mlp_only_layers': [0], 'decoder_sparse_step': 1, 'qkv_bias': True,
        'intermediate_size': 40, 'moe_intermediate_size': 24, 'shared_expert_intermediate_size': 16,
        'norm_topk_prob': False, 'num_key_value_heads': 2}
bad = {k: c.get(k) for k in want if c.get(k) != want[k]}
print('config.json:', 'ok' if not bad else f'differs: {bad}'); sys.exit(bool(bad))" "$dir/q2.hf/config.json" ||
      fail "the Qwen2-MoE config.json is not the model's"
    helper logits "$dir/q2.hf" "$dir/q2" || fail "the logits differ"
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
echo "ok: $case_name"
