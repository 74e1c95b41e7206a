"""`quantize_bundle`: an fp32 bundle -> a new bundle with each graph at its requested precision.

Same contract as the input (manifest, sha256 per file, I/O tables, fp32 KV); `--draft` sets the graph
named "drafter", `--target` every other graph in the manifest. Written to a hidden temp folder beside
the output and renamed into place only when complete (an interrupted run leaves nothing bundle-like);
the input bundle is only read.

>>> quantize_bundle(QuantizeOptions("bundle/", "bundle-int8/", target="int8", draft="int8"))  # doctest: +SKIP
"""
from __future__ import annotations

import copy
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from dflash_edge.runtime import bundle as bundle_mod

from .dedupe import TensorIndex
from .int8_cache import check_request, quantize_cache
from .precisions import QuantizeError, QuantSettings, check_lowering, check_precision
from .quality import ReportOptions

QUALITY_FILE = "quality.json"
DRAFTER = "drafter"


@dataclass
class QuantizeOptions:
    bundle: str | Path                   # input bundle (any precision; only fp32 graphs are lowered)
    out: str | Path
    target: str = "int8"                 # precision of every graph but the drafter (int8: see quantize_cli)
    draft: str = "int8"                  # precision of the drafter graph
    force: bool = False
    settings: QuantSettings = field(default_factory=QuantSettings)
    report: ReportOptions | None = field(default_factory=ReportOptions)   # None: no quality report
    kv_cache: str = "fp32"               # the fused target's cache: "int8" quantises it (int8_cache.py)


def family(precision: str):
    """The module that lowers a graph to `precision` (each has `quantize(model, settings) -> info`)."""
    import importlib

    return importlib.import_module(f"{__package__}.{check_precision(precision)}")


def wanted(opts: QuantizeOptions, graph: str) -> str:
    return opts.draft if graph == DRAFTER else opts.target


def _check_out(src: Path, out: Path, force: bool) -> None:
    src, res = src.resolve(), out.resolve()
    if res == src or src in res.parents:
        raise QuantizeError(f"--out {out} is inside the input bundle {src}; write the new bundle elsewhere")
    if res in src.parents:
        raise QuantizeError(f"--out {out} contains the input bundle {src} (replacing it would delete the input); "
                            f"choose another folder")
    if out.exists() and not force:
        raise QuantizeError(f"{out} already exists; pass --force to replace it")


def _lower_graph(src: bundle_mod.Bundle, name: str, want: str, tmp: Path, settings: QuantSettings,
                 index: TensorIndex, log) -> dict:
    """Write graph `name` at `want` into `tmp` (tensors an earlier graph stored are referenced, see dedupe.py);
    returns its manifest entry. int4/int8 stream the weights tensor by tensor (stream.py); the rest load whole."""
    import onnx

    from .stream import lower_graph, streamable

    entry = copy.deepcopy(src.manifest["graphs"][name])
    if want == entry["precision"]:                        # kept as it is: copy the files byte for byte
        for f in entry["files"]:
            shutil.copy2(src.root / f["path"], tmp / f["path"])
        return entry
    t = time.perf_counter()
    out = tmp / entry["files"][0]["path"]
    model = onnx.load(str(src.graph_path(name)), load_external_data=False)
    why = streamable(model, want, settings)
    if why is None:
        names, info = lower_graph(model, src.graph_path(name).parent, out, family(want).quantize, settings, index)
    else:
        print(f"quantize: {name} loaded whole ({why})", file=log)
        del model
        names, info = _lower_in_memory(src.graph_path(name), out, want, settings, index)
    entry["files"] = [bundle_mod.file_entry(tmp, n) for n in names]
    entry["precision"] = want
    entry.pop("weight_bytes", None)                  # the source graph's: devices plan falls back to the files
    entry["quantization"] = {"from": "fp32", "tool": f"onnxruntime {_ort_version()}", "settings": settings.to_dict(),
                             **info, "seconds": round(time.perf_counter() - t, 1)}
    return entry


def _lower_in_memory(path: Path, out: Path, want: str, settings: QuantSettings, index: TensorIndex):
    """The graph loaded with its weights, lowered by onnxruntime's whole-graph tools, saved; (files, info)."""
    from .graph_io import load_graph, save_graph

    model = load_graph(path)
    info = family(want).quantize(model, settings)
    borrowed = index.share(model)
    names = save_graph(model, out)
    index.add(out.parent / names[0])
    return [*names, *borrowed], info


def _keep_shared(manifest: dict, old: dict) -> None:
    """Shared tensors (one copy for several graphs) stay listed only for the graphs kept as they were."""
    kept = {n for n, g in manifest["graphs"].items() if g["precision"] == old["graphs"][n]["precision"]}
    shared = manifest.get("shared_weights") or {}
    entries = []
    for entry in shared.get("tensors", []):
        names = {g: n for g, n in entry["names"].items() if g in kept}
        if len(names) > 1:
            entries.append({**entry, "names": names})
    if "tensors" in shared:
        shared["tensors"] = entries
        if not entries:
            shared["embed_tokens"] = "each quantised graph holds its own (quantised) copy"


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def quantize_bundle(opts: QuantizeOptions, log=None) -> Path:
    """Lower the bundle's graphs, write the quality report (unless `opts.report` is None), publish atomically."""
    log = log or sys.stderr                     # looked up per call: a replaced sys.stderr is honoured
    from dflash_edge.runtime.publish import publish_dir

    from dflash_edge.runtime.memory import MemoryMeter

    meter = MemoryMeter()
    with meter.stage("read"):
        src = bundle_mod.read_bundle(opts.bundle, verify=True)      # a file failing its sha256 stops here
    out = Path(opts.out).expanduser()
    graphs = src.manifest["graphs"]
    for name, graph in graphs.items():
        check_lowering(name, graph["precision"], wanted(opts, name))
    quantize_kv = check_request(graphs, opts.target, opts.kv_cache)       # before minutes of lowering
    _check_out(src.root, out, opts.force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        manifest = copy.deepcopy(src.manifest)
        manifest.pop("engines", None)                              # TensorRT engines were built for the old graphs
        manifest.pop("quality", None)
        index = TensorIndex(tmp)
        for name in graphs:
            print(f"quantize: {name} -> {wanted(opts, name)}", file=log)
            with meter.stage(name):
                manifest["graphs"][name] = _lower_graph(src, name, wanted(opts, name), tmp, opts.settings, index, log)
        _keep_shared(manifest, src.manifest)
        for key in ("file", "config"):
            if src.manifest["tokenizer"].get(key):
                shutil.copy2(src.root / src.manifest["tokenizer"][key], tmp / src.manifest["tokenizer"][key])
        source = manifest.setdefault("source", {})
        source["quantized_from"] = str(src.root.resolve())
        source["quantize_peak_rss_mb"] = meter.report_mb()       # per stage; the report's is not included
        bundle_mod.write_manifest(tmp, manifest)
        if quantize_kv:
            print("quantize: target_fused KV cache -> int8 (calibrating its scales)", file=log)
            from .quality import load_prompts

            with meter.stage("kv_cache"):
                manifest["graphs"]["target_fused"] = quantize_cache(
                    tmp, manifest, load_prompts(opts.report.prompts if opts.report else None),
                    threads=opts.report.threads if opts.report else 0)
            bundle_mod.write_manifest(tmp, manifest)
        if opts.report is not None:
            from .quality import format_report, quality_report, write_report

            report = quality_report(src.root, tmp, opts.report, log=log)
            manifest["quality"] = write_report(tmp, QUALITY_FILE, report)
            bundle_mod.write_manifest(tmp, manifest)
            print(format_report(report), file=log)
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    sizes = ", ".join(f"{n} {g['precision']} {sum(f['bytes'] for f in g['files']) / 1e6:.1f} MB"
                      for n, g in manifest["graphs"].items())
    peaks = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in meter.peaks.items())
    print(f"quantized {out} ({sizes}; peak RSS GB: {peaks})", file=log)
    return out

