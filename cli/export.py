"""`dflash-edge export`: target + drafter -> bundle. Maps the arguments to `ExportOptions`; each
choice ("auto" precision, KV cache, device plan, drafter precision) is export/choices.py's, so
`export_bundle(ExportOptions(out=...))` writes the same bundle.
"""

from __future__ import annotations

from ..export.choices import AUTO
from ..export.device_plan import EXPORT_PRECISIONS
from ..export.exporter import ExportOptions, export_bundle
from .common import add_kv_cache_arg, add_model_args


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="bundle directory to create")
    add_model_args(p)
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="the draft/verify block (default: the drafter's trained block, at most 16)",
    )
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--prefill-chunk", type=int, default=64)
    p.add_argument("--force", action="store_true", help="replace an existing bundle")
    p.add_argument(
        "--draft-vocab",
        type=int,
        default=0,
        help="draft only the N most frequent tokens (needs the drafter's draft_vocab.json; 0: all)",
    )
    p.add_argument(
        "--no-verify", action="store_true", help="skip the onnxruntime-vs-torch parity check"
    )
    p.add_argument(
        "--no-fused",
        action="store_true",
        help="write only the portable target graph (no GroupQueryAttention `target_fused` flavour)",
    )
    p.add_argument(
        "--no-memory-check",
        action="store_true",
        help="start even when the estimated peak memory exceeds what is available",
    )
    p.add_argument(
        "--precision",
        default=AUTO,
        choices=(AUTO, *EXPORT_PRECISIONS),
        help="the target's weights, written as each tensor is read: int4 / int8 blocks "
        "(a GGUF source's own blocks exactly, others re-quantised), fp16, fp32; "
        "default auto: int4 for a low-bit GGUF source or a mixture-of-experts "
        "target, else fp32 (with --device: the plan's choice)",
    )
    p.add_argument(
        "--draft-precision",
        default=None,
        choices=EXPORT_PRECISIONS,
        help="the drafter's own layers (it borrows the target's embedding and head); default fp32 "
        "(fp16 with an fp16 target: that bundle is fp16 throughout); with a GPU / Jetson "
        "--device fp16 (int8 where fp16 overflows at parity)",
    )
    add_kv_cache_arg(p)
    p.add_argument(
        "--low-bit-ops",
        default=AUTO,
        choices=(AUTO, "standard", "tensorrt", "contrib"),
        help="int4/int8 weights: contrib (onnxruntime's MatMulNBits / GatherBlockQuantized, the "
        "source's own blocks: what a CPU runs), tensorrt (standard ONNX, re-quantised to "
        "TensorRT's weight-only rules: int4 blocks of 128, int8 per channel; slow on a CPU), "
        "standard (blocked DequantizeLinear, opset 21, the source's own blocks; "
        "onnxruntime fuses it into MatMulNBits); auto: tensorrt for a GPU / Jetson --device, "
        "else contrib",
    )
    p.add_argument(
        "--device",
        default=None,
        help="plan for this device profile (`dflash-edge devices`): take the "
        "precision and max context that fit (a CPU: the most precise; a GPU / Jetson: the "
        "fastest the planner sees, each candidate printed, with 16-bit KV caches), or refuse "
        "naming what would fit",
    )


def options_from(args) -> ExportOptions:
    """The `ExportOptions` the arguments name (nothing decided here: export/choices.py decides)."""
    return ExportOptions(
        out=args.out,
        target=args.target,
        draft=args.draft,
        block_size=args.block_size,
        max_context=args.max_context,
        prefill_chunk=args.prefill_chunk,
        force=args.force,
        verify=not args.no_verify,
        draft_vocab=args.draft_vocab,
        fused=not args.no_fused,
        memory_check=not args.no_memory_check,
        precision=args.precision,
        draft_precision=args.draft_precision,
        kv_cache=args.kv_cache,
        device=args.device,
        low_bit_ops=args.low_bit_ops,
    )


def run(args) -> int:
    export_bundle(options_from(args))
    return 0
