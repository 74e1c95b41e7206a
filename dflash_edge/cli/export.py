"""`dflash-edge export`: target + drafter -> bundle (`--precision` other than fp32: export, then quantise).

Chaining export -> quantize is this module's job (export/ and quantize/ never import each other); so is
the one line on the bundle's TensorRT readiness (engines/) printed after a successful export.
"""
from __future__ import annotations

import sys
from pathlib import Path

from dflash_edge.runtime.errors import DflashEdgeError

from dflash_edge.export.exporter import ExportOptions, export_bundle

SHORTEST_CHAT = [{"role": "user", "content": "Hi"}]


def add_arguments(p) -> None:
    from dflash_edge.quantize.precisions import PRECISIONS

    from .common import add_model_args

    p.add_argument("--out", required=True, help="bundle directory to create")
    add_model_args(p)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--prefill-chunk", type=int, default=64)
    p.add_argument("--force", action="store_true", help="replace an existing bundle")
    p.add_argument("--draft-vocab", type=int, default=0,
                   help="draft only the N most frequent tokens (needs the drafter's draft_vocab.json; 0: all)")
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime-vs-torch parity check")
    p.add_argument("--no-fused", action="store_true",
                   help="write only the portable target graph (no GroupQueryAttention `target_fused` flavour)")
    p.add_argument("--no-memory-check", action="store_true",
                   help="start even when the estimated peak memory exceeds what is available")
    p.add_argument("--precision", default=None, choices=PRECISIONS,
                   help="then quantise target and drafter to this precision (`dflash-edge quantize`, with its "
                        "report); default fp32, or the plan's choice with --device")
    from dflash_edge.quantize.int8_cache import KV_CACHES

    p.add_argument("--kv-cache", default="fp32", choices=KV_CACHES,
                   help="the fused target's KV cache (int8: `dflash-edge quantize --kv-cache int8` after export)")
    p.add_argument("--device", default=None, help="plan for this device profile (`dflash-edge devices`): take the "
                                                  "precision and max context that fit, or refuse naming what would fit")


def run(args) -> int:
    if args.device:                                   # the device plan picks the precision and context that fit
        from dflash_edge.quantize.precisions import PRECISIONS

        from .device_plan import choose_for_device
        from dflash_edge.models.fetch import resolve_target

        target_dir = resolve_target(None if args.target == "default" else args.target)
        args.precision, args.max_context = choose_for_device(args.device, target_dir, args.draft, args.block_size,
                                                             args.max_context, (args.precision,) if args.precision
                                                             else PRECISIONS)
    args.precision = args.precision or "fp32"
    check_up_front(args)
    opts = ExportOptions(out=args.out, target=args.target, draft=args.draft, block_size=args.block_size,
                         max_context=args.max_context, prefill_chunk=args.prefill_chunk, force=args.force,
                         verify=not args.no_verify, draft_vocab=args.draft_vocab, fused=not args.no_fused,
                         memory_check=not args.no_memory_check)
    if args.precision == "fp32" and args.kv_cache == "fp32":
        out = export_bundle(opts)
    else:
        out = export_quantized(opts, args.precision, kv_cache=args.kv_cache)
    print(trt_readiness_line(out), file=sys.stderr)
    return 0


def export_quantized(opts: ExportOptions, precision: str, report=None, kv_cache: str = "fp32") -> Path:
    """`export --precision`: export an fp32 bundle into a temp folder beside `opts.out`, quantise it into `opts.out`.

    `report` (quantize.quality.ReportOptions) defaults to the full quality report; the fp32 bundle is removed.
    """
    import dataclasses
    import shutil
    import tempfile

    from dflash_edge.quantize.bundle_quant import QuantizeOptions, quantize_bundle
    from dflash_edge.quantize.precisions import QuantizeError, check_precision
    from dflash_edge.quantize.quality import ReportOptions

    check_precision(precision)
    out = Path(opts.out).expanduser()
    if out.exists() and not opts.force:
        raise QuantizeError(f"{out} already exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.fp32-", dir=out.parent))
    try:
        fp32 = export_bundle(dataclasses.replace(opts, out=tmp / "fp32", force=True))
        return quantize_bundle(QuantizeOptions(fp32, out, target=precision, draft=precision, force=opts.force,
                                               report=report or ReportOptions(), kv_cache=kv_cache))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def trt_readiness_line(bundle: Path) -> str:
    """One line: can TensorRT parse the bundle's portable graphs (engines.readiness), and if not, what stops it."""
    from dflash_edge.engines.readiness import bundle_trt_readiness

    summary = bundle_trt_readiness(bundle)
    head = f"TensorRT {summary['tensorrt_version']} readiness of {', '.join(summary['graphs'])}"
    if summary["ok"]:
        return f"{head}: ok (`dflash-edge build-engines {bundle}` on a GPU machine)"
    problems = [f"{n}: {p}" for n, g in summary["graphs"].items() for p in g["problems"]]
    return f"{head}: not ready ({len(problems)} problem(s); the first, {problems[0]})"


def check_up_front(args) -> None:
    """A one-word chat prompt must fit the context (ranges: cli.py), before ~30 s of loading the models."""
    from dflash_edge.runtime.tokenizer import ChatTokenizer

    from dflash_edge.models.fetch import resolve_target

    tok = ChatTokenizer.from_dir(resolve_target(args.target))        # fetches the default model on first use
    n = len(tok.encode_chat(SHORTEST_CHAT) if tok.chat_template else tok.encode("Hi"))
    if n + args.block_size > args.max_context:
        raise DflashEdgeError(f"--max-context {args.max_context}: even the shortest chat prompt ({n} tokens with the "
                              f"chat template) plus one block of {args.block_size} does not fit; use --max-context "
                              f">= {n + args.block_size} (2048 is the default)")
