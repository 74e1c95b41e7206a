"""`export --stream`: graphs written node by node from the checkpoint match the torch-export path (tier 1, tiny models)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dflash_edge.export.exporter import ExportOptions, export_bundle
from dflash_edge.models import load_target
from dflash_edge.models.reference_loop import GenerationConfig, target_generate
from dflash_edge.runtime import Generator
from dflash_edge.runtime.bundle import read_bundle

from test_export import _drafter_dir


def _both(tmp_path, ckpt, block, **kw):
    draft = _drafter_dir(tmp_path, ckpt)
    outs = {}
    for stream in (False, True):
        opts = ExportOptions(out=tmp_path / f"b{int(stream)}", target=ckpt, draft=str(draft), block_size=block,
                             max_context=256, prefill_chunk=16, stream=stream, **kw)
        outs[stream] = export_bundle(opts, progress=False)
    return outs[False], outs[True]


def _io(path):
    m = onnx.load(str(path), load_external_data=False)
    return [(v.name, v.type.tensor_type.elem_type) for v in (*m.graph.input, *m.graph.output)]


def _run(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


@pytest.mark.parametrize("variant,block", [("qwen3", 4), ("llama", 8), ("qwen2", 16), ("llama-untied-llama3rope", 4)])
def test_streamed_bundle_matches_the_torch_export(tiny_checkpoints, tmp_path, variant, block):
    ckpt = tiny_checkpoints[variant][1]
    torch_out, stream_out = _both(tmp_path, ckpt, block)
    m, ms = read_bundle(torch_out).manifest, read_bundle(stream_out).manifest      # every sha256 checked
    assert ms["source"]["writer"] == "stream" and ms["source"]["parity"]["target.next_ids.agreement"] == 1.0
    assert ms["source"]["parity"]["drafter.draft_ids.agreement"] == 1.0
    assert set(ms["graphs"]) == set(m["graphs"]) and ms["model"] == m["model"]
    for name, graph in ms["graphs"].items():
        onnx.checker.check_model(str(stream_out / graph["files"][0]["path"]))
        assert _io(stream_out / f"{name}.onnx") == _io(torch_out / f"{name}.onnx")
        assert graph["io"] == m["graphs"][name]["io"]
    d = ms["model"]
    rng = np.random.default_rng(0)
    past = rng.standard_normal((3, d["num_layers"], d["num_kv_heads"], d["head_dim"])).astype(np.float32)
    feeds = {"input_ids": rng.integers(0, d["vocab_size"], (1, block)), "start": np.array([3]),
             "past_key": past, "past_value": past * 0.5}
    a, b = _run(torch_out / "target.onnx", feeds), _run(stream_out / "target.onnx", feeds)
    assert np.abs(a["logits"] - b["logits"]).max() <= 1e-4 and (a["next_ids"] == b["next_ids"]).all()
    assert np.abs(a["new_key"] - b["new_key"]).max() <= 1e-4 and np.abs(a["hidden"] - b["hidden"]).max() <= 1e-3


def test_streamed_bundle_generates_losslessly(tiny_checkpoints, tmp_path):
    ckpt = tiny_checkpoints["qwen3"][1]
    _, out = _both(tmp_path, ckpt, 8)
    prompt = [3, 17, 42, 8, 5, 61]
    ref = target_generate(load_target(ckpt), prompt, GenerationConfig(max_new_tokens=24)).token_ids
    for use_draft in (False, True):
        got = Generator.load(out).generate_ids(prompt, max_new_tokens=24, use_draft=use_draft).token_ids
        assert got == ref


def test_streamed_export_refuses_a_misshaped_tensor(tiny_checkpoints, tmp_path):
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
        export_bundle(ExportOptions(out=tmp_path / "b", target=ckpt, draft=str(draft), max_context=256,
                                    stream=True), progress=False)
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.partial*"))
