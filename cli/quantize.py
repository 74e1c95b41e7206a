"""`dflash-edge quantize BUNDLE --out DIR --target P --draft P`: the bundle's model re-exported at
another precision (from the checkpoints its manifest records) + its quality report."""

from __future__ import annotations

from ..export.choices import AUTO
from ..export.kv_cache import KV_CACHES
from ..quantize.bundle_quant import QuantizeOptions, quantize_bundle
from ..quantize.precisions import PRECISIONS, QuantizeError, QuantSettings
from ..quantize.quality import ReportOptions


def add_arguments(p) -> None:
    p.add_argument("bundle", help="input bundle (re-exported from the checkpoints it records)")
    p.add_argument("--out", required=True, help="new bundle directory")
    p.add_argument(
        "--target",
        default="int8",
        help=f"precision of the target graph(s): {', '.join(PRECISIONS)} "
        f"(int8 default: int4 keeps only ~71%% top-1 agreement on SmolLM2, docs/BENCHMARKS.md)",
    )
    p.add_argument(
        "--draft", default="int8", help=f"precision of the drafter graph: {', '.join(PRECISIONS)}"
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument(
        "--target-checkpoint",
        default=None,
        help="the target checkpoint (dir, .gguf or hub id), when the one the bundle records is "
        "not here",
    )
    p.add_argument(
        "--draft-checkpoint",
        default=None,
        help="the drafter checkpoint (dir or hub id), when the one the bundle records is not here",
    )
    add_kv_cache_argument(p)
    add_settings_arguments(p)
    add_report_arguments(p)


def add_kv_cache_argument(p) -> None:
    p.add_argument(
        "--kv-cache",
        default=AUTO,
        choices=(AUTO, *KV_CACHES),
        help="the fused target's KV cache, as in export: int8 stores it in a quarter of the bytes "
        "with per-channel scales calibrated on held-out text (faster attention at long context "
        "on CPU); auto: int8 for int4/int8 targets, else fp32",
    )


def add_settings_arguments(p) -> None:
    d = QuantSettings()
    p.add_argument(
        "--group-size",
        type=int,
        default=d.block_size,
        help="weights per scale (int4/int8 groups along K; power of two >= 16)",
    )
    p.add_argument(
        "--accuracy-level",
        type=int,
        default=d.accuracy_level,
        help="MatMulNBits activation type: 4 int8 (fast on CPU), 0 unset (fp32)",
    )


def add_report_arguments(p) -> None:
    p.add_argument(
        "--report",
        action="store_true",
        default=True,
        help="measure quality against the input bundle and store quality.json (default)",
    )
    p.add_argument(
        "--no-report", dest="report", action="store_false", help="skip the quality report"
    )
    p.add_argument(
        "--report-positions",
        type=int,
        default=2048,
        help="teacher-forced positions (>= 2000 for docs)",
    )
    p.add_argument(
        "--report-prompts",
        default=None,
        help="JSONL with 'prompt' fields (default: held-out prompts)",
    )
    p.add_argument(
        "--report-speed-prompts",
        type=int,
        default=8,
        help="prompts for acceptance length and speed",
    )
    p.add_argument(
        "--threads", type=int, default=0, help="onnxruntime threads for the report (0: all CPUs)"
    )


def settings_from(args) -> QuantSettings:
    return QuantSettings(block_size=args.group_size, accuracy_level=args.accuracy_level)


def report_from(args):
    if not args.report:
        return None
    if args.report_positions < 1 or args.report_speed_prompts < 1:
        raise QuantizeError(
            "--report-positions and --report-speed-prompts must be >= 1 (or pass --no-report)"
        )
    return ReportOptions(
        positions=args.report_positions,
        accept_prompts=args.report_speed_prompts,
        prompts=args.report_prompts,
        threads=args.threads,
    )


def run(args) -> int:
    quantize_bundle(
        QuantizeOptions(
            bundle=args.bundle,
            out=args.out,
            target=args.target,
            draft=args.draft,
            force=args.force,
            settings=settings_from(args),
            report=report_from(args),
            kv_cache=args.kv_cache,
            source_target=args.target_checkpoint,
            source_draft=args.draft_checkpoint,
        )
    )
    return 0
