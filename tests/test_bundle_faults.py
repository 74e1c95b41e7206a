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
