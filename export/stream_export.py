"""The default export writer: the bundle written node by node from the checkpoints, never building a torch model for export.

Every weight is read from its shard, converted and appended to the graph's external-data file, then
dropped (export/weight_store.py); the graphs come from portable_target / portable_drafter / fused_stream
with the I/O of runtime/io_tables.py. Parity runs the graphs first, then the torch reference layer by layer
(sources.reference), so neither ever holds a whole model. Same manifest as the torch-export path.

>>> export_streamed(ExportOptions(out="bundle/", stream=True), steps, MemoryMeter())   # doctest: +SKIP
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from dflash_edge.runtime import bundle as bundle_mod

from dflash_edge.runtime.publish import publish_dir


def _check(opts, tc, dc) -> None:
    """The torch path's option checks (exporter._check_options) on configs alone."""
    from types import SimpleNamespace

    from .exporter import _check_options

    _check_options(opts, SimpleNamespace(config=tc), SimpleNamespace(config=dc))


def export_streamed(opts, out: Path, steps, meter) -> Path:
    """Export `opts` to `out` (published atomically); per-stage peak RSS in `meter`."""
    from .exporter import _check_only_named_files, _copy_tokenizer, _graph_entry, _manifest, fused_supported
    from .fused_graph import OPSET_FUSED
    from .fused_target import build_fused_target
    from .onnx_export import OPSET
    from .portable_drafter import build_drafter
    from .portable_target import build_target
    from .sources import open_sources
    from .weight_store import WeightStore

    timings, t0 = {}, time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        with meter.stage("load"):
            src = open_sources(opts, scratch=tmp / ".scratch")
        tc, dc = src.target_cfg, src.draft_cfg
        _check(opts, tc, dc)
        steps.update(1)
        timings["load"] = time.perf_counter() - t0
        store, capture, paths = WeightStore(tmp), tuple(dc.target_layer_ids), {}
        fused_note = fused_supported(tc) if opts.fused else "not requested (--no-fused)"
        writers = {"target": lambda p: build_target(tc, src.target_ckpt, capture, store, p),
                   "target_fused": lambda p: build_fused_target(tc, src.target_ckpt, capture, store, p),
                   "drafter": lambda p: build_drafter(tc, dc, src.target_ckpt, src.draft_ckpt, store, p,
                                                      opts.block_size, src.vocab)}
        for name in ("target", "target_fused", "drafter"):
            if name == "target_fused" and fused_note is not None:
                continue
            t = time.perf_counter()
            steps.set_postfix_str(f"writing {name}")
            paths[name] = tmp / f"{name}.onnx"
            with meter.stage(f"export_{name}"):
                result = writers[name](paths[name])
            if name == "target_fused":
                fused_note = result
            timings[f"export_{name}"] = time.perf_counter() - t
            steps.update(name != "target_fused")
        shutil.rmtree(tmp / ".scratch", ignore_errors=True)
        tok_files = _copy_tokenizer(src.target_dir, tmp)
        report = {}
        if opts.verify:
            t = time.perf_counter()
            steps.set_postfix_str("parity")
            report = _parity(src, paths, opts, meter)
            timings["parity"] = time.perf_counter() - t
        steps.update(1)
        target_static = {"decode": {"T": 1}, "verify": {"T": opts.block_size}, "prefill": {"T": opts.prefill_chunk}}
        static = {"target": target_static, "target_fused": target_static, "drafter": {"draft": {"B": opts.block_size}}}
        opsets = {"target": OPSET, "drafter": OPSET, "target_fused": OPSET_FUSED}
        shared_entries = store.manifest()
        graphs = {n: _graph_entry(tmp, n, {"opset": opsets[n], "static_shapes": static[n]}, shared_entries)
                  for n in paths}
        sources = {"target": str(src.target_dir), "drafter": src.draft_source,
                   "drafter_random_init": src.draft_source == "random", "parity": report,
                   "target_fused": fused_note, "writer": "stream",
                   "export_seconds": {k: round(v, 2) for k, v in timings.items()},
                   "peak_rss_mb": meter.report_mb(), "rss_after_stage_mb": meter.after_mb()}
        from dflash_edge.engines.readiness import bundle_trt_readiness
        sources["trt_readiness"] = bundle_trt_readiness(tmp)
        bundle_mod.write_manifest(tmp, _manifest(tc, dc, tok_files, graphs, opts, sources, shared_entries))
        _check_only_named_files(tmp, graphs, tok_files)
        steps.update(1)
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    total = time.perf_counter() - t0
    sizes = ", ".join(f"{n} {sum(f['bytes'] for f in g['files']) / 1e6:.0f} MB" for n, g in graphs.items())
    peaks = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in meter.peaks.items())
    print(f"exported {out} in {total:.0f} s, streamed ({sizes}; parity {'ok' if opts.verify else 'skipped'}; "
          f"peak RSS GB: {peaks})", file=sys.stderr)
    return out


def _parity(src, paths: dict, opts, meter) -> dict:
    """ORT graphs first (one session at a time), then the layer-by-layer torch reference on the same inputs."""
    from .exporter import PARITY_PROMPT
    from .parity_stream import Probe, check_graphs
    from .sources import reference

    tc, dc = src.target_cfg, src.draft_cfg
    prompt = src.tokenizer.encode_chat([{"role": "user", "content": PARITY_PROMPT}])
    dims = {"L": tc.num_hidden_layers, "Ld": dc.num_hidden_layers, "Hkv": tc.num_key_value_heads, "D": tc.head_dim}
    probe = Probe(list(prompt), opts.block_size, dc.mask_token_id, dims)
    with meter.stage("parity"):
        return check_graphs(paths, probe, reference(src, opts.block_size), stage=meter.stage)

