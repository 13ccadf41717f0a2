#!/usr/bin/env bash
# Usage: megatron_data.sh AMPIPE DIR CASE [SPM_DIR]
# Megatron's data pipeline end to end (docs/training.md, "Data"): indexed datasets written by
# tests/train/indexed_dataset.py from the format's description alone (not by ampipe), trained on with --data-path;
# ampipe preprocess's JSON-lines output compared byte for byte with what that script makes of the same lines.
# DIR (in the build tree) holds the datasets between the cases; `fixture` runs first (CTest fixture megatron_data).
#   fixture     DIR/a (uint16, 400 documents, ids < 500 ending in the eod 499), DIR/b (int32, ids < 70000),
#               DIR/c (int64), and the bad files DIR/bad_{truncate-bin,bad-magic,bad-version,pointer-beyond,no-idx}
#   prefix      3 iterations on --data-path DIR/a: the start-up line's split counts are the script's (Megatron's
#               split by documents, windows of s + 1 at stride s), V = 512, three logged losses
#   blend       --data-path 0.7 a 0.3 b trains (V = 70016, int32 ids); the same blend from --config as a JSON array
#               gives the same start-up data line
#   per_split   --train-data-path 0.5 a 0.5 c --valid-data-path b: trains and evaluates
#   resume      a blend (0.7 a 0.3 b) trained 6 iterations straight, and 3 + a resume to 6 (a constant learning
#               rate, so both runs' first 3 iterations are the same): iterations 4-6 log the same losses (any sample
#               index gives the same sample after a resume)
#   preprocess  a JSON-lines file (license paragraphs, Unicode, an empty text, a list of sentences, a blank line) ->
#               ampipe preprocess --append-eod --workers 2 -> the bytes the script expects (byte-level: UTF-8 bytes,
#               eod 0; Megatron's names PREFIX_text_document), read back as the texts plus eod; then 3 iterations on it
#   gpt2        JSON lines through --tokenizer-type GPT2BPETokenizer with a small byte-level vocab.json (GPT-2's 256
#               byte characters, the merges "t h" and "th e", <|endoftext|>) and merges.txt: every document ends in
#               <|endoftext|> (258), "the" is one token (257), and the ids train (V = 384)
#   spm         (SPM_DIR: the SentencePiece fixture's corpus.model) JSON lines through --tokenizer-type
#               SentencePieceTokenizer --append-eod: every document ends in the model's </s> (id 2), ids < 2000, and
#               train with the model reads it (V = 2048)
# Exit 77 (skipped) without python3, or for spm without libsentencepiece.
set -u
bin=$1
dir=$2
case_=$3
py=$(dirname "$0")/../train/indexed_dataset.py
command -v python3 >/dev/null 2>&1 || { echo "no python3: skipped"; exit 77; }
mkdir -p "$dir"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
run() { "$@" >"$out" 2>&1 || { echo "failed: $*"; cat "$out"; exit 1; }; cat "$out"; }
small=(--num-experts 4 --num-layers 1 --hidden-size 64 --seq-length 64 --train-iters 3 --log-interval 1
       --eval-interval 3 --eval-iters 1)
losses() { n=$(grep -c "lm loss: " "$out"); [ "$n" -eq "$1" ] || { echo "expected $1 logged losses, got $n"; exit 1; }; }
case $case_ in
  fixture)
    run python3 "$py" write "$dir/a" --dtype uint16 --docs 400 --vocab 500 --eod 499 --seed 1
    run python3 "$py" write "$dir/b" --dtype int32 --docs 300 --vocab 70000 --seed 2
    run python3 "$py" write "$dir/c" --dtype int64 --docs 200 --vocab 300 --seed 3
    for k in truncate-bin bad-magic bad-version pointer-beyond no-idx; do
      rm -f "$dir/bad_$k".{bin,idx}
      run python3 "$py" write "$dir/bad_$k" --docs 50 --corrupt "$k"
    done
    ;;
  prefix)
    want=$(python3 "$py" split "$dir/a" --split 969,30,1 --seq-length 64)
    run "$bin" train --data-path "$dir/a" "${small[@]}"
    grep -qF "data: Megatron indexed dataset $dir/a (uint16, 400 documents)" "$out" || { echo "no data line"; exit 1; }
    grep -qF "split 969,30,1 per dataset, over its documents: $want sequences" "$out" ||
      { echo "the split is not Megatron's: expected $want"; exit 1; }
    grep -q " V=512 " "$out" || { echo "the vocabulary is not ids < 500 padded to 512"; exit 1; }
    losses 3
    echo "ok: $want"
    ;;
  blend)
    run "$bin" train --data-path 0.7 "$dir/a" 0.3 "$dir/b" "${small[@]}"
    grep -q " V=70016 " "$out" || { echo "the vocabulary is not ids < 70000 padded to 70016"; exit 1; }
    grep -q "data: blend of 2 Megatron indexed datasets: 0.7 $dir/a " "$out" || { echo "no blend line"; exit 1; }
    losses 3
    line=$(grep "  data: " "$out")
    printf '{"data_path": ["0.7", "%s", "0.3", "%s"]}\n' "$dir/a" "$dir/b" >"$dir/blend.json"
    run "$bin" train --config "$dir/blend.json" "${small[@]}"
    [ "$(grep "  data: " "$out")" = "$line" ] || { echo "--config's blend differs: $line"; exit 1; }
    echo "ok"
    ;;
  per_split)
    run "$bin" train --train-data-path 0.5 "$dir/a" 0.5 "$dir/c" --valid-data-path "$dir/b" "${small[@]}"
    grep -q "split from --train-data-path, --valid-data-path, --test-data-path: [0-9]* training / [0-9]* validation" \
      "$out" || { echo "no per-split data line"; exit 1; }
    grep -q "validation loss at iteration 3" "$out" || { echo "no evaluation on --valid-data-path"; exit 1; }
    echo "ok"
    ;;
  resume)
    rm -rf "$dir/ck"
    blend=(--data-path 0.7 "$dir/a" 0.3 "$dir/b" "${small[@]}" --eval-interval 0 --lr-decay-style constant)
    run "$bin" train "${blend[@]}" --train-iters 6
    straight=$(grep -Eo "iteration +[456]/ +6 .*lm loss: [0-9.E+-]+" "$out" | grep -Eo "lm loss: [0-9.E+-]+")
    run "$bin" train "${blend[@]}" --train-iters 3 --save "$dir/ck"
    run "$bin" train "${blend[@]}" --train-iters 6 --load "$dir/ck"
    grep -q "resumed from $dir/ck at iteration 3" "$out" || { echo "did not resume at iteration 3"; exit 1; }
    resumed=$(grep -Eo "iteration +[456]/ +6 .*lm loss: [0-9.E+-]+" "$out" | grep -Eo "lm loss: [0-9.E+-]+")
    [ "$(echo "$straight" | wc -l)" -eq 3 ] && [ "$straight" = "$resumed" ] ||
      { echo "iterations 4-6 differ after the resume: straight $straight, resumed $resumed"; exit 1; }
    echo "ok: $(echo $resumed)"
    ;;
  preprocess)
    python3 - "$dir/docs.jsonl" <<'EOF'
import json, sys
text = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()
with open(sys.argv[1], "w", encoding="utf-8") as f:
    for para in text.split("\n\n"):
        f.write(json.dumps({"text": para, "id": 1}) + "\n")
    f.write(json.dumps({"text": "Ünïcödé ✓ and a tab\tin it"}) + "\n")
    f.write("\n")
    f.write(json.dumps({"text": ""}) + "\n")
    f.write(json.dumps({"text": ["first sentence. ", "", "second sentence."]}, ensure_ascii=False) + "\n")
EOF
    rm -f "$dir"/pp_text_document.{bin,idx}
    run "$bin" preprocess --input "$dir/docs.jsonl" --output-prefix "$dir/pp" --append-eod --workers 2 --log-interval 50
    grep -q "wrote $dir/pp_text_document.bin and $dir/pp_text_document.idx" "$out" || { echo "no output line"; exit 1; }
    run python3 "$py" check-jsonl "$dir/docs.jsonl" "$dir/pp_text_document" --append-eod
    run "$bin" train --data-path "$dir/pp_text_document" "${small[@]}"
    grep -q " V=256 " "$out" || { echo "the byte-level vocabulary is not 256"; exit 1; }
    losses 3
    echo "ok"
    ;;
  gpt2)
    python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
cs, n = bs[:], 0
for b in range(256):  # GPT-2's bytes_to_unicode
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
vocab = {chr(c): i for i, c in enumerate(cs)}
vocab.update({"th": 256, "the": 257, "<|endoftext|>": 258})
json.dump(vocab, open(d + "/vocab.json", "w"))
open(d + "/merges.txt", "w").write("#version: 0.2\nt h\nth e\n")
text = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()
with open(d + "/gpt2.jsonl", "w") as f:
    for para in text.split("\n\n"):
        f.write(json.dumps({"text": para}) + "\n")
PY
    run "$bin" preprocess --input "$dir/gpt2.jsonl" --output-prefix "$dir/gpt2" --tokenizer-type GPT2BPETokenizer \
      --vocab-file "$dir/vocab.json" --merge-file "$dir/merges.txt" --append-eod
    python3 "$py" read "$dir/gpt2_text_document" | python3 -c "
import json, sys
docs = json.load(sys.stdin)['documents']
assert all(doc and doc[-1] == 258 for doc in docs), 'a document does not end in <|endoftext|> (258)'
assert sum(doc.count(257) for doc in docs) > 100, 'the merge of \"the\" is not used'
assert all(0 <= t <= 258 for doc in docs for t in doc)
print('ok: %d documents, %d tokens' % (len(docs), sum(map(len, docs))))
" || exit 1
    run "$bin" train --data-path "$dir/gpt2_text_document" "${small[@]}"
    grep -q " V=384 " "$out" || { echo "the vocabulary is not ids < 259 padded to 384"; exit 1; }
    losses 3
    echo "ok"
    ;;
  spm)
    spm=${4:?SPM_DIR}
    if "$bin" preprocess --input /dev/null --output-prefix x 2>&1 | grep -q "built without libsentencepiece"; then
      echo "this ampipe was built without libsentencepiece: skipped"; exit 77
    fi
    python3 - "$spm/corpus.txt" "$dir/spm.jsonl" <<'EOF'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for para in text.split("\n\n"):
        if para.strip():
            f.write(json.dumps({"text": para}) + "\n")
EOF
    docs=$(wc -l <"$dir/spm.jsonl")
    run "$bin" preprocess --input "$dir/spm.jsonl" --output-prefix "$dir/spm" --tokenizer-type SentencePieceTokenizer \
      --tokenizer-model "$spm/corpus.model" --append-eod --workers 2
    python3 "$py" read "$dir/spm_text_document" | python3 -c "
import json, sys
d = json.load(sys.stdin)
docs = d['documents']
assert d['dtype'] == 'uint16', d['dtype']
assert len(docs) == $docs, (len(docs), $docs)
assert all(doc and doc[-1] == 2 for doc in docs), 'a document does not end in </s> (2)'
assert all(0 <= t < 2000 for doc in docs for t in doc), 'an id outside the 2000 pieces'
print('ok: %d documents, %d tokens, each ending in </s>' % (len(docs), sum(map(len, docs))))
" || exit 1
    run "$bin" train --tokenizer-type SentencePieceTokenizer --tokenizer-model "$spm/corpus.model" \
      --data-path "$dir/spm_text_document" "${small[@]}"
    grep -q " V=2048 " "$out" || { echo "the vocabulary is not the model's 2000 pieces padded to 2048"; exit 1; }
    losses 3
    echo "ok"
    ;;
  *) echo "unknown case $case_"; exit 2 ;;
esac
