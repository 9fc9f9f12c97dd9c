#!/usr/bin/env python3
"""Checks that shards of a dos-train run hold exactly their slice of the unsharded run's saved fp32
master parameters (same seed, same iterations): every tensor piece of every shard file, bit for bit.
Standard library only (the CI machine's python3 has no numpy).

    shard_check.py FULL.safetensors SHARD0.safetensors [SHARD1.safetensors ...]
"""
import json
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items()}
    return tensors, meta


def main():
    full, _ = load(sys.argv[1])
    covered = {name: 0 for name in full}
    for path in sys.argv[2:]:
        tensors, meta = load(path)
        for name, blob in tensors.items():
            offset = int(meta.get(name + ".offset", "0")) * 4
            want = full[name][offset:offset + len(blob)]
            if blob != want:
                print(f"{path}: tensor {name} (offset {offset // 4}) differs from the unsharded run")
                return 1
            covered[name] += len(blob)
    missing = [n for n, b in covered.items() if b != len(full[n])]
    if missing:
        print(f"the shards do not cover {len(missing)} tensor(s) exactly, e.g. {missing[0]}")
        return 1
    print(f"{len(sys.argv) - 2} shards hold exactly their slices of {len(full)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
