"""Calibrate `devices plan` against this machine: planned vs measured peak RSS and decode/step
times.

Rounds interleave (a) this CPU's detection measurement (numpy copy bandwidth, fp32 matmul rate; in a
subprocess so its 256 MB of arrays stay out of this process's RSS) with (b) one plain and one
speculative greedy generation per prompt, so machine noise hits both alike. The plan uses the median
detected figures at the median decode position; peak RSS is this process's (the bench's measure).

    python benchmarks/plan_calibration.py BUNDLE [--limit 6] [--max-new-tokens 96] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys

from output import emit_json

MEASURE = (
    "import json; from dflash_edge.devices.detect import measure_cpu; "
    "print(json.dumps(measure_cpu(0.5)))"
)


def detect_once() -> dict:
    return json.loads(
        subprocess.run(
            [sys.executable, "-c", MEASURE], capture_output=True, text=True, check=True
        ).stdout
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from dflash_edge.cli.devices import bundle_request
    from dflash_edge.data import read_prompts as load_prompts
    from dflash_edge.devices.detect import detect_cpu
    from dflash_edge.devices.planner import plan
    from dflash_edge.runtime import Generator

    gen = Generator.load(args.bundle, provider="cpu")
    for use in ("drafter", "none"):
        gen.generate("Hello", max_new_tokens=8, draft=use)
    measured, ar_ms, spec_ms, positions, taus = [], [], [], [], []
    for i, row in enumerate(load_prompts(None, args.limit)):
        measured.append(detect_once())
        for use in ("none", "drafter") if i % 2 == 0 else ("drafter", "none"):
            s = gen.generate(row["prompt"], max_new_tokens=args.max_new_tokens, draft=use).stats
            (spec_ms if use == "drafter" else ar_ms).append(s.step_ms)
            if use == "none":
                positions.append(s.prompt_tokens + s.new_tokens // 2)
            else:
                taus.append(s.mean_acceptance_length)
    measured.append(detect_once())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    bw = statistics.median(m["bandwidth_gb_s"] for m in measured)
    tf = statistics.median(m["fp32_tflops"] for m in measured)
    profile = detect_cpu(measured={"bandwidth_gb_s": bw, "fp32_tflops": tf}).profile
    position = int(statistics.median(positions))
    req = bundle_request(
        argparse.Namespace(
            bundle=args.bundle,
            precision=None,
            block=None,
            context=position,
            tau=statistics.mean(taus),
        ),
        profile,
    )
    p = plan(req)
    sp = p["speed"]
    out = {
        "bundle": args.bundle,
        "rounds": len(ar_ms),
        "detected_bandwidth_gb_s": bw,
        "detected_fp32_tflops": tf,
        "bandwidth_samples": [m["bandwidth_gb_s"] for m in measured],
        "median_position": position,
        "peak_rss_mb": {
            "measured": round(peak_mb, 1),
            "planned": round(1e3 * p["memory"]["total_gb"], 1),
            "ratio": round(1e3 * p["memory"]["total_gb"] / peak_mb, 3),
        },
        "plain_ms_per_token": {
            "measured_median": round(statistics.median(ar_ms), 2),
            "planned": sp["decode"]["ms"],
            "ratio": round(sp["decode"]["ms"] / statistics.median(ar_ms), 3),
        },
        "spec_step_ms": {
            "measured_median": round(statistics.median(spec_ms), 2),
            "planned": round(sp["verify"]["ms"] + sp["draft"]["ms"], 2),
            "ratio": round(
                (sp["verify"]["ms"] + sp["draft"]["ms"]) / statistics.median(spec_ms), 3
            ),
        },
        "measured_tau": round(statistics.mean(taus), 3),
        "memory_components_gb": p["memory"]["components_gb"],
    }
    emit_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
