#!/usr/bin/env python3
"""Damages one tensor of a safetensors file in place, as the integrity tests need.

    st_tamper.py FILE flip TENSOR ELEMENT          XOR 0x40 into the top byte of a 4-byte element
    st_tamper.py FILE set-f32 TENSOR ELEMENT VALUE  set an F32 element (nan, -1, ...), checksums removed
    st_tamper.py FILE set-i64 TENSOR VALUE          set every I64 element, checksums removed
    st_tamper.py FILE set-i64-at TENSOR ELEMENT VALUE  set one I64 element, checksums removed

"checksums removed": the file is rewritten without its checksum tensors (*.xxh3) and metadata, as a
checkpoint saved before checksums were recorded, so that the loader's value checks are what refuse it.
"""
import json
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    return header, bytearray(raw[8 + hlen:])


def write(path, header, data):
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(data))


def strip_checksums(header, data):
    keep = sorted(((k, v) for k, v in header.items() if k != "__metadata__" and not k.endswith(".xxh3")),
                  key=lambda kv: kv[1]["data_offsets"][0])
    out, new, at = {}, bytearray(), 0
    meta = {k: v for k, v in header.get("__metadata__", {}).items() if k not in ("checksum", "checksum_block_elements")
            and not k.endswith(".xxh3")}
    if meta:
        out["__metadata__"] = meta
    for k, v in keep:
        b, e = v["data_offsets"]
        new += data[b:e]
        out[k] = dict(v, data_offsets=[at, at + e - b])
        at += e - b
    return out, new


def main():
    path, op = sys.argv[1], sys.argv[2]
    header, data = read(path)
    if op == "flip":
        name, k = sys.argv[3], int(sys.argv[4])
        data[header[name]["data_offsets"][0] + 4 * k + 3] ^= 0x40
    elif op == "set-f32":
        header, data = strip_checksums(header, data)
        name, k, v = sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
        at = header[name]["data_offsets"][0] + 4 * k
        data[at:at + 4] = struct.pack("<f", v)
    elif op == "set-i64":
        header, data = strip_checksums(header, data)
        name, v = sys.argv[3], int(sys.argv[4])
        b, e = header[name]["data_offsets"]
        for at in range(b, e, 8):
            data[at:at + 8] = struct.pack("<q", v)
    elif op == "set-i64-at":
        header, data = strip_checksums(header, data)
        name, k, v = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        at = header[name]["data_offsets"][0] + 8 * k
        data[at:at + 8] = struct.pack("<q", v)
    else:
        sys.exit(f"unknown operation {op}")
    write(path, header, data)


if __name__ == "__main__":
    main()
