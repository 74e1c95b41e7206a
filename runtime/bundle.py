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
         "tokenizer", "source", "engines"),
    "model": ("family", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
              "draft_num_layers", "target_layer_ids", "mask_token_id", "eos_token_ids", "bos_token_id",
              "max_position_embeddings", "draft_vocab_size"),
    "kv_cache": ("layout", "dtype", "slack"),
    "tokenizer": ("file", "config"),
    "graph": ("files", "precision", "io", "static_shapes", "opset"),
    "source": None,
    "shared_weights": None,
    "engines": None,
}
OPTIONAL = {"engines", "source", "created", "bos_token_id", "opset", "draft_vocab_size"}
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


def _check_keys(section: str, data: dict, where: str) -> None:
    allowed = SCHEMA[section]
    if allowed is None:
        return
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise BundleError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(allowed)} "
                          f"(was the bundle written by a newer dflash-edge? re-export it)")
    missing = sorted(set(allowed) - set(data) - OPTIONAL)
    if missing:
        raise BundleError(f"{where}: missing key(s) {missing}; re-export the bundle")


def validate_manifest(manifest: dict, where: str = MANIFEST) -> None:
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{where}: format is {manifest.get('format')!r}, expected {FORMAT!r}: not a dflash-edge bundle")
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise BundleError(f"{where}: manifest_version {manifest.get('manifest_version')!r} is not supported "
                          f"(this dflash-edge reads version {MANIFEST_VERSION}); re-export the bundle or upgrade")
    _check_keys("", manifest, where)
    for section in ("model", "kv_cache", "tokenizer", "source", "shared_weights", "engines"):
        if section in manifest:
            _check_keys(section, manifest[section], f"{where} [{section}]")
    for name, graph in manifest["graphs"].items():
        _check_keys("graph", graph, f"{where} [graphs.{name}]")
    if manifest["kv_cache"]["layout"] != KV_LAYOUT:
        raise BundleError(f"{where}: kv_cache.layout {manifest['kv_cache']['layout']!r} is not {KV_LAYOUT!r}")
    for required in ("target", "drafter"):
        if required not in manifest["graphs"]:
            raise BundleError(f"{where}: graphs lacks {required!r}; re-export the bundle")


def read_bundle(path: str | Path, verify: bool = True) -> Bundle:
    """Read and validate `path/manifest.json`; with `verify`, check every file's size and sha256."""
    root = Path(path).expanduser()
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise BundleError(f"{mpath} not found: not a bundle directory (create one with `dflash-edge export --out DIR`)")
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as err:
        raise BundleError(f"{mpath} is not valid JSON ({err}); re-export the bundle") from err
    validate_manifest(manifest, str(mpath))
    entries = list({e["path"]: e for g in manifest["graphs"].values() for e in g["files"]}.values())  # shared files once
    entries += [{"path": manifest["tokenizer"]["file"]}]
    for entry in entries:
        fpath = root / entry["path"]
        if not fpath.is_file():
            raise BundleError(f"bundle file {fpath} is missing (named in {mpath}); re-export the bundle")
        if verify and "sha256" in entry:
            if fpath.stat().st_size != entry["bytes"] or sha256_file(fpath) != entry["sha256"]:
                raise BundleError(f"bundle file {fpath} is corrupt: its sha256 does not match {mpath}; re-export it")
    return Bundle(root, manifest)


def write_manifest(root: Path, manifest: dict) -> None:
    """Validate and write `root/manifest.json` atomically."""
    validate_manifest(manifest, str(root / MANIFEST))
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", dir=root)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    os.replace(tmp, root / MANIFEST)
