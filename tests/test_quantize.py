"""`quantize`: a bundle's model re-exported at another precision from the checkpoints its manifest
records (the exporter is the one writer), plus the quality report. Each precision is lossless
against its own target; manifest, hashes and report fields; every bad input. Tier 1 on tiny
in-process bundles; tier 2 on SmolLM2 at int4."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

PROMPTS = [
    [5, 17, 33, 42, 8],
    [90, 1, 64, 12, 77, 3, 3, 19, 45, 60, 11],
    [(13 * i) % 90 + 3 for i in range(29)],
]
CASES = [("int4", "int4"), ("int8", "int8"), ("fp16", "fp16"), ("int4", "fp32")]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt": " ".join(f"t{(7 * i + k) % 90 + 3}" for k in range(n))}) + "\n"
            for i, n in enumerate((5, 11, 3, 8))
        )
    )
    return str(path)


def quantize(src, out, target, draft, report=None, **settings):
    from dflash_edge.quantize.bundle_quant import QuantizeOptions, quantize_bundle
    from dflash_edge.quantize.precisions import QuantSettings

    return quantize_bundle(
        QuantizeOptions(
            src,
            out,
            target=target,
            draft=draft,
            force=True,
            report=report,
            settings=QuantSettings(**settings),
        )
    )


def small_report(prompts_file):
    from dflash_edge.quantize.quality import ReportOptions

    return ReportOptions(
        positions=24, max_new_tokens=12, accept_prompts=2, prompts=prompts_file, threads=1
    )


@pytest.fixture(scope="module")
def quantized(tiny_bundle, tmp_path_factory, prompts_file):
    """(target, draft) -> quantised copy of the tied tiny llama bundle (block 8), each built
    once."""
    built = {}

    def get(target, draft, variant="llama"):
        if (target, draft, variant) not in built:
            out = tmp_path_factory.mktemp(f"q-{variant}-{target}-{draft}") / "bundle"
            src = tiny_bundle(variant, 8).path
            built[target, draft, variant] = quantize(
                src, out, target, draft, report=small_report(prompts_file)
            )
        return built[target, draft, variant]

    return get


# ---- lossless against the bundle's own target
# ------------------------------------------------------
@pytest.mark.parametrize("target,draft", CASES)
def test_each_precision_is_lossless_against_its_own_target(quantized, target, draft):
    from dflash_edge.runtime import Generator

    gen = Generator.load(quantized(target, draft), threads=1)
    for prompt in PROMPTS:
        spec = gen.generate_ids(prompt, 40, stop_token_ids=(), draft="drafter")
        plain = gen.generate_ids(prompt, 40, draft="none", stop_token_ids=())
        assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 40
        assert spec.stats.acceptance_lengths  # the drafter really ran


def test_untied_model_quantises_its_embedding_and_head(quantized):
    """qwen3 (untied): the embedding read from blocks, each projection and the head MatMulNBits."""
    import onnx

    from dflash_edge.runtime import Generator

    path = quantized("int4", "int4", variant="qwen3")
    ops = [
        n.op_type for n in onnx.load(str(path / "target.onnx"), load_external_data=False).graph.node
    ]
    # per layer q/k/v packed, o, gate/up packed, down; + the head
    assert "GatherBlockQuantized" in ops and ops.count("MatMulNBits") == 6 * 4 + 1
    gen = Generator.load(path, threads=1)
    spec = gen.generate_ids(PROMPTS[1], 30, stop_token_ids=(), draft="drafter")
    assert (
        spec.token_ids
        == gen.generate_ids(PROMPTS[1], 30, draft="none", stop_token_ids=()).token_ids
    )


@pytest.mark.parametrize("target", ["int4", "int8"])
def test_quantised_bundle_keeps_the_fused_flavour_on_the_portable_weights(
    tiny_bundle, quantized, target
):
    """qwen3 (head_dim 16) exports a fused target; quantised, it keeps it (the runtime's default on
    CPU), its quantised tensors stored once (borrowed from target.onnx.data), and it is lossless."""
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.bundle import read_bundle
    from dflash_edge.runtime.kv import FusedTargetModel

    path = quantized(target, target, variant="qwen3")
    graphs = read_bundle(path).manifest["graphs"]  # every file's sha256 checked
    fused = graphs["target_fused"]
    assert fused["precision"] == target and "target.onnx.data" in [
        f["path"] for f in fused["files"]
    ]
    import onnx

    model = onnx.load(str(path / "target_fused.onnx"), load_external_data=False)
    own = {
        i.name
        for i in model.graph.initializer
        if any(e.value == "target_fused.onnx.data" for e in i.external_data)
    }
    assert all("qkv_proj" in n or "rope" in n for n in own), own  # the rest: borrowed, not twice
    gen = Generator.load(path, threads=1)
    assert type(gen.target) is FusedTargetModel
    for prompt in PROMPTS:
        spec = gen.generate_ids(prompt, 30, stop_token_ids=(), draft="drafter")
        assert (
            spec.token_ids
            == gen.generate_ids(prompt, 30, draft="none", stop_token_ids=()).token_ids
        )


@pytest.mark.parametrize("target", ["int4", "int8", "fp32"])
def test_fused_decode_rows_equal_verify_rows_bit_for_bit(tiny_bundle, quantized, target):
    """A row's logits do not depend on how many tokens share its step: T = 1 decode steps and one T
    = k step over the same tokens give identical bits (the fused graph's pad row keeps onnxruntime
    off its single-row sgemm kernel; quantised MatMuls would amplify the last-bit differences into
    other tokens)."""
    from dflash_edge.runtime import Generator

    path = (
        tiny_bundle("qwen3", 8).path
        if target == "fp32"
        else quantized(target, target, variant="qwen3")
    )
    gen = Generator.load(path, threads=2)
    prompt, tokens = PROMPTS[1], [7, 41, 3, 88, 15, 60]
    rows = []
    gen.generate_ids(prompt, 1, stop_token_ids=(), draft="none")  # prefill: len(prompt) cached
    for i, t in enumerate(tokens):  # T = 1 steps
        step = gen.target.step(1)
        step["input_ids"][0, 0] = t
        gen.target.forward(1, len(prompt) + i)
        rows.append(step["logits"][0, 0].copy())
    step = gen.target.step(len(tokens))  # one T = 6 step, same positions
    step["input_ids"][0] = tokens
    gen.target.forward(len(tokens), len(prompt))
    np.testing.assert_array_equal(step["logits"][0], np.stack(rows))


# ---- manifest, hashes, report
# ----------------------------------------------------------------------
def test_manifest_hashes_and_report(quantized, tiny_bundle):
    import onnx

    from dflash_edge.runtime.bundle import read_bundle, sha256_file

    src = tiny_bundle("llama", 8).path
    before = {p.name: sha256_file(p) for p in src.iterdir() if p.is_file()}
    b = read_bundle(quantized("int4", "int8"), verify=True)
    assert {
        p.name: sha256_file(p) for p in src.iterdir() if p.is_file()
    } == before  # input untouched
    graphs = b.manifest["graphs"]
    assert graphs["target"]["precision"] == "int4" and graphs["drafter"]["precision"] == "int8"
    q = graphs["target"]["quantization"]
    assert q["from"] == "checkpoint" and q["settings"]["block_size"] == 32
    assert q["settings"]["accuracy_level"] == 4 and q["weights_by_source"]
    assert b.manifest["source"]["quantized_from"] == str(src.resolve())
    assert b.manifest["source"]["export_options"]["target"] == str(src.parent / "target")
    for g in graphs.values():
        for f in g["files"]:
            assert (
                sha256_file(b.root / f["path"]) == f["sha256"]
                and (b.root / f["path"]).stat().st_size == f["bytes"]
            )
    ops = {
        n.op_type
        for n in onnx.load(str(b.graph_path("target")), load_external_data=False).graph.node
    }
    assert "MatMulNBits" in ops
    for entry in graphs["target"]["io"]["inputs"] + graphs["target"]["io"]["outputs"]:
        assert entry["dtype"] in ("int64", "float32")  # KV and I/O stay fp32
    report = json.loads((b.root / b.manifest["quality"]["path"]).read_text())
    assert report["positions"] >= 24 and 0.0 <= report["top1_agreement"] <= 1.0
    assert set(report["perplexity"]) == {"reference", "quantized"} and all(
        np.isfinite(v) and v >= 1.0 for v in report["perplexity"].values()
    )
    assert (
        report["acceptance_length"]["quantized"] >= 1.0
        and report["speculative_equals_plain"] is True
    )
    assert (
        report["bytes"]["graphs"]["target"]["quantized"]
        < report["bytes"]["graphs"]["target"]["reference"]
    )
    assert report["plain_ms_per_token"]["quantized"] > 0 and "engines" not in b.manifest


def test_reexport_at_the_source_precision_gives_the_same_graphs(quantized, tiny_bundle, tmp_path):
    """An int4 bundle quantised back to fp32 is re-exported from its checkpoint: the original
    graphs, byte for byte (nothing lost in the int4 detour; precision can go up as well as down)."""
    from dflash_edge.runtime.bundle import read_bundle

    src = read_bundle(tiny_bundle("llama", 8).path)
    b = read_bundle(quantize(quantized("int4", "int8"), tmp_path / "fp32", "fp32", "fp32"))
    assert {n: [f["sha256"] for f in g["files"]] for n, g in b.manifest["graphs"].items()} == {
        n: [f["sha256"] for f in g["files"]] for n, g in src.manifest["graphs"].items()
    }


def test_quantised_top1_agrees_with_fp32_on_tiny_model(quantized):
    """int8 (8-bit weights) stays close to fp32; the report measures it rather than assuming it."""
    from dflash_edge.runtime.bundle import read_bundle

    b = read_bundle(quantized("int8", "int8"))
    report = json.loads((b.root / "quality.json").read_text())
    assert report["top1_agreement"] >= 0.9


def test_export_precision_writes_int4_directly(tiny_bundle, tmp_path):
    from dflash_edge.export.exporter import ExportOptions, export_bundle
    from dflash_edge.runtime import Generator

    root = tiny_bundle("llama", 8).path.parent
    opts = ExportOptions(
        out=tmp_path / "int4",
        target=str(root / "target"),
        draft=str(root / "drafter"),
        block_size=8,
        max_context=128,
        prefill_chunk=8,
        verify=False,
        precision="int4",
        draft_precision="int4",
    )
    out = export_bundle(opts, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int4"]  # no fp32 detour
    gen = Generator.load(out, threads=1)
    assert {g["precision"] for g in gen.bundle.manifest["graphs"].values()} == {"int4"}
    assert (
        gen.generate_ids(PROMPTS[0], 20, draft="drafter").token_ids
        == gen.generate_ids(PROMPTS[0], 20, draft="none").token_ids
    )


# ---- bad input
# -------------------------------------------------------------------------------------
def test_unknown_precision(tiny_bundle, tmp_path):
    from dflash_edge.quantize.precisions import QuantizeError

    with pytest.raises(QuantizeError, match="unknown precision 'int3'"):
        quantize(tiny_bundle("llama", 8).path, tmp_path / "out", "int3", "int8")
    assert not (tmp_path / "out").exists()


def test_missing_recorded_checkpoint_names_the_flag(tiny_bundle, tmp_path):
    from dflash_edge.quantize.bundle_quant import QuantizeOptions, quantize_bundle
    from dflash_edge.quantize.precisions import QuantizeError
    from dflash_edge.runtime.bundle import write_manifest

    root = tiny_bundle("llama", 8).path.parent
    moved = tmp_path / "bundle"
    shutil.copytree(root / "bundle", moved)
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["source"]["export_options"]["target"] = str(tmp_path / "gone")
    write_manifest(moved, manifest)
    with pytest.raises(QuantizeError, match="checkpoint .* is not here; pass --target-checkpoint"):
        quantize(moved, tmp_path / "a", "int4", "int8")
    out = quantize_bundle(
        QuantizeOptions(
            moved, tmp_path / "b", target="int4", report=None, source_target=str(root / "target")
        )
    )
    graphs = json.loads((out / "manifest.json").read_text())["graphs"]
    assert graphs["target"]["precision"] == "int4"
    del manifest["source"]["export_options"]
    write_manifest(moved, manifest)
    with pytest.raises(QuantizeError, match="does not record the checkpoints"):
        quantize(moved, tmp_path / "c", "int4", "int8")


def test_out_inside_input_or_existing(tiny_bundle, tmp_path):
    from dflash_edge.quantize.bundle_quant import QuantizeOptions, quantize_bundle
    from dflash_edge.quantize.precisions import QuantizeError

    src = tiny_bundle("llama", 8).path
    with pytest.raises(QuantizeError, match="inside the input bundle"):
        quantize(src, src / "int4", "int4", "int8")
    with pytest.raises(QuantizeError, match="contains the input bundle"):
        quantize(src, src.parent, "int4", "int8")
    (tmp_path / "exists").mkdir()
    with pytest.raises(QuantizeError, match="already exists; pass --force"):
        quantize_bundle(QuantizeOptions(src, tmp_path / "exists", report=None))
    assert not (src / "int4").exists()


def test_bundle_failing_its_sha256(tiny_bundle, tmp_path):
    from dflash_edge.runtime.bundle import BundleError

    bad = tmp_path / "bad"
    shutil.copytree(tiny_bundle("llama", 8).path, bad)
    with open(bad / "target.onnx.data", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(BundleError, match="sha256 does not match"):
        quantize(bad, tmp_path / "out", "int4", "int8")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["write_manifest", "quality_report"])
def test_interrupted_quantisation_leaves_nothing_bundle_like(
    tiny_bundle, tmp_path, monkeypatch, prompts_file, where
):
    import dflash_edge.quantize.bundle_quant as bundle_quant
    import dflash_edge.runtime.bundle as bundle_mod

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bundle_mod if where == "write_manifest" else bundle_quant, where, boom)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        quantize(
            tiny_bundle("llama", 8).path, out, "int4", "int8", report=small_report(prompts_file)
        )
    assert list(tmp_path.iterdir()) == []  # no output, no partial folder


def test_cli_errors_are_one_line_and_exit_2(tiny_bundle, tmp_path, capsys):
    from dflash_edge.cli import main

    src = str(tiny_bundle("llama", 8).path)
    assert (
        main(["quantize", src, "--out", str(tmp_path / "o"), "--target", "int2", "--no-report"])
        == 2
    )
    assert "unknown precision 'int2'" in capsys.readouterr().err
    assert (
        main(["quantize", src, "--out", str(tmp_path / "o"), "--group-size", "24", "--no-report"])
        == 2
    )
    assert "power of two" in capsys.readouterr().err


# ---- streamed quantisation (issue 15): same graphs as onnxruntime's whole-graph quantiser
# ----------
def test_bundle_holds_only_the_files_its_manifest_names(tiny_bundle, tmp_path, prompts_file):
    from dflash_edge.runtime.bundle import read_bundle

    b = read_bundle(
        quantize(
            tiny_bundle("llama", 8).path,
            tmp_path / "q",
            "int4",
            "int8",
            report=small_report(prompts_file),
            block_size=16,
        ),
        verify=True,
    )
    named = {f["path"] for g in b.manifest["graphs"].values() for f in g["files"]}
    named |= {
        "manifest.json",
        b.manifest["quality"]["path"],
        *(b.manifest["tokenizer"][k] for k in ("file", "config")),
    }
    assert {p.name for p in b.root.iterdir()} == named


# ---- tier 2: the default model at int4
# -------------------------------------------------------------
@pytest.mark.tier2
def test_smollm2_int4_speculative_equals_plain(smollm2_dir, tmp_path_factory):
    from dflash_edge.export.exporter import ExportOptions, export_bundle
    from dflash_edge.runtime import Generator

    root = tmp_path_factory.mktemp("smollm2-int4")
    fp32 = export_bundle(
        ExportOptions(
            out=root / "fp32",
            target=str(smollm2_dir),
            draft="default",
            verify=False,
            precision="fp32",
        ),
        progress=False,
    )
    q = quantize(fp32, root / "int4", "int4", "int8")
    shutil.rmtree(fp32)
    gen = Generator.load(q)
    for prompt in [
        "Why is the sky blue?",
        "Write a Python function that reverses a string.",
        "List three uses of a paperclip.",
    ]:
        ids = gen.encode(prompt)
        spec = gen.generate_ids(ids, 64, stop_token_ids=(), draft="drafter")
        plain = gen.generate_ids(ids, 64, draft="none", stop_token_ids=())
        assert spec.token_ids == plain.token_ids
        assert (
            spec.stats.mean_acceptance_length > 1.0
        )  # the shipped drafter still drafts useful tokens
