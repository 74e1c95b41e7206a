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
from dflash_edge.runtime.memory import MemoryMeter

from .external_data import SharedData
from dflash_edge.runtime.publish import publish_dir

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
    memory_check: bool = True            # refuse up front when the estimated peak memory exceeds what is available
    fused: bool = True                   # also write `target_fused` (GroupQueryAttention) where the model allows
    stream: bool = True                  # write the graphs node by node from the checkpoint (stream_export.py)


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


def _manifest(tc, dc, tok_files, graphs, opts, sources, shared: list[dict]) -> dict:
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
            "embed_tokens": ("stored once in shared.onnx.data, referenced by target.onnx and drafter.onnx; the "
                             "runtime loads it once for both sessions" if shared else
                             "duplicated: target.onnx and drafter.onnx each hold a copy"),
            "lm_head": ("tied to embed_tokens" if tc.tie_word_embeddings else "shared like embed_tokens")
                       + (f"; drafter.onnx holds only the rows of its {opts.draft_vocab}-token draft vocabulary"
                          if opts.draft_vocab else ""),
            "tensors": shared},
        "graphs": graphs,
        "tokenizer": tok_files,
        "source": sources,
    }


# graph -> its external-data file: the fused target reuses the portable target's weights file
DATA_FILES = {"target": "target.onnx.data", "target_fused": "target.onnx.data", "drafter": "drafter.onnx.data"}


def _graph_entry(root: Path, name: str, extra: dict, shared: list[dict]) -> dict:
    files = [bundle_mod.file_entry(root, f"{name}.onnx"), bundle_mod.file_entry(root, DATA_FILES[name])]
    files += [bundle_mod.file_entry(root, f) for f in sorted({e["file"] for e in shared if name in e["names"]})]
    return {"files": files, "precision": "fp32", "io": io_manifest(name, "float32"), "opset": extra["opset"],
            "static_shapes": extra["static_shapes"], "flavour": FLAVOURS[name].kind}


def fused_supported(cfg) -> str | None:
    """Why the fused target cannot be built for `cfg` (None: it can)."""
    if cfg.head_dim % 16:
        return f"head_dim {cfg.head_dim} is not a multiple of 16 (onnxruntime's GroupQueryAttention requires it)"
    return None


def export_bundle(opts: ExportOptions, progress=None) -> Path:
    """Export, check parity (unless `opts.verify` is False) and publish the bundle atomically."""
    import torch  # noqa: F401  (a runtime-only install stops here, before the progress bar is drawn)
    from tqdm import tqdm

    out = Path(opts.out).expanduser()
    if out.exists() and not opts.force:
        raise DflashEdgeError(f"{out} already exists; pass --force to replace it")
    steps = tqdm(total=5, desc="export", unit="step", disable=progress is False, file=sys.stderr)
    run = _Run(opts, out, steps, MemoryMeter())
    try:
        if opts.stream:
            from .stream_export import export_streamed

            return export_streamed(opts, out, steps, run.meter)
        return run.go()
    finally:
        steps.close()


@dataclass
class _Run:
    """One export: the stages in order, each timed and its peak resident memory measured."""

    opts: ExportOptions
    out: Path
    steps: object
    meter: MemoryMeter

    def go(self) -> Path:
        import torch

        from .fused_graph import OPSET_FUSED, build_fused_target
        from dflash_edge.models.graphs import DrafterGraph, TargetGraph
        from .onnx_export import OPSET, export_graph
        from .parity import check_graphs, reference_cases

        opts, timings, t0 = self.opts, {}, time.perf_counter()
        with self.meter.stage("load"):
            target, drafter, tok, target_dir, vocab = self._load()
        self.steps.update(1)
        timings["load"] = time.perf_counter() - t0
        tc, dc, draft_source = target.config, drafter.config, getattr(drafter, "source", "random")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.partial-", dir=self.out.parent))
        try:
            dims = {**_dims(target, drafter, opts.block_size), "T": opts.block_size, **SAMPLE_SIZES}
            modules = {"target": TargetGraph(target, tuple(dc.target_layer_ids)).eval(),
                       "drafter": DrafterGraph(target, drafter, vocab).eval()}
            shared = SharedData(tmp, _shared_tensors(target))
            fused_note = fused_supported(tc) if opts.fused else "not requested (--no-fused)"
            del target, drafter                  # `modules` holds the only references from here on
            cases, report = None, {}
            if opts.verify:                      # torch references first: the torch models can go as graphs are written
                with self.meter.stage("reference"):
                    prompt = tok.encode_chat([{"role": "user", "content": PARITY_PROMPT}])
                    modules["kv_empty_target"] = torch.zeros(0, dims["L"], dims["Hkv"], dims["D"])
                    modules["kv_empty_drafter"] = torch.zeros(0, dims["Ld"], dims["Hkv"], dims["D"])
                    cases = reference_cases(modules, prompt, opts.block_size)
            paths = {}
            for name in ("target", "drafter"):
                t = time.perf_counter()
                self.steps.set_postfix_str(f"tracing {name}")
                module = modules.pop(name)
                with self.meter.stage(f"export_{name}"):
                    paths[name] = export_graph(module, name, dims, tmp / f"{name}.onnx", shared)
                timings[f"export_{name}"] = time.perf_counter() - t
                if name == "target" and fused_note is None:   # same weights, reused from the files just written
                    t = time.perf_counter()
                    self.steps.set_postfix_str("writing target_fused")
                    paths["target_fused"] = tmp / "target_fused.onnx"
                    with self.meter.stage("export_target_fused"):
                        fused_note = build_fused_target(module.target, tuple(dc.target_layer_ids),
                                                        paths["target_fused"], tmp / DATA_FILES["target_fused"],
                                                        index_model=paths["target"], shared=shared)
                    timings["export_target_fused"] = time.perf_counter() - t
                del module
                self.steps.update(1)
            modules.clear()
            tok_files = _copy_tokenizer(target_dir, tmp)
            if opts.verify:
                t = time.perf_counter()
                self.steps.set_postfix_str("parity")
                with self.meter.stage("parity"):
                    report = check_graphs(paths, cases)
                timings["parity"] = time.perf_counter() - t
            self.steps.update(1)
            target_static = {"decode": {"T": 1}, "verify": {"T": opts.block_size}, "prefill": {"T": opts.prefill_chunk}}
            static = {"target": target_static, "target_fused": target_static, "drafter": {"draft": {"B": opts.block_size}}}
            opsets = {"target": OPSET, "drafter": OPSET, "target_fused": OPSET_FUSED}
            shared_entries = shared.manifest()
            graphs = {n: _graph_entry(tmp, n, {"opset": opsets[n], "static_shapes": static[n]}, shared_entries)
                      for n in paths}
            sources = {"target": str(target_dir), "drafter": draft_source,
                       "drafter_random_init": draft_source == "random", "parity": report, "target_fused": fused_note,
                       "export_seconds": {k: round(v, 2) for k, v in timings.items()},
                       "peak_rss_mb": self.meter.report_mb(), "rss_after_stage_mb": self.meter.after_mb()}
            from dflash_edge.engines.readiness import bundle_trt_readiness
            sources["trt_readiness"] = bundle_trt_readiness(tmp)
            bundle_mod.write_manifest(tmp, _manifest(tc, dc, tok_files, graphs, opts, sources, shared_entries))
            _check_only_named_files(tmp, graphs, tok_files)
            self.steps.update(1)
            publish_dir(tmp, self.out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        total = time.perf_counter() - t0
        sizes = ", ".join(f"{n} {sum(f['bytes'] for f in g['files']) / 1e6:.0f} MB" for n, g in graphs.items())
        peaks = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in self.meter.peaks.items())
        print(f"exported {self.out} in {total:.0f} s ({sizes}; parity {'ok' if opts.verify else 'skipped'}; "
              f"peak RSS GB: {peaks})", file=sys.stderr)
        return self.out

    def _load(self):
        from dflash_edge.models.fetch import resolve_target
        from .fits import check_fits
        from dflash_edge.models import load_target
        from dflash_edge.models.checkpoint import Checkpoint
        from dflash_edge.models.config import TargetConfig
        from dflash_edge.models.resolve_drafter import resolve_drafter
        from dflash_edge.runtime.tokenizer import ChatTokenizer

        opts = self.opts
        target_dir = resolve_target(None if opts.target in (None, "default") else opts.target)
        if opts.memory_check:          # before any weight is read: say so now, with the estimate
            cfg = TargetConfig.from_json(target_dir)
            skip = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
            check_fits(4 * Checkpoint.open(target_dir).num_params(skip), f"{target_dir.name} (fp32)")
        target = load_target(target_dir)
        tok = ChatTokenizer.from_dir(target_dir)
        drafter = resolve_drafter(opts.draft, target, tok)
        _check_options(opts, target, drafter)
        vocab = None
        if opts.draft_vocab:
            from dflash_edge.models.draft_vocab import load_draft_vocab

            source = getattr(drafter, "source", "random")
            vocab = load_draft_vocab(None if source == "random" else source, opts.draft_vocab, target.config.vocab_size)
        return target, drafter, tok, target_dir, vocab


def _shared_tensors(target) -> dict:
    """The target's tensors the drafter graph borrows: its embedding and (untied) LM head.

    The exporter stores an untied LM head transposed (MatMul on a constant-folded W^T): both forms are listed.
    """
    tensors = {"embed_tokens": [target.model.embed_tokens.weight]}
    if not target.config.tie_word_embeddings:
        w = target.lm_head.weight.detach()
        tensors["lm_head"] = [w, w.T]
    return tensors


def _check_only_named_files(root: Path, graphs: dict, tok_files: dict) -> None:
    """Every file of the bundle is named in its manifest (no exporter leftovers beside the graphs)."""
    named = {f["path"] for g in graphs.values() for f in g["files"]} | {bundle_mod.MANIFEST}
    named |= {f for f in (tok_files["file"], tok_files["config"]) if f}
    stray = sorted(p.name for p in root.iterdir() if p.name not in named)
    if stray:
        raise DflashEdgeError(f"export left files no manifest names: {stray[:6]}; this is a bug: please report it")


def _dims(target, drafter, block: int) -> dict[str, int]:
    tc, dc = target.config, drafter.config
    return model_dims({"num_layers": tc.num_hidden_layers, "draft_num_layers": dc.num_hidden_layers,
                       "num_kv_heads": tc.num_key_value_heads, "head_dim": tc.head_dim, "vocab_size": tc.vocab_size,
                       "hidden_size": tc.hidden_size, "target_layer_ids": dc.target_layer_ids}, block)


def _copy_tokenizer(src: Path, dst: Path) -> dict:
    """tokenizer.json + tokenizer_config.json; a chat template saved as chat_template.jinja is folded into the latter."""
    import json

    from dflash_edge.runtime.tokenizer import CHAT_TEMPLATE_FILE

    shutil.copy2(src / "tokenizer.json", dst / "tokenizer.json")
    config = json.loads((src / "tokenizer_config.json").read_text()) if (src / "tokenizer_config.json").exists() else None
    if (src / CHAT_TEMPLATE_FILE).is_file() and not (config or {}).get("chat_template"):
        config = {**(config or {}), "chat_template": (src / CHAT_TEMPLATE_FILE).read_text()}
    if config is not None:
        (dst / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    config = None if config is None else "tokenizer_config.json"
    checksums = [bundle_mod.file_entry(dst, f) for f in ("tokenizer.json", config) if f]    # verified at load
    return {"file": "tokenizer.json", "config": config, "checksums": checksums}
