"""A truncated or bit-flipped file in every position class of a bundle is refused at load (issue 16,
tier 1).

Classes: graph (`*.onnx`), external data (`*.onnx.data`), tokenizer (`tokenizer.json`, its config)
and the manifest itself; positions: first, middle and last byte; two bits (low and high) per
position."""

import shutil

import pytest

from dflash_edge.runtime.bundle import BundleError, read_bundle
from dflash_edge.runtime.errors import DflashEdgeError

FILES = [
    "target.onnx",
    "target.onnx.data",
    "target_fused.onnx",
    "drafter.onnx",
    "drafter.onnx.data",
    "shared.onnx.data",
    "tokenizer.json",
    "tokenizer_config.json",
    "manifest.json",
]
WHERE = {"first": lambda n: 0, "middle": lambda n: n // 2, "last": lambda n: n - 1}


@pytest.fixture(scope="module")
def bundle_copy(tiny_bundle, tmp_path_factory):
    dst = tmp_path_factory.mktemp("faults") / "bundle"
    shutil.copytree(tiny_bundle("qwen3", 8).path, dst)
    return dst


@pytest.fixture
def damage(bundle_copy):
    """damage(file, new_bytes_fn): rewrite one file of the bundle copy; restored after the test."""
    saved = {}

    def apply(name, fn):
        path = bundle_copy / name
        saved[path] = path.read_bytes()
        path.write_bytes(fn(saved[path]))
        return bundle_copy

    yield apply
    for path, data in saved.items():
        path.write_bytes(data)
    read_bundle(bundle_copy)  # the intact bundle loads: the damage was the cause


def _refused(path):
    with pytest.raises(BundleError):
        read_bundle(path)
    from dflash_edge.runtime import Generator

    with pytest.raises(DflashEdgeError):
        Generator.load(path)


@pytest.mark.parametrize("bit", [0x01, 0x80])
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", FILES)
def test_bit_flip_is_refused(damage, name, where, bit):
    def flip(data):
        i = WHERE[where](len(data))
        return data[:i] + bytes([data[i] ^ bit]) + data[i + 1 :]

    _refused(damage(name, flip))


@pytest.mark.parametrize("keep", [0.0, 0.5, 0.98])
@pytest.mark.parametrize("name", FILES)
def test_truncation_is_refused(damage, name, keep):
    _refused(damage(name, lambda data: data[: int(len(data) * keep)] if keep < 0.9 else data[:-2]))


def test_every_file_class_is_checksummed(bundle_copy):
    m = read_bundle(bundle_copy).manifest
    summed = {e["path"] for g in m["graphs"].values() for e in g["files"]} | {
        e["path"] for e in m["tokenizer"]["checksums"]
    }
    assert summed == set(FILES) - {"manifest.json"} and len(m["checksum"]) == 64


def test_keys_of_removed_tensorrt_writers_are_ignored_with_a_note(bundle_copy, tmp_path):
    """An older bundle's `engines` (.plan files of the old build-engines) and `flavours` (the
    contrib+tensorrt flavour): nothing reads them now, so the bundle loads and runs, with one note
    per key naming build-engines; a hostile path in them is still refused (test_security)."""
    import json

    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.bundle import LegacyKeyWarning, write_manifest

    old = tmp_path / "old"
    shutil.copytree(bundle_copy, old)
    manifest = json.loads((old / "manifest.json").read_text())
    plan = {"file": {"path": "engines/target.fp16.plan", "bytes": 4, "sha256": "0" * 64}}
    manifest["engines"] = {"target": {"fp16": plan}}
    manifest["flavours"] = {"tensorrt": {"path": "tensorrt", "graphs": ["target"], "bytes": 0}}
    write_manifest(old, manifest)
    with pytest.warns(LegacyKeyWarning) as notes:
        gen = Generator.load(old, use_tuned=False)
    said = sorted(str(n.message) for n in notes if n.category is LegacyKeyWarning)
    assert len(said) == 2 and all("is ignored" in s and "build-engines" in s for s in said)
    assert "'engines'" in said[0] and "'flavours'" in said[1]
    assert len(gen.generate_ids([3, 9, 14], 4, draft="drafter").token_ids) == 4
