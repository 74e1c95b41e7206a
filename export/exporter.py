"""`export_bundle`: target + drafter checkpoints -> a bundle directory (ONNX graphs, tokenizer,
manifest).

The one writer: every graph is written node by node straight from the checkpoints (portable_target,
fused_target, portable_drafter over graph_builder), each weight read from its shard, converted,
appended to the graph's external-data file through the bundle's `WeightStore` and dropped, so no
torch model is ever built for export (peak memory about the exported weights). The graph I/O is
runtime/io_tables.py's. Parity (parity.py) then runs the graphs in onnxruntime and compares them
with the independent torch reference (sources.reference: models/graphs.py over layer-streamed torch
models); the manifest is written last and the folder published atomically
(runtime.publish.publish_dir): an interrupted export leaves nothing.

>>> export_bundle(ExportOptions(out="bundle/"))     # default target and drafter  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..models.families import family
from ..runtime import bundle as bundle_mod
from ..runtime.errors import DflashEdgeError
from ..runtime.io_tables import FLAVOURS, io_manifest
from ..runtime.memory import MemoryMeter
from ..runtime.publish import publish_dir
from ..runtime.tokenizer import CHAT_TEMPLATE_FILE
from . import parity  # a module: tests stand in for its functions
from .choices import resolve_choices
from .drafters import write_drafter
from .families import family_writers
from .graph_builder import OPSET, OPSET_FUSED, Float16Overflow
from .hybrid_reference import hybrid_reference
from .hybrid_target import MAX_TOKENS
from .kv16 import apply_kv16
from .kv_cache import graph_kv_cache, load_prompts, write_int8_cache
from .sources import open_sources, reference
from .staging import pause_at, remove_stale, staging_dir
from .target_job import TargetJob
from .weight_format import FormatLog, StoredWeights, WeightFormat
from .weight_store import DATA_FILES, WeightStore

EXPORTER_VERSION = "0.1.0"
PARITY_PROMPT = "Explain in two sentences why the sky is blue."
SCRATCH = ".scratch"  # inside the partial folder: a random drafter's checkpoint, until parity ends
OPSETS = {"target": OPSET, "drafter": OPSET, "target_fused": OPSET_FUSED, "target_hybrid": OPSET}
WRITTEN = ("fp32", "fp16", "int8", "int4")  # precisions the writer stores weights in directly
# low-bit weights: blocked DequantizeLinear over the source's own blocks (standard ONNX;
# onnxruntime's CPU provider fuses it into MatMulNBits: one copy for every flavour), re-quantised to
# TensorRT's weight-only rules (tensorrt: int4 blocks of 128, int8 per channel; slow on a CPU), or
# onnxruntime's contrib ops
LOW_BIT_OPS = ("standard", "tensorrt", "contrib")


@dataclass
class ExportOptions:
    out: str | Path
    target: str | None = "default"  # checkpoint dir, .gguf file (read in place), hub id, "default"
    draft: str | None = "default"  # drafter dir, "default" (shipped) or "random"
    # the draft/verify block; None: the drafter's trained block, at most DEFAULT_BLOCK (choices.py)
    block_size: int | None = None
    max_context: int = 2048
    prefill_chunk: int = 64
    force: bool = False
    verify: bool = True
    draft_vocab: int = (
        0  # >0: the drafter's LM head over this many frequent tokens (draft_vocab.py)
    )
    memory_check: bool = (
        True  # refuse up front when the estimated peak memory exceeds what is available
    )
    fused: bool = True  # also write `target_fused` (GroupQueryAttention) where the model allows
    precision: str = "auto"  # target weights: auto | fp32 | fp16 | int8 | int4
    draft_precision: str | None = None  # the drafter's own layers; None: the planner's default
    kv_cache: str = "auto"  # fused target's cache: auto | fp32 | int8 (kv_cache.py)
    kv16: bool | None = None  # other caches at float16 (kv16.py); None: on a GPU / Jetson device
    device: str | None = None  # a device profile: its plan picks precision, max context
    kv_prompts: str | None = None  # int8 cache calibration: JSONL or a shipped set (heldout)
    threads: int = 0  # onnxruntime threads for the calibration (0: all CPUs)
    accuracy_level: int = (
        4  # MatMulNBits' activations: 4 int8 (row-exact, fast), 0 fp32 (weight_format.py)
    )
    quant_block: int = 32  # weights per scale of re-quantised (non-GGUF) weights
    low_bit_ops: str = (
        "auto"  # int4/int8 weights: auto or one of LOW_BIT_OPS (choices.py picks for auto)
    )

    @property
    def positions(self) -> int:
        """Positions the bundle's graphs can see (the RoPE tables' rows): the runtime's KV capacity,
        max context plus the widest step past it (runtime/generator.py), and the fused target's pad
        row."""
        return self.max_context + max(self.block_size, self.prefill_chunk) + 1


def _check_options(opts: ExportOptions, src) -> None:
    """`opts` against the target and drafter configs of `src` (sources.Sources), before any graph
    is written."""
    tc, dc = src.target_cfg, src.draft_cfg
    if opts.block_size < 2:
        raise DflashEdgeError(
            f"--block-size {opts.block_size} < 2: a block is the last token plus >= 1 mask"
        )
    if opts.block_size > dc.block_size:
        raise DflashEdgeError(
            f"--block-size {opts.block_size} is larger than the drafter was trained for "
            f"({dc.block_size}); use --block-size <= {dc.block_size}"
        )
    limit = tc.max_position_embeddings
    if opts.max_context + opts.block_size > limit:
        raise DflashEdgeError(
            f"--max-context {opts.max_context} (+ block {opts.block_size} slack) exceeds the "
            f"model's {limit} positions; use --max-context <= {limit - opts.block_size}"
        )
    if opts.prefill_chunk < 1:
        raise DflashEdgeError(f"--prefill-chunk {opts.prefill_chunk} must be >= 1")
    src.kind.check_options(opts)
    for flag, value in (
        ("--precision", opts.precision),
        ("--draft-precision", opts.draft_precision),
    ):
        if value not in WRITTEN:
            raise DflashEdgeError(f"{flag} {value!r}: the exporter writes {', '.join(WRITTEN)}")
    float_tables = opts.precision in ("fp32", "fp16")  # else the tables are 8-bit blocks
    if opts.low_bit_ops not in LOW_BIT_OPS:
        raise DflashEdgeError(
            f"--low-bit-ops {opts.low_bit_ops!r}: choose one of {', '.join(LOW_BIT_OPS)}"
        )
    if (
        float_tables
        and "fp16" in (opts.precision, opts.draft_precision)
        and (opts.precision != opts.draft_precision)
    ):
        raise DflashEdgeError(
            f"--precision {opts.precision} with --draft-precision {opts.draft_precision}: an fp16 "
            f"bundle is fp16 throughout (the drafter reads the target's float embedding); pass "
            f"both as fp16, or neither (an int8 / int4 target takes an fp16 drafter)"
        )


def weight_formats(opts: ExportOptions) -> dict:
    """graph -> its WeightFormat: the target's precision (and the shared table: 8-bit blocks unless
    the checkpoint's own table blocks say otherwise) for both target flavours, the drafter's for its
    own layers."""

    table = 0 if opts.precision in ("fp32", "fp16") else 8
    common = dict(
        table_bits=table,
        block_size=opts.quant_block,
        accuracy_level=opts.accuracy_level,
        standard=opts.low_bit_ops in ("standard", "tensorrt"),
        tensorrt=opts.low_bit_ops == "tensorrt",
    )
    target = WeightFormat(opts.precision, **common)
    drafter = WeightFormat(opts.draft_precision, **common)
    return {"target": target, "target_fused": target, "drafter": drafter, "target_hybrid": target}


def fused_supported(cfg) -> str | None:
    """Why the fused target cannot be built for `cfg` (None: it can)."""
    if cfg.head_dim % 16:
        return (
            f"head_dim {cfg.head_dim} is not a multiple of 16 "
            "(onnxruntime's GroupQueryAttention requires it)"
        )
    return None


def export_bundle(opts: ExportOptions, progress=None, finish=None) -> Path:
    """Make the "auto" choices (choices.py), write the graphs, check parity (unless `opts.verify`
    is False), calibrate the int8 cache on the written graph, write the manifest, run
    `finish(folder)` (a hook that may add files it names in the manifest: quantize's quality
    report), publish atomically.
    Everything happens in one temp folder beside `opts.out` (staging.py): a killed export leaves no
    bundle at `opts.out`, and the next one removes what it left."""
    import torch  # noqa: F401  (a runtime-only install stops here, before the progress bar is drawn)
    from tqdm import tqdm

    out = Path(opts.out).expanduser()
    if out.exists() and not opts.force:
        raise DflashEdgeError(f"{out} already exists; pass --force to replace it")
    draft_by_default = opts.draft_precision in (None, "auto")
    opts, target = resolve_choices(opts)
    steps = tqdm(total=6, desc="export", unit="step", disable=progress is False, file=sys.stderr)
    meter, t0 = MemoryMeter(), time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    tmp = staging_dir(out)
    try:
        opts, graphs = _write_or_fall_back(opts, target, tmp, steps, meter, draft_by_default)
        graphs = _int8_cache(opts, tmp, graphs, steps, meter)
        graphs = _kv16(opts, tmp, graphs)
        if finish is not None:
            finish(tmp)
        pause_at("publish")
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        steps.close()
    sizes = ", ".join(
        f"{n} {sum(f['bytes'] for f in g['files']) / 1e6:.0f} MB" for n, g in graphs.items()
    )
    peaks = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in meter.peaks.items())
    parity = "ok" if opts.verify else "skipped"
    print(
        f"exported {out} in {time.perf_counter() - t0:.0f} s ({opts.precision}, drafter "
        f"{opts.draft_precision}, KV cache "
        f"{_kv_dtype(graphs)}; {sizes}; parity {parity}; peak RSS GB: {peaks})",
        file=sys.stderr,
    )
    return out


def _kv_dtype(graphs: dict) -> str:
    return ", ".join(f"{n} {_cache_of(g)}" for n, g in graphs.items())


def _cache_of(entry: dict) -> str:
    """A graph entry's cache as printed: int8, fp16 or fp32."""
    kv = [s["dtype"] for s in entry["io"]["inputs"] if s["name"].startswith("past_key")]
    return "fp16" if kv == ["float16"] else graph_kv_cache(entry)


FALLBACK_DRAFT = "int8"  # an fp16 drafter that overflows: int8 weights, float32 activations


def _write_or_fall_back(opts, target, tmp: Path, steps, meter, draft_by_default: bool):
    """(`opts` as written, the graph entries) of `_write`; a drafter made fp16 by default beside a
    low-bit target that overflows fp16 (a weight or, at parity, an activation) is written again
    with FALLBACK_DRAFT weights, said on stderr. Asked for by name, or in an fp16 bundle, the
    overflow stops the export, naming the node."""
    try:
        return opts, _write(opts, target, tmp, steps, meter)
    except Float16Overflow as err:
        low_bit_target = opts.precision in ("int4", "int8")
        if not (draft_by_default and low_bit_target and opts.draft_precision == "fp16"):
            raise
        print(
            f"export: the fp16 drafter overflows ({err}); writing it with {FALLBACK_DRAFT} "
            f"weights instead (--draft-precision chooses)",
            file=sys.stderr,
        )
    steps.reset()
    for leftover in tmp.iterdir():  # the partial bundle: written again from the start
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    opts = dataclasses.replace(opts, draft_precision=FALLBACK_DRAFT)
    return opts, _write(opts, target, tmp, steps, meter)


def _kv16(opts: ExportOptions, tmp: Path, graphs: dict) -> dict:
    """Every float32 cache of the bundle in `tmp` at float16 (kv16.py), where `opts.kv16`."""
    if not opts.kv16:
        return graphs
    manifest = apply_kv16(tmp, json.loads((tmp / bundle_mod.MANIFEST).read_text()))
    bundle_mod.write_manifest(tmp, manifest)
    return manifest["graphs"]


def _int8_cache(opts: ExportOptions, tmp: Path, graphs: dict, steps, meter: MemoryMeter) -> dict:
    """The fused target's int8 cache, calibrated on the graph just written in `tmp`."""
    steps.update(1)
    if opts.kv_cache != "int8":
        return graphs
    if "target_fused" not in graphs:  # e.g. a hybrid target, or --no-fused
        print(
            "export: no fused target, so no int8 KV cache (its KV stays float32)", file=sys.stderr
        )
        return graphs
    steps.set_postfix_str("int8 KV cache")
    pause_at("calibrate")
    manifest = json.loads((tmp / bundle_mod.MANIFEST).read_text())
    with meter.stage("kv_cache"):
        prompts = load_prompts(opts.kv_prompts)
        manifest["graphs"]["target_fused"] = write_int8_cache(
            tmp, manifest, prompts, threads=opts.threads
        )
    bundle_mod.write_manifest(tmp, manifest)
    return manifest["graphs"]


@dataclass
class _Writing:
    """One bundle being written into the partial folder `tmp`."""

    opts: ExportOptions
    src: object  # sources.Sources
    tmp: Path
    steps: object  # the tqdm bar
    meter: MemoryMeter
    timings: dict  # stage -> seconds (the manifest's `source.export_seconds`)
    store: WeightStore = dataclasses.field(init=False)
    formats: dict = dataclasses.field(init=False)  # graph -> WeightFormat
    log: FormatLog = dataclasses.field(default_factory=FormatLog)

    def __post_init__(self):
        self.store, self.formats = WeightStore(self.tmp), weight_formats(self.opts)
        # a kind's own arithmetic (a DFlash2 drafter's exact candidates: fp32 activations)
        self.formats["drafter"] = self.src.kind.weight_format(
            self.formats["drafter"], self.src.target_cfg
        )

    def fmt(self, graph: str) -> dict:
        """The weight format arguments of `graph`'s writer."""
        return dict(fmt=self.formats[graph], log=self.log)


def _write(opts: ExportOptions, target, tmp: Path, steps, meter: MemoryMeter) -> dict:
    """Everything of the bundle into the partial folder `tmp`, from the `target` resolve_choices
    opened (sources.Target); returns the manifest's graph entries."""

    t0 = time.perf_counter()
    with meter.stage("load"):
        src = open_sources(opts, target, scratch=tmp / SCRATCH)
    _check_options(opts, src)
    steps.update(1)
    w = _Writing(opts, src, tmp, steps, meter, {"load": time.perf_counter() - t0})
    paths, fused_note = _write_graphs(w)
    tok_files = _copy_tokenizer(src.target_dir, tmp)
    report = {}
    if opts.verify:  # reads the drafter's checkpoint again (a random one: scratch)
        t = time.perf_counter()
        steps.set_postfix_str("parity")
        pause_at("parity")
        report = _parity(w, paths)
        w.timings["parity"] = time.perf_counter() - t
    # nothing reads it from here on; never published
    shutil.rmtree(tmp / SCRATCH, ignore_errors=True)
    steps.update(1)
    shared = w.store.manifest()
    graphs = {
        n: _graph_entry(tmp, n, _static_shapes(opts)[n], shared, w.formats[n], w.log) for n in paths
    }
    sources = _source_section(w, report, fused_note)
    bundle_mod.write_manifest(tmp, _manifest(w, tok_files, graphs, sources, shared))
    _check_only_named_files(tmp, graphs, tok_files)
    steps.update(1)
    return graphs


def _write_graphs(w: _Writing) -> tuple[dict, object]:
    """Every graph into `w.tmp`, in writing order (the family's target graphs, then the drafter by
    its kind); (graph -> path, the fused target's note: why there is none, or its writer's)."""
    opts, src = w.opts, w.src
    fmt = {n: w.fmt(n) for n in w.formats}
    capture = tuple(src.draft_cfg.target_layer_ids)
    job = TargetJob(src.target_cfg, src.target_ckpt, capture, w.store, fmt, opts, opts.positions)
    writers = {
        **family_writers(src.target_cfg.model_type).target_writers(job),
        "drafter": lambda p: write_drafter(job, src, p),
    }
    fused_note = fused_supported(src.target_cfg) if opts.fused else "not requested (--no-fused)"
    paths = {}
    for name, writer in writers.items():
        if name == "target_fused" and fused_note is not None:
            continue
        t = time.perf_counter()
        w.steps.set_postfix_str(f"writing {name}")
        paths[name] = w.tmp / f"{name}.onnx"
        with w.meter.stage(f"export_{name}"):
            result = writer(paths[name])
        pause_at("graphs")
        if name == "target_fused":
            fused_note = result
        w.timings[f"export_{name}"] = time.perf_counter() - t
        w.steps.update(name != "target_fused")
    return paths, fused_note


def _source_section(w: _Writing, report: dict, fused_note) -> dict:
    """The manifest's `source`: where the bundle came from, the options, parity, times, memory."""
    src = w.src
    return {
        "target": str(src.target_ckpt.root),  # the checkpoint folder, or the GGUF file
        "drafter": src.draft_source,
        "export_options": _recorded_options(w.opts),
        "drafter_random_init": src.draft_source == "random",
        "parity": report,
        "target_fused": fused_note,
        "writer": "stream",
        "export_seconds": {k: round(v, 2) for k, v in w.timings.items()},
        "peak_rss_mb": w.meter.report_mb(),
        "rss_after_stage_mb": w.meter.after_mb(),
    }


def _recorded_options(opts: ExportOptions) -> dict:
    """What a re-export (`quantize`) needs: the options as given (a hub id stays a hub id)."""
    kept = asdict(opts)
    for key in ("out", "force", "device", "threads"):
        kept.pop(key)
    return kept


def _parity(w: _Writing, paths: dict) -> dict:
    """ORT graphs first (one session at a time), then the layer-by-layer torch reference on the same
    inputs, its weights as the bundle stores them (low-bit blocks dequantised: parity at the
    bundle's own precision)."""

    opts, meter, src = w.opts, w.meter, w.src
    src = dataclasses.replace(
        src,
        target_ckpt=StoredWeights(src.target_ckpt, w.log),
        draft_ckpt=StoredWeights(src.draft_ckpt, w.log),
    )
    tc, dc = src.target_cfg, src.draft_cfg
    prompt = src.tokenizer.encode_chat([{"role": "user", "content": PARITY_PROMPT}])
    # within the positions the graphs reach (its verify block after it); an MoE target's to one
    # block: the
    # portable graph dequantises each token's expert per slot, [T, 2I, H] fp32 (0.5 GB at T = 40 and
    # Qwen3-Coder-30B-A3B's widths), and a block still routes to ~80 of 128 experts per layer
    keep = opts.positions - 1 - opts.block_size
    prompt = list(prompt)[: min(keep, opts.block_size) if tc.num_experts else keep]
    hybrid = "target_hybrid" in paths
    if hybrid:  # one call of the hybrid graph carries at most MAX_TOKENS
        prompt = prompt[:MAX_TOKENS]
    dims = {
        "L": tc.num_hidden_layers,
        "Ld": dc.num_hidden_layers,
        "Hkv": tc.num_key_value_heads,
        "D": tc.head_dim,
    }
    probe = parity.Probe(prompt, opts.block_size, dc.mask_token_id, dims)
    with meter.stage("parity"):
        tol = parity.tolerance_for(opts.precision, opts.accuracy_level, recurrent=hybrid)
        ref = (hybrid_reference if hybrid else reference)(src, opts.block_size)
        views = {"drafter": src.kind.parity_view}
        return parity.check_graphs(paths, probe, ref, tol=tol, stage=meter.stage, views=views)


def _static_shapes(opts: ExportOptions) -> dict:
    """graph -> call name -> the sizes its dynamic symbols take there (TensorRT profiles, static
    builds)."""
    target = {
        "decode": {"T": 1},
        "verify": {"T": opts.block_size},
        "prefill": {"T": opts.prefill_chunk},
    }
    return {
        "target": target,
        "target_fused": target,
        "target_hybrid": target,
        "drafter": {"draft": {"B": opts.block_size}},
    }


def _graph_entry(root: Path, name: str, static_shapes: dict, shared: list[dict], fmt, log) -> dict:
    files = [
        bundle_mod.file_entry(root, f"{name}.onnx"),
        bundle_mod.file_entry(root, DATA_FILES[name]),
    ]
    files += [
        bundle_mod.file_entry(root, f)
        for f in sorted({e["file"] for e in shared if name in e["names"]})
    ]
    entry = {
        "files": files,
        "precision": fmt.precision,
        "io": io_manifest(name, "float32"),
        "opset": _opset(root / f"{name}.onnx"),
        "static_shapes": static_shapes,
        "flavour": FLAVOURS[name].kind,
        "weight_bytes": _weight_bytes(root / f"{name}.onnx"),
    }
    # low-bit weights: where each came from (GGUF type, or "rtn": re-quantised)
    if log.sources.get(name):
        entry["quantization"] = {
            "from": "checkpoint",
            "writer": "stream",
            "settings": fmt.to_dict(),
            "weights_by_source": dict(log.sources[name]),
            "requantised_low_bit": log.requantised,
        }
    return entry


def _opset(path: Path) -> int:
    """The standard-domain opset `path` imports (21 where low-bit weights are DequantizeLinear)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _weight_bytes(path: Path) -> int:
    """Bytes of the weights this graph reads (its initializers, inline or in any data file; a region
    two initializers name, the embedding table's head and lookup, once): what a session of it
    holds, where the data files also hold the other flavour's weights (devices plan reads it)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    external = {
        (e["location"], e.get("offset", "0")): int(e["length"])
        for e in ({x.key: x.value for x in i.external_data} for i in graph.initializer)
        if e
    }
    return sum(external.values()) + sum(
        len(i.raw_data) for i in graph.initializer if not i.external_data
    )


def _manifest(w: _Writing, tok_files: dict, graphs: dict, sources: dict, shared: list) -> dict:
    """The bundle's manifest (runtime/bundle.py's schema) of what `w` wrote; `graphs` gets the
    drafter kind's I/O and notes."""
    opts = w.opts
    return {
        "format": bundle_mod.FORMAT,
        "manifest_version": bundle_mod.MANIFEST_VERSION,
        "exporter_version": EXPORTER_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": _model_section(w.src, opts, graphs),
        "block_size": opts.block_size,
        "trained_block_size": w.src.draft_cfg.block_size,
        "max_context": opts.max_context,
        "prefill_chunk": opts.prefill_chunk,
        "kv_cache": {"layout": bundle_mod.KV_LAYOUT, "dtype": "float32", "slack": opts.block_size},
        "shared_weights": _shared_section(w.src.target_cfg, opts, shared),
        "graphs": graphs,
        "tokenizer": tok_files,
        "source": sources,
    }


def _model_section(src, opts: ExportOptions, graphs: dict) -> dict:
    """The manifest's `model`: the target's dims, the drafter's (and its kind's), the family's."""
    tc, dc = src.target_cfg, src.draft_cfg
    return {
        "family": tc.model_type,
        "vocab_size": tc.vocab_size,
        "hidden_size": tc.hidden_size,
        "num_layers": tc.num_hidden_layers,
        "num_heads": tc.num_attention_heads,
        "num_kv_heads": tc.num_key_value_heads,
        "head_dim": tc.head_dim,
        "intermediate_size": tc.intermediate_size,
        "draft_intermediate_size": dc.intermediate_size,
        "draft_num_layers": dc.num_hidden_layers,
        "target_layer_ids": list(dc.target_layer_ids),
        "mask_token_id": dc.mask_token_id,
        "draft_vocab_size": opts.draft_vocab or tc.vocab_size,
        "eos_token_ids": list(tc.eos_token_id),
        "bos_token_id": tc.bos_token_id,
        "max_position_embeddings": tc.max_position_embeddings,
        **_drafter_fields(src.kind, dc, graphs["drafter"]),
        **family(tc.model_type).manifest_fields(tc),
    }


def _drafter_fields(kind, dc, entry: dict) -> dict:
    """The drafter's own `model` keys (sliding-window layers, its kind's); its graph `entry` gets
    the I/O they change (io_tables.py) and its kind's quantization note."""
    fields = {}
    layers = {"Ld": dc.num_hidden_layers - len(dc.window_layers), "Lw": len(dc.window_layers)}
    if dc.window_layers:  # sliding-window drafter layers: their cache and I/O (io_tables.py)
        fields = {
            "draft_layer_types": list(dc.layer_types),
            "draft_sliding_window": dc.sliding_window,
        }
    fields.update(kind.manifest_fields(dc))
    if kind.QUANTIZATION_NOTE:  # e.g. DFlash2's >= 8-bit conv and selector weights
        entry.setdefault("quantization", {})["dflash2"] = kind.QUANTIZATION_NOTE
    if dc.window_layers or kind.io_dims(dc):
        entry["io"] = io_manifest("drafter", "float32", {**layers, **kind.io_dims(dc)})
    return fields


def _shared_section(tc, opts: ExportOptions, shared: list[dict]) -> dict:
    """The manifest's `shared_weights`: how the target and drafter share the embedding / head."""
    return {
        "embed_tokens": (
            "stored once in shared.onnx.data, referenced by target.onnx and drafter.onnx; the "
            "runtime loads it once for both sessions"
            if shared
            else "duplicated: target.onnx and drafter.onnx each hold a copy"
        ),
        "lm_head": (
            "tied to embed_tokens" if tc.tie_word_embeddings else "shared like embed_tokens"
        )
        + (
            f"; drafter.onnx holds only the rows of its {opts.draft_vocab}-token draft vocabulary"
            if opts.draft_vocab
            else ""
        ),
        "tensors": shared,
    }


def _check_only_named_files(root: Path, graphs: dict, tok_files: dict) -> None:
    """Every file of the bundle is named in its manifest (no exporter leftovers beside the
    graphs)."""
    named = {f["path"] for g in graphs.values() for f in g["files"]} | {bundle_mod.MANIFEST}
    named |= {f for f in (tok_files["file"], tok_files["config"]) if f}
    stray = sorted(p.name for p in root.iterdir() if p.name not in named)
    if stray:
        raise DflashEdgeError(
            f"export left files no manifest names: {stray[:6]}; this is a bug: please report it"
        )


def _copy_tokenizer(src: Path, dst: Path) -> dict:
    """tokenizer.json + tokenizer_config.json; a chat template saved as chat_template.jinja is
    folded into the latter."""

    shutil.copy2(src / "tokenizer.json", dst / "tokenizer.json")
    config = (
        json.loads((src / "tokenizer_config.json").read_text())
        if (src / "tokenizer_config.json").exists()
        else None
    )
    if (src / CHAT_TEMPLATE_FILE).is_file() and not (config or {}).get("chat_template"):
        config = {**(config or {}), "chat_template": (src / CHAT_TEMPLATE_FILE).read_text()}
    if config is not None:
        (dst / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    config = None if config is None else "tokenizer_config.json"
    # verified at load
    checksums = [bundle_mod.file_entry(dst, f) for f in ("tokenizer.json", config) if f]
    return {"file": "tokenizer.json", "config": config, "checksums": checksums}
