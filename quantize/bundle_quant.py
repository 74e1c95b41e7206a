"""`quantize_bundle`: a bundle -> its model re-exported at another precision, plus a quality report.

The exporter is the one writer (docs/design.md §2): quantize reads the source checkpoints and
options the bundle's manifest recorded (`source.export_options`), exports them again at the
requested precisions (export/exporter.py: one temp folder, one publish), and, before that publish,
measures the new bundle against the input one (quality.py) and stores the report in it. The input
bundle is only read.

>>> quantize_bundle(  # doctest: +SKIP
...     QuantizeOptions("bundle/", "bundle-int8/", target="int8", draft="int8"))
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..export.exporter import ExportOptions, export_bundle
from ..models.locate import looks_like_hub_id
from ..runtime import bundle as bundle_mod
from .precisions import QuantizeError, QuantSettings, check_precision
from .quality import ReportOptions, format_report, quality_report, write_report

QUALITY_FILE = "quality.json"


@dataclass
class QuantizeOptions:
    bundle: str | Path  # input bundle: its manifest names its checkpoints
    out: str | Path
    target: str = "int8"  # precision of the target graph(s)
    draft: str = "int8"  # precision of the drafter's own layers
    force: bool = False
    settings: QuantSettings = field(default_factory=QuantSettings)
    report: ReportOptions | None = field(default_factory=ReportOptions)  # None: no quality report
    kv_cache: str = "auto"  # the fused target's cache: auto | fp32 | int8, as export's (choices.py)
    source_target: str | None = None  # the target checkpoint, when the recorded one is not here
    source_draft: str | None = None  # the drafter checkpoint, likewise


def _check_out(src: Path, out: Path, force: bool) -> None:
    src, res = src.resolve(), out.resolve()
    if res == src or src in res.parents:
        raise QuantizeError(
            f"--out {out} is inside the input bundle {src}; write the new bundle elsewhere"
        )
    if res in src.parents:
        raise QuantizeError(
            f"--out {out} contains the input bundle {src} (replacing it would "
            f"delete the input); choose another folder"
        )
    if out.exists() and not force:
        raise QuantizeError(f"{out} already exists; pass --force to replace it")


def recorded_options(manifest: dict, opts: QuantizeOptions) -> dict:
    """The export options the bundle was written with, its checkpoints overridden by `opts`; a
    QuantizeError naming --target-checkpoint / --draft-checkpoint when one is unknown or gone."""
    recorded = dict((manifest.get("source") or {}).get("export_options") or {})
    if not recorded:
        raise QuantizeError(
            "the bundle does not record the checkpoints it was exported from (an "
            "older exporter); re-export it with `dflash-edge export --precision "
            "...`, or pass --target-checkpoint and --draft-checkpoint"
        )
    for key, given, flag in (
        ("target", opts.source_target, "--target-checkpoint"),
        ("draft", opts.source_draft, "--draft-checkpoint"),
    ):
        spec = given or recorded.get(key)
        if not _available(spec):
            raise QuantizeError(
                f"the bundle's {key} checkpoint {spec!r} is not here; pass {flag} DIR"
            )
        recorded[key] = spec
    return recorded


def _available(spec) -> bool:
    """A checkpoint spec that can be read: a folder or .gguf file that exists, a hub id
    (`org/name[:QUANT][@REVISION]`, resolved later), "default" or "random"."""
    if spec in (None, "default", "random"):
        return True
    return Path(spec).expanduser().exists() or looks_like_hub_id(spec)


def quantize_bundle(opts: QuantizeOptions, log=None) -> Path:
    """Re-export the bundle's checkpoints at `opts.target` / `opts.draft`, add the quality report
    (unless `opts.report` is None), publish atomically."""
    log = log or sys.stderr  # looked up per call: a replaced sys.stderr is honoured
    src = bundle_mod.read_bundle(opts.bundle, verify=True)  # a file failing its sha256 stops here
    check_precision(opts.target)
    check_precision(opts.draft)
    out = Path(opts.out).expanduser()
    _check_out(src.root, out, opts.force)
    recorded = recorded_options(src.manifest, opts)
    prompts = opts.report.prompts if opts.report else recorded.get("kv_prompts")
    export = ExportOptions(
        **{
            **recorded,
            "out": out,
            "force": opts.force,
            "precision": opts.target,
            "draft_precision": opts.draft,
            "kv_cache": opts.kv_cache,
            "quant_block": opts.settings.block_size,
            "accuracy_level": opts.settings.accuracy_level,
            "kv_prompts": prompts,
            "threads": opts.report.threads if opts.report else 0,
        }
    )

    def finish(tmp: Path) -> None:
        manifest = json.loads((tmp / bundle_mod.MANIFEST).read_text())
        manifest["source"]["quantized_from"] = str(src.root.resolve())
        if opts.report is not None:
            report = quality_report(src.root, tmp, opts.report, log=log)
            manifest["quality"] = write_report(tmp, QUALITY_FILE, report)
            print(format_report(report), file=log)
        bundle_mod.write_manifest(tmp, manifest)

    return export_bundle(export, progress=False, finish=finish)
