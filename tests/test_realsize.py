"""Issue 15 (tier 1): a published-layout export end to end, bundle hygiene, the shared embedding at
run time, the memory check, and the CUDA path's device-buffer logic with the CPU provider standing
in."""

import json

import onnx
import pytest

from dflash_edge.export.exporter import ExportOptions, export_bundle
from dflash_edge.runtime import Generator
from dflash_edge.runtime.bundle import MANIFEST, read_bundle

from published import reduced, write_target, write_zlab_drafter, zlab_config

PROMPTS = ([3, 17, 200, 5, 9, 120], [7] * 12, list(range(40, 70)))


@pytest.fixture(scope="module")
def published_bundle(tmp_path_factory):
    """Qwen3-8B's published layout (untied, bf16 shards) + a z-lab drafter without target_layer_ids,
    exported."""
    root = tmp_path_factory.mktemp("realsize")
    cfg = reduced("Qwen3-8B")
    write_target(root / "target", cfg, shards=3)
    tok_cfg = (
        root / "target" / "tokenizer_config.json"
    )  # the template as newer transformers saves it
    (root / "target" / "chat_template.jinja").write_text(
        json.loads(tok_cfg.read_text())["chat_template"]
    )
    tok_cfg.write_text(json.dumps({"model_max_length": 40960}))
    write_zlab_drafter(root / "draft", zlab_config(cfg, num_layers=2))
    out = export_bundle(
        ExportOptions(
            out=root / "bundle",
            target=str(root / "target"),
            draft=str(root / "draft"),
            block_size=8,
            max_context=128,
            prefill_chunk=8,
        ),
        progress=False,
    )
    return out


def test_bundle_holds_only_named_files_and_stores_the_embedding_once(published_bundle):
    m = read_bundle(published_bundle).manifest
    named = {f["path"] for g in m["graphs"].values() for f in g["files"]} | {
        m["tokenizer"]["file"],
        MANIFEST,
    }
    named |= {m["tokenizer"]["config"]}
    assert {p.name for p in published_bundle.iterdir()} == named
    shared = {t["key"]: t for t in m["shared_weights"]["tensors"]}
    assert set(shared) == {"embed_tokens", "lm_head"}  # untied: both borrowed by the drafter
    embed = shared["embed_tokens"]
    assert embed["shape"] == [256, 64] and embed["dtype"] == "float32"
    assert set(embed["names"]) == {
        "target",
        "target_fused",
        "drafter",
    }  # the fused flavour borrows it too
    for entry in shared.values():
        for graph, name in entry["names"].items():
            model = onnx.load(str(published_bundle / f"{graph}.onnx"), load_external_data=False)
            ref = {
                e.key: e.value
                for e in next(i for i in model.graph.initializer if i.name == name).external_data
            }
            assert ref["location"] == "shared.onnx.data" and int(ref["offset"]) == entry["offset"]
    blob = (published_bundle / "shared.onnx.data").read_bytes()[
        embed["offset"] : embed["offset"] + embed["length"]
    ]
    for graph in ("target", "drafter"):  # stored once: in neither graph's own data
        assert blob not in (published_bundle / f"{graph}.onnx.data").read_bytes()
    assert m["source"]["parity"]["drafter.draft_ids.agreement"] == 1.0
    assert (
        "{% for m in messages %}"
        in json.loads((published_bundle / "tokenizer_config.json").read_text())["chat_template"]
    )
    stages = {
        "load",
        "export_target",
        "export_target_fused",
        "export_drafter",
        "parity",
        "parity_onnxruntime",
        "reference",
    }  # parity: onnxruntime first, then the reference
    assert set(m["source"]["peak_rss_mb"]) == stages
    assert all(v > 0 for v in m["source"]["peak_rss_mb"].values())


def test_runtime_is_lossless_on_the_published_bundle_with_and_without_sharing(published_bundle):
    shared, separate = (
        Generator.load(published_bundle),
        Generator.load(published_bundle, share_weights=False),
    )
    assert shared.encode("t5 t6") == [1, 5, 6, 2, 3]  # chat template from chat_template.jinja
    for prompt in PROMPTS:
        plain = separate.generate_ids(
            prompt, max_new_tokens=24, draft="none", stop_token_ids=[]
        ).token_ids
        assert len(plain) == 24
        assert (
            shared.generate_ids(
                prompt, max_new_tokens=24, draft="drafter", stop_token_ids=[]
            ).token_ids
            == plain
        )
        assert (
            shared.generate_ids(
                prompt, max_new_tokens=24, draft="none", stop_token_ids=[]
            ).token_ids
            == plain
        )


def test_target_alone_decodes_the_same_and_refuses_drafting(published_bundle):
    """Generator.load(drafter=False) (what KV-cache calibration loads): the same plain tokens
    without the drafter's session, and a draft mode that needs it is refused by name."""
    from dflash_edge.runtime.validate import InvalidArgumentError

    alone, both = Generator.load(published_bundle, drafter=False), Generator.load(published_bundle)
    assert alone.drafter is None
    for prompt in PROMPTS[:2]:
        want = both.generate_ids(
            prompt, max_new_tokens=16, draft="none", stop_token_ids=[]
        ).token_ids
        assert (
            alone.generate_ids(prompt, max_new_tokens=16, draft="none", stop_token_ids=[]).token_ids
            == want
        )
    for draft in ("auto", "drafter", "lookup"):
        with pytest.raises(InvalidArgumentError, match="loaded without its drafter"):
            alone.generate_ids(PROMPTS[0], max_new_tokens=4, draft=draft)


def test_too_large_for_memory_is_refused_before_loading(tmp_path, monkeypatch):
    from dflash_edge.export import fits as memory
    from dflash_edge.export.fits import InsufficientMemoryError

    cfg = reduced("Qwen3-4B")
    write_target(tmp_path / "t", cfg, shards=2)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1000)
    monkeypatch.setattr(memory, "rss_bytes", lambda: 0)
    from dflash_edge.models.checkpoint import Checkpoint

    loads = []  # no weight is read before the check
    monkeypatch.setattr(Checkpoint, "array", lambda self, name, *a, **k: loads.append(name))
    monkeypatch.setattr(Checkpoint, "get", lambda self, name: loads.append(name))
    with pytest.raises(
        InsufficientMemoryError,
        match=r"exporting t \(fp32\) needs about 0.5 GB .* but 0.0 GB is "
        r"available.*--no-memory-check",
    ):
        export_bundle(
            ExportOptions(out=tmp_path / "b", target=str(tmp_path / "t"), draft="random"),
            progress=False,
        )
    assert not loads and not (tmp_path / "b").exists()


def test_interrupted_export_of_a_graph_leaves_nothing(tmp_path, monkeypatch):
    cfg = reduced("Qwen3-4B")
    write_target(tmp_path / "t", cfg, shards=2)
    write_zlab_drafter(tmp_path / "d", zlab_config(cfg, num_layers=1))

    def interrupt(*a, **k):  # the drafter, after both targets are written
        raise KeyboardInterrupt

    monkeypatch.setattr("dflash_edge.export.drafters.dflash.build", interrupt)
    with pytest.raises(KeyboardInterrupt):
        export_bundle(
            ExportOptions(
                out=tmp_path / "b",
                target=str(tmp_path / "t"),
                draft=str(tmp_path / "d"),
                block_size=4,
                max_context=64,
                prefill_chunk=8,
            ),
            progress=False,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "d",
        "t",
    ]  # no bundle, no partial or scratch folder


# ---------------------------------------------------------------- the CUDA path's buffers, CPU
# standing in
class _StandInBinding:
    """An IOBinding that takes the device-buffer path's "cuda" bindings and binds them as CPU
    memory."""

    def __init__(self, real):
        self.real, self.devices = real, set()

    def bind_input(self, name, device, device_id, dtype, shape, ptr):
        self.devices.add(device)
        self.real.bind_input(name, "cpu", 0, dtype, shape, ptr)

    def bind_output(self, name, device, device_id, dtype, shape, ptr):
        self.devices.add(device)
        self.real.bind_output(name, "cpu", 0, dtype, shape, ptr)


class _StandInRunner:
    """A graph runner whose buffers live on "cuda" as far as the loop and kv.py know (OrtValues in
    CPU memory)."""

    def __init__(self, real):
        self.real, self.device, self.device_id, self.bindings = real, "cuda", 0, []

    def binding(self):
        self.bindings.append(_StandInBinding(self.real.binding()))
        return self.bindings[-1]

    def run(self, binding) -> None:
        self.real.run(binding.real)

    def __getattr__(self, name):  # timing counters (run_s, calls) are the real runner's
        return getattr(self.real, name)


def test_device_buffer_path_is_lossless_with_cpu_standing_in(published_bundle, monkeypatch):
    import onnxruntime as ort

    from dflash_edge.runtime import loading

    reference = Generator.load(published_bundle)
    make = ort.OrtValue.ortvalue_from_shape_and_type.__func__
    monkeypatch.setattr(
        ort.OrtValue,
        "ortvalue_from_shape_and_type",
        classmethod(
            lambda cls, shape, dtype, device="cpu", device_id=0: make(cls, shape, dtype, "cpu", 0)
        ),
    )
    real_open = loading.open_graph
    monkeypatch.setattr(loading, "open_graph", lambda *a, **k: _StandInRunner(real_open(*a, **k)))
    device = Generator.load(published_bundle)
    for buf in (device.target.kv.key, device.target.hidden, device.drafter.kv.value):
        assert buf.array is None and buf.device == "cuda"  # onnxruntime-owned, bound by pointer
    for prompt in PROMPTS:
        for use in ("drafter", "none"):
            want = reference.generate_ids(
                prompt, max_new_tokens=24, draft=use, stop_token_ids=[]
            ).token_ids
            assert (
                device.generate_ids(
                    prompt, max_new_tokens=24, draft=use, stop_token_ids=[]
                ).token_ids
                == want
            )
    seen = {
        d
        for r in (device.target.runner, device.drafter.runner)
        for b in r.bindings
        for d in b.devices
    }
    assert seen == {"cuda", "cpu"}  # KV/hidden on the device, step I/O on the host
