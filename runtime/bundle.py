"""The bundle contract: `manifest.json` schema, reading and validation (docs/design.md §3).

The runtime learns everything from the manifest; export and quantize write bundles through
`write_manifest`. Unknown keys, missing files and sha256 mismatches are errors naming the key or
file. Bundles come from downloads, so the manifest is untrusted: every path it names resolves inside
the bundle folder (`inside`), every graph's external data is one of its listed files, and sizes are
bounded before anything is allocated (`check_sizes`).

>>> bundle = read_bundle("bundle/")                  # doctest: +SKIP
>>> bundle.graph_path("target"), bundle.block_size   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import memory
from .errors import DflashEdgeError
from .onnx_scan import OnnxScanError, external_locations

FORMAT = "dflash-edge-bundle"
MANIFEST_VERSION = 1
MANIFEST = "manifest.json"

# the model section's sizes (bounded by check_sizes, with max_position_embeddings)
MODEL_DIMS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "draft_num_layers",
)
# the model section's optional keys (older bundles, or other kinds of model, lack them)
MODEL_OPTIONAL = (
    # MLP widths for devices plan
    "draft_intermediate_size",
    "draft_layer_types",
    # a drafter with sliding-window layers (io_tables)
    "draft_sliding_window",
    # a DFlash2 drafter: candidates per position (its lattice)
    "draft_selector_top_k",
    # an MoE target (qwen3_moe)
    "num_experts",
    "experts_per_token",
    "moe_intermediate_size",
    "intermediate_size",
    "sparse_layers",
    # a hybrid target (qwen3_5)
    "layer_types",
    "linear_conv_kernel_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
)
# section -> allowed keys (None: free-form dict). Every key is required unless listed in OPTIONAL.
SCHEMA: dict[str, tuple[str, ...] | None] = {
    # quality: quantize's report file (path, bytes, sha256); engines, flavours: LEGACY (ignored)
    "": (
        "format",
        "manifest_version",
        "exporter_version",
        "created",
        "model",
        "block_size",
        "trained_block_size",
        "max_context",
        "prefill_chunk",
        "kv_cache",
        "shared_weights",
        "graphs",
        "tokenizer",
        "source",
        "engines",
        "checksum",
        "quality",
        "flavours",
    ),
    "model": (
        "family",
        *MODEL_DIMS,
        "target_layer_ids",
        "mask_token_id",
        "eos_token_ids",
        "bos_token_id",
        "max_position_embeddings",
        "draft_vocab_size",
        *MODEL_OPTIONAL,
    ),
    "kv_cache": ("layout", "dtype", "slack"),
    "tokenizer": ("file", "config", "checksums"),
    "graph": (
        "files",
        "precision",
        "io",
        "static_shapes",
        "opset",
        # io_tables.FLAVOURS
        "flavour",
        # tool, settings, what was lowered
        "quantization",
        # the graph's own cache (export/kv_cache.py)
        "kv_cache",
        # its initializers' (devices plan)
        "weight_bytes",
    ),
    "source": None,
    "shared_weights": None,
    "engines": None,
}
# older bundles lack the manifest's and the tokenizer files' sha256
OPTIONAL = {
    "engines",
    "flavours",
    "source",
    "created",
    "bos_token_id",
    "opset",
    "draft_vocab_size",
    "flavour",
    *MODEL_OPTIONAL,
    "quality",
    "quantization",
    "checksum",
    "checksums",
}
# keys only removed writers wrote: read (their paths still checked), then ignored with a note
LEGACY = {
    "engines": "TensorRT .plan files from an older `build-engines`, in engines/",
    "flavours": "a TensorRT flavour from an older `export --low-bit-ops contrib+tensorrt`, in "
    "tensorrt/",
}


class LegacyKeyWarning(UserWarning):
    """The manifest holds a key of a removed writer (`LEGACY`), which this runtime ignores."""


def note_legacy(manifest: dict, root: Path) -> None:
    """One LegacyKeyWarning per `LEGACY` key in `manifest`: the bundle runs without it."""
    import warnings

    for key, what in LEGACY.items():
        if key in manifest:
            warnings.warn(
                f"{root / MANIFEST}: key {key!r} ({what}) is ignored: TensorRT runs through "
                f"onnxruntime's TensorRT provider on this bundle's own graphs (`dflash-edge "
                f"build-engines {root}` fills its engine cache); that folder can be deleted",
                LegacyKeyWarning,
                stacklevel=3,
            )


# optional in that section only (the top-level kv_cache is required)
OPTIONAL_IN = {"graph": {"kv_cache", "weight_bytes"}}
KV_LAYOUT = "S,L,Hkv,D"
# read by fixed name, not through the manifest (tuning.TUNED, tokenizer.py, TensorRT EP's cache)
LOADER_FILES = (
    "tuned.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    ".trt-cache",
)
MAX_DIM = 2**31 - 1  # any one size (onnxruntime's shapes, numpy's buffers)
MAX_KV_BYTES = 2**40  # 1 TiB of KV cache: no device has it; a larger figure is hostile
KV_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
SIZES = {
    "": ("block_size", "trained_block_size", "max_context", "prefill_chunk"),
    "model": (*MODEL_DIMS, "max_position_embeddings"),
}


class BundleError(DflashEdgeError):
    """A bundle directory or manifest that the runtime cannot use."""


@dataclass
class Bundle:
    root: Path
    manifest: dict

    @property
    def model(self) -> dict:
        return self.manifest["model"]

    @property
    def block_size(self) -> int:
        return self.manifest["block_size"]

    @property
    def max_context(self) -> int:
        return self.manifest["max_context"]

    @property
    def kv_dtype(self) -> str:
        return self.manifest["kv_cache"]["dtype"]

    def graph_kv_dtype(self, name: str) -> str:
        """The cache dtype graph `name` runs with: its own `kv_cache` entry (an int8 fused target),
        else the bundle's."""
        return self.manifest["graphs"][name].get("kv_cache", {}).get("dtype", self.kv_dtype)

    def graph_pad_rows(self, name: str) -> int | None:
        """Zero rows graph `name` appends to attention's input when its manifest says (0 for an int8
        fused target); None: the graph's own default (targets.py: 1 for the fp32-cache fused
        target)."""
        return self.manifest["graphs"][name].get("kv_cache", {}).get("pad_rows")

    def graph_path(self, name: str) -> Path:
        """Graph `name`'s .onnx file, inside the bundle; its external data all among its files."""
        files = self.manifest["graphs"][name]["files"]
        path = inside(self.root, files[0]["path"], f"graphs.{name}.files[0].path")
        check_external_data(path, {f["path"] for f in files}, f"graphs.{name}")
        return path


class PathEscapeError(BundleError):
    """A bundle names a file outside its folder (absolute path, `..`, or a symlink leading out)."""


def escape_reason(rel) -> str | None:
    """Why the relative path `rel` could leave the folder it is joined to, by its text alone
    (None: it cannot)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        return "is not a relative path"
    if rel.startswith(("/", "\\")) or os.path.isabs(rel) or (len(rel) > 1 and rel[1] == ":"):
        return "is absolute"
    if ".." in rel.replace("\\", "/").split("/"):
        return "climbs out with '..'"
    return None


def inside(
    root: Path,
    rel,
    key: str,
    error: type[DflashEdgeError] = PathEscapeError,
    home: Path | None = None,
) -> Path:
    """`root / rel`, refused (`error` naming `key` and the path) unless it stays inside `root`:
    no absolute path, no `..`, no symlink on the way that leads outside `home` (default `root`):
    what a hostile download would try.

    >>> inside(Path("b"), "target.onnx", "graphs.target.files[0].path")     # doctest: +SKIP
    PosixPath('b/target.onnx')
    """
    reason = escape_reason(rel)
    home = os.path.realpath(home or root)
    if reason is None and not Path(os.path.realpath(Path(root) / rel)).is_relative_to(home):
        reason = "leads outside through a symlink"
    if reason is not None:
        raise error(
            f"{key} = {rel!r:.120} {reason} of {root}: only files inside that folder may "
            f"be named. The files are damaged or hostile: re-create them (or get them "
            f"from a source you trust)"
        )
    return Path(root) / rel


def check_external_data(graph: Path, listed: set[str], key: str) -> None:
    """Every external-data `location` in `graph` is one of the manifest's files for it (`listed`,
    each checked by `inside`): onnxruntime 1.17 reads `../x` and follows symlinks, so we check."""
    try:
        unlisted = sorted(external_locations(graph) - listed)
    except (OnnxScanError, OSError) as err:
        raise BundleError(
            f"{graph} is not a readable ONNX file ({err}); re-export the bundle"
        ) from None
    if unlisted:
        raise PathEscapeError(
            f"{graph} reads external data from {unlisted[:3]!r:.160}, which "
            f"{key}.files does not list: the graph is damaged or hostile; "
            f"re-export the bundle"
        )


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_entry(root: Path, rel: str) -> dict:
    """The manifest record of one bundle file: path, size and sha256."""
    path = root / rel
    return {"path": rel, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def manifest_checksum(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON without its own `checksum` key (catches any edit or
    bit flip)."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def _expect(value, kind: type, where: str):
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BundleError(
            f"{where} is {type(value).__name__} {value!r:.60}, expected {kind.__name__}; "
            f"the manifest is damaged: re-export the bundle"
        )
    return value


def _file_entries(manifest: dict, where: str) -> list[dict]:
    """Every file the manifest names (graphs' files, the tokenizer's, the quality report),
    type-checked."""
    entries = []
    for name, graph in manifest["graphs"].items():
        for i, e in enumerate(_expect(graph["files"], list, f"{where} [graphs.{name}.files]")):
            entries.append(_entry(e, f"{where} [graphs.{name}.files[{i}]]"))
    tok = manifest["tokenizer"]
    entries.append({"path": _expect(tok["file"], str, f"{where} [tokenizer.file]")})
    if tok["config"] is not None:
        entries.append({"path": _expect(tok["config"], str, f"{where} [tokenizer.config]")})
    for i, e in enumerate(
        _expect(tok.get("checksums", []), list, f"{where} [tokenizer.checksums]")
    ):
        entries.append(_entry(e, f"{where} [tokenizer.checksums[{i}]]"))
    if "quality" in manifest:
        entries.append(_entry(manifest["quality"], f"{where} [quality]"))
    return entries


def _named_paths(manifest: dict) -> list[tuple[str, object]]:
    """(manifest key, path) of every path the manifest names, the free-form sections' included."""
    named = []
    for name, graph in manifest["graphs"].items():
        named += [
            (f"graphs.{name}.files[{i}].path", e["path"]) for i, e in enumerate(graph["files"])
        ]
    tok = manifest["tokenizer"]
    named += [("tokenizer.file", tok["file"])]
    named += [("tokenizer.config", tok["config"])] if tok["config"] else []
    named += [
        (f"tokenizer.checksums[{i}].path", e["path"])
        for i, e in enumerate(tok.get("checksums", []))
    ]
    if "quality" in manifest:
        named.append(("quality.path", manifest["quality"]["path"]))
    for name, flavour in _get(manifest, "flavours", dict).items():
        named.append((f"flavours.{name}.path", _get(flavour, "path", str)))
    for i, t in enumerate(_get(manifest.get("shared_weights"), "tensors", list)):
        named.append((f"shared_weights.tensors[{i}].file", _get(t, "file", str)))
    engines = manifest.get("engines") or {}
    for graph in engines:
        for precision, build in _get(engines, graph, dict).items():
            path = _get(_get(build, "file", dict), "path", str)
            named.append((f"engines.{graph}.{precision}.file.path", path))
    return named


def _get(section, key: str, kind: type):
    """section[key] of a free-form section when it is a `kind`, else an empty `kind`."""
    value = section.get(key) if isinstance(section, dict) else None
    return value if isinstance(value, kind) else kind()


def _check_paths(manifest: dict, where: str, root: Path | None = None) -> None:
    """Every named path by its text (and, with `root`, where it resolves: symlinks)."""
    for key, rel in _named_paths(manifest):
        reason = escape_reason(rel)
        if reason is not None:
            raise PathEscapeError(
                f"{where} [{key}] = {rel!r:.120} {reason}: a bundle may only "
                f"name files inside its own folder. The bundle is damaged or "
                f"hostile: re-export it"
            )
        if root is not None:
            inside(root, rel, f"{where} [{key}]")


def _entry(e, where: str) -> dict:
    _expect(e, dict, where)
    for key, kind in (("path", str), ("bytes", int), ("sha256", str)):
        _expect(e.get(key), kind, f"{where}.{key}")
    return e


def _check_keys(section: str, data: dict, where: str) -> None:
    _expect(data, dict, where)
    allowed = SCHEMA[section]
    if allowed is None:
        return
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise BundleError(
            f"{where}: unknown key(s) {unknown}; allowed: {', '.join(allowed)} "
            f"(was the bundle written by a newer dflash-edge? re-export it)"
        )
    missing = sorted(set(allowed) - set(data) - OPTIONAL - OPTIONAL_IN.get(section, set()))
    if missing:
        raise BundleError(f"{where}: missing key(s) {missing}; re-export the bundle")


def validate_manifest(manifest: dict, where: str = MANIFEST) -> None:
    """Format, version, keys and types of the sections (BundleError naming the key otherwise)."""
    _expect(manifest, dict, where)
    if manifest.get("format") != FORMAT:
        raise BundleError(
            f"{where}: format is {manifest.get('format')!r}, expected {FORMAT!r}: not a "
            "dflash-edge bundle"
        )
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise BundleError(
            f"{where}: manifest_version {manifest.get('manifest_version')!r} is not supported "
            f"(this dflash-edge reads version {MANIFEST_VERSION}); re-export the bundle or upgrade"
        )
    _check_keys("", manifest, where)
    for section in ("model", "kv_cache", "tokenizer", "source", "shared_weights", "engines"):
        if section in manifest:
            _check_keys(section, manifest[section], f"{where} [{section}]")
    for name, graph in _expect(manifest["graphs"], dict, f"{where} [graphs]").items():
        _check_keys("graph", graph, f"{where} [graphs.{name}]")
    _file_entries(manifest, where)
    _check_paths(manifest, where)
    check_sizes(manifest, where)
    if manifest["kv_cache"]["layout"] != KV_LAYOUT:
        raise BundleError(
            f"{where}: kv_cache.layout {manifest['kv_cache']['layout']!r} is not {KV_LAYOUT!r}"
        )
    # a hybrid target's graph is target_hybrid
    for required in (
        ("target", "target_hybrid"),
        ("drafter",),
    ):
        if not set(required) & set(manifest["graphs"]):
            raise BundleError(f"{where}: graphs lacks {required[0]!r}; re-export the bundle")
    _check_windows(manifest, where)


def _check_windows(manifest: dict, where: str) -> None:
    """`model.draft_layer_types` (one known kind per draft layer) and `draft_sliding_window`
    (1..max_context)."""
    model = manifest["model"]
    kinds = model.get("draft_layer_types")
    if kinds is None:
        return
    known = ("full_attention", "sliding_attention")
    if (
        not isinstance(kinds, list)
        or len(kinds) != model["draft_num_layers"]
        or not set(kinds) <= set(known)
    ):
        raise BundleError(
            f"{where} [model.draft_layer_types] is {kinds!r:.80}: expected one of {known} per "
            "draft "
            f"layer ({model['draft_num_layers']}); re-export the bundle"
        )
    window = model.get("draft_sliding_window")
    if "sliding_attention" in kinds and not (
        isinstance(window, int) and 1 <= window <= manifest["max_context"]
    ):
        raise BundleError(
            f"{where} [model.draft_sliding_window] is {window!r}: the sliding layers need a window "
            f"of 1..max_context ({manifest['max_context']}) positions; re-export the bundle"
        )


def check_sizes(manifest: dict, where: str = MANIFEST) -> None:
    """Every size is an int in 1..MAX_DIM and the KV cache the runtime preallocates
    (`kv_cache_bytes`) is under MAX_KV_BYTES: a one-line error before anything is allocated."""
    for section, keys in SIZES.items():
        for key in keys:
            _check_int(manifest[section] if section else manifest, key, section, where)
    _check_int(manifest["kv_cache"], "slack", "kv_cache", where, low=0)
    dtype = manifest["kv_cache"]["dtype"]
    if not isinstance(dtype, str) or dtype not in KV_ITEMSIZE:
        raise BundleError(
            f"{where} [kv_cache.dtype] is {dtype!r:.40}: expected one of "
            f"{', '.join(KV_ITEMSIZE)}; re-export the bundle"
        )
    need = kv_cache_bytes(manifest)
    if need > MAX_KV_BYTES:
        raise BundleError(
            f"{where}: its KV cache would take {need / 2**30:,.0f} GiB "
            f"(max_context {manifest['max_context']}, "
            f"{manifest['model']['num_layers']} layers): no device holds that; the "
            f"manifest is damaged or hostile: re-export with a smaller --max-context"
        )


def _check_int(data: dict, key: str, section: str, where: str, low: int = 1) -> None:
    name = f"{where} [{section + '.' if section else ''}{key}]"
    value = _expect(data[key], int, name)
    if not low <= value <= MAX_DIM:
        raise BundleError(
            f"{name} is {value}: a size must be {low}..{MAX_DIM}; the manifest is "
            f"damaged or hostile: re-export the bundle"
        )


def kv_cache_bytes(manifest: dict) -> int:
    """Bytes of the target's and drafter's KV caches at max context (+ slack, block, prefill
    chunk), as Generator.load preallocates them; exact Python ints, so no product overflows."""
    m = manifest["model"]
    rows = manifest["max_context"] + max(
        manifest["kv_cache"]["slack"], manifest["block_size"], manifest["prefill_chunk"]
    )
    itemsize = KV_ITEMSIZE[manifest["kv_cache"]["dtype"]]
    per_layer = rows * m["num_kv_heads"] * m["head_dim"] * 2 * itemsize  # K and V
    kinds = m.get("layer_types")
    layers = kinds.count("full_attention") if isinstance(kinds, list) else m["num_layers"]
    return per_layer * (layers + m["draft_num_layers"])


def check_kv_fits(bundle: Bundle, provider: str) -> None:
    """Refuse a bundle whose KV cache exceeds the memory `provider` has, with the figure (CPU: the
    host's MemAvailable, Linux; elsewhere not checked: the device's allocator reports it)."""
    need = kv_cache_bytes(bundle.manifest)
    available = memory.available_bytes() if provider == "cpu" else None
    if available is not None and need > available:
        raise BundleError(
            f"{bundle.root}: its KV cache at max_context {bundle.max_context} needs "
            f"{need / 2**30:.2f} GiB but {available / 2**30:.2f} GiB is available; "
            f"re-export with a smaller --max-context (or free memory)"
        )


def read_bundle(path: str | Path, verify: bool = True) -> Bundle:
    """Read and validate `path/manifest.json`; with `verify`, check every file's size and sha256."""
    root = Path(path).expanduser()
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise BundleError(
            f"{mpath} not found: not a bundle directory (create one with `dflash-edge export "
            "--out DIR`)"
        )
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BundleError(f"{mpath} is not valid JSON ({err}); re-export the bundle") from err
    validate_manifest(manifest, str(mpath))
    if verify and "checksum" in manifest and manifest["checksum"] != manifest_checksum(manifest):
        raise BundleError(
            f"{mpath} is corrupt: its content does not match its checksum (edited or damaged after "
            f"export); re-export the bundle"
        )
    _check_paths(manifest, str(mpath), root)
    note_legacy(manifest, root)
    for name in LOADER_FILES:
        if os.path.lexists(root / name):
            inside(root, name, f"{name} (read by the runtime)")
    # shared files once
    for entry in {e["path"]: e for e in _file_entries(manifest, str(mpath))}.values():
        fpath = root / entry["path"]
        if not fpath.is_file():
            raise BundleError(
                f"bundle file {fpath} is missing (named in {mpath}); re-export the bundle"
            )
        if verify and "sha256" in entry:
            if fpath.stat().st_size != entry["bytes"] or sha256_file(fpath) != entry["sha256"]:
                raise BundleError(
                    f"bundle file {fpath} is corrupt: its sha256 does not match {mpath}; "
                    "re-export it"
                )
    return Bundle(root, manifest)


def write_manifest(root: Path, manifest: dict) -> None:
    """Validate and write `root/manifest.json` atomically, with its checksum
    (`manifest_checksum`)."""
    manifest = {**manifest, "checksum": manifest_checksum(manifest)}
    validate_manifest(manifest, str(root / MANIFEST))
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", dir=root)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    os.replace(tmp, root / MANIFEST)
