"""An independent reader of TensorBoard event files (the TFRecord container and the tensorflow.Event protobuf),
written from the formats' descriptions, for the tests of `ampipe train --tensorboard-dir` (docs/training.md).

TFRecord: uint64 length (little-endian), uint32 masked CRC-32C of the 8 length bytes, the payload, uint32 masked
CRC-32C of the payload; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8 mod 2^32. The CRC here is computed bit
by bit (no table), so it shares no code or method with the engine's table-driven one.
"""
import struct


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def records(path):
    """Yields the payloads of a TFRecord file; raises ValueError on a bad CRC or a truncated record."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if len_crc != masked(header):
            raise ValueError(f"{path}: length CRC mismatch at byte {pos}")
        start = pos + 12
        if start + length + 4 > len(data):
            raise ValueError(f"{path}: truncated record at byte {pos}")
        payload = data[start:start + length]
        (data_crc,) = struct.unpack("<I", data[start + length:start + length + 4])
        if data_crc != masked(payload):
            raise ValueError(f"{path}: payload CRC mismatch at byte {pos}")
        yield payload
        pos = start + length + 4


def _varint(buf, pos):
    value, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def fields(buf):
    """Generic protobuf decoding: a list of (field number, wire type, value), value bytes for wire types 1, 2, 5."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            val, pos = _varint(buf, pos)
        elif wire == 1:
            val, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            val, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            val, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.append((num, wire, val))
    if pos != len(buf):
        raise ValueError("protobuf message overruns its buffer")
    return out


def events(path):
    """Every Event of the file as a dict: wall_time, step, file_version (or None), scalars {tag: value}."""
    result = []
    for payload in records(path):
        ev = {"wall_time": None, "step": 0, "file_version": None, "scalars": {}}
        for num, wire, val in fields(payload):
            if num == 1 and wire == 1:
                ev["wall_time"] = struct.unpack("<d", val)[0]
            elif num == 2 and wire == 0:
                ev["step"] = val - (1 << 64) if val >= 1 << 63 else val
            elif num == 3 and wire == 2:
                ev["file_version"] = val.decode()
            elif num == 5 and wire == 2:  # Summary
                for snum, swire, sval in fields(val):
                    if snum != 1 or swire != 2:
                        continue
                    tag, simple = None, None
                    for vnum, vwire, vval in fields(sval):  # Value
                        if vnum == 1 and vwire == 2:
                            tag = vval.decode()
                        elif vnum == 2 and vwire == 5:
                            simple = struct.unpack("<f", vval)[0]
                    if tag is not None and simple is not None:
                        ev["scalars"][tag] = simple
        result.append(ev)
    return result


def scalars(path):
    """{tag: [(step, value), ...]} over the file, in file order."""
    out = {}
    for ev in events(path):
        for tag, value in ev["scalars"].items():
            out.setdefault(tag, []).append((ev["step"], value))
    return out
