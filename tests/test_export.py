"""Export to a bundle: parity, checker, manifest contract and bad inputs (tier 1, tiny models)."""
import json

import onnx
import pytest

from dflash_edge.models.drafter import DraftConfig, new_drafter, save_drafter
from dflash_edge.export.exporter import ExportOptions, export_bundle
from dflash_edge.models import load_target
from dflash_edge.runtime.bundle import BundleError, read_bundle, sha256_file
from dflash_edge.runtime.errors import DflashEdgeError


def _drafter_dir(tmp_path, ckpt, block=16, layers=2, **overrides):
    target = load_target(ckpt)
    cfg = DraftConfig.for_target(target.config, num_layers=layers, block_size=block, mask_token_id=5)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return save_drafter(new_drafter(cfg, seed=1), tmp_path / f"draft{block}")


def _export(tmp_path, ckpt, block, **kw):
    draft = kw.pop("draft", None) or _drafter_dir(tmp_path, ckpt)
    opts = ExportOptions(out=tmp_path / f"bundle{block}", target=ckpt, draft=str(draft), block_size=block,
                         max_context=256, prefill_chunk=16, **kw)
    return export_bundle(opts, progress=False)


@pytest.mark.parametrize("variant,block", [("qwen3", 4), ("qwen3", 8), ("qwen3", 16), ("llama", 8),
                                           ("qwen2", 16), ("llama-untied-llama3rope", 4)])
def test_export_passes_parity_checker_and_hashes(tiny_checkpoints, tmp_path, variant, block):
    out = _export(tmp_path, tiny_checkpoints[variant][1], block)
    bundle = read_bundle(out)                       # schema + every sha256
    m = bundle.manifest
    assert m["block_size"] == block and m["model"]["family"] == variant.split("-")[0]
    parity = m["source"]["parity"]
    assert parity["target.logits.max_abs_diff"] <= 1e-3 and parity["target.next_ids.agreement"] == 1.0
    assert parity["drafter.draft_ids.agreement"] == 1.0
    for name, graph in m["graphs"].items():
        onnx.checker.check_model(str(out / graph["files"][0]["path"]))
        for f in graph["files"]:
            assert sha256_file(out / f["path"]) == f["sha256"]
        layers = range(m["model"]["num_layers"])       # per-layer specs (fused flavour) name one input per layer
        names = [t["name"].format(i=i) for t in graph["io"]["inputs"] for i in (layers if t.get("per") else [0])]
        assert names == [i.name for i in onnx.load(str(out / f"{name}.onnx"), load_external_data=False).graph.input]
    assert not list(tmp_path.glob(".*partial*"))


def test_existing_output_needs_force(tiny_checkpoints, tmp_path):
    ckpt = tiny_checkpoints["qwen3"][1]
    out = _export(tmp_path, ckpt, 4)
    with pytest.raises(DflashEdgeError, match="already exists; pass --force"):
        _export(tmp_path, ckpt, 4)
    assert _export(tmp_path, ckpt, 4, force=True) == out


@pytest.mark.parametrize("stream", [False, True])
def test_interrupted_export_leaves_nothing(tiny_checkpoints, tmp_path, monkeypatch, stream):
    from dflash_edge.export import parity, parity_stream

    def boom(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(parity, "check_graphs", boom)
    monkeypatch.setattr(parity_stream, "check_graphs", boom)
    with pytest.raises(KeyboardInterrupt):
        _export(tmp_path, tiny_checkpoints["qwen3"][1], 4, stream=stream)
    assert not (tmp_path / "bundle4").exists() and not list(tmp_path.glob(".bundle4*"))


@pytest.mark.parametrize("stream", [False, True])
def test_parity_failure_names_graph_and_output(tiny_checkpoints, tmp_path, monkeypatch, stream):
    from dflash_edge.export import parity, parity_stream

    strict = parity.Tolerance(logits=0.0, hidden=0.0, kv=0.0)
    for module in (parity, parity_stream):
        real = module.check_graphs
        monkeypatch.setattr(module, "check_graphs", lambda *a, real=real, **k: real(*a, **{**k, "tol": strict}))
    with pytest.raises(parity.ParityError, match=r"graph 'target' output 'logits': max abs diff .* > 0 vs torch"):
        _export(tmp_path, tiny_checkpoints["qwen3"][1], 4, stream=stream)


@pytest.mark.parametrize("kw,message", [
    ({"block_size": 1}, "--block-size 1 < 2"),
    ({"block_size": 32}, "larger than the drafter was trained for"),
    ({"max_context": 4096}, "exceeds the model's 512 positions"),
])
def test_bad_options(tiny_checkpoints, tmp_path, kw, message):
    ckpt = tiny_checkpoints["qwen3"][1]
    opts = dict(out=tmp_path / "b", target=ckpt, draft=str(_drafter_dir(tmp_path, ckpt)), block_size=8, max_context=256)
    opts.update(kw)
    with pytest.raises(DflashEdgeError, match=message):
        export_bundle(ExportOptions(**opts), progress=False)
    assert not (tmp_path / "b").exists()


def test_drafter_for_another_target_is_refused(tiny_checkpoints, tmp_path):
    other = _drafter_dir(tmp_path, tiny_checkpoints["qwen3"][1], num_target_layers=12)
    with pytest.raises(DflashEdgeError, match="num_target_layers=12 does not fit the target's 6"):
        _export(tmp_path, tiny_checkpoints["llama"][1], 8, draft=other)


def _bundle(tiny_checkpoints, tmp_path):
    return _export(tmp_path, tiny_checkpoints["qwen3"][1], 4)


def test_manifest_errors_name_the_problem(tiny_checkpoints, tmp_path):
    out = _bundle(tiny_checkpoints, tmp_path)
    good = (out / "manifest.json").read_text()

    def edit(fn):
        m = json.loads(good)
        fn(m)
        (out / "manifest.json").write_text(json.dumps(m))

    edit(lambda m: m.__setitem__("colour", "blue"))
    with pytest.raises(BundleError, match=r"unknown key\(s\) \['colour'\]"):
        read_bundle(out)
    edit(lambda m: m["model"].__setitem__("rope", 1))
    with pytest.raises(BundleError, match=r"\[model\]: unknown key\(s\) \['rope'\]"):
        read_bundle(out)
    edit(lambda m: m.__setitem__("manifest_version", 99))
    with pytest.raises(BundleError, match="manifest_version 99 is not supported"):
        read_bundle(out)
    (out / "manifest.json").write_text(good)
    data = (out / "drafter.onnx.data").read_bytes()
    (out / "drafter.onnx.data").write_bytes(data[:-4] + b"abcd")
    with pytest.raises(BundleError, match="drafter.onnx.data is corrupt: its sha256 does not match"):
        read_bundle(out)
    (out / "drafter.onnx.data").unlink()
    with pytest.raises(BundleError, match="drafter.onnx.data is missing"):
        read_bundle(out)
    with pytest.raises(BundleError, match="not a bundle directory"):
        read_bundle(tmp_path)


@pytest.mark.tier2
def test_default_export_end_to_end(smollm2_dir, tmp_path):
    """`dflash-edge export --out DIR` with no other arguments: default target + drafter, parity on."""
    from dflash_edge.cli import main

    out = tmp_path / "bundle"
    assert main(["export", "--out", str(out)]) == 0
    m = read_bundle(out).manifest                    # every sha256 checked
    parity = m["source"]["parity"]
    assert parity["target.logits.max_abs_diff"] <= 1e-3
    assert parity["target.next_ids.agreement"] == parity["drafter.draft_ids.agreement"] == 1.0
    assert m["source"]["trt_readiness"]["ok"]
    assert m["model"]["vocab_size"] == 49152 and m["block_size"] == 16
    for graph in m["graphs"].values():
        onnx.checker.check_model(str(out / graph["files"][0]["path"]))


def test_reduced_draft_vocabulary_drafts_only_its_tokens_and_stays_lossless(tiny_checkpoints, tmp_path):
    import numpy as np

    from dflash_edge.models.draft_vocab import DRAFT_VOCAB_FILE, draft_vocab_json, load_draft_vocab
    from dflash_edge.models.reference_loop import GenerationConfig, target_generate
    from dflash_edge.runtime import Generator

    ckpt = tiny_checkpoints["qwen3"][1]
    draft = _drafter_dir(tmp_path, ckpt)
    with pytest.raises(DflashEdgeError, match="no draft_vocab.json"):
        _export(tmp_path, ckpt, 8, draft=draft, draft_vocab=20)
    (draft / DRAFT_VOCAB_FILE).write_text(draft_vocab_json([[7, 7, 7, 9, 9, 11]], always=[2]))
    vocab = load_draft_vocab(draft, 20, vocab_size=96)
    assert vocab[:4].tolist() == [0, 1, 2, 3] and {2, 7, 9, 11} <= set(vocab.tolist()) and len(vocab) == 20
    out = _export(tmp_path, ckpt, 8, draft=draft, draft_vocab=20)
    m = read_bundle(out).manifest
    assert m["model"]["draft_vocab_size"] == 20 and m["source"]["parity"]["drafter.draft_ids.agreement"] == 1.0
    gen = Generator.load(out)
    real_draft, seen = gen.drafter.draft, []

    def spy(*a, **k):
        ids = real_draft(*a, **k)
        seen.extend(np.asarray(ids).tolist())
        return ids
    gen.drafter.draft = spy
    prompt = [3, 17, 42, 8, 5, 61]
    res = gen.generate_ids(prompt, max_new_tokens=24)
    ref = target_generate(load_target(ckpt), prompt, GenerationConfig(max_new_tokens=24))
    assert res.token_ids == ref.token_ids[:len(res.token_ids)] and len(res.token_ids) == len(ref.token_ids)
    assert seen and set(seen) <= set(vocab.tolist())
