"""Export from a GGUF two ways, each in its own process, and compare (issue 36, item 2):

  import: `dflash-edge fetch --gguf FILE` (float32 checkpoint + exact blocks), then
          `dflash-edge export --target NAME`
  stream: `dflash-edge export --target FILE` (tensors read from the file as they are written)

For each command: peak RSS (the child's ru_maxrss: the kernel's VmHWM), wall seconds, and the
bytes it left on disk (its cache folder and bundle). Then the bundles' files compared by the
sha256 their manifests record (graphs, weight data, tokenizer). Extra arguments go to both
exports. Prints one JSON object.

    python benchmarks/gguf_stream.py SmolLM2-135M-Instruct.Q4_1.gguf --work /tmp/gs
    python benchmarks/gguf_stream.py qwen.gguf --work /tmp/gs --kv-cache fp32
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "dflash_edge.cli"]


def run(cmd: list[str], home: Path) -> dict:
    """Run `cmd` with DFLASH_EDGE_HOME=`home`; its peak RSS (GB) and wall seconds."""
    env = {**os.environ, "DFLASH_EDGE_HOME": str(home)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(cmd)} failed (exit {os.waitstatus_to_exitcode(status)})")
    return {
        "peak_rss_gb": round(usage.ru_maxrss * 1024 / 1e9, 3),  # ru_maxrss: KiB on Linux
        "seconds": round(time.perf_counter() - t0, 1),
    }


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def checksums(bundle: Path) -> dict[str, str]:
    m = json.loads((bundle / "manifest.json").read_text())
    files = {f["path"]: f["sha256"] for g in m["graphs"].values() for f in g["files"]}
    return files | {f["path"]: f["sha256"] for f in m["tokenizer"]["checksums"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("--work", type=Path, required=True, help="scratch folder (emptied first)")
    args, export_args = p.parse_known_args()  # the rest: `export` arguments for both
    shutil.rmtree(args.work, ignore_errors=True)
    gguf = args.gguf.resolve()
    a, b = args.work / "import", args.work / "stream"
    report = {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "export_args": export_args}
    report["import.fetch"] = run([*CLI, "fetch", "--gguf", str(gguf), "--name", "m"], a / "home")
    report["import.export"] = run(
        [*CLI, "export", "--target", "m", "--out", str(a / "bundle"), *export_args], a / "home"
    )
    report["stream.export"] = run(
        [*CLI, "export", "--target", str(gguf), "--out", str(b / "bundle"), *export_args],
        b / "home",
    )
    for side in (a, b):
        report[f"{side.name}.cache_bytes"] = disk_bytes(side / "home")
        report[f"{side.name}.bundle_bytes"] = disk_bytes(side / "bundle")
    got, want = checksums(b / "bundle"), checksums(a / "bundle")
    report["files_compared"] = len(want)
    report["files_differing"] = sorted(f for f in set(got) | set(want) if got.get(f) != want.get(f))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
