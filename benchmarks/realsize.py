"""Real-size fixture (issue 15): a Qwen3-0.6B-dimension checkpoint, random weights, as published.

    python benchmarks/realsize.py write /tmp/realsize-fx       # bf16, 3 shards + index;
                                                               # z-lab drafter
    /usr/bin/time -v dflash-edge export --target /tmp/realsize-fx/target \\
        --draft /tmp/realsize-fx/draft --out /tmp/realsize-fx/bundle --max-context 512 --force
    python benchmarks/realsize.py run /tmp/realsize-fx/bundle  # lossless check, speed,
                                                               # loaded-bundle memory

No weights are committed: `write` generates them (seeded) tensor by tensor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def write(out: Path, draft_layers: int, layers: int) -> None:
    from published import PUBLISHED, write_target, write_zlab_drafter, zlab_config

    cfg = {**PUBLISHED["Qwen3-0.6B"]}
    if layers:  # fewer layers at the same width (scripts/gpu/check.sh: a quicker export)
        cfg.update(num_hidden_layers=layers, max_window_layers=layers)
    t = time.perf_counter()
    write_target(out / "target", cfg, shards=3)
    write_zlab_drafter(
        out / "draft", zlab_config(cfg, num_layers=draft_layers, mask_token_id=151669)
    )
    sizes = {p.name: p.stat().st_size for p in sorted((out / "target").glob("*.safetensors"))}
    print(
        json.dumps(
            {
                "seconds": round(time.perf_counter() - t, 1),
                "target_shards": sizes,
                "draft_bytes": (out / "draft" / "model.safetensors").stat().st_size,
            },
            indent=1,
        )
    )


def _mem_mb() -> dict:
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("Rss", "Pss", "Anonymous"):
                out[key] = int(line.split()[1]) // 1024
    return out


def run(bundle: Path, prompts: int, new_tokens: int, share: bool, provider: str) -> None:
    import numpy as np

    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.bundle import read_bundle

    b = read_bundle(bundle, verify=False)
    files = {f["path"]: f["bytes"] for g in b.manifest["graphs"].values() for f in g["files"]}
    unique = sum(v for k, v in files.items() if k.endswith(".data"))
    before = _mem_mb()
    gen = Generator.load(b, provider, share_weights=share)
    loaded = _mem_mb()
    rng = np.random.default_rng(0)
    rows, identical = [], True
    for i in range(prompts):
        ids = [int(x) for x in rng.integers(100, 4000, size=24)]
        timings = {}
        for use in ("none", "drafter"):  # interleaved, side by side
            t = time.perf_counter()
            res = gen.generate_ids(ids, max_new_tokens=new_tokens, draft=use, stop_token_ids=[])
            timings[use] = (time.perf_counter() - t, res)
        plain, spec = timings["none"][1], timings["drafter"][1]
        identical &= plain.token_ids == spec.token_ids
        rows.append(
            {
                "plain_s": timings["none"][0],
                "spec_s": timings["drafter"][0],
                "tau": spec.stats.mean_acceptance_length,
                "tokens": len(plain.token_ids),
            }
        )
    report = {
        "provider": provider,
        "share_weights": share,
        "lossless_greedy_identical": identical,
        "prompts": prompts,
        "new_tokens": new_tokens,
        "median_plain_tok_s": round(statistics.median(r["tokens"] / r["plain_s"] for r in rows), 2),
        "median_spec_tok_s": round(statistics.median(r["tokens"] / r["spec_s"] for r in rows), 2),
        "median_tau": round(statistics.median(r["tau"] for r in rows), 3),
        "unique_weight_mb": round(unique / 1e6),
        "rss_before_load_mb": before["Rss"],
        "rss_loaded_mb": loaded["Rss"],
        "pss_loaded_mb": loaded["Pss"],
        "anon_loaded_mb": loaded["Anonymous"],
        "rss_after_runs_mb": _mem_mb()["Rss"],
        "kv_cache_mb": round((gen.target.kv.nbytes + gen.drafter.kv.nbytes) / 1e6),
    }
    print(json.dumps(report, indent=1))
    if not identical:
        raise SystemExit("speculative output differs from plain greedy decoding: NOT lossless")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("out", type=Path)
    w.add_argument("--draft-layers", type=int, default=5)
    w.add_argument("--layers", type=int, default=0, help="target layers (0: Qwen3-0.6B's 28)")
    r = sub.add_parser("run")
    r.add_argument("bundle", type=Path)
    r.add_argument("--prompts", type=int, default=3)
    r.add_argument("--new-tokens", type=int, default=32)
    r.add_argument(
        "--no-share", action="store_true", help="load the shared embedding once per session"
    )
    r.add_argument("--provider", default="cpu", help="cpu | cuda | tensorrt")
    args = p.parse_args()
    if args.cmd == "write":
        write(args.out, args.draft_layers, args.layers)
    else:
        run(args.bundle, args.prompts, args.new_tokens, not args.no_share, args.provider)
    return 0


if __name__ == "__main__":
    sys.exit(main())
