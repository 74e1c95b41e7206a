"""Peak RSS of one onnxruntime session of a bundle's portable target: after loading, and after one
40-token prefill, with MatMulNBits prepacking on (what export parity uses for low-bit graphs) or
off. Run once per setting (each in a fresh process: VmHWM only grows).

    python benchmarks/session_rss.py BUNDLE on
    python benchmarks/session_rss.py BUNDLE off
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import onnxruntime as ort


def vm(key: str) -> int:
    """/proc/self/status `key` (VmHWM, VmRSS) in MB (10^6 bytes)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(key))
    return int(line.split()[1]) * 1024 // 10**6  # the kernel counts kB of 1024 bytes


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("bundle", help="a bundle folder holding target.onnx")
    ap.add_argument("prepack", choices=("on", "off"), help="MatMulNBits prepacking")
    args = ap.parse_args()
    bundle, prepack = args.bundle, args.prepack == "on"
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(
        f"{bundle}/target.onnx", opts, providers=["CPUExecutionProvider"]
    )
    loaded = vm("VmHWM")
    d = json.load(open(f"{bundle}/manifest.json"))["model"]
    empty = np.zeros((0, d["num_layers"], d["num_kv_heads"], d["head_dim"]), np.float32)
    ids = np.arange(100, 140, dtype=np.int64)[None]  # [1, 40]
    feeds = {"input_ids": ids, "logits_from": np.array([0]), "start": np.array([0])}
    feeds.update(past_key=empty, past_value=empty)
    session.run(None, feeds)
    print(json.dumps({"prepack": prepack, "hwm_loaded_mb": loaded, "hwm_run_mb": vm("VmHWM")}))


if __name__ == "__main__":
    main()
