"""Export to a bundle: parity, checker, manifest contract and bad inputs (tier 1, tiny models)."""

import json

import onnx
import pytest

from dflash_edge.export.exporter import ExportOptions, export_bundle
from dflash_edge.models import load_target
from dflash_edge.models.drafter import DraftConfig, new_drafter, save_drafter
from dflash_edge.runtime.bundle import BundleError, read_bundle, sha256_file
from dflash_edge.runtime.errors import DflashEdgeError

from fixtures_bundle import export_args


def _drafter_dir(tmp_path, ckpt, block=16, layers=2, **overrides):
    target = load_target(ckpt)
    cfg = DraftConfig.for_target(
        target.config, num_layers=layers, block_size=block, mask_token_id=5
    )
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return save_drafter(new_drafter(cfg, seed=1), tmp_path / f"draft{block}")


def _export(tmp_path, ckpt, block, **kw):
    draft = kw.pop("draft", None) or _drafter_dir(tmp_path, ckpt)
    opts = ExportOptions(
        out=tmp_path / f"bundle{block}",
        target=ckpt,
        draft=str(draft),
        block_size=block,
        max_context=256,
        prefill_chunk=16,
        **kw,
    )
    return export_bundle(opts, progress=False)


@pytest.mark.parametrize(
    "variant,block",
    [
        ("qwen3", 4),
        ("qwen3", 8),
        ("qwen3", 16),
        ("llama", 8),
        ("qwen2", 16),
        ("llama-untied-llama3rope", 4),
    ],
)
def test_export_passes_parity_checker_and_hashes(tiny_checkpoints, tmp_path, variant, block):
    out = _export(tmp_path, tiny_checkpoints[variant][1], block)
    bundle = read_bundle(out)  # schema + every sha256
    m = bundle.manifest
    assert m["block_size"] == block and m["model"]["family"] == variant.split("-")[0]
    parity = m["source"]["parity"]
    assert (
        parity["target.logits.max_abs_diff"] <= 1e-3 and parity["target.next_ids.agreement"] == 1.0
    )
    assert parity["drafter.draft_ids.agreement"] == 1.0
    for name, graph in m["graphs"].items():
        onnx.checker.check_model(str(out / graph["files"][0]["path"]))
        for f in graph["files"]:
            assert sha256_file(out / f["path"]) == f["sha256"]
        layers = range(
            m["model"]["num_layers"]
        )  # per-layer specs (fused flavour) name one input per layer
        names = [
            t["name"].format(i=i)
            for t in graph["io"]["inputs"]
            for i in (layers if t.get("per") else [0])
        ]
        assert names == [
            i.name
            for i in onnx.load(str(out / f"{name}.onnx"), load_external_data=False).graph.input
        ]
    assert not list(tmp_path.glob(".*.export-*"))


def test_export_reads_the_target_once(tiny_checkpoints, tmp_path, monkeypatch):
    """One resolution, one config parse, one tokenizer load per export: the choices (a device
    plan included) and the writers share the opened target (export/sources.Target)."""
    from dflash_edge.export import sources
    from dflash_edge.models.config import TargetConfig
    from dflash_edge.runtime.tokenizer import ChatTokenizer

    ckpt = tiny_checkpoints["qwen3"][1]
    draft = _drafter_dir(tmp_path, ckpt)  # (reads the target's config itself)
    calls = {"resolve": 0, "config": 0, "tokenizer": 0}

    def counted(key, fn):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(sources, "target_files", counted("resolve", sources.target_files))
    config = counted("config", TargetConfig.from_json.__func__)
    monkeypatch.setattr(TargetConfig, "from_json", classmethod(config))
    tokenizer = counted("tokenizer", ChatTokenizer.from_dir.__func__)
    monkeypatch.setattr(ChatTokenizer, "from_dir", classmethod(tokenizer))
    # kv_cache fp32: the int8 cache's calibration loads the written bundle's tokenizer, not the
    # target's (the GPU plan's int4 / int8 target would get one)
    _export(tmp_path, ckpt, 4, draft=draft, device="rtx-4090-24gb", verify=False, kv_cache="fp32")
    assert calls == {"resolve": 1, "config": 1, "tokenizer": 1}


def test_existing_output_needs_force(tiny_checkpoints, tmp_path):
    ckpt = tiny_checkpoints["qwen3"][1]
    out = _export(tmp_path, ckpt, 4)
    with pytest.raises(DflashEdgeError, match="already exists; pass --force"):
        _export(tmp_path, ckpt, 4)
    assert _export(tmp_path, ckpt, 4, force=True) == out


def test_interrupted_export_leaves_nothing(tiny_checkpoints, tmp_path, monkeypatch):
    from dflash_edge.export import parity

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(parity, "check_graphs", boom)
    with pytest.raises(KeyboardInterrupt):
        _export(tmp_path, tiny_checkpoints["qwen3"][1], 4)
    assert not (tmp_path / "bundle4").exists() and not list(tmp_path.glob(".bundle4*"))


def test_parity_failure_names_graph_and_output(tiny_checkpoints, tmp_path, monkeypatch):
    from dflash_edge.export import parity

    strict = parity.Tolerance(logits=0.0, hidden=0.0, kv=0.0)
    real = parity.check_graphs
    monkeypatch.setattr(parity, "check_graphs", lambda *a, **k: real(*a, **{**k, "tol": strict}))
    with pytest.raises(
        parity.ParityError, match=r"graph 'target' output 'logits': max abs diff .* > 0 vs torch"
    ):
        _export(tmp_path, tiny_checkpoints["qwen3"][1], 4)
    assert not (tmp_path / "bundle4").exists() and not list(tmp_path.glob(".bundle4*"))


def test_random_drafter_export_passes_parity_and_leaves_no_scratch(tiny_checkpoints, tmp_path):
    """`export --target CK --draft random`: parity reads the random drafter from the scratch folder,
    which then goes."""
    from dflash_edge.cli import main

    out = tmp_path / "b"
    assert main(export_args(out, tiny_checkpoints["qwen3"][1], "random")) == 0
    m = read_bundle(out).manifest  # every sha256 checked
    assert m["source"]["drafter"] == "random" and m["source"]["drafter_random_init"]
    assert (
        m["source"]["parity"]["drafter.draft_ids.agreement"] == 1.0
        and "parity" in m["source"]["export_seconds"]
    )
    named = {f["path"] for g in m["graphs"].values() for f in g["files"]} | {
        "manifest.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert {p.name for p in out.iterdir()} == named and not list(tmp_path.glob(".b*"))


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"block_size": 1}, "--block-size 1 < 2"),
        ({"block_size": 32}, "larger than the drafter was trained for"),
        ({"max_context": 4096}, "exceeds the model's 512 positions"),
    ],
)
def test_bad_options(tiny_checkpoints, tmp_path, kw, message):
    ckpt = tiny_checkpoints["qwen3"][1]
    opts = dict(
        out=tmp_path / "b",
        target=ckpt,
        draft=str(_drafter_dir(tmp_path, ckpt)),
        block_size=8,
        max_context=256,
    )
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
    with pytest.raises(
        BundleError, match="drafter.onnx.data is corrupt: its sha256 does not match"
    ):
        read_bundle(out)
    (out / "drafter.onnx.data").unlink()
    with pytest.raises(BundleError, match="drafter.onnx.data is missing"):
        read_bundle(out)
    with pytest.raises(BundleError, match="not a bundle directory"):
        read_bundle(tmp_path)


@pytest.mark.tier2
def test_default_export_end_to_end(smollm2_dir, tmp_path):
    """`dflash-edge export --out DIR` with no other arguments: default target + drafter, parity on;
    the target is the GGUF's own 4-bit blocks (no re-quantisation) with the int8 KV cache."""
    from dflash_edge.cli import main

    out = tmp_path / "bundle"
    assert main(["export", "--out", str(out)]) == 0
    m = read_bundle(out).manifest  # every sha256 checked
    parity = m["source"]["parity"]  # int8 activations (level 4) against fp32 arithmetic
    assert parity["target.logits.max_abs_diff"] <= 5.0 and parity["target.hidden.max_abs_diff"] > 0
    assert (
        parity["target.next_ids.agreement"] >= 0.85
        and parity["drafter.draft_ids.agreement"] >= 0.85
    )
    assert m["model"]["vocab_size"] == 49152 and m["block_size"] == 16
    target = m["graphs"]["target_fused"]
    assert (
        target["precision"],
        target["kv_cache"]["dtype"],
        m["graphs"]["drafter"]["precision"],
    ) == ("int4", "int8", "fp32")
    assert target["quantization"]["weights_by_source"] == {
        "Q4_1": 210,
        "Q8_0": 1,
    }  # 7 x 30 layers + table
    assert target["quantization"]["requantised_low_bit"] == {}
    for graph in m["graphs"].values():
        onnx.checker.check_model(str(out / graph["files"][0]["path"]))


def test_reduced_draft_vocabulary_drafts_only_its_tokens_and_stays_lossless(
    tiny_checkpoints, tmp_path
):
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
    assert (
        vocab[:4].tolist() == [0, 1, 2, 3]
        and {2, 7, 9, 11} <= set(vocab.tolist())
        and len(vocab) == 20
    )
    out = _export(tmp_path, ckpt, 8, draft=draft, draft_vocab=20)
    m = read_bundle(out).manifest
    assert (
        m["model"]["draft_vocab_size"] == 20
        and m["source"]["parity"]["drafter.draft_ids.agreement"] == 1.0
    )
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
    assert res.token_ids == ref.token_ids[: len(res.token_ids)] and len(res.token_ids) == len(
        ref.token_ids
    )
    assert seen and set(seen) <= set(vocab.tolist())


def _ort(path, feeds):
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


@pytest.mark.parametrize(
    "variant,block", [("qwen3", 4), ("llama", 8), ("qwen2", 16), ("llama-untied-llama3rope", 4)]
)
def test_bundle_graphs_match_transformers(tiny_checkpoints, tmp_path, variant, block):
    """The written graphs against transformers' own model (not the exporter's torch reference):
    logits and greedy ids of a prefill, then of a block run on the graph's own K/V, equal the HF
    model on the whole sequence; the captured hidden states are HF's residual stream after those
    layers."""
    import numpy as np
    import torch

    hf, ckpt = tiny_checkpoints[variant]
    out = _export(tmp_path, ckpt, block)
    m = read_bundle(out).manifest
    d, ids = m["model"], [(7 * i) % 90 + 3 for i in range(11 + block)]
    empty = np.zeros(
        (0, d["num_layers"], d["num_kv_heads"], d["head_dim"]), np.float32
    )  # [S=0, L, Hkv, D]
    pre = _ort(
        out / "target.onnx",
        {
            "input_ids": np.array([ids[:11]]),
            "logits_from": np.array([0]),
            "start": np.array([0]),
            "past_key": empty,
            "past_value": empty,
        },
    )
    step = _ort(
        out / "target.onnx",
        {
            "input_ids": np.array([ids[11:]]),
            "logits_from": np.array([0]),
            "start": np.array([11]),
            "past_key": pre["new_key"],
            "past_value": pre["new_value"],
        },
    )
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), output_hidden_states=True)
    want = ref.logits.numpy()  # [1, 11 + B, V]
    got = np.concatenate([pre["logits"], step["logits"]], axis=1)
    assert np.abs(got - want).max() <= 1e-4
    assert (np.concatenate([pre["next_ids"], step["next_ids"]], axis=1) == want.argmax(-1)).all()
    layers = [
        i for i in d["target_layer_ids"] if i + 1 < d["num_layers"]
    ]  # HF's last entry is after the norm
    hidden = pre["hidden"].reshape(1, 11, -1, d["hidden_size"])  # [1, T, n, H]
    for k, i in enumerate(d["target_layer_ids"]):
        if i in layers:
            assert np.abs(hidden[:, :, k] - ref.hidden_states[i + 1][:, :11].numpy()).max() <= 1e-4


def test_bundle_generates_losslessly(tiny_checkpoints, tmp_path):
    from dflash_edge.models.reference_loop import GenerationConfig, target_generate
    from dflash_edge.runtime import Generator

    ckpt = tiny_checkpoints["qwen3"][1]
    out = _export(tmp_path, ckpt, 8)
    prompt = [3, 17, 42, 8, 5, 61]
    ref = target_generate(load_target(ckpt), prompt, GenerationConfig(max_new_tokens=24)).token_ids
    for draft in ("none", "drafter"):
        assert (
            Generator.load(out).generate_ids(prompt, max_new_tokens=24, draft=draft).token_ids
            == ref
        )


def test_rope_tables_hold_the_positions_the_bundle_reaches(tiny_checkpoints, tmp_path):
    """RoPE tables are cut to the bundle's reach (max context + the widest step + the fused pad
    row), not the model's max_position_embeddings, and generation still runs losslessly to the very
    end of the context."""
    from dflash_edge.models.reference_loop import GenerationConfig, target_generate
    from dflash_edge.runtime import Generator

    ckpt = tiny_checkpoints["qwen3"][1]
    opts = ExportOptions(
        out=tmp_path / "b",
        target=ckpt,
        draft=str(_drafter_dir(tmp_path, ckpt, block=8)),
        block_size=8,
        max_context=48,
        prefill_chunk=16,
    )
    out = export_bundle(opts, progress=False)
    rows = {}
    for graph, name in (
        ("target", "rope.cos"),
        ("drafter", "rope.cos"),
        ("target_fused", "rope.cos_cache"),
    ):
        inits = onnx.load(str(out / f"{graph}.onnx"), load_external_data=False).graph.initializer
        rows[graph] = [list(i.dims)[0] for i in inits if i.name == name]
    assert rows == {g: [48 + 16 + 1] for g in rows} and opts.positions == 65
    prompt = [(7 * i) % 90 + 3 for i in range(40)]
    ref = target_generate(
        load_target(ckpt), prompt, GenerationConfig(max_new_tokens=100, max_context=48)
    ).token_ids
    assert len(prompt) + len(ref) == 48
    for graph in ("target_fused", "target"):
        gen = Generator.load(out, target_graph=graph)
        for draft in ("none", "drafter"):
            assert (
                gen.generate_ids(
                    prompt, max_new_tokens=100, draft=draft, stop_token_ids=()
                ).token_ids
                == ref
            )


def test_export_refuses_a_misshaped_tensor(tiny_checkpoints, tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file

    from dflash_edge.runtime.errors import ModelFormatError

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoints["qwen3"][1], ckpt)
    draft = _drafter_dir(tmp_path, ckpt)
    weights = load_file(ckpt / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    weights[name] = weights[name][:-1]
    save_file(weights, ckpt / "model.safetensors")
    with pytest.raises(ModelFormatError, match=r"misshaped tensors .*up_proj"):
        export_bundle(
            ExportOptions(out=tmp_path / "b", target=ckpt, draft=str(draft), max_context=256),
            progress=False,
        )
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.*"))


@pytest.mark.parametrize("flags", [[], ["--precision", "int4"]])
def test_api_and_cli_write_the_same_bundle(tiny_checkpoints, tmp_path, flags, capsys):
    """One pipeline: `export_bundle(ExportOptions(...))` and `dflash-edge export` make the same
    "auto" choices (precision, drafter precision, KV cache: int8 for int4, in one pass)."""
    from dflash_edge.cli import main

    ckpt = tiny_checkpoints["qwen3"][1]
    draft = _drafter_dir(tmp_path, ckpt, block=4)
    common = dict(block_size=4, max_context=256, prefill_chunk=16)
    kw = dict(zip(flags[::2], flags[1::2]))
    api = export_bundle(
        ExportOptions(
            out=tmp_path / "api",
            target=ckpt,
            draft=str(draft),
            **common,
            **({"precision": kw["--precision"]} if kw else {}),
        ),
        progress=False,
    )
    assert main(export_args(tmp_path / "cli", ckpt, draft, *flags)) == 0
    want = "int4" if kw else "fp32"
    manifests = [json.loads((p / "manifest.json").read_text()) for p in (api, tmp_path / "cli")]
    seen = [
        {
            n: (
                g["precision"],
                g.get("kv_cache", {}).get("dtype", m["kv_cache"]["dtype"]),
                [(f["path"], f["sha256"]) for f in g["files"]],
            )
            for n, g in m["graphs"].items()
        }
        for m in manifests
    ]
    assert seen[0] == seen[1]
    assert {n: p for n, (p, _, _) in seen[0].items()} == {
        "target": want,
        "target_fused": want,
        "drafter": "fp32",
    }
    assert seen[0]["target_fused"][1] == ("int8" if kw else "float32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["api", "cli", "draft4"]


def test_drafter_kinds_are_modules_found_by_config_class():
    """export/drafters/: every kind offers the interface; a config finds its kind by its class."""
    from dflash_edge.export.drafters import INTERFACE, available, drafter_kind
    from dflash_edge.models.dflash2_config import DFlash2Config

    assert available() == ("dflash", "dflash2")
    for cfg_class, name in ((DraftConfig, "dflash"), (DFlash2Config, "dflash2")):
        kind = drafter_kind(object.__new__(cfg_class))
        assert kind.__name__.endswith(f".{name}")
        assert all(hasattr(kind, attr) for attr in INTERFACE)
    with pytest.raises(DflashEdgeError, match="no drafter kind"):
        drafter_kind(object())
