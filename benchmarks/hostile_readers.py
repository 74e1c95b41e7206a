"""Hostile variants of real checkpoint files: the error line and peak RSS of reading each.

    python benchmarks/hostile_readers.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --raw \
        --safetensors ~/.cache/dflash-edge/models/smollm2-135m-instruct/model.safetensors

Each variant is read in a fresh subprocess (peak RSS = VmHWM in /proc/self/status). GGUF:
`open_gguf` and the importer's tensor-name table (sized by block_count); `--raw` also runs bare
`gguf.GGUFReader` (stopped after 30 s, 4 GB address-space cap). safetensors: `Checkpoint.open`
on a folder holding the variant. One JSON line per variant.
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

OURS_GGUF = """
from dflash_edge.models import gguf_import as g
p = Path(sys.argv[1])
try:
    r = g.open_gguf(p)
    arch = g.architecture(r, p)
    g.check_tensor_table(r, arch, p)
    out = f"read: {len(r.tensors)} tensors"
except DflashEdgeError as err:
    out = f"{type(err).__name__}: {err}"
"""
OURS_ST = """
from dflash_edge.models.checkpoint import Checkpoint
try:
    out = f"read: {len(Checkpoint.open(Path(sys.argv[1]).parent).names())} tensors"
except DflashEdgeError as err:
    out = f"{type(err).__name__}: {err}"
"""
RAW_GGUF = """
import resource, threading, gguf
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
def stop():
    print(repr("still looping after 30 s (stopped)")); print(hwm(), flush=True)
    os._exit(0)
threading.Timer(30, stop).start()
try:
    out = f"read: {len(gguf.GGUFReader(sys.argv[1]).tensors)} tensors"
except BaseException as err:
    out = f"{type(err).__name__}: {str(err)[:100]}"
"""
HEAD = """
import os, sys
from pathlib import Path
from dflash_edge.runtime.errors import DflashEdgeError
def hwm():
    kb = next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]
    return int(kb) * 1024
"""
TAIL = """
print(repr(out)); print(hwm(), flush=True)
os._exit(0)
"""


def gguf_variants(data: bytes) -> dict[str, bytes]:
    """name -> bytes of each hostile GGUF; offsets found with gguf.GGUFReader on the intact one."""
    import gguf

    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(data)
        f.flush()
        r = gguf.GGUFReader(f.name)
        at = lambda part: part.ctypes.data - r.data.ctypes.data  # noqa: E731
        arch = r.fields["general.architecture"].contents()
        items = at(r.fields["tokenizer.ggml.token_type"].parts[3])  # item type, then length
        layers = at(r.fields[f"{arch}.block_count"].parts[-1])
        t = next(t for t in r.tensors if len(t.shape) == 2)
        dims = at(t.field.parts[3])
    return {
        "intact": data,
        "truncated to half": data[: len(data) // 2],
        "tensor count 2**60": _put(data, 8, "<Q", 2**60),
        "metadata count 2**60": _put(data, 16, "<Q", 2**60),
        "token_type: 2**40 uint8 items": _put(data, items, "<IQ", 0, 2**40),
        f"{t.name} dims[0] 2**40": _put(data, dims, "<Q", 2**40),
        f"{t.name} dims 2**32 x 2**32": _put(data, dims, "<QQ", 2**32, 2**32),
        f"{arch}.block_count 2**32-1": _put(data, layers, "<I", 2**32 - 1),
    }


def safetensors_variants(data: bytes) -> dict[str, bytes]:
    """name -> bytes of each hostile safetensors file (its first tensor's entry inflated)."""
    (n,) = struct.unpack("<Q", data[:8])
    header, body = json.loads(data[8 : 8 + n]), data[8 + n :]
    name = next(k for k in header if k != "__metadata__")

    def edited(key: str, value) -> bytes:
        h = json.loads(json.dumps(header))
        h[name][key] = value
        text = json.dumps(h).encode()
        return struct.pack("<Q", len(text)) + text + body

    return {
        "intact": data,
        "truncated to half": data[: len(data) // 2],
        "header length 2**62": struct.pack("<Q", 2**62) + data[8:],
        f"{name} shape 2**32 x 2**32": edited("shape", [2**32, 2**32]),
        f"{name} end offset 2**40": edited("data_offsets", [0, 2**40]),
    }


def _put(data: bytes, offset: int, fmt: str, *values) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, *values)
    return bytes(b)


def measure(code: str, path: Path) -> tuple[str, int]:
    """(error line or "read: ...", peak RSS in bytes) of `code` reading `path` in a child."""
    cmd = [sys.executable, "-c", HEAD + code + TAIL, str(path)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "still running after 60 s (killed)", 0
    lines = run.stdout.split("\n")
    if run.returncode or len(lines) < 2:
        return f"exit {run.returncode}: {run.stderr.strip().splitlines()[-1:]}", 0
    return eval(lines[0]), int(lines[1])  # noqa: S307 (the child's repr of a str)


def report(kind: str, variants: dict[str, bytes], ours: str, raw: str | None, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        for variant, blob in variants.items():
            path.write_bytes(blob)
            line, peak = measure(ours, path)
            row = {
                "file": kind,
                "variant": variant,
                "file_MB": round(len(blob) / 1e6, 1),
                "peak_MB": round(peak / 1e6, 1),
                "result": line,
            }
            if raw:
                row["raw"], raw_peak = measure(raw, path)
                row["raw_peak_MB"] = round(raw_peak / 1e6, 1)
            print(json.dumps(row, ensure_ascii=False), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--safetensors", type=Path)
    ap.add_argument("--raw", action="store_true", help="also read each GGUF with bare GGUFReader")
    args = ap.parse_args()
    if args.gguf:
        report(
            "gguf",
            gguf_variants(args.gguf.read_bytes()),
            OURS_GGUF,
            RAW_GGUF if args.raw else None,
            "hostile.gguf",
        )
    if args.safetensors:
        report(
            "safetensors",
            safetensors_variants(args.safetensors.read_bytes()),
            OURS_ST,
            None,
            "model.safetensors",
        )


if __name__ == "__main__":
    main()
