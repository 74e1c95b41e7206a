"""Low-bit weights in standard ONNX (issue 39): blocked DequantizeLinear feeding MatMul computes
what onnxruntime's MatMulNBits computes, onnxruntime fuses it back (one copy of the weights for
every graph), and an int4 bundle's portable graphs hold no contrib op, pass onnx's checker at
opset 21, match the torch reference on the stored weights and stay lossless on onnxruntime's CPU
provider. Tier 1, tiny models."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dflash_edge.export.dq_format import signed_fits, weight_codes
from dflash_edge.models.nbits import NBitsWeight, dequantize, rtn

K, N = 128, 48
PROMPT = [5, 17, 42, 8, 61, 33, 9, 12]


def _weights():
    """int4 and int8 RTN weights, and an 8-bit one with a GGUF-style zero point (Q5_0: centre 16,
    codes 0..31) and a correction."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K)).astype(np.float32)
    codes = rng.integers(0, 32, (N, K // 32, 32), dtype=np.uint8)
    q5 = NBitsWeight(
        8,
        32,
        N,
        K,
        codes,
        (rng.random((N, K // 32)) * 0.1).astype(np.float32),
        np.full((N, K // 32), 16, np.uint8),
        rng.standard_normal((K // 32, N)).astype(np.float32),
        "Q5_0",
    )
    return {"int4": rtn(w, 4, 32), "int8": rtn(w, 8, 32), "q5_0": q5}


def _model(w: NBitsWeight, standard: bool):
    from onnx import TensorProto, helper, numpy_helper

    from dflash_edge.export.dq_format import weight_zero_points

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N])
    if standard:
        signed = signed_fits(w)
        q = weight_codes(w, signed)
        if isinstance(q, np.ndarray):
            codes = numpy_helper.from_array(q, "q")
        else:  # Packed int4
            codes = helper.make_tensor("q", TensorProto.INT4, q.shape, q.data.tobytes(), raw=True)
        inits = [codes, numpy_helper.from_array(np.ascontiguousarray(w.scales.T), "s")]
        if not signed:
            inits.append(numpy_helper.from_array(weight_zero_points(w), "z"))
        ins = [i.name for i in inits]
        nodes = [
            helper.make_node("DequantizeLinear", ins, ["wt"], axis=0, block_size=w.block_size),
            helper.make_node("MatMul", ["x", "wt"], ["y"]),
        ]
        opsets = [helper.make_opsetid("", 21)]
    else:
        inits = [numpy_helper.from_array(w.B, "B"), numpy_helper.from_array(w.scales, "s")]
        if w.zero_points is not None:
            inits.append(numpy_helper.from_array(w.zero_points, "z"))
        attrs = dict(K=K, N=N, bits=w.bits, block_size=w.block_size, accuracy_level=4)
        nodes = [
            helper.make_node(
                "MatMulNBits",
                ["x", *(i.name for i in inits)],
                ["y"],
                domain="com.microsoft",
                **attrs,
            )
        ]
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _run(model, x, level=None, dump=None):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if level is not None:
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(level))
    if dump:
        opts.optimized_model_filepath = str(dump)
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("kind", ["int4", "int8", "q5_0"])
def test_dequantize_linear_weights_are_the_nbits_weights(kind, tmp_path):
    """Same numbers as the contrib form: bit for bit at accuracy level 4 (onnxruntime fuses the
    pair into MatMulNBits: no DequantizeLinear left, so no float copy of the weight), and x @ W^T of
    the dequantised weight at level 0 (fp32 activations)."""
    import onnx

    w = _weights()[kind]
    x = np.random.default_rng(1).standard_normal((5, K)).astype(np.float32)
    dq, nbits = _model(w, True), _model(w, False)
    onnx.checker.check_model(dq, full_check=True)
    got = _run(dq, x, dump=tmp_path / "opt.onnx")
    ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert ops == ["MatMulNBits"], ops
    contrib = _run(nbits, x)  # a non-default zero point (Q5_0) goes another kernel path there
    if w.zero_points is None:
        assert np.array_equal(got, contrib)
    else:
        assert np.abs(got - contrib).max() <= 1e-5 * np.abs(contrib).max()
    exact = x @ dequantize(replace(w, correction=None)).T  # the correction is a separate MatMul
    np.testing.assert_allclose(_run(dq, x, level=0), exact, rtol=1e-4, atol=1e-4)


def test_codes_are_signed_when_they_fit():
    ws = _weights()
    assert signed_fits(ws["int4"]) and signed_fits(ws["int8"]) and signed_fits(ws["q5_0"])
    q = weight_codes(ws["q5_0"], True)  # q - 16 in [-16, 15], stored as int8 [K, N]
    assert q.dtype == np.int8 and q.shape == (K, N) and q.min() >= -16 and q.max() <= 15


@pytest.fixture(scope="module")
def bundles(tiny_checkpoints, tmp_path_factory):
    from dflash_edge.export.exporter import ExportOptions, export_bundle

    from tiny import add_tiny_tokenizer, hf_model, save_hf

    root = tmp_path_factory.mktemp("dq")

    def export(ops, target=tiny_checkpoints["qwen3"][1], **kw):
        opts = ExportOptions(
            out=root / ops,
            target=str(target),
            draft="random",
            block_size=4,
            max_context=128,
            prefill_chunk=8,
            precision="int4",
            kv_cache="fp32",
            low_bit_ops=ops,
            **kw,
        )
        return export_bundle(opts, progress=False)

    out = {ops: export(ops) for ops in ("standard", "contrib")}
    # fp32 activations: this tiny model's N(0, 1)-scale activations put level 4's int8 rounding
    # at parity's argmax bound with 64-wide blocks (84.6% against 85%); TensorRT never runs it
    # widths TensorRT's INT4 blocks tile (K = 64 or 128)
    wide = save_hf(
        hf_model("qwen3", overrides=dict(hidden_size=64, intermediate_size=128)), root / "w"
    )
    add_tiny_tokenizer(root / "w")
    out["tensorrt"] = export("tensorrt", target=wide, accuracy_level=0)
    return out


def _bytes(bundle):
    return sum(p.stat().st_size for p in bundle.iterdir() if p.name.endswith(".data"))


def test_int4_bundle_in_standard_ops(bundles):
    """No contrib op in the portable graphs (target, drafter, the shared table), onnx's full check
    at opset 21; parity against the torch reference on the stored weights ran on every graph; one
    copy: the fused target reads the portable target's initializers and the bundle stays within
    1.1x of the contrib form's bytes."""
    import onnx

    from dflash_edge.runtime.bundle import read_bundle

    out = bundles["standard"]
    m = read_bundle(out).manifest
    for name in ("target", "drafter"):
        model = onnx.load(str(out / f"{name}.onnx"))
        onnx.checker.check_model(model, full_check=True)
        assert {n.domain for n in model.graph.node} == {""}, name
        assert m["graphs"][name]["opset"] == 21
        assert "DequantizeLinear" in {n.op_type for n in model.graph.node}
    parity = m["source"]["parity"]
    assert parity["target.next_ids.agreement"] >= 0.85 and "drafter.draft_ids.agreement" in parity

    def names(graph):
        model = onnx.load(str(out / f"{graph}.onnx"), load_external_data=False)
        return {i.name for i in model.graph.initializer if i.external_data}

    assert names("target") & names("target_fused") >= {
        n for n in names("target") if "_DQ" in n and "embed" not in n
    }
    assert _bytes(out) <= 1.1 * _bytes(bundles["contrib"])


def test_portable_target_on_cpu_is_lossless(bundles):
    """The portable flavour itself (not the fused one) decodes on onnxruntime's CPU provider, and
    drafting changes no token of its own greedy decoding."""
    from dflash_edge.runtime import Generator

    gen = Generator.load(bundles["standard"], target_graph="target", use_tuned=False)
    plain = gen.generate_ids(PROMPT, 24, draft="none").token_ids
    assert gen.generate_ids(PROMPT, 24, draft="drafter").token_ids == plain
    assert len(plain) == 24


def test_runtime_names_the_onnxruntime_a_standard_bundle_needs(monkeypatch):
    import onnxruntime

    from dflash_edge.runtime.errors import DflashEdgeError
    from dflash_edge.runtime.session import low_bit_settings

    entry = {
        "opset": 21,
        "quantization": {"settings": {"low_bit_ops": "standard", "accuracy_level": 0}},
    }
    assert low_bit_settings(entry) == 0 and low_bit_settings({"opset": 17}) is None
    monkeypatch.setattr(onnxruntime, "__version__", "1.18.1")
    with pytest.raises(DflashEdgeError, match=r"pip install -U 'onnxruntime>=1.19'"):
        low_bit_settings(entry)
    assert low_bit_settings({"opset": 17}) is None  # older bundles still load


def test_runtime_names_the_onnxruntime_a_fused_int8_cache_needs(monkeypatch):
    """The fused target (opset 23: IR 11) needs onnxruntime 1.23, its int8 cache (GQA with scales)
    1.30: an older one is refused by name, with the re-export that avoids it."""
    import onnxruntime

    from dflash_edge.runtime.errors import DflashEdgeError
    from dflash_edge.runtime.session import low_bit_settings

    fused = {"opset": 23, "kv_cache": {"dtype": "int8"}}
    monkeypatch.setattr(onnxruntime, "__version__", "1.26.0")
    with pytest.raises(DflashEdgeError, match=r"int8 KV cache.*>=1.30'.*--kv-cache fp32"):
        low_bit_settings(fused)
    assert low_bit_settings({"opset": 23, "kv_cache": {"dtype": "float32"}}) is None
    monkeypatch.setattr(onnxruntime, "__version__", "1.22.1")
    with pytest.raises(DflashEdgeError, match=r"opset-23.*>=1.23'"):
        low_bit_settings({"opset": 23})


def test_graphs_carry_the_oldest_ir_their_opsets_allow(bundles):
    """Not onnx's newest IR: onnxruntime 1.26 refuses IR 14 outright (its maximum is 13)."""
    import onnx

    want = {17: 8, 21: 10, 23: 11}  # onnx.helper.VERSION_TABLE
    seen = set()
    for out in bundles.values():
        for path in out.glob("*.onnx"):
            model = onnx.load(str(path), load_external_data=False)
            opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
            assert model.ir_version == want[opset], (path, opset, model.ir_version)
            seen.add(opset)
    assert seen == {17, 21, 23}, seen


def test_tensorrt_recipe_is_lossless(bundles):
    """`--low-bit-ops tensorrt`: int4 weights re-quantised in blocks of 64 / 128, int8 (the untied
    head, the table) one scale per channel (TensorRT's weight-only rules); parity holds against
    the torch reference on those stored weights, and it runs on the CPU, with a warning:
    onnxruntime's int4 kernels are not row-exact at those blocks (this tiny model's tokens still
    agree; the 135M's do not: docs/BENCHMARKS.md)."""
    import onnx

    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.bundle import read_bundle
    from dflash_edge.runtime.session import NotRowExactWarning

    out = bundles["tensorrt"]
    model = onnx.load(str(out / "target.onnx"), load_external_data=False)
    types = {i.name: i.data_type for i in model.graph.initializer}
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    blocks = {
        (types[n.input[0]], next((a.i for a in n.attribute if a.name == "block_size"), 0))
        for n in dq
    }
    int4, int8 = onnx.TensorProto.INT4, onnx.TensorProto.INT8
    assert blocks == {(int4, 64), (int4, 128), (int8, 0)}, blocks
    m = read_bundle(out).manifest
    assert m["graphs"]["target"]["quantization"]["settings"]["low_bit_ops"] == "tensorrt"
    assert min(v for k, v in m["source"]["parity"].items() if k.endswith("agreement")) >= 0.95
    with pytest.warns(NotRowExactWarning, match="not row-exact"):
        gen = Generator.load(out, use_tuned=False)
    plain = gen.generate_ids(PROMPT, 24, draft="none").token_ids
    assert gen.generate_ids(PROMPT, 24, draft="drafter").token_ids == plain


def test_the_device_plan_picks_the_low_bit_form():
    """`export --device` (low_bit_ops auto) and `devices plan`: TensorRT's blocks on a Jetson or a
    GPU, the source's own on a CPU; an 8B int4 target fits an Orin NX 16 GB."""
    from dflash_edge.devices.dims import preset
    from dflash_edge.devices.planner import PlanRequest, plan
    from dflash_edge.devices.profiles import get_profile
    from dflash_edge.export.device_plan import low_bit_ops_for

    assert low_bit_ops_for(None) == low_bit_ops_for("cpu") == "contrib"
    assert low_bit_ops_for("jetson-orin-nx-16gb") == low_bit_ops_for("rtx-4090-24gb") == "tensorrt"
    t, d, _ = preset("qwen3-8b")
    out = plan(PlanRequest(t, d, get_profile("jetson-orin-nx-16gb"), "int4", 4096))
    assert out["fits"] and out["runs"] == {"target_graph": "target", "low_bit_ops": "tensorrt"}
