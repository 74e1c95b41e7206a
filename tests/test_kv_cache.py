"""`--kv-cache int8` (export, and quantize through it): the fused target's cache as int8 with
calibrated per-channel scales, calibrated by the exporter on the graph it has just written.

Tier 1 on the tiny qwen3 bundle (head_dim 16, so it has a fused target): lossless against its own
target with and without quantised weights, decode rows equal verify rows bit for bit without the pad
row, the cache holds exactly clip(rint(x / scale)) of the fp32 graph's K/V, manifest and hashes,
every bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

PROMPTS = [
    [5, 17, 33, 42, 8],
    [90, 1, 64, 12, 77, 3, 3, 19, 45, 60, 11],
    [(13 * i) % 90 + 3 for i in range(29)],
]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("kv-prompts") / "prompts.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt": " ".join(f"t{(5 * i + k) % 90 + 3}" for k in range(n))}) + "\n"
            for i, n in enumerate((6, 13, 4, 9, 21))
        )
    )
    return str(path)


def quantize(src, out, target="fp32", draft="fp32", kv_cache="int8", prompts=None):
    from dflash_edge.quantize.bundle_quant import QuantizeOptions, quantize_bundle
    from dflash_edge.quantize.quality import ReportOptions

    report = ReportOptions(
        positions=24, max_new_tokens=12, accept_prompts=2, prompts=prompts, threads=1
    )
    return quantize_bundle(
        QuantizeOptions(
            src,
            out,
            target=target,
            draft=draft,
            force=True,
            kv_cache=kv_cache,
            report=report if prompts else None,
        )
    )


@pytest.fixture(scope="module")
def kv8(tiny_bundle, tmp_path_factory, prompts_file):
    """target precision -> the tiny qwen3 bundle with an int8 fused cache (built once each)."""
    built = {}

    def get(target="fp32"):
        if target not in built:
            out = tmp_path_factory.mktemp(f"kv8-{target}") / "bundle"
            built[target] = quantize(
                tiny_bundle("qwen3", 8).path, out, target, target, prompts=prompts_file
            )
        return built[target]

    return get


@pytest.mark.parametrize("target", ["fp32", "int4"])
def test_int8_cache_is_lossless_against_its_own_target(kv8, target):
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.targets import FusedTargetModel

    gen = Generator.load(kv8(target), threads=1)
    assert type(gen.target) is FusedTargetModel and gen.target.pad_rows == 0
    assert gen.target.kv.key.array.dtype == np.int8
    for prompt in PROMPTS:
        spec = gen.generate_ids(prompt, 30, stop_token_ids=(), draft="drafter")
        assert (
            spec.token_ids
            == gen.generate_ids(prompt, 30, stop_token_ids=(), draft="none").token_ids
        )
    assert np.abs(gen.target.kv.key.array).max() > 0


@pytest.mark.parametrize("target", ["fp32", "int4"])
def test_int8_cache_decode_rows_equal_verify_rows_bit_for_bit(kv8, target):
    """Without the pad row, T = 1 steps and one T = 6 step over the same tokens give the same
    logits."""
    from dflash_edge.runtime import Generator

    gen = Generator.load(kv8(target), threads=2)
    prompt, tokens = PROMPTS[1], [7, 41, 3, 88, 15, 60]
    gen.generate_ids(prompt, 1, stop_token_ids=(), draft="none")
    rows = []
    for i, t in enumerate(tokens):
        step = gen.target.step(1)
        step["input_ids"][0, 0] = t
        gen.target.forward(1, len(prompt) + i)
        rows.append(step["logits"][0, 0].copy())
    step = gen.target.step(len(tokens))
    step["input_ids"][0] = tokens
    gen.target.forward(len(tokens), len(prompt))
    np.testing.assert_array_equal(step["logits"][0], np.stack(rows))


def test_cache_holds_rounded_scaled_fp32_rows(kv8, tiny_bundle):
    """Layer 0's K/V do not depend on attention, so the int8 cache must be exactly clip(rint(fp32 /
    scale)) of the fp32 graph's (checks the scales' [Hkv * D] channel order and the rounding)."""
    import onnx
    from onnx import numpy_helper

    from dflash_edge.export.kv_cache import teacher_forced_logits
    from dflash_edge.runtime import Generator

    path = kv8("fp32")
    ids = PROMPTS[2]
    fp32 = Generator.load(tiny_bundle("qwen3", 8).path, threads=1, target_graph="target_fused")
    int8 = Generator.load(path, threads=1)
    for gen in (fp32, int8):
        teacher_forced_logits(gen, ids, slice(0, 0))
    inits = {
        i.name: numpy_helper.to_array(i)
        for i in onnx.load(str(path / "target_fused.onnx")).graph.initializer
        if i.name.startswith("kv.")
    }
    for kind in ("key", "value"):
        scale = inits[f"kv.{kind[0]}_scale.0"]  # [Hkv * D]
        ref = getattr(fp32.target.kv, kind).array[0, :, : len(ids)]  # [Hkv, S, D]
        heads, _, dim = ref.shape
        want = np.clip(np.rint(ref / scale.reshape(heads, 1, dim)), -128, 127)
        np.testing.assert_array_equal(getattr(int8.target.kv, kind).array[0, :, : len(ids)], want)


def test_manifest_graph_and_hashes(kv8, tiny_bundle):
    import onnx

    from dflash_edge.runtime.bundle import read_bundle

    b = read_bundle(kv8("fp32"), verify=True)  # every file's sha256, the new graph's too
    entry = b.manifest["graphs"]["target_fused"]
    assert entry["kv_cache"]["dtype"] == "int8" and entry["kv_cache"]["pad_rows"] == 0
    assert entry["kv_cache"]["calibration"]["positions"] > 0 and entry["kv_cache"]["margin"] > 0
    assert {s["dtype"] for s in entry["io"]["inputs"] if s["name"].startswith("past_")} == {"int8"}
    assert (
        b.kv_dtype == "float32" and b.graph_kv_dtype("target") == "float32"
    )  # portable target, drafter
    assert "kv_cache" not in b.manifest["graphs"]["target"]
    model = onnx.load(str(b.graph_path("target_fused")), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    src = onnx.load(
        str(tiny_bundle("qwen3", 8).path / "target_fused.onnx"), load_external_data=False
    )
    sliced = [n for n in model.graph.node if n.op_type == "Slice"]  # only the LM head's rows
    assert [n.input[1] for n in sliced] == ["logits_from"] and ops.count("Concat") < [
        n.op_type for n in src.graph.node
    ].count("Concat")
    assert not any(i.name.startswith("pad_row") for i in model.graph.initializer)
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert gqa and all(
        {a.name for a in n.attribute} >= {"k_quant_type", "kv_cache_bit_width"} for n in gqa
    )
    report = json.loads((b.root / "quality.json").read_text())
    assert report["speculative_equals_plain"] is True and 0 <= report["top1_agreement"] <= 1
    assert report["kv_cache"] == {
        "reference": {"graph": "target_fused", "dtype": "float32"},
        "quantized": {"graph": "target_fused", "dtype": "int8"},
    }


def test_tensorrt_and_cuda_keep_the_portable_target(kv8):
    from dflash_edge.runtime.bundle import read_bundle
    from dflash_edge.runtime.io_tables import pick_graph

    b = read_bundle(kv8("fp32"), verify=False)
    dtypes = {g: b.graph_kv_dtype(g) for g in b.manifest["graphs"]}
    assert pick_graph(b.manifest["graphs"], "target", "cpu", dtypes) == "target_fused"
    assert pick_graph(b.manifest["graphs"], "target", "cuda", dtypes) == "target"
    assert pick_graph(b.manifest["graphs"], "target", "tensorrt", dtypes) == "target"


# ---- bad input
# ----------------------------------------------------------------------------------------
def test_bundle_without_fused_target(tiny_bundle, tmp_path, capsys):
    from dflash_edge.runtime.bundle import read_bundle

    out = quantize(tiny_bundle("llama", 8).path, tmp_path / "out")  # head_dim 8: no fused target
    assert "no fused target, so no int8 KV cache" in capsys.readouterr().err
    assert read_bundle(out).kv_dtype == "float32"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_int8_cache_bundle_reexported_with_fp32_gets_the_fp32_graph(kv8, tiny_bundle, tmp_path):
    back = quantize(kv8("fp32"), tmp_path / "out", kv_cache="fp32")
    want = tiny_bundle("qwen3", 8).path / "target_fused.onnx"
    assert (back / "target_fused.onnx").read_bytes() == want.read_bytes()


def test_rewriting_an_already_int8_graph(kv8):
    import onnx

    from dflash_edge.export.kv_cache import KVCacheError, int8_cache_graph

    model = onnx.load(str(kv8("fp32") / "target_fused.onnx"), load_external_data=False)
    layers = sum(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    with pytest.raises(KVCacheError, match="already quantised"):
        int8_cache_graph(
            model, np.ones((layers, 32), np.float32), np.ones((layers, 32), np.float32)
        )


def test_unknown_kv_cache_name_on_the_cli(tiny_bundle, tmp_path, capsys):
    from dflash_edge.cli import main

    with pytest.raises(SystemExit) as e:
        main(
            [
                "quantize",
                str(tiny_bundle("qwen3", 8).path),
                "--out",
                str(tmp_path / "o"),
                "--kv-cache",
                "int3",
            ]
        )
    assert e.value.code == 2 and "int3" in capsys.readouterr().err


def test_interrupted_calibration_leaves_nothing_bundle_like(tiny_bundle, tmp_path, monkeypatch):
    import dflash_edge.export.kv_cache as kv_cache

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(kv_cache, "calibrate", boom)
    with pytest.raises(KeyboardInterrupt):
        quantize(tiny_bundle("qwen3", 8).path, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_fp16_target_is_refused_up_front(tiny_bundle, tmp_path):
    from dflash_edge.export.kv_cache import KVCacheError

    with pytest.raises(KVCacheError, match="fp16"):
        quantize(tiny_bundle("qwen3", 8).path, tmp_path / "out", "fp16", "fp16")
    assert list(tmp_path.iterdir()) == []


def test_calibration_texts_are_prompts_and_following_prompts(tiny_bundle):
    """Each text: one of the last `pool` prompts in the chat template, then the pool prompts after
    it (round robin) as its reply, cut at `length` tokens; nothing decoded."""
    from dflash_edge.export.kv_cache import calibration_texts
    from dflash_edge.runtime import Generator

    gen = Generator.load(tiny_bundle("qwen3", 8).path, threads=1, drafter=False)
    prompts = ["ignored", "t5 t6 t7", "t8 t9", "t10"]
    texts = calibration_texts(gen, prompts, count=3, length=40, pool=3)
    enc = gen.tokenizer.encode
    tail = lambda *ps: sum((enc("\n\n" + p) for p in ps), [])  # noqa: E731
    assert len(texts) == 3 and all(len(t) == 40 for t in texts)
    assert texts[0] == (gen.encode("t5 t6 t7") + tail("t8 t9", "t10", "t5 t6 t7") * 9)[:40]
    assert texts[2] == (gen.encode("t10") + tail("t5 t6 t7", "t8 t9", "t10") * 9)[:40]
    spread = calibration_texts(gen, ["t3", "t4", *prompts], count=2, length=30, pool=4)
    assert [t[: len(gen.encode(p))] for t, p in zip(spread, prompts[::2])] == [
        gen.encode(p) for p in prompts[::2]
    ]  # pool prompts 0 and 2 of 4 open the two texts
    one = calibration_texts(gen, ["t5"], count=16, length=30)  # one prompt: itself after itself
    assert one == [(gen.encode("t5") + tail("t5") * 30)[:30]]


def test_export_kv_cache_int8_is_one_pass(tiny_bundle, tmp_path, prompts_file, monkeypatch):
    """Calibrated inside the export from prefill chunks alone: nothing is decoded."""
    from dflash_edge.runtime import Generator

    from fixtures_bundle import export_again

    def no_decoding(*args, **kwargs):
        raise AssertionError("the calibration decoded")

    monkeypatch.setattr(Generator, "generate_ids", no_decoding)

    tiny = tiny_bundle("qwen3", 8)
    out = export_again(
        tiny, tmp_path / "kv8", 8, kv_cache="int8", kv_prompts=prompts_file, threads=1
    )
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kv8"]  # no fp32 leftovers
    gen = Generator.load(out, threads=1)
    calibration = gen.bundle.manifest["graphs"]["target_fused"]["kv_cache"]["calibration"]
    assert calibration["teacher_forced"] and calibration["texts"] == 4  # kv_cache.COUNT
    room = gen.target.kv.capacity - gen.prefill_chunk  # kv_cache.LENGTH each, or what fits
    assert calibration["positions"] == 4 * min(128, room)
    assert gen.target.kv.key.array.dtype == np.int8
    assert {g["precision"] for g in gen.bundle.manifest["graphs"].values()} == {"fp32"}


def test_manifest_cache_dtype_that_the_graph_does_not_have(kv8, tmp_path):
    import shutil

    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.bundle import BundleError
    from dflash_edge.runtime.io_tables import io_manifest

    bad = tmp_path / "b"
    shutil.copytree(kv8("fp32"), bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["graphs"]["target_fused"]["kv_cache"]["dtype"] = "float16"  # the graph's cache is int8
    manifest["graphs"]["target_fused"]["io"] = io_manifest(
        "target_fused", "float16"
    )  # consistent with it
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="does not match"):
        Generator.load(bad, verify=False)
