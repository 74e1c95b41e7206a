"""Bytes and time per verify step: new-block K/V write (our design) vs copying a full-cache output.

python benchmarks/kv_copy_cost.py [--layers 30 --kv-heads 3 --head-dim 64 --context 2048 \\
    --block 16]
"""

import argparse

import numpy as np
from timing import median_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    for name, default in (
        ("layers", 30),
        ("kv-heads", 3),
        ("head-dim", 64),
        ("context", 2048),
        ("block", 16),
    ):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args()
    rows = a.context + a.block
    k, v = (np.zeros((rows, a.layers, a.kv_heads, a.head_dim), np.float32) for _ in range(2))
    k2, v2 = np.zeros_like(k), np.zeros_like(v)
    new = np.ones((a.block, a.layers, a.kv_heads, a.head_dim), np.float32)
    per_pos = a.layers * a.kv_heads * a.head_dim * 4 * 2

    def write_block():
        k[100 : 100 + a.block] = new
        v[100 : 100 + a.block] = new

    def copy_full():
        np.copyto(k2, k)
        np.copyto(v2, v)

    print(f"K+V bytes per position: {per_pos:,}")
    print(f"new-block write: {a.block * per_pos:,} B, median {median_ms(write_block, 200):.3f} ms")
    print(f"full-cache copy: {rows * per_pos:,} B, median {median_ms(copy_full, 20):.1f} ms")


if __name__ == "__main__":
    main()
