"""`dflash-edge export`: target + drafter -> bundle (`--precision` other than fp32: export, then quantise)."""
from __future__ import annotations

from .exporter import ExportOptions, export_bundle


def add_arguments(p) -> None:
    from dflash_edge.quantize.precisions import PRECISIONS

    p.add_argument("--out", required=True, help="bundle directory to create")
    p.add_argument("--target", default="default", help="checkpoint dir or 'default' (SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default="default", help="drafter dir, 'default' (shipped) or 'random'")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-context", type=int, default=2048)
    p.add_argument("--prefill-chunk", type=int, default=64)
    p.add_argument("--force", action="store_true", help="replace an existing bundle")
    p.add_argument("--draft-vocab", type=int, default=0,
                   help="draft only the N most frequent tokens (needs the drafter's draft_vocab.json; 0: all)")
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime-vs-torch parity check")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="then quantise target and drafter to this precision (`dflash-edge quantize`, with its report)")


def run(args) -> int:
    opts = ExportOptions(out=args.out, target=args.target, draft=args.draft, block_size=args.block_size,
                         max_context=args.max_context, prefill_chunk=args.prefill_chunk, force=args.force,
                         verify=not args.no_verify, draft_vocab=args.draft_vocab)
    if args.precision == "fp32":
        export_bundle(opts)
    else:
        from dflash_edge.quantize.bundle_quant import export_quantized

        export_quantized(export_bundle, opts, args.precision)
    return 0
