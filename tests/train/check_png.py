#!/usr/bin/env python3
"""Checks a loss plot written by `ampipe train --loss-plot` with an independent PNG reader (the standard library's
zlib and the PNG filters written out here, not cairo's reader): the signature, every chunk's CRC-32, the IHDR (8-bit
RGB, the expected size), the file under 200 KB, the scanlines (filters 0-4 undone), and that both curves are drawn
(training blue 31,119,180; validation orange 255,127,14: pixels within 12 per channel of them, so cairo's
anti-aliased edges count only where they are nearly the colour). Usage: check_png.py FILE WIDTH HEIGHT"""
import os
import struct
import sys
import zlib


def unfilter(raw, w, h):
    """The PNG scanline filters (PNG spec, section 9) undone for 3 bytes per pixel; returns the rows."""
    stride, bpp, rows, prev = 3 * w, 3, [], bytearray(3 * w)
    for y in range(h):
        ft, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        assert ft <= 4, f'row {y}: filter {ft}'
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if ft == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ft == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ft == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(line)
        prev = line
    return rows


def main():
    path, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    data = open(path, 'rb').read()
    assert data[:8] == b'\x89PNG\r\n\x1a\n', 'bad signature'
    assert os.path.getsize(path) < 200 * 1024, f'{os.path.getsize(path)} bytes: not under 200 KB'
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
    assert len(raw) == h * (3 * w + 1), (len(raw), h * (3 * w + 1))
    colours = {'blue': (31, 119, 180), 'orange': (255, 127, 14)}
    counts = {k: 0 for k in colours}
    for row in unfilter(raw, w, h):
        for x in range(w):
            px = row[3 * x:3 * x + 3]
            for k, c in colours.items():
                if all(abs(px[i] - c[i]) <= 12 for i in range(3)):
                    counts[k] += 1
    assert counts['blue'] > w, counts        # a curve across the plot, 2 px wide
    assert counts['orange'] > 50, counts     # the validation dots and segments
    print(f'{path}: {w} x {h} RGB, CRCs ok, {len(data)} bytes, {counts["blue"]} training and {counts["orange"]} '
          'validation pixels')


if __name__ == '__main__':
    main()
