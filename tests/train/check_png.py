#!/usr/bin/env python3
"""Checks a loss plot written by `ampipe train --loss-plot` with an independent PNG reader (the standard library's
zlib): the signature, every chunk's CRC-32, the IHDR (8-bit RGB), the scanlines (filter 0), and that both curves are
drawn (training blue 31,119,180; validation orange 255,127,14). Usage: check_png.py FILE WIDTH HEIGHT"""
import struct
import sys
import zlib


def main():
    path, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    data = open(path, 'rb').read()
    assert data[:8] == b'\x89PNG\r\n\x1a\n', 'bad signature'
    at, chunks = 8, []
    while at < len(data):
        n, = struct.unpack('>I', data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + n]
        crc, = struct.unpack('>I', data[at + 8 + n:at + 12 + n])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, f'chunk {kind} CRC mismatch'
        chunks.append((kind, body))
        at += 12 + n
    assert chunks[0][0] == b'IHDR' and chunks[-1][0] == b'IEND', [c[0] for c in chunks]
    w, h, depth, ctype, comp, filt, inter = struct.unpack('>IIBBBBB', chunks[0][1])
    assert (w, h, depth, ctype, comp, filt, inter) == (width, height, 8, 2, 0, 0, 0), (w, h, depth, ctype)
    raw = zlib.decompress(b''.join(body for kind, body in chunks if kind == b'IDAT'))
    stride = 3 * w + 1
    assert len(raw) == h * stride, (len(raw), h * stride)
    counts = {'blue': 0, 'orange': 0}
    for y in range(h):
        assert raw[y * stride] == 0, f'row {y}: filter {raw[y * stride]}'
        row = raw[y * stride + 1:(y + 1) * stride]
        for x in range(w):
            px = tuple(row[3 * x:3 * x + 3])
            if px == (31, 119, 180):
                counts['blue'] += 1
            elif px == (255, 127, 14):
                counts['orange'] += 1
    assert counts['blue'] > w, counts        # a curve across the plot, drawn 3 px thick
    assert counts['orange'] > 50, counts     # the validation dots and segments
    print(f'{path}: {w} x {h} RGB, CRCs ok, {counts["blue"]} training and {counts["orange"]} validation pixels')


if __name__ == '__main__':
    main()
