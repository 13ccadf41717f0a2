#!/usr/bin/env python3
"""The byte-level BPE tokenizers of train/bpe_tokenizer.h against Hugging Face's tokenizers (PyPI), the reference.

Trains small byte-level BPEs with tokenizers on the licence texts of /usr/share/common-licenses (the bundled
corpus; a built-in text without it) and writes them in five forms: GPT-2's vocab.json + merges.txt (read by
GPT2BPETokenizer; reference: tokenizers' ByteLevelBPETokenizer over the same two files, which is GPT-2's
encoder.py) and four tokenizer.json files (read by HuggingFaceTokenizer; reference: tokenizers.Tokenizer over the
same file): GPT-2's (ByteLevel with its pattern), Llama-3's (Split by Llama-3's pattern, ByteLevel without one,
ignore_merges, a BOS added by TemplateProcessing), Qwen2's (NFC, Split by Qwen2's pattern, chat special tokens)
and RoBERTa's (add_prefix_space, <mask> with lstrip, RobertaProcessing). For every text: the ids equal the
reference's, decode(ids) equals its decode(ids, skip_special_tokens=False), and so do the decodes of random id
lists (invalid UTF-8 included); vocab_size and the eod are checked too, and files of other kinds (WordPiece,
Unigram, a Metaspace BPE) must be refused with one line naming the file and what it holds.
Usage: check_bpe_tokenizers.py TOKENIZE_TOOL WORKDIR. Exit 77 (CTest's skip) without tokenizers."""
import json
import os
import random
import subprocess
import sys

try:
    from tokenizers import (AddedToken, ByteLevelBPETokenizer, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
except ImportError:
    print('the Python package tokenizers is missing (pip install tokenizers): skipped')
    sys.exit(77)

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")

TEXTS = [
    '', 'Hello world!', "It's 2024; we've 3.14 reasons, don't we? I'll say: we'd... THEY'RE I'M YOU'VE 's 't",
    'a  b\t\tc\n\n  d   ', '   leading', 'trailing   ', '\n', ' ', '  ', '\t \n \r\n\r\n  x',
    '\u00a0nbsp\u3000ideographic\u2028ls\u2029ps\x85nel\x0bvt\x0cff\u1680ogham\u2000\u200aen\u202f\u205f',
    '\x1cfs\x1dgs\x1ers\x1fus\u200bzwsp\u180emvs',
    'naïve café Ωμέγα Привет мир 你好，世界！ 日本語のテキスト 한국어 텍스트 עברית العربية हिन्दी',
    'emoji 😀🎉 👨‍👩‍👧 🇩🇪 ✓ ✗ →', 'cafe\u0301 and café, Å vs A\u030a, ﬁ ligature, ｆｕｌｌ',
    'digits 0123456789 1234567 ١٢٣ ٤٥ ½ ² Ⅻ ⑤ 12,345.678', 'snake_case camelCase kebab-case x86_64 C++20 a.b.c',
    'tabs\tand\vvertical\fform', 'zzqx zzqxzzqx Zzqx', '<|endoftext|>', 'a<|endoftext|>b', 'x <|endoftext|> y',
    '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n', 'fill <mask> here, and <mask>there', '<s>x</s>',
    '<|begin_of_text|>hi', '\ue000 private \U000f0000 use', '`~!@#$%^&*()_+-=[]{}|;:",./<>?\\\'',
    "''''' ''s 'S", '    \n    code()\n        more()\n', 'a' * 300, ' '.join(['word'] * 50),
]

FALLBACK = ('The licence grants you the right to use, copy, modify and distribute the software, provided that the '
            'notice is kept. THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND. 1. Definitions. '
            '2. Grant of copyright licence. You may not use this file except in compliance with the License.\n') * 40


def corpus():
    root = '/usr/share/common-licenses'
    text = ''
    if os.path.isdir(root):
        for name in sorted(os.listdir(root))[:8]:
            path = os.path.join(root, name)
            if os.path.isfile(path):
                text += open(path, encoding='utf-8', errors='replace').read() + '\n'
    text = text[:400000] or FALLBACK
    # Some non-ASCII so that merges of multi-byte characters exist too.
    extra = ('naïve café Привет мир 你好世界 日本語 😀 zzqx ' * 20 + '\n') * 5
    return text + extra


def train_bytelevel(lines, vocab, special):
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(lines, vocab_size=vocab, min_frequency=2, special_tokens=special, show_progress=False)
    return tok


def train_split(lines, pattern, vocab, special, normalizer=None):
    tok = Tokenizer(models.BPE())
    if normalizer:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior='isolated', invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    return tok


def edit_json(path, fn):
    j = json.load(open(path, encoding='utf-8'))
    fn(j)
    json.dump(j, open(path, 'w', encoding='utf-8'), ensure_ascii=False)


def make_files(work, lines):
    files = {}
    # GPT-2: vocab.json + merges.txt, and the same model as tokenizer.json.
    gpt2 = train_bytelevel(lines, 700, ['<|endoftext|>'])
    d = os.path.join(work, 'gpt2')
    os.makedirs(d, exist_ok=True)
    gpt2.save_model(d)
    gpt2.save(os.path.join(d, 'tokenizer.json'))
    files['gpt2'] = d
    # Llama-3 style: its pattern, ignore_merges with a whole word in the vocabulary that no merge builds, a BOS.
    llama = train_split(lines, LLAMA3, 600, ['<|begin_of_text|>', '<|end_of_text|>'])
    bos = llama.token_to_id('<|begin_of_text|>')
    llama.post_processor = processors.TemplateProcessing(single='<|begin_of_text|> $A',
                                                         special_tokens=[('<|begin_of_text|>', bos)])
    d = os.path.join(work, 'llama3')
    os.makedirs(d, exist_ok=True)
    llama.save(os.path.join(d, 'tokenizer.json'))

    def llama_edit(j):
        j['model']['ignore_merges'] = True
        n = max(j['model']['vocab'].values()) + 1
        j['model']['vocab']['zzqx'] = n  # tokens that no merge builds
        j['model']['vocab']['ĠZzqx'] = n + 1
    edit_json(os.path.join(d, 'tokenizer.json'), llama_edit)
    files['llama3'] = d
    # Qwen2 style: NFC, its pattern, chat tokens; tokenizer_config.json names the eos.
    qwen = train_split(lines, QWEN2, 600, ['<|endoftext|>', '<|im_start|>', '<|im_end|>'], normalizers.NFC())
    d = os.path.join(work, 'qwen2')
    os.makedirs(d, exist_ok=True)
    qwen.save(os.path.join(d, 'tokenizer.json'))
    json.dump({'eos_token': '<|im_end|>'}, open(os.path.join(d, 'tokenizer_config.json'), 'w'))
    files['qwen2'] = d
    # RoBERTa style: add_prefix_space, <mask> with lstrip, <s> A </s>.
    rob = ByteLevelBPETokenizer(add_prefix_space=True)
    rob.train_from_iterator(lines, vocab_size=650, min_frequency=2, special_tokens=['<s>', '<pad>', '</s>', '<unk>'],
                          show_progress=False)
    rob.add_special_tokens([AddedToken('<mask>', lstrip=True)])
    rob.post_processor = processors.RobertaProcessing(('</s>', rob.token_to_id('</s>')),
                                                      ('<s>', rob.token_to_id('<s>')))
    d = os.path.join(work, 'roberta')
    os.makedirs(d, exist_ok=True)
    rob.save(os.path.join(d, 'tokenizer.json'))
    files['roberta'] = d
    return files


def run_tool(tool, args, payload):
    p = subprocess.run([tool] + args, input=json.dumps(payload), capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def compare(tool, name, args, ref, texts, eod_token):
    rng = random.Random(7)
    vocab = ref.get_vocab_size(with_added_tokens=True)
    random_ids = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 12))] for _ in range(300)]
    rc, out, err = run_tool(tool, args, {'texts': texts, 'decode': random_ids})
    assert rc == 0, f'{name}: tokenize_tool failed ({rc}): {err}'
    got = json.loads(out)
    bad = 0
    for t, ids, rt in zip(texts, got['encoded'], got['roundtrip']):
        want = ref.encode(t).ids
        if ids != want:
            bad += 1
            print(f'{name}: ids differ for {t[:60]!r}:\n  ours {ids[:30]}\n  ref  {want[:30]}')
        want_text = ref.decode(want, skip_special_tokens=False)
        if rt != want_text:
            bad += 1
            print(f'{name}: decode differs for {t[:60]!r}: {rt[:60]!r} vs {want_text[:60]!r}')
    for ids, text in zip(random_ids, got['decoded']):
        want = ref.decode(ids, skip_special_tokens=False)
        if text != want:
            bad += 1
            print(f'{name}: decode of {ids} differs: {text!r} vs {want!r}')
    if got['vocab_size'] != vocab:
        bad += 1
        print(f'{name}: vocab_size {got["vocab_size"]} vs {vocab}')
    want_eod = ref.token_to_id(eod_token) if eod_token else -1
    if got['eod'] != want_eod:
        bad += 1
        print(f'{name}: eod {got["eod"]} vs {want_eod} ({eod_token})')
    n_ids = sum(len(i) for i in got['encoded'])
    print(f'{name}: {len(texts)} texts ({n_ids} ids), {len(random_ids)} random id lists: '
          f'{"all equal" if bad == 0 else f"{bad} differences"} ({got["describe"]})')
    return bad


def expect_refused(tool, work, name, tok, words):
    path = os.path.join(work, name + '.json')
    tok.save(path)
    rc, _, err = run_tool(tool, ['HuggingFaceTokenizer', path, '', ''], {'texts': []})
    lines = err.strip().splitlines()
    ok = rc == 2 and len(lines) == 1 and path in lines[0] and all(w in lines[0] for w in words)
    print(f'{name}: {"refused" if ok else "NOT REFUSED AS EXPECTED"}: {err.strip()}')
    return 0 if ok else 1


def main():
    tool, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    text = corpus()
    lines = text.splitlines()
    files = make_files(work, lines)
    texts = TEXTS + [text[:20000], '\n'.join(lines[100:160])]
    bad = 0
    g = files['gpt2']
    vocab, merges = os.path.join(g, 'vocab.json'), os.path.join(g, 'merges.txt')
    bad += compare(tool, 'GPT2BPETokenizer (vocab.json, merges.txt)', ['GPT2BPETokenizer', '', vocab, merges],
                   ByteLevelBPETokenizer(vocab, merges), texts, '<|endoftext|>')
    for name, eod in [('gpt2', '<|endoftext|>'), ('llama3', '<|end_of_text|>'), ('qwen2', '<|im_end|>'),
                      ('roberta', '</s>')]:
        path = os.path.join(files[name], 'tokenizer.json')
        bad += compare(tool, f'HuggingFaceTokenizer ({name} style)', ['HuggingFaceTokenizer', files[name], '', ''],
                       Tokenizer.from_file(path), texts, eod)
    # The Llama-3 file must really use ignore_merges: its whole-word tokens come out as one id.
    llama = Tokenizer.from_file(os.path.join(files['llama3'], 'tokenizer.json'))
    assert llama.encode('zzqx').ids[1:] == [llama.token_to_id('zzqx')], llama.encode('zzqx').ids
    # Other kinds of tokenizer.json are refused.
    wp = Tokenizer(models.WordPiece(unk_token='[UNK]'))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    wp.train_from_iterator(lines[:200], trainers.WordPieceTrainer(vocab_size=200, special_tokens=['[UNK]'],
                                                                  show_progress=False))
    bad += expect_refused(tool, work, 'wordpiece', wp, ['WordPiece', 'BPE'])
    uni = Tokenizer(models.Unigram())
    uni.train_from_iterator(lines[:200], trainers.UnigramTrainer(vocab_size=100, show_progress=False))
    bad += expect_refused(tool, work, 'unigram', uni, ['Unigram'])
    meta = Tokenizer(models.BPE(unk_token='<unk>'))
    meta.pre_tokenizer = pre_tokenizers.Metaspace()
    meta.train_from_iterator(lines[:200], trainers.BpeTrainer(vocab_size=300, special_tokens=['<unk>'],
                                                              show_progress=False))
    bad += expect_refused(tool, work, 'metaspace', meta, ['Metaspace'])
    if bad:
        print(f'FAILED: {bad} differences')
        sys.exit(1)
    print('BPE_TOKENIZERS_OK')


if __name__ == '__main__':
    main()
