#!/usr/bin/env python3
"""Megatron's indexed dataset (PREFIX.bin + PREFIX.idx), written and read from its description alone, for the tests.

Independent of ampipe's C++: only struct and json. The format, from megatron/core/datasets/indexed_dataset.py
(_IndexWriter, _IndexReader, IndexedDatasetBuilder):
  .idx  b"MMIDIDX\\x00\\x00", version <Q 1, dtype code <B, sequence count <Q, document count <Q (the entries of the
        document index: documents + 1), then the sequence lengths (int32 each), the sequence pointers (int64 byte
        offsets into the .bin, the running sum of length * itemsize) and the document index (int64; starts at 0,
        document k is sequences [idx[k], idx[k+1]))
  .bin  every sequence's ids, one after the other, in the dtype
DType codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16.

Commands:
  write PREFIX [--dtype NAME] [--docs N] [--vocab V] [--eod ID] [--seed S] [--min-len A] [--max-len B]
        [--corrupt KIND]
      deterministic documents (ids in [0, V), lengths in [A, B], each ended by ID when given), one sequence each;
      KIND breaks the files: truncate-bin, bad-magic, bad-version, pointer-beyond, no-idx
  check-jsonl JSONL PREFIX [--key K] [--append-eod]
      the byte-level dataset preprocess_data.py's rules make of JSONL (key K: a document per line, its UTF-8 bytes,
      end of document 0 with --append-eod, empty documents kept, blank lines skipped), compared byte for byte with
      PREFIX.bin and PREFIX.idx
  read PREFIX
      prints the documents as JSON (one list of ids per document), read by the description above
  split PREFIX --split W --seq-length S
      prints Megatron's per-split window counts of one dataset: "T training / V validation / X test" (documents
      split by round(e_k * n), e the cumulative normalised weights; windows (tokens - 1) // S)
"""
import argparse
import json
import struct
import sys

CODES = {"uint8": (1, "B"), "int8": (2, "b"), "int16": (3, "h"), "int32": (4, "i"), "int64": (5, "q"),
         "float64": (6, "d"), "float32": (7, "f"), "uint16": (8, "H")}
BY_CODE = {code: (name, fmt) for name, (code, fmt) in CODES.items()}
MAGIC = b"MMIDIDX\x00\x00"


def pack(dtype, documents):
    """The .bin and .idx bytes of `documents` (each a list of sequences, each a list of ids)."""
    code, fmt = CODES[dtype]
    item = struct.calcsize("<" + fmt)
    lengths, pointers, doc_index, data = [], [], [0], bytearray()
    for doc in documents:
        for seq in doc:
            pointers.append(len(data))
            lengths.append(len(seq))
            data += struct.pack("<%d%s" % (len(seq), fmt), *seq)
        doc_index.append(len(lengths))
    assert len(data) == sum(lengths) * item
    idx = bytearray(MAGIC)
    idx += struct.pack("<Q", 1) + struct.pack("<B", code)
    idx += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_index))
    idx += struct.pack("<%di" % len(lengths), *lengths)
    idx += struct.pack("<%dq" % len(pointers), *pointers)
    idx += struct.pack("<%dq" % len(doc_index), *doc_index)
    return bytes(data), bytes(idx)


def unpack(prefix):
    idx = open(prefix + ".idx", "rb").read()
    data = open(prefix + ".bin", "rb").read()
    assert idx[:9] == MAGIC, "bad magic"
    (version,) = struct.unpack_from("<Q", idx, 9)
    assert version == 1
    name, fmt = BY_CODE[idx[17]]
    item = struct.calcsize("<" + fmt)
    n, m = struct.unpack_from("<QQ", idx, 18)
    lengths = struct.unpack_from("<%di" % n, idx, 34)
    pointers = struct.unpack_from("<%dq" % n, idx, 34 + 4 * n)
    doc_index = struct.unpack_from("<%dq" % m, idx, 34 + 12 * n)
    seqs = [list(struct.unpack_from("<%d%s" % (l, fmt), data, p)) for l, p in zip(lengths, pointers)]
    docs = [[t for s in seqs[doc_index[k]:doc_index[k + 1]] for t in s] for k in range(m - 1)]
    return name, seqs, docs


def lcg(seed):
    x = seed & 0xFFFFFFFF
    while True:
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        yield x


def cmd_write(a):
    r = lcg(a.seed)
    docs = []
    for _ in range(a.docs):
        n = a.min_len + next(r) % (a.max_len - a.min_len + 1)
        seq = [next(r) % a.vocab for _ in range(n)]
        if a.eod is not None:
            seq.append(a.eod)
        if a.dtype.startswith("float"):
            seq = [float(t) for t in seq]
        docs.append([seq])
    data, idx = pack(a.dtype, docs)
    if a.corrupt == "truncate-bin":
        data = data[:len(data) - 3]
    elif a.corrupt == "bad-magic":
        idx = b"MMIDIDY\x00\x00" + idx[9:]
    elif a.corrupt == "bad-version":
        idx = idx[:9] + struct.pack("<Q", 2) + idx[17:]
    elif a.corrupt == "pointer-beyond":  # the last sequence's pointer far past the .bin
        n = struct.unpack_from("<Q", idx, 18)[0]
        off = 34 + 4 * n + 8 * (n - 1)
        idx = idx[:off] + struct.pack("<q", len(data) * 4) + idx[off + 8:]
    open(a.prefix + ".bin", "wb").write(data)
    if a.corrupt != "no-idx":
        open(a.prefix + ".idx", "wb").write(idx)
    print("wrote %s.bin/.idx: %d documents, %d tokens, %s%s" % (a.prefix, len(docs), sum(len(d[0]) for d in docs),
                                                               a.dtype, ", " + a.corrupt if a.corrupt else ""))


def cmd_check_jsonl(a):
    docs = []
    for line in open(a.jsonl, encoding="utf-8"):
        if not line.strip():
            continue
        text = json.loads(line)[a.key]
        sentences = text if isinstance(text, list) else [text]
        seqs = [list(s.encode("utf-8")) for s in sentences if s]
        if seqs and a.append_eod:
            seqs[-1].append(0)  # the byte-level tokenizer's end of document
        docs.append(seqs)
    data, idx = pack("uint16", docs)
    got_data, got_idx = open(a.prefix + ".bin", "rb").read(), open(a.prefix + ".idx", "rb").read()
    for what, want, got in (("bin", data, got_data), ("idx", idx, got_idx)):
        if want != got:
            at = next((i for i in range(min(len(want), len(got))) if want[i] != got[i]), min(len(want), len(got)))
            print("%s.%s differs from the expected bytes at byte %d (%d bytes expected, %d written)" %
                  (a.prefix, what, at, len(want), len(got)))
            return 1
    # and read back through the reader: the documents are the texts' bytes (+ 0)
    _, _, back = unpack(a.prefix)
    want_docs = [[t for s in d for t in s] for d in docs]
    if back != want_docs:
        print("the documents read back differ from the texts")
        return 1
    print("ok: %d documents, %d tokens, %d + %d bytes identical" % (len(docs), sum(map(len, want_docs)), len(data),
                                                                   len(idx)))
    return 0


def cmd_read(a):
    name, _, docs = unpack(a.prefix)
    json.dump({"dtype": name, "documents": docs}, sys.stdout)
    print()


def cmd_split(a):
    _, seqs, _ = unpack(a.prefix)
    w = [float(x) for x in a.split.split(",")]
    w += [0.0] * (3 - len(w))
    w = [x / sum(w) for x in w]
    e = [0.0, w[0], w[0] + w[1], w[0] + w[1] + w[2]]
    n = len(seqs)
    counts = []
    for k in range(3):
        if e[k + 1] <= e[k]:
            counts.append(0)
            continue
        b, end = int(round(e[k] * n)), int(round(e[k + 1] * n))
        tokens = sum(len(s) for s in seqs[b:end])
        counts.append((tokens - 1) // a.seq_length if tokens > a.seq_length else 0)
    print("%d training / %d validation / %d test" % tuple(counts))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("prefix")
    w.add_argument("--dtype", default="uint16", choices=sorted(CODES))
    w.add_argument("--docs", type=int, default=100)
    w.add_argument("--vocab", type=int, default=500)
    w.add_argument("--eod", type=int)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--min-len", type=int, default=20)
    w.add_argument("--max-len", type=int, default=200)
    w.add_argument("--corrupt", choices=["truncate-bin", "bad-magic", "bad-version", "pointer-beyond", "no-idx"])
    c = sub.add_parser("check-jsonl")
    c.add_argument("jsonl")
    c.add_argument("prefix")
    c.add_argument("--key", default="text")
    c.add_argument("--append-eod", action="store_true")
    r = sub.add_parser("read")
    r.add_argument("prefix")
    s = sub.add_parser("split")
    s.add_argument("prefix")
    s.add_argument("--split", required=True)
    s.add_argument("--seq-length", type=int, required=True)
    a = p.parse_args()
    return {"write": cmd_write, "check-jsonl": cmd_check_jsonl, "read": cmd_read, "split": cmd_split}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
