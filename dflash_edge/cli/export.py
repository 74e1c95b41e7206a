"""`dflash-edge export`: target + drafter -> bundle, its weights written at `--precision` as they are read.

`--precision auto` (the default) keeps a low-bit source low-bit: a checkpoint imported from a GGUF carries
its exact blocks (int4 for Q4_*), a mixture-of-experts target is written at int4, anything else in fp32. Every
precision (int4 / int8 / fp16 / fp32) is written by the exporter itself, tensor by tensor. The int8 KV cache
(`--kv-cache auto`: int8 for quantised targets) is calibrated on the written bundle. Chaining
export -> quantize is this module's job (export/ and quantize/ never import each other); so is the one line
on the bundle's TensorRT readiness (engines/) printed after a successful export.
"""
from __future__ import annotations

import sys
from pathlib import Path

from dflash_edge.devices.planner import default_draft_precision
from dflash_edge.runtime.errors import DflashEdgeError

from dflash_edge.export.exporter import ExportOptions, export_bundle

SHORTEST_CHAT = [{"role": "user", "content": "Hi"}]
AUTO = "auto"


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
    p.add_argument("--precision", default=None, choices=(AUTO, *PRECISIONS),
                   help="the target's weights, written as each tensor is read: int4 / int8 blocks (a GGUF source's "
                        "own blocks exactly, others re-quantised), fp16, fp32; default auto: int4 for a low-bit GGUF "
                        "source or a mixture-of-experts target, else fp32 (with --device: the plan's choice)")
    p.add_argument("--draft-precision", default=None, choices=PRECISIONS,
                   help="the drafter's own layers (it borrows the target's embedding and head); default fp32 "
                        "(fp16 with an fp16 target: that bundle is fp16 throughout)")
    from dflash_edge.quantize.int8_cache import KV_CACHES

    p.add_argument("--kv-cache", default=AUTO, choices=(AUTO, *KV_CACHES),
                   help="the fused target's KV cache; auto: int8 for int4/int8 targets (calibrated after export), "
                        "else fp32")
    p.add_argument("--device", default=None, help="plan for this device profile (`dflash-edge devices`): take the "
                                                  "precision and max context that fit, or refuse naming what would fit")


def run(args) -> int:
    if args.device:                                   # the device plan picks the precision and context that fit
        from dflash_edge.quantize.precisions import PRECISIONS

        from .device_plan import choose_for_device
        from dflash_edge.models.fetch import resolve_target

        target_dir = resolve_target(None if args.target == "default" else args.target)
        args.precision, args.max_context = choose_for_device(args.device, target_dir, args.draft, args.block_size,
                                                             args.max_context, (args.precision,)
                                                             if args.precision not in (None, AUTO) else PRECISIONS)
    check_up_front(args)
    precision = resolve_precision(args.precision, args.target)
    kv_cache = args.kv_cache if args.kv_cache != AUTO else ("fp32" if precision in ("fp32", "fp16") or args.no_fused
                                                            else "int8")
    opts = ExportOptions(out=args.out, target=args.target, draft=args.draft, block_size=args.block_size,
                         max_context=args.max_context, prefill_chunk=args.prefill_chunk, force=args.force,
                         verify=not args.no_verify, draft_vocab=args.draft_vocab, fused=not args.no_fused,
                         memory_check=not args.no_memory_check,
                         precision=precision,
                         draft_precision=args.draft_precision or default_draft_precision(precision))
    out = export_bundle(opts) if kv_cache == "fp32" else export_with_int8_cache(opts)
    print(trt_readiness_line(out), file=sys.stderr)
    return 0


def resolve_precision(precision: str | None, target: str | None) -> str:
    """`--precision auto`: int4 when the target checkpoint holds exact low-bit blocks (a GGUF import) or is a
    mixture of experts (onnxruntime's QMoE is its only expert kernel whose rows do not depend on the step's
    length: docs/BENCHMARKS.md), else fp32."""
    if precision not in (None, AUTO):
        return precision
    from dflash_edge.models.checkpoint import BLOCKS
    from dflash_edge.models.config import TargetConfig
    from dflash_edge.models.fetch import resolve_target

    path = resolve_target(None if target == "default" else target)
    low_bit = (path / BLOCKS).is_file() or bool(getattr(TargetConfig.from_json(path), "num_experts", 0))
    return "int4" if low_bit else "fp32"


def export_with_int8_cache(opts: ExportOptions, report=None) -> Path:
    """Export at `opts.precision` into a temp folder beside `opts.out`, then give its fused target the int8 KV cache
    (calibrated on the written graphs; every graph file copied as it is) into `opts.out`. `report`
    (quantize.quality.ReportOptions): its prompts and threads calibrate the cache, and a quality report is written."""
    import dataclasses
    import shutil
    import tempfile

    from dflash_edge.quantize.bundle_quant import QuantizeOptions, quantize_bundle
    from dflash_edge.quantize.precisions import QuantizeError
    from dflash_edge.runtime.bundle import read_bundle
    from dflash_edge.runtime.publish import publish_dir

    out = Path(opts.out).expanduser()
    if out.exists() and not opts.force:
        raise QuantizeError(f"{out} already exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        first = export_bundle(dataclasses.replace(opts, out=tmp / "bundle", force=True))
        if "target_fused" not in read_bundle(first, verify=False).manifest["graphs"]:     # e.g. a hybrid target:
            print("export: no fused target, so no int8 KV cache (its KV stays float32)", file=sys.stderr)
            publish_dir(first, out)                                                     # published as written
            return out
        return quantize_bundle(QuantizeOptions(first, out, target=opts.precision, draft=opts.draft_precision,
                                               force=opts.force, report=report, kv_cache="int8"))
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
    low_bit = any("MatMulNBits" in p or "GatherBlockQuantized" in p for p in problems)
    hint = ("; int4/int8 graphs use onnxruntime's MatMulNBits blocks (the CPU runtime's): for TensorRT export "
            "with --precision fp16") if low_bit else ""
    return f"{head}: not ready ({len(problems)} problem(s); the first, {problems[0]}){hint}"


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
