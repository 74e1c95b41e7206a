"""The exporter's low-bit writer (issue 27): weights written as MatMulNBits blocks as they are read,
a GGUF's own blocks exactly, float weights re-quantised; parity at the bundle's own precision;
decoding stays lossless. Tier 1, tiny models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dflash_edge.export.exporter import ExportOptions, export_bundle
from dflash_edge.runtime.bundle import read_bundle

gguf = pytest.importorskip("gguf")
from tiny_gguf import write_tiny_gguf  # noqa: E402

# one GGUF type per kind of matmul: every exactly mapped type gguf can quantise in numpy, 4- and
# 8-bit
TYPES = {
    "attn_q.weight": "Q4_1",
    "attn_k.weight": "Q4_0",
    "attn_v.weight": "Q5_0",
    "attn_output.weight": "Q5_1",
    "ffn_gate.weight": "Q8_0",
    "ffn_up.weight": "Q4_1",
    "ffn_down.weight": "Q4_0",
}
PROMPT = [5, 17, 42, 8, 61, 33, 9, 12]


@pytest.fixture(scope="module")
def gguf_ckpt(tmp_path_factory):
    from dflash_edge.models.gguf_import import import_gguf

    root = tmp_path_factory.mktemp("lowbit")
    write_tiny_gguf(root / "tiny.gguf", "llama", types=TYPES)
    return import_gguf(root / "tiny.gguf", root / "ckpt")


def _export(ckpt, out, **kw):
    kw.setdefault("kv_cache", "fp32")  # these tests are about the weights
    opts = ExportOptions(
        out=out,
        target=str(ckpt),
        draft="random",
        block_size=4,
        max_context=128,
        prefill_chunk=8,
        **kw,
    )
    return export_bundle(opts, progress=False)


def _logits(bundle, ids):
    from dflash_edge.export import parity

    m = read_bundle(bundle).manifest
    d = m["model"]
    empty = np.zeros((0, d["num_layers"], d["num_kv_heads"], d["head_dim"]), np.float32)
    sess = parity._session(bundle / "target.onnx")  # with the accuracy level the graph asks for
    feeds = {
        "input_ids": np.array([ids], np.int64),
        "logits_from": np.array([0], np.int64),
        "start": np.array([0], np.int64),
        "past_key": empty,
        "past_value": empty,
    }
    return sess.run(["logits"], feeds)[0]


def test_gguf_blocks_are_written_exactly(gguf_ckpt, tmp_path):
    """Each mapped type keeps its own codes: the int4 graph computes what the fp32 graph of the
    dequantised weights computes (accuracy level 0: fp32 activations), every weight counted by its
    source type."""
    fp32 = _export(gguf_ckpt, tmp_path / "fp32", precision="fp32")
    low = _export(gguf_ckpt, tmp_path / "int4", precision="int4", accuracy_level=0)
    graphs = read_bundle(low).manifest["graphs"]
    layers = 2
    want = {
        "Q4_1": 2 * layers,
        "Q4_0": 2 * layers,
        "Q5_0": layers,
        "Q5_1": layers,
        "Q8_0": layers + 1,
    }  # + table
    assert set(graphs) == {"target", "drafter"}  # head_dim 8: no fused flavour
    for name in ("target",):
        assert graphs[name]["precision"] == "int4"
        assert graphs[name]["quantization"]["weights_by_source"] == want, name
        assert graphs[name]["quantization"]["requantised_low_bit"] == {}
    a, b = _logits(fp32, PROMPT), _logits(low, PROMPT)
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    assert (a.argmax(-1) == b.argmax(-1)).all()


def test_gguf_int4_bundle_decodes_the_reference_tokens_and_stays_lossless(gguf_ckpt, tmp_path):
    """With fp32 activations (accuracy level 0) the exact int4 bundle's greedy tokens are the torch
    reference's on the GGUF's weights; at the default level 4 (int8 activations, rows independent of
    the step's length) drafting changes no token of its own plain decoding."""
    from dflash_edge.models import load_target
    from dflash_edge.models.reference_loop import GenerationConfig, target_generate
    from dflash_edge.runtime import Generator

    exact = Generator.load(
        _export(gguf_ckpt, tmp_path / "level0", precision="int4", accuracy_level=0)
    )
    ref = target_generate(
        load_target(gguf_ckpt), PROMPT, GenerationConfig(max_new_tokens=24)
    ).token_ids
    assert exact.generate_ids(PROMPT, 24, draft="none").token_ids == ref
    # (this fixture's N(0, 1) weights put its activations far outside a real model's range: int8
    # rounding moves
    # its logits by more than parity's level-4 bounds, so parity is left to the test above and the
    # others)
    gen = Generator.load(_export(gguf_ckpt, tmp_path / "level4", precision="int4", verify=False))
    plain = gen.generate_ids(PROMPT, 24, draft="none").token_ids
    assert gen.generate_ids(PROMPT, 24, draft="drafter").token_ids == plain


def test_unmapped_low_bit_type_is_requantised_with_a_named_warning(gguf_ckpt, tmp_path, capsys):
    import shutil

    from safetensors import safe_open

    from dflash_edge.models.gguf_import import BLOCKS_FILE, write_blocks
    from dflash_edge.models.nbits import NBitsWeight

    ckpt = tmp_path / "ckpt"
    shutil.copytree(gguf_ckpt, ckpt)
    with safe_open(
        str(ckpt / BLOCKS_FILE), framework="numpy"
    ) as f:  # pretend ffn_down was an IQ type
        meta = f.metadata()
        names = [n for n in meta if n != "unmapped" and "down_proj" not in n]
        exact = {
            n: NBitsWeight.from_arrays(
                meta[n],
                {k.split("/")[1]: f.get_tensor(k) for k in f.keys() if k.split("/")[0] == n},
            )
            for n in names
        }
    down = {f"model.layers.{i}.mlp.down_proj.weight": "IQ4_XS" for i in range(2)}
    write_blocks(ckpt / BLOCKS_FILE, exact, down)
    out = _export(ckpt, tmp_path / "b", precision="int4", accuracy_level=0)
    err = capsys.readouterr().err
    assert (
        "model.layers.0.mlp.down_proj.weight is GGUF IQ4_XS, which has no exact MatMulNBits form"
        in err
    )
    q = read_bundle(out).manifest["graphs"]["target"]["quantization"]
    assert q["requantised_low_bit"] == down and q["weights_by_source"]["rtn"] == 2


@pytest.mark.parametrize(
    "precision, ops", [("int8", "standard"), ("int4", "standard"), ("int4", "contrib")]
)
def test_float_checkpoint_is_written_low_bit_and_stays_lossless(
    tiny_checkpoints, tmp_path, precision, ops
):
    """A float checkpoint re-quantised as it is read; parity runs against the reference on the
    stored weights (so it holds at fp32 bounds), and drafting changes no token of the bundle's own
    greedy decoding; in standard ops (the default) no graph holds MatMulNBits itself."""
    from dflash_edge.runtime import Generator

    out = _export(
        tiny_checkpoints["qwen3"][1],
        tmp_path / precision,
        precision=precision,
        draft_precision=precision,
        low_bit_ops=ops,
    )
    m = read_bundle(out).manifest
    assert {n: g["precision"] for n, g in m["graphs"].items()} == {
        "target": precision,
        "target_fused": precision,
        "drafter": precision,
    }
    assert m["graphs"]["target"]["quantization"]["weights_by_source"]["rtn"] > 0
    parity = m["source"]["parity"]  # int8 activations: most argmaxes agree with fp32 arithmetic
    assert (
        parity["target.next_ids.agreement"] >= 0.85
        and parity["target_fused.next_ids.agreement"] >= 0.85
    )
    gen = Generator.load(out)
    plain = gen.generate_ids(PROMPT, 32, draft="none").token_ids
    assert gen.generate_ids(PROMPT, 32, draft="drafter").token_ids == plain
    raw = json.loads((out / "manifest.json").read_text())
    fused = (out / "target_fused.onnx").read_bytes().decode("latin-1")
    assert ("MatMulNBits" in fused) == (ops == "contrib")
    import onnx

    for name in raw["graphs"]:  # valid ONNX: the contrib ops' domain is imported
        onnx.checker.check_model(str(out / f"{name}.onnx"))
        assert raw["graphs"][name]["quantization"]["settings"]["low_bit_ops"] == ops
    assert raw["graphs"]["drafter"]["quantization"]["settings"]["block_size"] == 32


def test_writer_refuses_a_precision_it_does_not_write(tiny_checkpoints, tmp_path):
    from dflash_edge.runtime.errors import DflashEdgeError

    with pytest.raises(
        DflashEdgeError, match="--precision 'bf16': the exporter writes fp32, fp16, int8, int4"
    ):
        _export(tiny_checkpoints["qwen3"][1], tmp_path / "b", precision="bf16")
    with pytest.raises(DflashEdgeError, match="an fp16 bundle is fp16 throughout"):
        _export(
            tiny_checkpoints["qwen3"][1], tmp_path / "b", precision="fp16", draft_precision="fp32"
        )


def test_fp16_writer_is_lossless_and_names_an_overflowing_layer(tmp_path):
    """fp16 written straight from the checkpoint decodes losslessly; a layer whose activations pass
    float16's range stops the export at parity, naming that layer's weight and the remedy."""
    import shutil
    import sys

    from safetensors.numpy import load_file, save_file

    from dflash_edge.export.parity import ParityError
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.errors import DflashEdgeError

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from tiny import add_tiny_tokenizer, hf_model, save_hf

    ckpt = save_hf(hf_model("qwen3"), tmp_path / "ckpt")
    add_tiny_tokenizer(ckpt)
    out = _export(ckpt, tmp_path / "fp16", precision="fp16", draft_precision="fp16")
    assert {g["precision"] for g in read_bundle(out).manifest["graphs"].values()} == {"fp16"}
    gen = Generator.load(out)
    assert (
        gen.generate_ids(PROMPT, 24, draft="drafter").token_ids
        == gen.generate_ids(PROMPT, 24, draft="none").token_ids
    )
    hot = tmp_path / "hot"
    shutil.copytree(ckpt, hot)
    weights = load_file(str(hot / "model.safetensors"))
    down = "model.layers.2.mlp.down_proj.weight"
    weights[down] *= 6e4 / np.abs(weights[down]).max()  # fits fp16; layer 2's MLP output does not
    weights["model.layers.2.mlp.up_proj.weight"] *= 100.0
    save_file(weights, str(hot / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        ParityError,
        match=r"overflows: inf/NaN first at node .*model\.layers\.2\.mlp\.down_proj.*"
        r"export with --precision fp32",
    ):
        _export(hot, tmp_path / "hot16", precision="fp16", draft_precision="fp16")
    assert _export(hot, tmp_path / "hot32")  # fp32 holds it
    weights[down] *= 10.0
    save_file(weights, str(hot / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        DflashEdgeError,
        match=r"weight model\.layers\.2\.mlp\.down_proj\.weight\.T holds 6e\+05, "
        r"beyond float16's range",
    ):
        _export(hot, tmp_path / "hot16b", precision="fp16", draft_precision="fp16")


@pytest.mark.parametrize(
    "table, head", [("Q4_1", None), ("Q5_0", None), ("Q5_1", "Q4_1"), ("Q4_0", "Q5_1")]
)
def test_gguf_table_and_head_are_exact_for_affine_and_5_bit_types(table, head, tmp_path):
    """The embedding table keeps the GGUF's blocks whatever their type (zero points and offsets
    included: issue 36 item 3), read from the file in place, and so does an untied head: nothing
    re-quantised, and the int4 graph computes what the fp32 graph of the dequantised file does."""
    types = {**TYPES, "token_embd.weight": table}
    if head:
        types["output.weight"] = head
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, "llama", untied=head is not None, types=types)
    fp32 = _export(path, tmp_path / "fp32", precision="fp32")
    low = _export(path, tmp_path / "int4", precision="int4", accuracy_level=0)
    q = read_bundle(low).manifest["graphs"]["target"]["quantization"]
    assert q["requantised_low_bit"] == {} and "rtn" not in q["weights_by_source"]
    assert q["weights_by_source"][table] >= 1 and (head is None or head in q["weights_by_source"])
    a, b = _logits(fp32, PROMPT), _logits(low, PROMPT)
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    assert (a.argmax(-1) == b.argmax(-1)).all()
