"""Untrusted artefacts (issue 34; tier 1, plus the default model's tokenizer): a hostile chat
template runs nothing, a bundle or checkpoint naming a file outside its folder is refused by name,
absurd manifest sizes are refused before anything is allocated. docs/security.md lists the cases."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from dflash_edge.cli import main
from dflash_edge.models.checkpoint import INDEX, Checkpoint
from dflash_edge.runtime import bundle as bundle_mod
from dflash_edge.runtime import memory
from dflash_edge.runtime.bundle import (
    MANIFEST,
    BundleError,
    PathEscapeError,
    file_entry,
    kv_cache_bytes,
    read_bundle,
    write_manifest,
)
from dflash_edge.runtime.errors import ModelFormatError, UnsafeTemplateError
from dflash_edge.runtime.generator import Generator
from dflash_edge.runtime.onnx_scan import OnnxScanError, external_locations
from dflash_edge.runtime.tokenizer import ChatTokenizer
from dflash_edge.runtime.tuning import TunedFileError

POPEN = "lipsum.__globals__.os.popen('touch MARKER')"
ATTACKS = [  # each runs `touch MARKER` in a plain jinja2.Environment
    "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "{{ joiner.__init__.__globals__['os'].system('touch MARKER') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}{{ " + POPEN + " }}",
    "{{ namespace.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "{{ cycler | attr('__init__') | attr('__globals__') }}{{ " + POPEN + " }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}{{ " + POPEN + " }}",
]
CHAT = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "Capital of France?"},
]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": CITY,
            "description": "Weather in a city, °C",
        },
    }
]
DATA = Path(__file__).parent / "data"
QWEN_STYLE = (DATA / "qwen2_5_chat_template.jinja").read_text()  # system, tools, tool calls
HELPERS = (  # helpers real templates use, with arguments jinja2's own tojson renders otherwise
    "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
    "{{ m | tojson(indent=2) }}{{ m | tojson(separators=(',', ':'), ensure_ascii=True) }}"
    "{% continue %}{% endfor %}"
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
    "{{ ns.n }}{{ tools | tojson(sort_keys=True) }}{{ '<&>' | tojson }}"
)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _set_template(folder: Path, template: str) -> None:
    cfg = folder / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "chat_template": template}))


def _rehash(root: Path) -> None:
    """The manifest's sha256 entries and checksum recomputed (a hostile publisher writes them)."""
    manifest = json.loads((root / MANIFEST).read_text())
    for graph in manifest["graphs"].values():
        graph["files"] = [
            file_entry(root, f["path"]) if (root / f["path"]).is_file() else f
            for f in graph["files"]
        ]
    tok = manifest["tokenizer"]
    tok["checksums"] = [file_entry(root, e["path"]) for e in tok.get("checksums", [])]
    write_manifest(root, {k: v for k, v in manifest.items() if k != "checksum"})


@pytest.fixture
def bundle_copy(tiny_bundle, tmp_path):
    return _copy(tiny_bundle("qwen3", 8).path, tmp_path / "bundle")


# ---- 1. chat templates ---------------------------------------------------------------------
@pytest.mark.parametrize("attack", ATTACKS)
def test_hostile_template_in_bundle_runs_nothing(bundle_copy, tmp_path, attack, capsys):
    marker = tmp_path / "pwned"
    _set_template(bundle_copy, attack.replace("MARKER", str(marker)))
    _rehash(bundle_copy)
    gen = Generator.load(bundle_copy)
    with pytest.raises(UnsafeTemplateError, match="tokenizer_config.json.*nothing it asked for"):
        gen.generate(CHAT, max_new_tokens=2)
    rc = main(["run", str(bundle_copy), "--prompt", "hi", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "sandbox forbids" in err and "Traceback" not in err
    assert not marker.exists()


def test_hostile_template_in_checkpoint_runs_nothing(tiny_checkpoints, tmp_path):
    from dflash_edge.export.exporter import ExportOptions, export_bundle

    ckpt, marker = _copy(Path(tiny_checkpoints["qwen3"][1]), tmp_path / "ckpt"), tmp_path / "pwned"
    (ckpt / "tokenizer_config.json").unlink()
    attack = ATTACKS[0].replace("MARKER", str(marker))
    (ckpt / "chat_template.jinja").write_text(attack)  # newer transformers' layout
    with pytest.raises(UnsafeTemplateError, match="chat_template.jinja"):
        ChatTokenizer.from_dir(ckpt).encode_chat(CHAT)
    with pytest.raises(UnsafeTemplateError):
        export_bundle(
            ExportOptions(
                out=tmp_path / "out",
                target=str(ckpt),
                block_size=4,
                max_context=64,
                prefill_chunk=8,
                draft="random",
            ),
            progress=False,
        )
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.tier2
@pytest.mark.parametrize(
    "template, tools",
    [(None, None), (QWEN_STYLE, None), (QWEN_STYLE, TOOLS)],
    ids=["smollm2", "qwen-style", "qwen-style-tools"],
)
def test_templates_keep_their_ids(smollm2_dir, tmp_path, template, tools):
    """The sandbox changes nothing a real template renders: transformers' ids, exactly."""
    transformers = pytest.importorskip("transformers")
    folder = _copy(Path(smollm2_dir), tmp_path / "tok")
    if template is not None:
        _set_template(folder, template)
    chat = CHAT + [
        {"role": "assistant", "content": "Paris, é 🙂"},
        {"role": "user", "content": "Why?"},
    ]
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    want = ref.apply_chat_template(
        chat, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    ours = ChatTokenizer.from_dir(folder)
    text = ref.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True)
    assert ours.render_chat(chat, tools=tools) == text
    assert ours.encode_chat(chat, tools=tools) == want


@pytest.mark.tier2
def test_helpers_render_as_transformers_does(smollm2_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = _copy(Path(smollm2_dir), tmp_path / "tok")
    _set_template(folder, HELPERS)
    want = transformers.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        CHAT, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert ChatTokenizer.from_dir(folder).render_chat(CHAT, tools=TOOLS) == want


def test_template_errors_name_the_file(bundle_copy):
    _set_template(bundle_copy, "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ModelFormatError, match="tokenizer_config.json: roles must alternate"):
        ChatTokenizer.from_dir(bundle_copy).render_chat(CHAT)
    _set_template(bundle_copy, "{% for m in messages %}")
    with pytest.raises(ModelFormatError, match="tokenizer_config.json: line 1"):
        ChatTokenizer.from_dir(bundle_copy).render_chat(CHAT)


# ---- 2. paths ------------------------------------------------------------------------------
ESCAPES = [
    "../outside.data",
    "/etc/passwd",
    "sub/../../outside.data",
    "C:\\Windows\\x",
    "..\\x",
    "",
]
KEYS = {  # manifest key -> how to put a path there
    "graphs.drafter.files[1].path": lambda m, p: m["graphs"]["drafter"]["files"][1].update(path=p),
    "tokenizer.file": lambda m, p: m["tokenizer"].update(file=p),
    "tokenizer.checksums[0].path": lambda m, p: m["tokenizer"]["checksums"][0].update(path=p),
    "shared_weights.tensors[0].file": lambda m, p: m["shared_weights"]["tensors"][0].update(file=p),
    "engines.target.fp16.file.path": lambda m, p: m.update(
        engines={"target": {"fp16": {"file": {"path": p}}}}
    ),
    "quality.path": lambda m, p: m.update(quality={"path": p, "bytes": 1, "sha256": "0" * 64}),
}


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("escape", ESCAPES)
def test_manifest_paths_stay_inside(bundle_copy, key, escape):
    manifest = json.loads((bundle_copy / MANIFEST).read_text())
    KEYS[key](manifest, escape)
    (bundle_copy / MANIFEST).write_text(json.dumps(manifest))
    for verify in (True, False):
        with pytest.raises(PathEscapeError, match=rf"\[{re.escape(key)}\] = "):
            read_bundle(bundle_copy, verify=verify)


@pytest.mark.parametrize(
    "name", ["target.onnx.data", "tokenizer.json", "tuned.json", "chat_template.jinja"]
)
def test_symlink_out_of_the_bundle(bundle_copy, tmp_path, name):
    """A symlink to a byte-identical file outside: the sha256 fields agree, the path is refused."""
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    if (bundle_copy / name).exists():
        shutil.move(bundle_copy / name, outside)
    else:
        outside.write_text("{}")
    os.symlink(outside, bundle_copy / name)
    with pytest.raises(PathEscapeError, match=f"{name}.*symlink"):
        read_bundle(bundle_copy)
    with pytest.raises(PathEscapeError, match=name):
        Generator.load(bundle_copy)


def test_symlink_inside_the_bundle_is_fine(bundle_copy):
    shutil.move(bundle_copy / "tokenizer.json", bundle_copy / "real-tokenizer.json")
    os.symlink("real-tokenizer.json", bundle_copy / "tokenizer.json")
    assert read_bundle(bundle_copy).root == bundle_copy


def test_tuned_symlink_refused_by_name(bundle_copy, tmp_path):
    from dflash_edge.runtime.tuning import read_tuned

    (tmp_path / "t.json").write_text("{}")
    os.symlink(tmp_path / "t.json", bundle_copy / "tuned.json")
    with pytest.raises(TunedFileError, match="tuned.json.*symlink"):
        read_tuned(bundle_mod.Bundle(bundle_copy, json.loads((bundle_copy / MANIFEST).read_text())))


def _relocate(graph: Path, old: str, new: str) -> None:
    onnx = pytest.importorskip("onnx")

    model = onnx.load(str(graph), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    onnx.save(model, str(graph))


@pytest.mark.parametrize(
    "location", ["../drafter.onnx.data", "stolen.data", "/ABS/drafter.onnx.data"]
)
def test_external_data_outside_the_manifest(bundle_copy, tmp_path, location):
    """A graph whose external data is not among its listed files (onnxruntime 1.17 reads ../x)."""
    location = location.replace("/ABS", str(tmp_path))
    shutil.copy(bundle_copy / "drafter.onnx.data", tmp_path / "drafter.onnx.data")
    shutil.copy(bundle_copy / "drafter.onnx.data", bundle_copy / "stolen.data")
    _relocate(bundle_copy / "drafter.onnx", "drafter.onnx.data", location)
    _rehash(bundle_copy)
    read_from = rf"drafter.onnx reads external data from \['{re.escape(location)}'\]"
    with pytest.raises(PathEscapeError, match=read_from + ".*graphs.drafter.files does not list"):
        Generator.load(bundle_copy)


def test_scan_finds_what_onnx_finds(tiny_bundle):
    onnx = pytest.importorskip("onnx")

    root = tiny_bundle("qwen3", 8).path
    for graph in root.glob("*.onnx"):
        model = onnx.load(str(graph), load_external_data=False)
        want = {
            e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"
        }
        assert want and external_locations(graph) == want


def test_scan_of_damaged_graphs(tiny_bundle, tmp_path):
    """Truncated and bit-flipped graphs: the scan answers or raises OnnxScanError, nothing else."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    data = (tiny_bundle("qwen3", 8).path / "drafter.onnx").read_bytes()
    path = tmp_path / "g.onnx"

    @settings(max_examples=200, deadline=None)
    @given(
        cut=st.integers(0, len(data)), flips=st.lists(st.integers(0, len(data) * 8 - 1), max_size=8)
    )
    def run(cut, flips):
        raw = bytearray(data)
        for bit in flips:
            raw[bit // 8] ^= 1 << bit % 8
        path.write_bytes(bytes(raw[:cut]))
        try:
            assert isinstance(external_locations(path), set)
        except OnnxScanError:
            pass

    run()


def _checkpoint_with_index(tiny_checkpoints, root: Path, shard: str) -> Path:
    ckpt = _copy(Path(tiny_checkpoints["qwen3"][1]), root)
    names = Checkpoint.open(ckpt).names()
    (ckpt / INDEX).write_text(json.dumps({"weight_map": {n: shard for n in names}}))
    return ckpt


@pytest.mark.parametrize(
    "shard", ["../model.safetensors", "/ABS/model.safetensors", "a/../../model.safetensors"]
)
def test_shard_index_stays_inside(tiny_checkpoints, tmp_path, shard):
    shard = shard.replace("/ABS", str(tmp_path))
    ckpt = _checkpoint_with_index(tiny_checkpoints, tmp_path / "ckpt", shard)
    shutil.copy(ckpt / "model.safetensors", tmp_path / "model.safetensors")
    with pytest.raises(ModelFormatError, match=rf"{INDEX} weight_map = '{shard}'"):
        Checkpoint.open(ckpt)


def test_shard_symlinks_hf_cache_layout(tiny_checkpoints, tmp_path):
    """A Hugging Face cache snapshot links its files to ../../blobs (fine); out of the repo: no."""
    repo = tmp_path / "models--org--tiny"
    snap = _checkpoint_with_index(
        tiny_checkpoints, repo / "snapshots" / "abc", "model-00001.safetensors"
    )
    (repo / "blobs").mkdir()
    shutil.move(snap / "model.safetensors", repo / "blobs" / "f00d")
    os.symlink("../../blobs/f00d", snap / "model-00001.safetensors")
    assert Checkpoint.open(snap).names()
    shutil.move(repo / "blobs" / "f00d", tmp_path / "f00d")
    os.unlink(snap / "model-00001.safetensors")
    os.symlink(tmp_path / "f00d", snap / "model-00001.safetensors")
    with pytest.raises(ModelFormatError, match="model-00001.safetensors' leads outside through"):
        Checkpoint.open(snap)


# ---- 3. sizes ------------------------------------------------------------------------------
SIZES = [
    ("max_context", 2**62),
    ("max_context", -1),
    ("block_size", 0),
    ("prefill_chunk", "8"),
    ("max_context", 1.5),
    ("block_size", True),
    ("model.num_layers", 2**40),
    ("model.head_dim", -(2**63)),
    ("model.vocab_size", None),
    ("kv_cache.slack", -1),
    ("kv_cache.dtype", ["float32"]),
]


@pytest.mark.parametrize("key, value", SIZES)
def test_absurd_sizes_are_one_line(bundle_copy, key, value):
    manifest = json.loads((bundle_copy / MANIFEST).read_text())
    *section, name = key.split(".")
    (manifest[section[0]] if section else manifest)[name] = value
    (bundle_copy / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=key.split(".")[-1]) as err:
        read_bundle(bundle_copy, verify=False)
    assert "\n" not in str(err.value)


def test_kv_product_overflow_is_refused(bundle_copy):
    """Each size in range, their product (the KV cache) 1 PiB: refused with the figure."""
    manifest = json.loads((bundle_copy / MANIFEST).read_text())
    manifest["max_context"] = manifest["model"]["max_position_embeddings"] = 2**30
    manifest["model"].update(num_kv_heads=64, head_dim=256)
    (bundle_copy / MANIFEST).write_text(json.dumps(manifest))
    need = kv_cache_bytes(manifest)
    with pytest.raises(BundleError, match=f"{need / 2**30:,.0f} GiB"):
        read_bundle(bundle_copy, verify=False)


def test_kv_beyond_available_memory(bundle_copy, monkeypatch):
    b = read_bundle(bundle_copy)
    need = kv_cache_bytes(b.manifest)
    monkeypatch.setattr(memory, "available_bytes", lambda: need - 1)
    figure = rf"needs {need / 2**30:.2f} GiB but .* smaller --max-context"
    with pytest.raises(BundleError, match=figure):
        Generator.load(bundle_copy)
    monkeypatch.setattr(memory, "available_bytes", lambda: need)
    assert Generator.load(bundle_copy).max_context == b.max_context
