"""Models named as users name them (models/locate.py): folders, `.gguf` files and hub ids.

No model hub is reachable here. Every hub test runs offline (`HF_HUB_OFFLINE=1`) against a
Hugging Face cache built in tmp_path exactly as huggingface_hub lays one out
(`models--org--name/{blobs,refs/main,snapshots/<commit>/...}`, snapshot files symlinked into
`blobs/`); the one online case (a gated repo) replaces huggingface_hub's download function with
one that raises its real `GatedRepoError`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_edge.models import fetch, locate
from dflash_edge.models.checkpoint import Checkpoint
from dflash_edge.runtime.errors import ModelFormatError

from tiny import add_tiny_tokenizer, hf_model

COMMIT = "3f2a9c0d1e4b5a6978877665544332211ffeeddc"
OTHER_COMMIT = "0" * 39 + "1"


def add_to_cache(cache: Path, repo: str, files: dict, commit: str = COMMIT) -> Path:
    """Lay `files` (name -> bytes) out as huggingface_hub caches repo `repo` at `commit` (refs/main
    -> commit, snapshot entries are relative symlinks into blobs/); return the snapshot folder."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs" / "main").write_text(commit)  # huggingface_hub writes no newline
    return snapshot


def folder_files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """A tiny qwen3 checkpoint (one safetensors file, and the same split into shards) and a random
    drafter for it, as plain folders."""
    from dflash_edge.models import load_target
    from dflash_edge.models.drafter import DraftConfig, new_drafter, save_drafter

    root = tmp_path_factory.mktemp("tiny-hub")
    model = hf_model("qwen3")
    dirs = {"target": root / "target", "sharded": root / "sharded"}
    model.save_pretrained(dirs["target"], safe_serialization=True)
    model.save_pretrained(dirs["sharded"], safe_serialization=True, max_shard_size="40KB")
    for d in dirs.values():
        add_tiny_tokenizer(d)
    assert (dirs["sharded"] / "model.safetensors.index.json").is_file()
    cfg = DraftConfig.for_target(
        load_target(dirs["target"]).config, num_layers=1, block_size=4, mask_token_id=5
    )
    dirs["draft"] = save_drafter(new_drafter(cfg, seed=1), root / "draft")
    return dirs


@pytest.fixture
def cache(tmp_path, monkeypatch, tiny_dirs) -> Path:
    """An offline Hugging Face cache holding org/tiny (main and COMMIT) and org/tiny-dflash."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("DFLASH_EDGE_HOME", str(tmp_path / "home"))
    add_to_cache(cache, "org/tiny", folder_files(tiny_dirs["target"]))
    add_to_cache(cache, "org/tiny-dflash", folder_files(tiny_dirs["draft"]))
    return cache


def snapshot_of(cache: Path, repo: str, commit: str = COMMIT) -> Path:
    return cache / ("models--" + repo.replace("/", "--")) / "snapshots" / commit


@pytest.mark.parametrize("spec", ["org/tiny", f"org/tiny@{COMMIT}", "org/tiny@main"])
def test_hub_ids_resolve_from_the_cache_offline(cache, spec):
    want = snapshot_of(cache, "org/tiny")
    assert locate.locate(spec, "target") == want
    assert fetch.resolve_target(spec) == want
    assert (want / "model.safetensors").is_symlink()  # the cache's own layout, not a copy


def test_export_from_hub_ids(cache, tmp_path, capsys):
    """`dflash-edge export --target org/name --draft org/name` reads both from the cache."""
    from dflash_edge.cli import main

    out = tmp_path / "bundle"
    args = ["export", "--target", "org/tiny", "--draft", "org/tiny-dflash", "--out", str(out)]
    sizes = ["--block-size", "4", "--max-context", "256", "--prefill-chunk", "16"]
    assert main(args + sizes) == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    recorded = manifest["source"]["export_options"]
    assert recorded["target"] == "org/tiny" and recorded["draft"] == "org/tiny-dflash"
    assert manifest["source"]["parity"]["target.next_ids.agreement"] == 1.0


def test_shards_linked_into_blobs_are_accepted(cache, tiny_dirs):
    """checkpoint.py's rule for HF snapshots: index-listed shards may resolve into the repo's
    blobs/ (the symlinks huggingface_hub makes), no further."""
    add_to_cache(cache, "org/sharded", folder_files(tiny_dirs["sharded"]))
    snapshot = locate.locate("org/sharded", "target")
    want = Checkpoint.open(tiny_dirs["sharded"]).names()
    assert Checkpoint.open(snapshot).names() == want and len(want) > 0

    outside = cache.parent / "elsewhere"
    outside.mkdir()
    shard = next(snapshot.glob("model-*.safetensors"))
    (outside / shard.name).write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(outside / shard.name)  # leads out of the repo's folder: refused
    with pytest.raises(ModelFormatError):
        Checkpoint.open(snapshot)


@pytest.mark.parametrize(
    "spec", ["org/na me", "org/name@", "org/name:", "-org/name", "org/a--b", "org/name@a@b"]
)
def test_malformed_hub_id_is_named(cache, spec):
    with pytest.raises(ModelFormatError, match="is not a hub id") as err:
        fetch.resolve_target(spec)
    assert "org/name@REVISION" in str(err.value) and "\n" not in str(err.value)


def test_no_snapshot_while_offline_says_where_and_how(cache):
    with pytest.raises(ModelFormatError) as err:
        fetch.resolve_target("org/absent")
    msg = str(err.value)
    assert "no snapshot of org/absent" in msg and str(cache) in msg and "\n" not in msg
    assert "hf download org/absent" in msg and "HF_HUB_OFFLINE" in msg


def test_revision_not_in_cache_lists_cached_ones(cache):
    with pytest.raises(ModelFormatError) as err:
        fetch.resolve_target(f"org/tiny@{OTHER_COMMIT}")
    msg = str(err.value)
    assert f"revision '{OTHER_COMMIT}'" in msg and "main" in msg and COMMIT in msg
    assert f"--revision {OTHER_COMMIT}" in msg and "\n" not in msg
    with pytest.raises(ModelFormatError, match="revision 'v2' of org/tiny is not in"):
        fetch.resolve_target("org/tiny@v2")


def _hub_error(cls, status: int):
    import httpx2

    url = "https://huggingface.co/api/models/org/secret/revision/main"
    response = httpx2.Response(status, request=httpx2.Request("GET", url))
    return cls(f"{status} Client Error. Cannot access repo {url}.", response=response)


@pytest.mark.parametrize(
    "name,status,words",
    [
        ("GatedRepoError", 401, ("gated", "HF_TOKEN", "hf auth login")),
        ("RepositoryNotFoundError", 404, ("no repo org/secret", "HF_TOKEN", "hf auth login")),
    ],
)
def test_gated_or_private_repo_without_token(cache, monkeypatch, name, status, words):
    """Online, the hub refuses: huggingface_hub's own error becomes ours, naming the token."""
    import huggingface_hub
    from huggingface_hub import errors

    def refuse(*args, **kwargs):
        raise _hub_error(getattr(errors, name), status)

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(ModelFormatError) as err:
        fetch.resolve_target("org/secret")
    msg = str(err.value)
    assert all(w in msg for w in words) and "\n" not in msg, msg


def test_online_download_asks_only_for_what_export_reads(cache, monkeypatch):
    import huggingface_hub

    calls = []

    def download(repo, **kwargs):
        calls.append((repo, kwargs))
        return str(snapshot_of(cache, "org/tiny"))

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    assert fetch.resolve_target("org/tiny@v1") == snapshot_of(cache, "org/tiny")
    ((repo, kw),) = calls
    assert repo == "org/tiny" and kw["revision"] == "v1" and kw["local_files_only"] is False
    assert kw["cache_dir"] == cache and kw["ignore_patterns"] == ["*/*"]
    assert {"config.json", "tokenizer.json", "*.safetensors"} <= set(kw["allow_patterns"])
    assert not any(p.endswith((".bin", ".gguf", ".onnx", ".pt")) for p in kw["allow_patterns"])


# ------------------------------------------------------------------------------------ GGUF


gguf = pytest.importorskip("gguf")
from tiny_gguf import write_tiny_gguf  # noqa: E402


def test_gguf_path_is_imported_once(cache, tmp_path, monkeypatch):
    path = tmp_path / "tiny-llama.gguf"
    write_tiny_gguf(path)
    first = fetch.resolve_target(str(path))
    assert first == tmp_path / "home" / "models" / "tiny-llama"
    assert json.loads((first / "config.json").read_text())["model_type"] == "llama"

    def no_import(*args, **kwargs):
        raise AssertionError("imported again")

    monkeypatch.setattr(locate, "import_gguf", no_import)
    assert fetch.resolve_target(str(path)) == first  # same size and mtime
    os.utime(path, ns=(0, 0))
    assert fetch.resolve_target(str(path)) == first  # touched, same bytes: by sha256
    assert json.loads((first / "SOURCE.json").read_text())["gguf_mtime_ns"] == 0
    copy = tmp_path / "elsewhere" / path.name
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    assert fetch.resolve_target(str(copy)) == first  # a copy of the same bytes

    monkeypatch.undo()
    monkeypatch.setenv("DFLASH_EDGE_HOME", str(tmp_path / "home"))
    write_tiny_gguf(path, "qwen3")  # another model under the same file name
    second = fetch.resolve_target(str(path))
    assert second != first and second.name.startswith("tiny-llama-")
    assert json.loads((second / "config.json").read_text())["model_type"] == "qwen3"
    assert json.loads((first / "config.json").read_text())["model_type"] == "llama"


def test_gguf_repo_by_quant_tag(cache, tmp_path):
    path = tmp_path / "x.gguf"
    write_tiny_gguf(path)
    files = {"tiny-Q8_0.gguf": path.read_bytes(), "README.md": b"tiny"}
    add_to_cache(cache, "org/tiny-GGUF", files)
    ckpt = fetch.resolve_target("org/tiny-GGUF:Q8_0")
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "llama"
    assert json.loads((ckpt / "SOURCE.json").read_text())["gguf_file"] == "tiny-Q8_0.gguf"
    assert fetch.resolve_target("org/tiny-GGUF:q8_0@main") == ckpt
    with pytest.raises(ModelFormatError, match=r"no \.gguf file matches quantisation 'Q4_K'"):
        fetch.resolve_target("org/tiny-GGUF:Q4_K")
    with pytest.raises(ModelFormatError, match="no config.json .* org/tiny-GGUF:Q4_K_M"):
        fetch.resolve_target("org/tiny-GGUF")


def test_pick_gguf_takes_whole_tags_only():
    hub = locate.HubId("org/m-GGUF", quant="Q4_K")
    names = ["m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "m-Q4_K.gguf", "mmproj-m-Q4_K.gguf"]
    assert locate.pick_gguf(names, hub) == "m-Q4_K.gguf"
    with pytest.raises(ModelFormatError, match="several files match"):
        locate.pick_gguf(["a-Q8_0.gguf", "b-Q8_0.gguf"], locate.HubId("o/m", quant="Q8_0"))
    split = ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"]
    with pytest.raises(ModelFormatError, match="llama-gguf-split --merge"):
        locate.pick_gguf(split, locate.HubId("o/m", quant="Q8_0"))


def test_unsupported_gguf_target_is_one_line_and_writes_nothing(cache, tmp_path, capsys):
    from dflash_edge.cli import main

    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "bundle"
    assert main(["export", "--target", str(path), "--draft", "random", "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()  # "importing ..." then the error
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and errors[0] == lines[-1] and "'mamba' is not supported" in errors[0]
    assert not out.exists() and not list((tmp_path / "home" / "models").glob("*"))


def test_drafter_must_be_a_folder(cache, tmp_path):
    from dflash_edge.models.locate import drafter_folder

    assert drafter_folder("org/tiny-dflash") == snapshot_of(cache, "org/tiny-dflash")
    path = tmp_path / "d.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(ModelFormatError, match="a DFlash drafter is a folder"):
        drafter_folder(str(path))
    with pytest.raises(ModelFormatError, match="no such folder"):
        drafter_folder(str(tmp_path / "nowhere"))


def test_quantize_and_devices_plan_take_hub_ids(cache):
    from dflash_edge.cli import main
    from dflash_edge.quantize.bundle_quant import _available

    assert _available("org/tiny@main") and _available("org/m-GGUF:Q4_K_M@v1")
    assert not _available("/no/such/folder")
    plan = ["devices", "plan", "--target", "org/tiny", "--draft", "org/tiny-dflash"]
    assert main(plan + ["--device", "rtx-4090-24gb", "--context", "256", "--json"]) == 0


def test_online_gguf_repo_downloads_the_one_file(cache, tmp_path, monkeypatch):
    import huggingface_hub

    path = tmp_path / "x.gguf"
    write_tiny_gguf(path)
    snapshot = add_to_cache(cache, "org/m-GGUF", {"m-Q8_0.gguf": path.read_bytes()})
    calls = []

    def download(repo, filename, **kwargs):
        calls.append((repo, filename, kwargs))
        return str(snapshot / filename)

    names = ["README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-m-Q8_0.gguf"]
    monkeypatch.delenv("HF_HUB_OFFLINE")
    info = SimpleNamespace(siblings=[SimpleNamespace(rfilename=n) for n in names])
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, *a, **k: info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    ckpt = fetch.resolve_target("org/m-GGUF:Q8_0@v1")
    assert json.loads((ckpt / "SOURCE.json").read_text())["gguf_file"] == "m-Q8_0.gguf"
    ((repo, filename, kw),) = calls
    assert (repo, filename, kw["revision"], kw["local_files_only"]) == (
        "org/m-GGUF",
        "m-Q8_0.gguf",
        "v1",
        False,
    )
