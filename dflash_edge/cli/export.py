"""`dflash-edge export`: target + drafter -> bundle (`--precision` other than fp32: export, then quantise)."""
from __future__ import annotations

from dflash_edge.runtime.errors import DflashEdgeError

from dflash_edge.export.exporter import ExportOptions, export_bundle

SHORTEST_CHAT = [{"role": "user", "content": "Hi"}]


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
    p.add_argument("--no-fused", action="store_true",
                   help="write only the portable target graph (no GroupQueryAttention `target_fused` flavour)")
    p.add_argument("--torch-export", action="store_true",
                   help="trace the graphs with torch.onnx.export (the first writer; peak memory ~2.4-5x the "
                        "exported weights) instead of writing them node by node from the checkpoint's shards")
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
                         memory_check=not args.no_memory_check, stream=not args.torch_export)
    if args.precision == "fp32" and args.kv_cache == "fp32":
        export_bundle(opts)
    else:
        from dflash_edge.quantize.bundle_quant import export_quantized

        export_quantized(export_bundle, opts, args.precision, kv_cache=args.kv_cache)
    return 0


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
