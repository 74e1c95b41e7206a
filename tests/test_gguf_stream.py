"""A GGUF read in place as the export's target (issue 36, item 2): the bundle equals the one
exported from the imported checkpoint, file for file; the torch reference over the GGUF equals
the one over the import; a bad file is refused in one line. Tier 1, tiny models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dflash_edge.export.exporter import ExportOptions, export_bundle
from dflash_edge.runtime.errors import CorruptFileError

gguf = pytest.importorskip("gguf")
from tiny_gguf import write_tiny_gguf  # noqa: E402

# the embedding Q8_0 (tiny_gguf's default); one matmul of each kind: affine, symmetric, 8-bit, float
TYPES = {
    "attn_q.weight": "Q4_1",
    "attn_k.weight": "Q4_0",
    "attn_v.weight": "Q5_0",
    "ffn_gate.weight": "Q8_0",
    "ffn_up.weight": "Q4_1",
}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """The GGUF, its import, and a private cache (the small files open_gguf writes)."""
    root = tmp_path_factory.mktemp("stream")
    mp = pytest.MonkeyPatch()
    mp.setenv("DFLASH_EDGE_HOME", str(root / "home"))
    from dflash_edge.models.gguf_import import import_gguf

    write_tiny_gguf(root / "tiny.gguf", "llama", types=TYPES)
    import_gguf(root / "tiny.gguf", root / "imported")
    yield root
    mp.undo()


def _export(target, out, precision: str):
    opts = ExportOptions(
        out=out,
        target=str(target),
        draft="random",
        block_size=4,
        max_context=128,
        prefill_chunk=8,
        precision=precision,
        kv_cache="fp32",
        accuracy_level=0,  # fp32 activations: parity at its tightest bounds
    )
    return export_bundle(opts, progress=False)


def _files(bundle) -> dict:
    """file -> sha256 of every graph, weight and tokenizer file, as the manifest records them."""
    m = json.loads((bundle / "manifest.json").read_text())
    files = {f["path"]: f["sha256"] for g in m["graphs"].values() for f in g["files"]}
    files |= {f["path"]: f["sha256"] for f in m["tokenizer"]["checksums"]}
    return files


@pytest.mark.parametrize("precision", ["int4", "fp32"])
def test_gguf_export_equals_import_then_export(home, tmp_path, precision):
    direct = _export(home / "tiny.gguf", tmp_path / "direct", precision)
    imported = _export(home / "imported", tmp_path / "imported", precision)
    got, want = _files(direct), _files(imported)
    assert "target.onnx" in got and "tokenizer.json" in got
    assert got == want
    manifest = json.loads((direct / "manifest.json").read_text())
    assert manifest["source"]["target"] == str(home / "tiny.gguf")
    assert manifest["source"]["parity"]  # parity ran, and passed
    assert not list((home / "home").rglob("*.safetensors"))  # no weights in the cache


def test_gguf_checkpoint_reads_what_the_import_holds(home):
    """Every tensor, row slices of the table, and the exact blocks equal the import's."""
    from dflash_edge.models.checkpoint import Checkpoint
    from dflash_edge.models.gguf_checkpoint import open_gguf

    ckpt, folder = open_gguf(home / "tiny.gguf")
    ref = Checkpoint.open(home / "imported")
    assert sorted(ckpt.names()) == sorted(ref.names())
    for name in ref.names():
        assert ckpt.shape(name) == ref.shape(name)
        np.testing.assert_array_equal(ckpt.array(name), ref.array(name), err_msg=name)
        a, b = ckpt.nbits(name), ref.nbits(name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.meta() == b.meta()
            for field, arr in b.arrays().items():
                np.testing.assert_array_equal(getattr(a, field), arr, err_msg=f"{name}/{field}")
    table = "model.embed_tokens.weight"
    np.testing.assert_array_equal(
        ckpt.array(table, rows=slice(7, 11)), ref.array(table, rows=slice(7, 11))
    )
    assert ckpt.unmapped_low_bit() == ref.unmapped_low_bit() == {}
    for f in ("config.json", "tokenizer_config.json", "generation_config.json"):
        assert json.loads((folder / f).read_text()) == json.loads(
            (home / "imported" / f).read_text()
        )


def test_torch_reference_over_the_gguf_equals_the_imports(home):
    """Layer-streamed torch models over the two checkpoints give the same logits, bit for bit."""
    import torch

    from dflash_edge.models import build_target
    from dflash_edge.models.checkpoint import Checkpoint
    from dflash_edge.models.config import TargetConfig
    from dflash_edge.models.gguf_checkpoint import open_gguf
    from dflash_edge.models.weights import stream_layers

    ckpt, folder = open_gguf(home / "tiny.gguf")
    cfg = TargetConfig.from_json(folder)
    ids = torch.tensor([[5, 17, 42, 8, 61, 33, 9, 12]])

    def logits(c):
        tied = ("lm_head.weight",)
        model = stream_layers(lambda: build_target(cfg), c, "model.layers", ignore=tied)
        model.tie_weights()
        with torch.no_grad():
            return model.eval()(ids, model.new_cache(32)).logits

    got, want = logits(ckpt), logits(Checkpoint.open(home / "imported"))
    assert torch.isfinite(want).all()
    assert torch.equal(got, want)


def test_truncated_gguf_is_one_line_corrupt_file_error(home, tmp_path):
    data = (home / "tiny.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 100])
    with pytest.raises(CorruptFileError) as err:
        _export(cut, tmp_path / "out", "int4")
    assert "\n" not in str(err.value) and "re-download" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_missing_or_foreign_gguf_target_is_named(home, tmp_path):
    """A .gguf path that is not there, or not a GGUF, is refused in one line before any writing."""
    from dflash_edge.runtime.errors import ModelFormatError

    (tmp_path / "notes.gguf").write_text("not a model")
    for name, words in (("absent.gguf", "no such GGUF file"), ("notes.gguf", "not a GGUF file")):
        with pytest.raises(ModelFormatError, match=words) as err:
            _export(tmp_path / name, tmp_path / "out", "int4")
        assert "\n" not in str(err.value)
        assert not (tmp_path / "out").exists()


def test_a_file_cut_after_it_was_opened_is_named(home, tmp_path):
    """Bytes read per tensor are checked again: a file truncated after its header was walked."""
    from dflash_edge.models.gguf_checkpoint import open_gguf

    path = tmp_path / "later.gguf"
    path.write_bytes((home / "tiny.gguf").read_bytes())
    ckpt, _ = open_gguf(path)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 64)
    last = max(ckpt.names(), key=lambda n: ckpt.tensors[n].offset)
    with pytest.raises(CorruptFileError, match="re-download"):
        ckpt.array(last)
