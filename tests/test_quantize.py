"""Quantised bundles (issue 12): each precision round-trips losslessly against its own target; manifest,
hashes and report fields; every bad input. Tier 1 on tiny in-process bundles; tier 2 on SmolLM2 at int4."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest


PROMPTS = [[5, 17, 33, 42, 8], [90, 1, 64, 12, 77, 3, 3, 19, 45, 60, 11], [(13 * i) % 90 + 3 for i in range(29)]]
CASES = [("int4", "int4"), ("int8", "int8"), ("fp16", "fp16"), ("int4", "fp32")]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": " ".join(f"t{(7 * i + k) % 90 + 3}" for k in range(n))}) + "\n"
                            for i, n in enumerate((5, 11, 3, 8))))
    return str(path)


def quantize(src, out, target, draft, report=None, **settings):
    from dflash_edge.quantize.bundle_quant import QuantizeOptions, quantize_bundle
    from dflash_edge.quantize.precisions import QuantSettings

    return quantize_bundle(QuantizeOptions(src, out, target=target, draft=draft, force=True, report=report,
                                           settings=QuantSettings(**settings)))


def small_report(prompts_file):
    from dflash_edge.quantize.quality import ReportOptions

    return ReportOptions(positions=24, max_new_tokens=12, accept_prompts=2, prompts=prompts_file, threads=1)


@pytest.fixture(scope="module")
def quantized(tiny_bundle, tmp_path_factory, prompts_file):
    """(target, draft) -> quantised copy of the tied tiny llama bundle (block 8), each built once."""
    built = {}

    def get(target, draft, variant="llama"):
        if (target, draft, variant) not in built:
            out = tmp_path_factory.mktemp(f"q-{variant}-{target}-{draft}") / "bundle"
            src = tiny_bundle(variant, 8).path
            built[target, draft, variant] = quantize(src, out, target, draft, report=small_report(prompts_file))
        return built[target, draft, variant]

    return get


# ---- lossless against the bundle's own target ------------------------------------------------------
@pytest.mark.parametrize("target,draft", CASES)
def test_each_precision_is_lossless_against_its_own_target(quantized, target, draft):
    from dflash_edge.runtime import Generator

    gen = Generator.load(quantized(target, draft), threads=1)
    for prompt in PROMPTS:
        spec = gen.generate_ids(prompt, 40, stop_token_ids=(), draft="drafter")
        plain = gen.generate_ids(prompt, 40, draft="none", stop_token_ids=())
        assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 40
        assert spec.stats.acceptance_lengths            # the drafter really ran


def test_untied_model_quantises_its_embedding_and_head(quantized):
    """qwen3 (untied): the embedding Gather alone becomes 4-bit blocks, the LM head a MatMulNBits."""
    import onnx

    from dflash_edge.runtime import Generator

    path = quantized("int4", "int4", variant="qwen3")
    ops = [n.op_type for n in onnx.load(str(path / "target.onnx"), load_external_data=False).graph.node]
    assert "GatherBlockQuantized" in ops and "Gemm" not in ops and ops.count("MatMulNBits") == 6 * 5 + 1   # q/k/v packed
    gen = Generator.load(path, threads=1)
    spec = gen.generate_ids(PROMPTS[1], 30, stop_token_ids=(), draft="drafter")
    assert spec.token_ids == gen.generate_ids(PROMPTS[1], 30, draft="none", stop_token_ids=()).token_ids


@pytest.mark.parametrize("target", ["int4", "int8"])
def test_quantised_bundle_keeps_the_fused_flavour_on_the_portable_weights(tiny_bundle, quantized, target):
    """qwen3 (head_dim 16) exports a fused target; quantised, it keeps it (the runtime's default on CPU),
    its quantised tensors stored once (borrowed from target.onnx.data), and it is lossless."""
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.bundle import read_bundle
    from dflash_edge.runtime.kv import FusedTargetModel

    path = quantized(target, target, variant="qwen3")
    graphs = read_bundle(path).manifest["graphs"]                 # every file's sha256 checked
    fused = graphs["target_fused"]
    assert fused["precision"] == target and "target.onnx.data" in [f["path"] for f in fused["files"]]
    import onnx

    model = onnx.load(str(path / "target_fused.onnx"), load_external_data=False)
    own = {i.name for i in model.graph.initializer if any(e.value == "target_fused.onnx.data" for e in i.external_data)}
    assert own and all("qkv_proj" in n or "rope" in n for n in own), own   # the rest is borrowed, not stored twice
    gen = Generator.load(path, threads=1)
    assert type(gen.target) is FusedTargetModel
    for prompt in PROMPTS:
        spec = gen.generate_ids(prompt, 30, stop_token_ids=(), draft="drafter")
        assert spec.token_ids == gen.generate_ids(prompt, 30, draft="none", stop_token_ids=()).token_ids


@pytest.mark.parametrize("target", ["int4", "int8", "fp32"])
def test_fused_decode_rows_equal_verify_rows_bit_for_bit(tiny_bundle, quantized, target):
    """A row's logits do not depend on how many tokens share its step: T = 1 decode steps and one T = k
    step over the same tokens give identical bits (the fused graph's pad row keeps onnxruntime off its
    single-row sgemm kernel; quantised MatMuls would amplify the last-bit differences into other tokens)."""
    from dflash_edge.runtime import Generator

    path = tiny_bundle("qwen3", 8).path if target == "fp32" else quantized(target, target, variant="qwen3")
    gen = Generator.load(path, threads=2)
    prompt, tokens = PROMPTS[1], [7, 41, 3, 88, 15, 60]
    rows = []
    gen.generate_ids(prompt, 1, stop_token_ids=(), draft="none")            # prefill: len(prompt) cached
    for i, t in enumerate(tokens):                                             # T = 1 steps
        step = gen.target.step(1)
        step["input_ids"][0, 0] = t
        gen.target.forward(1, len(prompt) + i)
        rows.append(step["logits"][0, 0].copy())
    step = gen.target.step(len(tokens))                                        # one T = 6 step, same positions
    step["input_ids"][0] = tokens
    gen.target.forward(len(tokens), len(prompt))
    np.testing.assert_array_equal(step["logits"][0], np.stack(rows))


@pytest.mark.parametrize("bits", [4, 8])
def test_tied_embedding_and_head_share_one_block_quantised_tensor(bits):
    """Gather(W) + Gemm(x, W, transB=1) (the exporter's tied LM head) -> one packed tensor feeding
    GatherBlockQuantized and MatMulNBits; both equal the numpy dequantisation of that tensor."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from dflash_edge.quantize.tied_embedding import quantize_tied_embedding

    v, h, bs = 256, 64, 32
    w = np.random.default_rng(0).standard_normal((v, h)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["W", "ids"], ["emb"]), helper.make_node("Shape", ["emb"], ["s"]),
             helper.make_node("Reshape", ["emb", "flat"], ["x"]),
             helper.make_node("Gemm", ["x", "W"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "T"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("emb", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([-1, h]), "flat")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert quantize_tied_embedding(model, bits, bs, accuracy_level=0) == ["W"]
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert "W" not in inits and [n.op_type for n in model.graph.node].count("Gemm") == 0
    packed, scales = inits[f"W_Q{bits}"], inits["W_scales"]                 # [V, H/bs, bs*bits/8], [V, H/bs]
    if bits == 4:
        q = np.stack([packed & 15, packed >> 4], -1).reshape(v, h // bs, bs).astype(np.float32) - 8
    else:
        q = packed.reshape(v, h // bs, bs).astype(np.float32) - 128
    deq = (q * scales[..., None]).reshape(v, h)                                # [V, H]
    assert np.abs(deq - w).max() <= np.abs(w).max() / (7 if bits == 4 else 127)
    ids = np.array([[3, 7, 200, 255]])
    logits, emb = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"ids": ids})
    np.testing.assert_allclose(emb[0], deq[ids[0]], rtol=0, atol=1e-6)
    np.testing.assert_allclose(logits, deq[ids[0]] @ deq.T, rtol=1e-4, atol=1e-3)


# ---- manifest, hashes, report ----------------------------------------------------------------------
def test_manifest_hashes_and_report(quantized, tiny_bundle):
    import onnx

    from dflash_edge.runtime.bundle import read_bundle, sha256_file

    src = tiny_bundle("llama", 8).path
    before = {p.name: sha256_file(p) for p in src.iterdir() if p.is_file()}
    b = read_bundle(quantized("int4", "int8"), verify=True)
    assert {p.name: sha256_file(p) for p in src.iterdir() if p.is_file()} == before     # input untouched
    graphs = b.manifest["graphs"]
    assert graphs["target"]["precision"] == "int4" and graphs["drafter"]["precision"] == "int8"
    q = graphs["target"]["quantization"]
    assert q["settings"] == {"block_size": 32, "accuracy_level": 4, "embedding_bits": 0, "symmetric": True,
                             "algorithm": "rtn"}
    # 6 layers x 5 MatMuls (q/k/v packed in one), + the LM head where the export wrote it as its own MatMul (the torch path ties
    # tables of >= 65536 elements only); the streamed writer ties it as Gemm on the embedding, quantised with it
    src_ops = {n.op_type for n in onnx.load(str(src / "target.onnx"), load_external_data=False).graph.node}
    assert q["embedding_bits"] == 4 and q["embedding"] and q["matmul_nbits"] == 6 * 5 + ("Gemm" not in src_ops)
    assert graphs["drafter"]["quantization"]["embedding_bits"] == 8
    for g in graphs.values():
        for f in g["files"]:
            assert sha256_file(b.root / f["path"]) == f["sha256"] and (b.root / f["path"]).stat().st_size == f["bytes"]
    ops = {n.op_type for n in onnx.load(str(b.graph_path("target")), load_external_data=False).graph.node}
    assert {"MatMulNBits", "GatherBlockQuantized"} <= ops and "Gather" in ops   # Gather left: shapes, rope
    for entry in graphs["target"]["io"]["inputs"] + graphs["target"]["io"]["outputs"]:
        assert entry["dtype"] in ("int64", "float32")                                   # KV and I/O stay fp32
    report = json.loads((b.root / b.manifest["quality"]["path"]).read_text())
    assert report["positions"] >= 24 and 0.0 <= report["top1_agreement"] <= 1.0
    assert set(report["perplexity"]) == {"reference", "quantized"} and all(
        np.isfinite(v) and v >= 1.0 for v in report["perplexity"].values())
    assert report["acceptance_length"]["quantized"] >= 1.0 and report["speculative_equals_plain"] is True
    assert report["bytes"]["graphs"]["target"]["quantized"] < report["bytes"]["graphs"]["target"]["reference"]
    assert report["plain_ms_per_token"]["quantized"] > 0 and "engines" not in b.manifest


def test_keeping_fp32_copies_graphs_byte_for_byte(quantized, tiny_bundle):
    from dflash_edge.runtime.bundle import read_bundle

    src = read_bundle(tiny_bundle("llama", 8).path)
    b = read_bundle(quantized("int4", "fp32"))
    assert b.manifest["graphs"]["drafter"] == src.manifest["graphs"]["drafter"]


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
    opts = ExportOptions(out=tmp_path / "int4", target=str(root / "target"), draft=str(root / "drafter"),
                         block_size=8, max_context=128, prefill_chunk=8, verify=False, precision="int4",
                         draft_precision="int4")
    out = export_bundle(opts, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int4"]                    # no fp32 detour
    gen = Generator.load(out, threads=1)
    assert {g["precision"] for g in gen.bundle.manifest["graphs"].values()} == {"int4"}
    assert gen.generate_ids(PROMPTS[0], 20, draft="drafter").token_ids == gen.generate_ids(PROMPTS[0], 20, draft="none").token_ids


# ---- bad input -------------------------------------------------------------------------------------
def test_unknown_precision(tiny_bundle, tmp_path):
    from dflash_edge.quantize.precisions import QuantizeError

    with pytest.raises(QuantizeError, match="unknown precision 'int3'"):
        quantize(tiny_bundle("llama", 8).path, tmp_path / "out", "int3", "int8")
    assert not (tmp_path / "out").exists()


def test_raising_or_requantising_a_quantised_graph(quantized, tmp_path):
    from dflash_edge.quantize.precisions import QuantizeError

    src = quantized("int4", "int8")
    with pytest.raises(QuantizeError, match="already int4: cannot raise it to fp16"):
        quantize(src, tmp_path / "a", "fp16", "int8")
    with pytest.raises(QuantizeError, match="'drafter' is already int8: cannot re-quantise it to int4"):
        quantize(src, tmp_path / "b", "int4", "int4")


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


@pytest.mark.parametrize("where", ["save_graph", "quality_report"])
def test_interrupted_quantisation_leaves_nothing_bundle_like(tiny_bundle, tmp_path, monkeypatch, prompts_file, where):
    import dflash_edge.quantize.graph_io as graph_io
    import dflash_edge.quantize.quality as quality

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(graph_io if where == "save_graph" else quality, where, boom)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        quantize(tiny_bundle("llama", 8).path, out, "int4", "int8", report=small_report(prompts_file))
    assert list(tmp_path.iterdir()) == []                    # no output, no partial folder


def test_cli_errors_are_one_line_and_exit_2(tiny_bundle, tmp_path, capsys):
    from dflash_edge.cli import main

    src = str(tiny_bundle("llama", 8).path)
    assert main(["quantize", src, "--out", str(tmp_path / "o"), "--target", "int2", "--no-report"]) == 2
    assert "unknown precision 'int2'" in capsys.readouterr().err
    assert main(["quantize", src, "--out", str(tmp_path / "o"), "--block-size", "24", "--no-report"]) == 2
    assert "power of two" in capsys.readouterr().err


# ---- streamed quantisation (issue 15): same graphs as onnxruntime's whole-graph quantiser ----------
def _graph_parts(path):
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))                                     # with its data, wherever each tensor lies
    inits = [(i.name, i.data_type, list(i.dims), numpy_helper.to_array(i).tobytes()) for i in m.graph.initializer]
    return ([n.SerializeToString() for n in m.graph.node], inits, list(m.opset_import), list(m.graph.input),
            list(m.graph.output))


@pytest.mark.parametrize("variant,target,draft,settings", [
    ("llama", "int4", "int8", {}), ("qwen3", "int4", "int4", {}),
    ("qwen3", "int8", "int8", {"symmetric": False, "block_size": 16}), ("llama", "int4", "int4", {"embedding_bits": 8})])
def test_streamed_graphs_equal_the_whole_graph_quantisers(tiny_bundle, tmp_path, monkeypatch, capsys,
                                                          variant, target, draft, settings):
    """Streamed (weights memory-mapped, quantised one tensor at a time) and loaded whole (onnxruntime's
    MatMulNBitsQuantizer, the path before issue 15): the same nodes, attributes, opsets, I/O, initializer
    names in the same order and byte-identical tensors, for the portable, fused and drafter graphs."""
    import dflash_edge.quantize.graph_io as graph_io
    import dflash_edge.quantize.stream as stream
    from dflash_edge.runtime.bundle import read_bundle

    src = tiny_bundle(variant, 8).path
    monkeypatch.setattr(graph_io, "load_graph", lambda *a: pytest.fail("a streamed graph was loaded whole"))
    streamed = read_bundle(quantize(src, tmp_path / "streamed", target, draft, **settings))
    monkeypatch.undo()
    assert "loaded whole" not in capsys.readouterr().err
    monkeypatch.setattr(stream, "streamable", lambda *a: "forced for the test")
    whole = read_bundle(quantize(src, tmp_path / "whole", target, draft, **settings))
    assert "loaded whole (forced for the test)" in capsys.readouterr().err
    for name, entry in whole.manifest["graphs"].items():
        assert _graph_parts(streamed.graph_path(name)) == _graph_parts(whole.graph_path(name)), name
        q_s, q_w = streamed.manifest["graphs"][name]["quantization"], entry["quantization"]
        assert {**q_s, "seconds": 0} == {**q_w, "seconds": 0}
    assert set(streamed.manifest["source"]["quantize_peak_rss_mb"]) == {"read", *whole.manifest["graphs"]}


def _tied_graph(folder, v=256, h=64):
    """Gather(W) + Gemm(x, W, transB=1) (the exporter's tied head), W in `folder`/g.onnx.data; returns (path, W)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(3).standard_normal((v, h)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["W", "ids"], ["emb"]), helper.make_node("Reshape", ["emb", "flat"], ["x"]),
             helper.make_node("Gemm", ["x", "W"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "T"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([-1, h]), "flat")])
    path = folder / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path),
              save_as_external_data=True, location="g.onnx.data", size_threshold=1024)
    return path, w


def test_streamed_tied_embedding_stores_its_scales_once(tmp_path):
    """Streamed, the tied table's head and gather scales (the same 4 KB in two ranks at block 16) share one
    range of the new data file, which holds packed table + scales once; logits equal the in-memory path's."""
    import onnx
    import onnxruntime as ort

    from dflash_edge.quantize.dedupe import TensorIndex
    from dflash_edge.quantize.tensor_io import SourceTensors, Streamed, TensorSink
    from dflash_edge.quantize.tied_embedding import quantize_tied_embedding

    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    path, w = _tied_graph(tmp_path / "src")
    model = onnx.load(str(path), load_external_data=False)
    with SourceTensors(path.parent) as src, TensorSink(tmp_path / "out", "q.onnx.data", TensorIndex(tmp_path / "out")) as sink:
        assert quantize_tied_embedding(model, 4, 16, 0, Streamed(src, sink)) == ["W"]
        sink.copy_rest(model, src, {"flat"})
    where = {i.name: tuple(e.value for e in i.external_data) for i in model.graph.initializer}
    assert where["W_scales"] and where["W_scales"] == where["W_gather_scales"]
    assert where["W_Q4"] != where["W_scales"]
    packed, scales = 256 * 64 // 2, 256 * 64 // 16 * 4                              # bytes
    assert packed + scales <= (tmp_path / "out" / "q.onnx.data").stat().st_size < packed + 2 * scales
    onnx.save(model, str(tmp_path / "out" / "q.onnx"))
    inline = onnx.load(str(path))
    quantize_tied_embedding(inline, 4, 16, 0)
    ids = {"ids": np.array([[0, 9, 255]])}
    run = [ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, ids)[0]
           for m in (str(tmp_path / "out" / "q.onnx"), inline.SerializeToString())]
    np.testing.assert_array_equal(run[0], run[1])


def test_streamed_bundle_holds_only_the_files_its_manifest_names(tiny_bundle, tmp_path, prompts_file):
    from dflash_edge.runtime.bundle import read_bundle

    b = read_bundle(quantize(tiny_bundle("llama", 8).path, tmp_path / "q", "int4", "int8",
                             report=small_report(prompts_file), block_size=16), verify=True)
    named = {f["path"] for g in b.manifest["graphs"].values() for f in g["files"]}
    named |= {"manifest.json", b.manifest["quality"]["path"], *(b.manifest["tokenizer"][k] for k in ("file", "config"))}
    assert {p.name for p in b.root.iterdir()} == named


@pytest.mark.parametrize("k,bits,symmetric", [(64, 4, True), (40, 4, False), (48, 8, True), (40, 8, False)])
def test_pack_blocks_equals_onnxruntimes_quantiser(k, bits, symmetric):
    """One weight through matmul_nbits.pack_blocks == onnxruntime's DefaultWeightOnlyQuantizer, including a
    last partial block along K and asymmetric zero points."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, DefaultWeightOnlyQuantizer

    from dflash_edge.quantize.matmul_nbits import pack_blocks

    w = np.random.default_rng(k + bits).standard_normal((k, 24)).astype(np.float32)      # [K, N]
    ref = DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=symmetric, bits=bits))
    for mine, theirs in zip(pack_blocks(w, bits, 32, symmetric), ref.qbits_block_quant(w)):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        np.testing.assert_array_equal(mine, theirs)


def test_embedding_quantised_in_row_chunks_equals_whole_table():
    from dflash_edge.quantize.tied_embedding import block_quantize

    w = np.random.default_rng(1).standard_normal((100, 64)).astype(np.float32)
    whole = block_quantize(w, 4, 32, rows=100)
    for got, want in zip(block_quantize(w, 4, 32, rows=7), whole):
        np.testing.assert_array_equal(got, want)


# ---- tier 2: the default model at int4 -------------------------------------------------------------
@pytest.mark.tier2
def test_smollm2_int4_speculative_equals_plain(smollm2_dir, tmp_path_factory):
    from dflash_edge.export.exporter import ExportOptions, export_bundle
    from dflash_edge.runtime import Generator

    root = tmp_path_factory.mktemp("smollm2-int4")
    fp32 = export_bundle(ExportOptions(out=root / "fp32", target=str(smollm2_dir), draft="default", verify=False),
                         progress=False)
    q = quantize(fp32, root / "int4", "int4", "int8")
    shutil.rmtree(fp32)
    gen = Generator.load(q)
    for prompt in ["Why is the sky blue?", "Write a Python function that reverses a string.",
                   "List three uses of a paperclip."]:
        ids = gen.encode(prompt)
        spec = gen.generate_ids(ids, 64, stop_token_ids=(), draft="drafter")
        plain = gen.generate_ids(ids, 64, draft="none", stop_token_ids=())
        assert spec.token_ids == plain.token_ids
        assert spec.stats.mean_acceptance_length > 1.0     # the shipped drafter still drafts useful tokens
