"""Models named as users name them: a folder, a `.gguf` file, or a Hugging Face hub id.

Hub ids (resolved through huggingface_hub, imported only when one is named):

    org/name                a checkpoint repo (config.json, tokenizer, *.safetensors)
    org/name@REVISION       at a branch, tag or commit (default: main)
    org/name:QUANT          a repo of GGUF files: the one `.gguf` whose name carries QUANT
    org/name:QUANT@REVISION (llama.cpp's `-hf` spelling: `Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M`)

The hub's own settings apply: its cache (`HF_HUB_CACHE`, `HF_HOME`), `HF_HUB_OFFLINE`, its token
(`HF_TOKEN`, `hf auth login`). Online, only the files the exporter reads are downloaded
(`SNAPSHOT_FILES`, or the one GGUF), with the hub's progress bars; offline or without a network,
the cache alone answers. An existing path always wins over a hub id of the same spelling.

A `.gguf` file becomes a checkpoint folder through the GGUF import (`checkpoint_for`), once per
file.

    >>> locate("Qwen/Qwen2.5-0.5B-Instruct@main", "target")   # doctest: +SKIP
    PosixPath('/home/me/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B-Instruct/snapshots/7ae5...')
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..runtime.errors import ModelFormatError
from .gguf_import import import_gguf, sha256_file

# What export, generate and train read from a checkpoint repo (top level only: `ignore_patterns`
# keeps out sub-folders such as onnx/ or original/).
SNAPSHOT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "draft_vocab.json",  # a drafter's ranked draft vocabulary (models/draft_vocab.py)
)
SUB_FOLDERS = ["*/*"]
HUB_SYNTAX = "org/name, org/name@REVISION or, for a repo of GGUF files, org/name:QUANT[@REVISION]"
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?"  # huggingface_hub's repo-id rules, roughly
_HUB_ID = re.compile(
    rf"^(?P<repo>{_PART}/{_PART})(?::(?P<quant>[A-Za-z0-9_.-]+))?(?:@(?P<revision>[\w./-]+))?$"
)
_SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.I)
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubId:
    repo: str  # org/name
    revision: str | None = None  # branch, tag or commit; None: main
    quant: str | None = None  # a GGUF repo's quantisation tag, e.g. Q4_K_M

    def __str__(self) -> str:
        quant = f":{self.quant}" if self.quant else ""
        return f"{self.repo}{quant}@{self.revision or 'main'}"


def locate(spec: str, what: str) -> Path:
    """Where the files of the model `spec` names are: an existing folder or file as given, else
    the hub snapshot folder of a hub id (for `org/name:QUANT`, its `.gguf` file). `what`
    ("target", "draft") is the flag errors name."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if looks_like_hub_id(spec):
        return hub_files(parse_hub_id(spec, what), what)
    kind = "GGUF file" if path.suffix.lower() == ".gguf" else "folder"
    raise ModelFormatError(
        f"--{what} {spec!r}: no such {kind}; pass a folder, a .gguf file (a target) or a hub id "
        f"({HUB_SYNTAX})"
    )


def drafter_folder(spec: str) -> Path:
    """The folder of a drafter `spec` names: a folder, or a hub id of a z-lab drafter repo."""
    path = locate(spec, "draft")
    if path.is_file():
        raise ModelFormatError(
            f"--draft {spec!r} is a file; a DFlash drafter is a folder (config.json + "
            "model.safetensors, z-lab's layout) or the hub id of one"
        )
    return path


def config_folder(spec: str, what: str) -> Path | None:
    """For a hub id of a checkpoint repo, its snapshot folder with config.json alone (what
    `devices plan` reads); None for anything else (resolve it in full)."""
    if Path(spec).expanduser().exists() or not looks_like_hub_id(spec):
        return None
    hub = parse_hub_id(spec, what)
    return None if hub.quant else hub_files(hub, what, ("config.json",))


def looks_like_hub_id(spec: str) -> bool:
    """True for a spec meant as a hub id: relative, one '/' before any ':' or '@', no .gguf end."""
    head = re.split(r"[:@]", spec, maxsplit=1)[0]
    local = spec.startswith(("/", ".", "~")) or spec.lower().endswith(".gguf")
    return not local and head.count("/") == 1


def parse_hub_id(spec: str, what: str = "target") -> HubId:
    """`org/name[:QUANT][@REVISION]` as a HubId; a malformed one is a ModelFormatError."""
    m = _HUB_ID.match(spec)
    if m is None or ".." in m["repo"] or "--" in m["repo"]:
        raise ModelFormatError(
            f"--{what} {spec!r} is not a hub id: write {HUB_SYNTAX} (letters, digits, '-', '_', "
            f"'.'), or pass an existing folder or .gguf file"
        )
    return HubId(m["repo"], m["revision"], m["quant"])


def hub_cache() -> Path:
    """huggingface_hub's cache folder as the environment says now (its constants are fixed when
    it is imported): HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub or XDG_CACHE_HOME."""
    env = os.environ
    xdg = env.get("XDG_CACHE_HOME") or "~/.cache"
    home = env.get("HF_HOME") or os.path.join(xdg, "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(cache)).expanduser()


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set, read now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def hub_files(hub: HubId, what: str, patterns: tuple[str, ...] = SNAPSHOT_FILES) -> Path:
    """The snapshot folder of `hub` (its `.gguf` file for a quant tag) with the files `patterns`
    match, downloaded unless cached; huggingface_hub's errors become one-line ModelFormatErrors."""
    from huggingface_hub import errors  # lazy: only a hub id needs the hub

    try:
        return _gguf_file(hub) if hub.quant else _snapshot(hub, what, patterns)
    except errors.GatedRepoError as err:
        raise ModelFormatError(
            f"--{what} {hub}: the hub repo {hub.repo} is gated and no token with access was found; "
            f"accept its terms on https://huggingface.co/{hub.repo}, then run `hf auth "
            "login` or set HF_TOKEN"
        ) from err
    except errors.RepositoryNotFoundError as err:
        raise ModelFormatError(
            f"--{what} {hub}: the hub has no repo {hub.repo} this machine may read (a typo, or a "
            "private repo without a token); check the id, or run `hf auth login` or set "
            "HF_TOKEN"
        ) from err
    except errors.RevisionNotFoundError as err:
        raise ModelFormatError(
            f"--{what} {hub}: the hub repo {hub.repo} has no revision {hub.revision!r}; name a "
            "branch, tag or commit it has (e.g. @main)"
        ) from err
    except errors.LocalEntryNotFoundError as err:
        raise not_cached(hub, what, err) from err
    except errors.HfHubHTTPError as err:
        raise ModelFormatError(
            f"--{what} {hub}: the hub refused the download ({_first_line(err)}); retry, or "
            "download it with `hf download` and pass the folder"
        ) from err


def _snapshot(hub: HubId, what: str, patterns: tuple[str, ...]) -> Path:
    from huggingface_hub import snapshot_download

    folder = Path(
        snapshot_download(
            hub.repo,
            revision=hub.revision,
            cache_dir=hub_cache(),
            local_files_only=hub_offline(),
            allow_patterns=list(patterns),
            ignore_patterns=SUB_FOLDERS,
        )
    )
    if not (folder / "config.json").is_file():
        raise ModelFormatError(
            f"--{what} {hub}: the snapshot {folder} has no config.json (a repo of GGUF files?); "
            f"name one of its files by quantisation, e.g. {hub.repo}:Q4_K_M"
        )
    return folder


def _gguf_file(hub: HubId) -> Path:
    from huggingface_hub import hf_hub_download

    name = pick_gguf(_repo_files(hub), hub)
    return Path(
        hf_hub_download(
            hub.repo,
            name,
            revision=hub.revision,
            cache_dir=hub_cache(),
            local_files_only=hub_offline(),
        )
    )


def _repo_files(hub: HubId) -> list[str]:
    """The repo's file names: from the hub, or offline (or unreachable) from the cached
    snapshot."""
    from huggingface_hub import HfApi, errors

    if not hub_offline():
        try:
            info = HfApi().model_info(hub.repo, revision=hub.revision)  # one request, no retries
            return [s.rfilename for s in info.siblings or ()]
        except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError):
            raise
        except Exception:  # noqa: BLE001 (no network, hub down: the cache may still answer)
            pass
    folder = cached_snapshot(hub)
    if folder is None:
        raise errors.LocalEntryNotFoundError(f"no cached snapshot of {hub}")
    return [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]


def cached_snapshot(hub: HubId) -> Path | None:
    """The cache's snapshot folder for `hub`'s revision (a ref or a commit), or None."""
    repo = hub_cache() / repo_folder(hub.repo)
    revision = hub.revision or "main"
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    folder = repo / "snapshots" / commit
    return folder if folder.is_dir() and commit else None


def repo_folder(repo: str) -> str:
    """huggingface_hub's folder name for a model repo: `models--org--name`."""
    return "models--" + repo.replace("/", "--")


def pick_gguf(names: list[str], hub: HubId) -> str:
    """The one `.gguf` of `names` whose file name carries `hub.quant` as a whole tag (Q4_K does
    not pick Q4_K_M); none, several, or a split file is a ModelFormatError listing what there
    is."""
    tag = re.compile(rf"(?<![a-z0-9]){re.escape(hub.quant.lower())}(?![a-z0-9_])")
    ggufs = [n for n in names if n.lower().endswith(".gguf") and "mmproj" not in n.lower()]
    found = [n for n in ggufs if tag.search(Path(n).name.lower())]
    if len(found) == 1 and not _SPLIT_GGUF.search(found[0]):
        return found[0]
    if found and all(_SPLIT_GGUF.search(n) for n in found):
        raise ModelFormatError(
            f"{hub}: {found[0]} is split into {len(found)} files, which the GGUF import does not "
            "read; merge them (`llama-gguf-split --merge`) and pass the merged .gguf file"
        )
    what = "several files match" if found else "no .gguf file matches"
    raise ModelFormatError(
        f"{hub}: {what} quantisation {hub.quant!r} (files: {_preview(found or ggufs)}); name the "
        f"tag of exactly one, e.g. {hub.repo}:Q4_K_M"
    )


def not_cached(hub: HubId, what: str, err: Exception) -> ModelFormatError:
    """The error for a hub id the cache cannot answer (offline, or the hub unreachable)."""
    cache, repo = hub_cache(), hub_cache() / repo_folder(hub.repo)
    why = "HF_HUB_OFFLINE is set" if hub_offline() else "the hub cannot be reached"
    rev = f" --revision {hub.revision}" if hub.revision else ""
    only = f" --include '*{hub.quant}*.gguf'" if hub.quant else ""
    fix = f"download it with `hf download {hub.repo}{rev}{only}`" + (
        " or unset HF_HUB_OFFLINE" if hub_offline() else ""
    )
    if (repo / "snapshots").is_dir() and cached_snapshot(hub) is None:
        return ModelFormatError(
            f"--{what} {hub}: revision {hub.revision or 'main'!r} of {hub.repo} is not in the "
            f"Hugging Face cache {cache} ({why}; cached: {_preview(_cached_revisions(repo))}); "
            f"{fix}, or name a cached revision"
        )
    if cached_snapshot(hub) is not None:  # there, but missing files the export reads
        return ModelFormatError(
            f"--{what} {hub}: the cached snapshot in {cache} is incomplete ({_first_line(err)}; "
            f"{why}); {fix}"
        )
    return ModelFormatError(
        f"--{what} {hub}: no snapshot of {hub.repo} in the Hugging Face cache {cache} ({why}, "
        f"and it is no local folder either); {fix}"
    )


def _cached_revisions(repo: Path) -> list[str]:
    refs = repo / "refs"
    names = [p.relative_to(refs).as_posix() for p in refs.rglob("*") if p.is_file()]
    return names + [p.name for p in (repo / "snapshots").iterdir()]


def checkpoint_for(gguf: Path, home: Path) -> Path:
    """The checkpoint folder under `home` imported from the GGUF file `gguf` (models/gguf_import),
    reusing an earlier import of the same file (same path, size and mtime, else same sha256).

    The one place a GGUF becomes a folder for --target: a streamed GGUF source replaces it."""
    gguf = Path(gguf).expanduser()
    if not gguf.is_file():
        raise ModelFormatError(f"GGUF file {gguf} does not exist; pass the path of a .gguf file")
    st = gguf.stat()
    stamp = {
        "gguf_path": str(gguf.resolve()),
        "gguf_size": st.st_size,
        "gguf_mtime_ns": st.st_mtime_ns,
    }
    same = home / gguf.stem
    if _stamped(same, stamp):  # the same file, untouched since it was imported
        return same
    digest = sha256_file(gguf)
    for out in (same, home / f"{gguf.stem}-{digest[:12]}"):
        if _source(out).get("gguf_sha256") == digest:
            _stamp(out, stamp)
            return out
        if not out.exists():
            break
    print(f"importing {gguf} into {out} (once: later runs reuse it)", file=sys.stderr)
    return import_gguf(gguf, out, source={"source": f"local GGUF {gguf.resolve()}", **stamp})


def _source(ckpt: Path) -> dict:
    try:
        record = json.loads((ckpt / "SOURCE.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and (ckpt / "config.json").is_file() else {}


def _stamped(ckpt: Path, stamp: dict) -> bool:
    record = _source(ckpt)
    return all(record.get(k) == v for k, v in stamp.items())


def _stamp(ckpt: Path, stamp: dict) -> None:
    """Record the file's size and mtime beside its sha256, so the next run need not hash it."""
    path = ckpt / "SOURCE.json"
    tmp = path.with_name(f".SOURCE.json.{os.getpid()}")
    try:
        tmp.write_text(json.dumps({**_source(ckpt), **stamp}, indent=2), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a read-only cache: reuse still works, by hash
        tmp.unlink(missing_ok=True)


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def _preview(items: list[str], n: int = 6) -> str:
    items = list(items)
    more = f", ... ({len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more if items else "none"
