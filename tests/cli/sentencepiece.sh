#!/usr/bin/env bash
# Usage: sentencepiece.sh AMPIPE DIR CASE
# The subword path (docs/training.md, "Data"): `ampipe preprocess` and `ampipe train --tokenizer-type
# SentencePieceTokenizer`. DIR (in the build tree) holds the corpus text and PREFIX files between the cases;
# `preprocess` runs first (CTest fixture spm_corpus).
#   preprocess     the bundled corpus as one text file (data/README.md: /usr/share/common-licenses, regular files in
#                  name order, each followed by a newline) -> DIR/corpus.{model,vocab,bin} with a 2000-piece
#                  vocabulary; --check-roundtrip fails unless text -> ids -> text is exact; the token file's header
#                  (magic 20240520, version 1, count) matches its size
#   train          200 iterations of a small model on DIR/corpus.bin with the model: the mean logged lm loss of the
#                  last 20 of 200 iterations is below that of the first 20, and the vocabulary is the model's 2000 pieces
#                  padded to 2048
#   text           the same model tokenizes the plain text at load: the same 65k-odd tokens as the token file
#   outside_vocab  DIR/corpus.bin (ids up to 1999) with a 500-piece model trained by preprocess on the same text:
#                  one error line naming --data-path and the vocabulary, exit 2
# Exit 77 (skipped) when this ampipe was built without libsentencepiece.
set -u
bin=$1
dir=$2
case_=$3
if "$bin" preprocess --input /dev/null --output-prefix x 2>&1 | grep -q "built without libsentencepiece"; then
  echo "this ampipe was built without libsentencepiece (scripts/setup.sh installs libsentencepiece-dev): skipped"
  exit 77
fi
mkdir -p "$dir"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
run() { "$@" >"$out" 2>&1 || { echo "failed: $*"; cat "$out"; exit 1; }; cat "$out"; }
case $case_ in
  preprocess)
    : >"$dir/corpus.txt"
    while IFS= read -r f; do
      p=/usr/share/common-licenses/$f
      [ -f "$p" ] && [ ! -L "$p" ] && { cat "$p"; echo; } >>"$dir/corpus.txt"
    done < <(ls /usr/share/common-licenses | LC_ALL=C sort)
    [ -s "$dir/corpus.txt" ] || { echo "no bundled corpus in /usr/share/common-licenses"; exit 1; }
    rm -f "$dir"/corpus.{model,vocab,bin}
    run "$bin" preprocess --input "$dir/corpus.txt" --output-prefix "$dir/corpus" --vocab-size 2000 --check-roundtrip
    grep -q "round trip exact: $(stat -c %s "$dir/corpus.txt") bytes" "$out" || { echo "no exact round trip"; exit 1; }
    for f in model vocab bin; do [ -s "$dir/corpus.$f" ] || { echo "corpus.$f missing"; exit 1; }; done
    read -r magic version count < <(od -An -t d4 -N 12 "$dir/corpus.bin")
    size=$(stat -c %s "$dir/corpus.bin")
    [ "$magic" = 20240520 ] && [ "$version" = 1 ] && [ "$size" -eq $((1024 + 2 * count)) ] ||
      { echo "bad token file header: magic $magic version $version count $count, $size bytes"; exit 1; }
    [ "$(wc -l <"$dir/corpus.vocab")" -eq 2000 ] || { echo "corpus.vocab has not 2000 pieces"; exit 1; }
    echo "ok: $count tokens"
    ;;
  train | text)
    data=$dir/corpus.bin
    [ "$case_" = text ] && data=$dir/corpus.txt
    run "$bin" train --num-experts 4 --tokenizer-type SentencePieceTokenizer --tokenizer-model "$dir/corpus.model" --data-path "$data" \
      --num-layers 1 --hidden-size 64 --train-iters 200 --log-interval 1 --eval-interval 0
    grep -q " V=2048 " "$out" || { echo "the vocabulary is not 2000 pieces padded to 2048"; exit 1; }
    count=$(od -An -t d4 -j 8 -N 4 "$dir/corpus.bin" | tr -d ' ')
    grep -q "($count tokens)" "$out" || { echo "not the $count tokens of corpus.bin"; exit 1; }
    grep -Eo "lm loss: [0-9.E+-]+" "$out" | awk '{print $3}' | awk '
      { l[NR] = $1 + 0 }
      END {
        if (NR != 200) { print "expected 200 logged losses, got " NR; exit 1 }
        a = 0; b = 0
        for (i = 1; i <= 20; ++i) { a += l[i] / 20; b += l[180 + i] / 20 }
        if (!(b < a - 1.0)) { printf "the loss did not fall: first 20 %.4f, last 20 %.4f\n", a, b; exit 1 }
        printf "ok: lm loss first 20 %.4f -> last 20 %.4f\n", a, b
      }'
    ;;
  outside_vocab)
    run "$bin" preprocess --input "$dir/corpus.txt" --output-prefix "$dir/small" --vocab-size 500
    exec "$(dirname "$0")/expect_error.sh" \
      "--data-path .*corpus.bin: token [0-9]+ has id [0-9]+, outside the vocabulary of SentencePieceTokenizer \\(.*small.model: 500 ids\\)" \
      "$bin" train --num-experts 4 --tokenizer-type SentencePieceTokenizer --tokenizer-model "$dir/small.model" \
      --data-path "$dir/corpus.bin"
    ;;
  *) echo "unknown case $case_"; exit 2 ;;
esac
