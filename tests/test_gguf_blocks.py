"""Exact GGUF low-bit import (issue 27, item 1): each mapped type's MatMulNBits operands dequantise
to what gguf's own `dequantize` gives, and run in onnxruntime to A @ W^T, up to float32 rounding.
Tier 1 (small W).

The reference dequantisation here follows MatMulNBits' definition, (q - zero_point) * scale [+
correction], not the module's code; the truth is `gguf.quants.dequantize` of blocks made by gguf's
own quantiser (or, for the K-quants gguf cannot quantise in numpy, valid random blocks built byte by
byte)."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from dflash_edge.models.gguf_blocks import TYPES, UnsupportedQuantType, nbits_operands  # noqa: E402
from dflash_edge.models.nbits import dequantize as dequant_operands  # noqa: E402
from dflash_edge.models.nbits import dequantize_rows  # noqa: E402
from dflash_edge.runtime.errors import ModelFormatError  # noqa: E402

N, K = 64, 256
QUANTISED_BY_GGUF = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
# type -> (byte offset, count) of its float16 fields in a block; the other bytes are codes/scales
K_QUANTS = {
    "Q4_K": [(0, 2)],
    "Q5_K": [(0, 2)],
    "Q6_K": [(208, 1)],
}


def _random_blocks(name: str, rng) -> np.ndarray:
    """Valid random GGUF bytes [N, K/256*type_size]: any code/scale bytes, finite float16 d (and
    dmin)."""
    _, size = GGML_QUANT_SIZES[T[name]]
    raw = rng.integers(0, 256, size=(N, K // 256, size), dtype=np.uint8)
    for start, count in K_QUANTS[name]:
        halves = (rng.random((N, K // 256, count)) * 0.02 + 1e-3).astype(np.float16)
        raw[..., start : start + 2 * count] = halves.view(np.uint8)
    return raw.reshape(N, -1)


def _raw(name: str) -> np.ndarray:
    rng = np.random.default_rng(sum(map(ord, name)))
    if name in K_QUANTS:
        return _random_blocks(name, rng)
    w = rng.standard_normal((N, K)).astype(np.float32) * 0.05 + 0.01
    return quantize(w, T[name])  # [N, bytes per row], as GGUFReader


def _session(w):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    attrs = dict(
        domain="com.microsoft", K=w.k, N=w.n, bits=w.bits, block_size=w.block_size, accuracy_level=0
    )
    zp = [] if w.zero_points is None else ["z"]  # None: the op's default
    nodes = [
        helper.make_node(
            "MatMulNBits", ["A", "B", "s", *zp], ["Y" if w.correction is None else "Y0"], **attrs
        )
    ]
    inits = [numpy_helper.from_array(w.B, "B"), numpy_helper.from_array(w.scales, "s")]
    inits += [numpy_helper.from_array(w.zero_points, "z")] if zp else []
    if w.correction is not None:
        nodes += [
            helper.make_node("Reshape", ["A", "shape"], ["Ab"]),  # [M, K/bs, bs]
            helper.make_node("ReduceSum", ["Ab", "axis"], ["As"], keepdims=0),  # [M, K/bs]
            helper.make_node("MatMul", ["As", "C"], ["Y1"]),  # [M, N]
            helper.make_node("Add", ["Y0", "Y1"], ["Y"]),
        ]
        inits += [
            numpy_helper.from_array(w.correction, "C"),
            numpy_helper.from_array(
                np.array([-1, w.k // w.block_size, w.block_size], np.int64), "shape"
            ),
            numpy_helper.from_array(np.array([2], np.int64), "axis"),
        ]
    graph = helper.make_graph(
        nodes,
        "nbits",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, w.k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, w.n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


MAPPED = QUANTISED_BY_GGUF + list(K_QUANTS)


def test_table_matches_gguf_block_sizes():
    assert set(TYPES) == set(MAPPED)
    for name, spec in TYPES.items():
        assert (spec.gguf_block, spec.type_size) == GGML_QUANT_SIZES[T[name]], name


@pytest.mark.parametrize("name", MAPPED)
def test_operands_dequantise_to_gguf(name):
    raw = _raw(name)
    truth = dequantize(raw, T[name])  # [N, K] float32
    w = nbits_operands(raw, T[name])
    assert (w.n, w.k, w.B.dtype, w.scales.dtype) == (N, K, np.uint8, np.float32)
    assert w.zero_points is None or w.zero_points.dtype == np.uint8
    assert w.B.shape == (N, K // w.block_size, w.block_size * w.bits // 8)
    diff = np.abs(dequant_operands(w) - truth).max()
    assert diff <= 1e-6 * np.abs(truth).max(), (name, diff, np.abs(truth).max())


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("name", MAPPED)
def test_onnxruntime_matmul_matches(name, rows):
    raw = _raw(name)
    truth = dequantize(raw, T[name]).astype(np.float64)
    a = np.random.default_rng(rows).standard_normal((rows, K)).astype(np.float32)
    ref = a.astype(np.float64) @ truth.T
    got = _session(nbits_operands(raw, T[name])).run(None, {"A": a})[0]
    diff = np.abs(got - ref).max()
    assert diff <= 1e-5 * np.abs(ref).max() + 1e-6, (name, rows, diff, np.abs(ref).max())


def test_flat_bytes_with_shape_and_type_by_name_or_int():
    raw = _raw("Q4_1")
    by_enum = nbits_operands(raw, T.Q4_1)
    for w in (nbits_operands(raw.ravel(), "Q4_1", shape=(N, K)), nbits_operands(raw, int(T.Q4_1))):
        assert np.array_equal(w.B, by_enum.B) and np.array_equal(w.correction, by_enum.correction)


@pytest.mark.parametrize("qtype", [T.IQ4_XS, T.Q2_K, T.F16, "MXFP4"])
def test_unmapped_type_is_refused_by_name(qtype):
    with pytest.raises(UnsupportedQuantType, match=getattr(qtype, "name", qtype)) as err:
        nbits_operands(np.zeros((4, 144), np.uint8), qtype, shape=(4, 256))
    assert err.value.qtype == getattr(qtype, "name", qtype)
    assert isinstance(err.value, ModelFormatError)


def test_k_not_a_multiple_of_the_block_is_refused_naming_the_shape():
    raw = _raw("Q8_0").ravel()
    with pytest.raises(ModelFormatError, match=r"\[64, 240\]"):
        nbits_operands(
            raw[: 64 * 240 // 32 * 34], T.Q8_0, shape=(64, 240), name="blk.0.attn_q.weight"
        )
    with pytest.raises(ModelFormatError, match=r"\[4, 100\]"):
        nbits_operands(np.zeros((4, 100), np.uint8), T.Q8_0)
    with pytest.raises(ModelFormatError, match="shape"):
        nbits_operands(raw, T.Q8_0, shape=(N, 2 * K))  # bytes and shape disagree


def test_reader_tensor_round_trip(tmp_path):
    """What GGUFReader hands over (memory-mapped byte rows [N, bytes], GGUF's reversed dims undone)
    maps as is."""
    raw = _raw("Q4_1")
    writer = gguf.GGUFWriter(str(tmp_path / "w.gguf"), "llama")
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=T.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (t,) = gguf.GGUFReader(str(tmp_path / "w.gguf")).tensors
    w = nbits_operands(t.data, t.tensor_type, name=t.name)
    assert (w.n, w.k, list(t.shape)) == (N, K, [K, N])
    assert np.array_equal(dequant_operands(w), dequantize(t.data, t.tensor_type))


@pytest.mark.parametrize("name", MAPPED)
def test_no_type_needs_a_zero_point_tensor(name):
    """Codes are stored shifted so that the op's default zero point is their centre."""
    assert nbits_operands(_raw(name), T[name]).zero_points is None


@pytest.mark.parametrize("name", MAPPED)
def test_looked_up_rows_are_gguf_bit_for_bit(name):
    """A table row (row_form: scale*q + the GGUF's own offset for affine types) is
    `gguf.quants.dequantize`'s value exactly, not up to rounding; so is a reordered subset."""
    raw = _raw(name)
    truth = dequantize(raw, T[name])
    w = nbits_operands(raw, T[name])
    assert np.array_equal(dequantize_rows(w), truth)
    order = [5, 0, 63, 5]
    assert np.array_equal(dequantize_rows(w.rows(order)), truth[order])


class _OneTensor:
    """A checkpoint holding one GGUF tensor as its exact operands (what Table reads)."""

    root = "memory"

    def __init__(self, w):
        self.w = w

    def shape(self, name):
        return (self.w.n, self.w.k)

    def nbits(self, name):
        return self.w

    def unmapped_low_bit(self):
        return {}


@pytest.mark.parametrize("standard", [False, True], ids=["contrib", "standard"])
@pytest.mark.parametrize("name", MAPPED)
def test_exported_table_lookup_is_gguf_bit_for_bit(name, standard, tmp_path):
    """The exporter's own table lookup (weight_format.Table: GatherBlockQuantized of the rows' codes
    plus the rows' offsets; dq_table.DqTable: DequantizeLinear of the gathered codes plus the same
    offsets), run in onnxruntime, gives gguf's dequantised rows exactly; nothing is re-quantised.
    The tied head (MatMul form, its correction a separate term) agrees to its int8 activations."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from dflash_edge.export.dq_table import embedding_table
    from dflash_edge.export.graph_builder import GraphBuilder
    from dflash_edge.export.weight_format import WeightFormat
    from dflash_edge.export.weight_store import WeightStore

    raw = _raw(name)
    truth = dequantize(raw, T[name])
    fmt = WeightFormat("int4", table_bits=4, standard=standard)
    g = GraphBuilder("target", WeightStore(tmp_path), fmt)
    table = embedding_table(g, _OneTensor(nbits_operands(raw, T[name])), "token_embd.weight")
    g.op("Identity", [table.gather("ids")], "Y")
    g.op("Identity", [table.head("X")], "Z")
    assert g.log.requantised == {} and table.layout.qtype == name
    graph = helper.make_graph(
        g.nodes,
        "lookup",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, truth.shape[1]]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, None),
        ],
        g.inits,
    )
    opsets = [
        helper.make_opsetid("", 21 if standard else 18),
        helper.make_opsetid("com.microsoft", 1),
    ]
    path = tmp_path / "lookup.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    ids = np.array([5, 0, 63, 5, 17], np.int64)
    x = np.random.default_rng(0).standard_normal((3, truth.shape[1])).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rows, logits = sess.run(None, {"ids": ids, "X": x})
    assert np.array_equal(rows, truth[ids])
    want = x.astype(np.float64) @ truth.T.astype(np.float64)
    # the head quantises its activations to int8 per block (accuracy level 4): ~0.5% here
    assert np.abs(logits - want).max() <= 2e-2 * np.abs(want).max()
    if standard:
        assert all(n.domain in ("", "ai.onnx") for n in g.nodes), "a contrib op in standard form"
