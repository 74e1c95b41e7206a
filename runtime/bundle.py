"""The bundle contract: `manifest.json` schema, reading and validation (DESIGN.md §3).

The runtime learns everything from the manifest; export and quantize write bundles through
`write_manifest`. Unknown keys, missing files and sha256 mismatches are errors naming the key or file.

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

from .errors import DflashEdgeError

FORMAT = "dflash-edge-bundle"
MANIFEST_VERSION = 1
MANIFEST = "manifest.json"

# section -> allowed keys (None: free-form dict). Every key is required unless listed in OPTIONAL.
SCHEMA: dict[str, tuple[str, ...] | None] = {
    "": ("format", "manifest_version", "exporter_version", "created", "model", "block_size",
         "trained_block_size", "max_context", "prefill_chunk", "kv_cache", "shared_weights", "graphs",
         "tokenizer", "source", "engines", "checksum",
         "quality"),                                  # quality: quantize's report file (path, bytes, sha256)
    "model": ("family", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
              "draft_num_layers", "target_layer_ids", "mask_token_id", "eos_token_ids", "bos_token_id",
              "max_position_embeddings", "draft_vocab_size",
              "draft_intermediate_size",                       # MLP widths for devices plan (older bundles lack them)
              "draft_layer_types", "draft_sliding_window",     # a drafter with sliding-window layers (io_tables)
              "num_experts", "experts_per_token", "moe_intermediate_size", "intermediate_size",
              "sparse_layers",                                # an MoE target (qwen3_moe)
              "layer_types", "linear_conv_kernel_dim", "linear_num_key_heads", "linear_num_value_heads",
              "linear_key_head_dim", "linear_value_head_dim"),    # a hybrid target (qwen3_5)
    "kv_cache": ("layout", "dtype", "slack"),
    "tokenizer": ("file", "config", "checksums"),
    "graph": ("files", "precision", "io", "static_shapes", "opset", "flavour",   # flavour: io_tables.FLAVOURS
              "quantization", "kv_cache", "weight_bytes"),    # weight_bytes: its initializers' (devices plan)            # quantization: tool, settings, what was lowered;
    #                                                   kv_cache: the graph's own cache (quantize/int8_cache.py)
    "source": None,
    "shared_weights": None,
    "engines": None,
}
OPTIONAL = {"engines", "source", "created", "bos_token_id", "opset", "draft_vocab_size", "flavour", "draft_intermediate_size",
            "draft_layer_types", "draft_sliding_window",
            "num_experts", "experts_per_token", "moe_intermediate_size", "intermediate_size", "sparse_layers",
            "layer_types", "linear_conv_kernel_dim", "linear_num_key_heads", "linear_num_value_heads",
            "linear_key_head_dim", "linear_value_head_dim",
            "quality", "quantization",
            "checksum", "checksums"}     # older bundles lack the manifest's and the tokenizer files' sha256
OPTIONAL_IN = {"graph": {"kv_cache", "weight_bytes"}}   # optional in that section only (the top-level kv_cache is required)
KV_LAYOUT = "S,L,Hkv,D"


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
        """The cache dtype graph `name` runs with: its own `kv_cache` entry (an int8 fused target), else the bundle's."""
        return self.manifest["graphs"][name].get("kv_cache", {}).get("dtype", self.kv_dtype)

    def graph_pad_rows(self, name: str) -> int | None:
        """Zero rows graph `name` appends to attention's input when its manifest says (0 for an int8 fused
        target); None: the graph's own default (kv.py: 1 for the fp32-cache fused target)."""
        return self.manifest["graphs"][name].get("kv_cache", {}).get("pad_rows")

    def graph_path(self, name: str) -> Path:
        return self.root / self.manifest["graphs"][name]["files"][0]["path"]


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
    """sha256 of the manifest's canonical JSON without its own `checksum` key (catches any edit or bit flip)."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _expect(value, kind: type, where: str):
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BundleError(f"{where} is {type(value).__name__} {value!r:.60}, expected {kind.__name__}; "
                          f"the manifest is damaged: re-export the bundle")
    return value


def _file_entries(manifest: dict, where: str) -> list[dict]:
    """Every file the manifest names (graphs' files, the tokenizer's, the quality report), type-checked."""
    entries = []
    for name, graph in manifest["graphs"].items():
        for i, e in enumerate(_expect(graph["files"], list, f"{where} [graphs.{name}.files]")):
            entries.append(_entry(e, f"{where} [graphs.{name}.files[{i}]]"))
    tok = manifest["tokenizer"]
    entries.append({"path": _expect(tok["file"], str, f"{where} [tokenizer.file]")})
    if tok["config"] is not None:
        entries.append({"path": _expect(tok["config"], str, f"{where} [tokenizer.config]")})
    for i, e in enumerate(_expect(tok.get("checksums", []), list, f"{where} [tokenizer.checksums]")):
        entries.append(_entry(e, f"{where} [tokenizer.checksums[{i}]]"))
    if "quality" in manifest:
        entries.append(_entry(manifest["quality"], f"{where} [quality]"))
    return entries


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
        raise BundleError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(allowed)} "
                          f"(was the bundle written by a newer dflash-edge? re-export it)")
    missing = sorted(set(allowed) - set(data) - OPTIONAL - OPTIONAL_IN.get(section, set()))
    if missing:
        raise BundleError(f"{where}: missing key(s) {missing}; re-export the bundle")


def validate_manifest(manifest: dict, where: str = MANIFEST) -> None:
    """Format, version, keys and types of the sections (BundleError naming the key otherwise)."""
    _expect(manifest, dict, where)
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{where}: format is {manifest.get('format')!r}, expected {FORMAT!r}: not a dflash-edge bundle")
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise BundleError(f"{where}: manifest_version {manifest.get('manifest_version')!r} is not supported "
                          f"(this dflash-edge reads version {MANIFEST_VERSION}); re-export the bundle or upgrade")
    _check_keys("", manifest, where)
    for section in ("model", "kv_cache", "tokenizer", "source", "shared_weights", "engines"):
        if section in manifest:
            _check_keys(section, manifest[section], f"{where} [{section}]")
    for name, graph in _expect(manifest["graphs"], dict, f"{where} [graphs]").items():
        _check_keys("graph", graph, f"{where} [graphs.{name}]")
    _file_entries(manifest, where)
    if manifest["kv_cache"]["layout"] != KV_LAYOUT:
        raise BundleError(f"{where}: kv_cache.layout {manifest['kv_cache']['layout']!r} is not {KV_LAYOUT!r}")
    for required in (("target", "target_hybrid"), ("drafter",)):     # a hybrid target's graph is target_hybrid
        if not set(required) & set(manifest["graphs"]):
            raise BundleError(f"{where}: graphs lacks {required[0]!r}; re-export the bundle")
    _check_windows(manifest, where)


def _check_windows(manifest: dict, where: str) -> None:
    """`model.draft_layer_types` (one known kind per draft layer) and `draft_sliding_window` (1..max_context)."""
    model = manifest["model"]
    kinds = model.get("draft_layer_types")
    if kinds is None:
        return
    known = ("full_attention", "sliding_attention")
    if not isinstance(kinds, list) or len(kinds) != model["draft_num_layers"] or not set(kinds) <= set(known):
        raise BundleError(f"{where} [model.draft_layer_types] is {kinds!r:.80}: expected one of {known} per draft "
                          f"layer ({model['draft_num_layers']}); re-export the bundle")
    window = model.get("draft_sliding_window")
    if "sliding_attention" in kinds and not (isinstance(window, int) and 1 <= window <= manifest["max_context"]):
        raise BundleError(f"{where} [model.draft_sliding_window] is {window!r}: the sliding layers need a window "
                          f"of 1..max_context ({manifest['max_context']}) positions; re-export the bundle")


def read_bundle(path: str | Path, verify: bool = True) -> Bundle:
    """Read and validate `path/manifest.json`; with `verify`, check every file's size and sha256."""
    root = Path(path).expanduser()
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise BundleError(f"{mpath} not found: not a bundle directory (create one with `dflash-edge export --out DIR`)")
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BundleError(f"{mpath} is not valid JSON ({err}); re-export the bundle") from err
    validate_manifest(manifest, str(mpath))
    if verify and "checksum" in manifest and manifest["checksum"] != manifest_checksum(manifest):
        raise BundleError(f"{mpath} is corrupt: its content does not match its checksum (edited or damaged after "
                          f"export); re-export the bundle")
    for entry in {e["path"]: e for e in _file_entries(manifest, str(mpath))}.values():   # shared files once
        fpath = root / entry["path"]
        if not fpath.is_file():
            raise BundleError(f"bundle file {fpath} is missing (named in {mpath}); re-export the bundle")
        if verify and "sha256" in entry:
            if fpath.stat().st_size != entry["bytes"] or sha256_file(fpath) != entry["sha256"]:
                raise BundleError(f"bundle file {fpath} is corrupt: its sha256 does not match {mpath}; re-export it")
    return Bundle(root, manifest)


def write_manifest(root: Path, manifest: dict) -> None:
    """Validate and write `root/manifest.json` atomically, with its checksum (`manifest_checksum`)."""
    manifest = {**manifest, "checksum": manifest_checksum(manifest)}
    validate_manifest(manifest, str(root / MANIFEST))
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", dir=root)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    os.replace(tmp, root / MANIFEST)
