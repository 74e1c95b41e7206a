"""`export_bundle`: target + drafter -> a bundle directory (ONNX graphs, tokenizer, manifest).

>>> export_bundle(ExportOptions(out="bundle/"))     # default target and drafter  # doctest: +SKIP
"""
from __future__ import annotations

import datetime
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dflash_edge.runtime import bundle as bundle_mod
from dflash_edge.runtime.errors import DflashEdgeError
from dflash_edge.runtime.io_tables import FLAVOURS, io_manifest, model_dims

from .publish import publish_dir

EXPORTER_VERSION = "0.1.0"
SAMPLE_SIZES = {"S": 5, "C": 3}          # dynamic dims' sizes while tracing (any value > 1 works)
PARITY_PROMPT = "Explain in two sentences why the sky is blue."


@dataclass
class ExportOptions:
    out: str | Path
    target: str | None = "default"       # checkpoint dir or "default"
    draft: str | None = "default"        # drafter dir, "default" (shipped) or "random"
    block_size: int = 16
    max_context: int = 2048
    prefill_chunk: int = 64
    force: bool = False
    verify: bool = True
    draft_vocab: int = 0                 # >0: the drafter's LM head over this many frequent tokens (draft_vocab.py)
    fused: bool = True                   # also write `target_fused` (GroupQueryAttention) where the model allows


def _check_options(opts: ExportOptions, target, drafter) -> None:
    trained = drafter.config.block_size
    if opts.block_size < 2:
        raise DflashEdgeError(f"--block-size {opts.block_size} < 2: a block is the last token plus >= 1 mask")
    if opts.block_size > trained:
        raise DflashEdgeError(f"--block-size {opts.block_size} is larger than the drafter was trained for "
                              f"({trained}); use --block-size <= {trained}")
    limit = target.config.max_position_embeddings
    if opts.max_context + opts.block_size > limit:
        raise DflashEdgeError(f"--max-context {opts.max_context} (+ block {opts.block_size} slack) exceeds the "
                              f"model's {limit} positions; use --max-context <= {limit - opts.block_size}")
    if opts.prefill_chunk < 1:
        raise DflashEdgeError(f"--prefill-chunk {opts.prefill_chunk} must be >= 1")


def _manifest(target, drafter, tok_files, graphs, opts, sources) -> dict:
    tc, dc = target.config, drafter.config
    return {
        "format": bundle_mod.FORMAT, "manifest_version": bundle_mod.MANIFEST_VERSION,
        "exporter_version": EXPORTER_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": {"family": tc.model_type, "vocab_size": tc.vocab_size, "hidden_size": tc.hidden_size,
                  "num_layers": tc.num_hidden_layers, "num_heads": tc.num_attention_heads,
                  "num_kv_heads": tc.num_key_value_heads, "head_dim": tc.head_dim,
                  "draft_num_layers": dc.num_hidden_layers, "target_layer_ids": list(dc.target_layer_ids),
                  "mask_token_id": dc.mask_token_id, "draft_vocab_size": opts.draft_vocab or tc.vocab_size,
                  "eos_token_ids": list(tc.eos_token_id),
                  "bos_token_id": tc.bos_token_id, "max_position_embeddings": tc.max_position_embeddings},
        "block_size": opts.block_size, "trained_block_size": dc.block_size,
        "max_context": opts.max_context, "prefill_chunk": opts.prefill_chunk,
        "kv_cache": {"layout": bundle_mod.KV_LAYOUT, "dtype": "float32", "slack": opts.block_size},
        "shared_weights": {
            "embed_tokens": "duplicated: target.onnx and drafter.onnx each hold a copy (onnxruntime sessions "
                            "cannot share an initializer without loading it twice)",
            "lm_head": ("tied to embed_tokens" if tc.tie_word_embeddings else "duplicated, like embed_tokens")
                       + (f"; drafter.onnx holds only the rows of its {opts.draft_vocab}-token draft vocabulary"
                          if opts.draft_vocab else "")},
        "graphs": graphs,
        "tokenizer": tok_files,
        "source": sources,
    }


# graph -> its external-data file: the fused target reuses the portable target's weights file
DATA_FILES = {"target": "target.onnx.data", "target_fused": "target.onnx.data", "drafter": "drafter.onnx.data"}


def _graph_entry(root: Path, name: str, opts: ExportOptions, extra: dict) -> dict:
    files = [bundle_mod.file_entry(root, f"{name}.onnx"), bundle_mod.file_entry(root, DATA_FILES[name])]
    return {"files": files, "precision": "fp32", "io": io_manifest(name, "float32"), "opset": extra["opset"],
            "static_shapes": extra["static_shapes"], "flavour": FLAVOURS[name].kind}


def fused_supported(cfg) -> str | None:
    """Why the fused target cannot be built for `cfg` (None: it can)."""
    if cfg.head_dim % 16:
        return f"head_dim {cfg.head_dim} is not a multiple of 16 (onnxruntime's GroupQueryAttention requires it)"
    return None


def export_bundle(opts: ExportOptions, progress=None) -> Path:
    """Export, check parity (unless `opts.verify` is False) and publish the bundle atomically."""
    import torch
    from tqdm import tqdm

    from .fetch import resolve_target
    from .fused_graph import OPSET_FUSED, build_fused_target
    from .graphs import DrafterGraph, TargetGraph
    from .models import load_target
    from .onnx_export import OPSET, export_graph
    from .parity import check_graphs
    from .resolve_drafter import resolve_drafter
    from dflash_edge.runtime.tokenizer import ChatTokenizer

    out = Path(opts.out).expanduser()
    if out.exists() and not opts.force:
        raise DflashEdgeError(f"{out} already exists; pass --force to replace it")
    timings = {}
    steps = tqdm(total=5, desc="export", unit="step", disable=progress is False, file=sys.stderr)
    t0 = time.perf_counter()
    target_dir = resolve_target(None if opts.target in (None, "default") else opts.target)
    target = load_target(target_dir)
    tok = ChatTokenizer.from_dir(target_dir)
    drafter = resolve_drafter(opts.draft, target, tok)
    _check_options(opts, target, drafter)
    vocab = None
    if opts.draft_vocab:
        from .draft_vocab import load_draft_vocab

        source = getattr(drafter, "source", "random")
        vocab = load_draft_vocab(None if source == "random" else source, opts.draft_vocab, target.config.vocab_size)
    steps.update(1)
    timings["load"] = time.perf_counter() - t0

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        dims = {**_dims(target, drafter, opts.block_size), "T": opts.block_size, **SAMPLE_SIZES}
        modules = {"target": TargetGraph(target, tuple(drafter.config.target_layer_ids)).eval(),
                   "drafter": DrafterGraph(target, drafter, vocab).eval()}
        paths = {}
        for name in ("target", "drafter"):
            t = time.perf_counter()
            steps.set_postfix_str(f"tracing {name}")
            paths[name] = export_graph(modules[name], name, dims, tmp / f"{name}.onnx")
            timings[f"export_{name}"] = time.perf_counter() - t
            steps.update(1)
        fused_note = fused_supported(target.config) if opts.fused else "not requested (--no-fused)"
        if fused_note is None:
            t = time.perf_counter()
            steps.set_postfix_str("writing target_fused")
            paths["target_fused"] = tmp / "target_fused.onnx"
            fused_note = build_fused_target(target, tuple(drafter.config.target_layer_ids), paths["target_fused"],
                                            tmp / DATA_FILES["target_fused"], index_model=paths["target"])
            timings["export_target_fused"] = time.perf_counter() - t
        tok_files = _copy_tokenizer(target_dir, tmp)
        report = {}
        if opts.verify:
            t = time.perf_counter()
            steps.set_postfix_str("parity")
            prompt = tok.encode_chat([{"role": "user", "content": PARITY_PROMPT}])
            modules["kv_empty_target"] = torch.zeros(0, dims["L"], dims["Hkv"], dims["D"])
            modules["kv_empty_drafter"] = torch.zeros(0, dims["Ld"], dims["Hkv"], dims["D"])
            report = check_graphs(paths, modules, prompt, opts.block_size)
            timings["parity"] = time.perf_counter() - t
        steps.update(1)
        target_static = {"decode": {"T": 1}, "verify": {"T": opts.block_size}, "prefill": {"T": opts.prefill_chunk}}
        static = {"target": target_static, "target_fused": target_static, "drafter": {"draft": {"B": opts.block_size}}}
        opsets = {"target": OPSET, "drafter": OPSET, "target_fused": OPSET_FUSED}
        graphs = {n: _graph_entry(tmp, n, opts, {"opset": opsets[n], "static_shapes": static[n]}) for n in paths}
        sources = {"target": str(target_dir), "drafter": getattr(drafter, "source", "random"),
                   "drafter_random_init": getattr(drafter, "source", "random") == "random", "parity": report,
                   "target_fused": fused_note,
                   "export_seconds": {k: round(v, 2) for k, v in timings.items()}}
        from .trt_readiness import bundle_trt_readiness
        sources["trt_readiness"] = bundle_trt_readiness(tmp)
        bundle_mod.write_manifest(tmp, _manifest(target, drafter, tok_files, graphs, opts, sources))
        steps.update(1)
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        steps.close()
    total = time.perf_counter() - t0
    sizes = ", ".join(f"{n} {sum(f['bytes'] for f in g['files']) / 1e6:.0f} MB" for n, g in graphs.items())
    print(f"exported {out} in {total:.0f} s ({sizes}; parity {'ok' if opts.verify else 'skipped'})", file=sys.stderr)
    return out


def _dims(target, drafter, block: int) -> dict[str, int]:
    tc, dc = target.config, drafter.config
    return model_dims({"num_layers": tc.num_hidden_layers, "draft_num_layers": dc.num_hidden_layers,
                       "num_kv_heads": tc.num_key_value_heads, "head_dim": tc.head_dim, "vocab_size": tc.vocab_size,
                       "hidden_size": tc.hidden_size, "target_layer_ids": dc.target_layer_ids}, block)


def _copy_tokenizer(src: Path, dst: Path) -> dict:
    shutil.copy2(src / "tokenizer.json", dst / "tokenizer.json")
    config = None
    if (src / "tokenizer_config.json").exists():
        shutil.copy2(src / "tokenizer_config.json", dst / "tokenizer_config.json")
        config = "tokenizer_config.json"
    checksums = [bundle_mod.file_entry(dst, f) for f in ("tokenizer.json", config) if f]    # verified at load
    return {"file": "tokenizer.json", "config": config, "checksums": checksums}
