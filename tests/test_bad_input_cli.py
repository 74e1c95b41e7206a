"""Bad input to `dflash-edge export`, named in one line and nothing left on disk (issue 36 item 6).

Each case runs the CLI in-process: exit status 2, exactly one `error:` line (the last one, no
traceback) naming the problem and the fix, and no bundle, staging folder or cached file left
behind. The GGUF-level refusals themselves are tested in test_gguf_stream / test_fuzz_readers /
test_locate; these are the same inputs through the command a user types."""

from __future__ import annotations

from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
from tiny_gguf import write_tiny_gguf  # noqa: E402


@pytest.fixture
def env(tmp_path, monkeypatch):
    """An empty, offline Hugging Face cache and a private DFLASH_EDGE_HOME under tmp_path/env."""
    root = tmp_path / "env"
    (root / "hf-cache").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DFLASH_EDGE_HOME", str(root / "home"))
    return tmp_path


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}


def _export_fails(env: Path, target: str, capsys) -> str:
    """Run `export --target TARGET`; assert exit 2, one error line, nothing new on disk; return
    the error line."""
    from dflash_edge.cli import main

    before, out = _files(env), env / "work" / "bundle"
    out.parent.mkdir(exist_ok=True)
    argv = ["export", "--target", target, "--draft", "random", "--out", str(out)]
    assert main([*argv, "--max-context", "64", "--block-size", "4"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and errors[0] == lines[-1], err
    assert "Traceback" not in err
    assert not out.exists() and not list(out.parent.iterdir())  # no bundle, no staging folder
    assert _files(env) == before  # nothing cached, nothing half-written anywhere
    return errors[0]


@pytest.mark.parametrize("model", ["bert", "t5"])
def test_gguf_with_an_unsupported_tokenizer(env, capsys, model):
    path = env / f"{model}.gguf"
    write_tiny_gguf(path, tokenizer_model=model)
    line = _export_fails(env, str(path), capsys)
    assert f"tokenizer.ggml.model {model!r} is not supported" in line and str(path) in line


def test_gguf_of_an_unsupported_architecture(env, capsys):
    path = env / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    line = _export_fails(env, str(path), capsys)
    assert "general.architecture 'mamba' is not supported" in line


@pytest.mark.parametrize("keep", [0.3, 0.97])
def test_truncated_gguf(env, capsys, keep):
    """Cut in the metadata or in the tensor data: both named, with the fix (re-download)."""
    whole = env / "whole.gguf"
    write_tiny_gguf(whole)
    data = whole.read_bytes()
    whole.unlink()
    path = env / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    line = _export_fails(env, str(path), capsys)
    assert str(path) in line and "re-download" in line, line


def test_hub_id_without_a_cached_snapshot_offline(env, capsys):
    line = _export_fails(env, "org/absent", capsys)
    assert "no snapshot of org/absent" in line and "HF_HUB_OFFLINE" in line
    assert "hf download org/absent" in line


def test_gated_repository_without_a_token(env, capsys, monkeypatch):
    """Online, the hub refuses: huggingface_hub's GatedRepoError from its download call."""
    import httpx2
    import huggingface_hub
    from huggingface_hub import errors

    url = "https://huggingface.co/api/models/org/gated/revision/main"

    def refuse(*args, **kwargs):
        response = httpx2.Response(401, request=httpx2.Request("GET", url))
        raise errors.GatedRepoError(
            f"401 Client Error. Cannot access repo {url}.", response=response
        )

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    line = _export_fails(env, "org/gated", capsys)
    assert "gated" in line and "HF_TOKEN" in line and "hf auth login" in line
