"""Offline prompt corpus: instructions built from what this machine has installed (no hub datasets).

Sources: the Python standard library's docstrings and source (via `inspect`), the man pages' NAME
lines (/usr/share/man), and templated instructions filled from small word lists. Six categories
(chat, code, math, writing, knowledge, lists), deduplicated, split into train / held-out *by
prompt*.

>>> train, heldout = build_prompts(PromptSpec(num_train=200, num_heldout=60))   # doctest: +SKIP
>>> heldout[0]                                                                  # doctest: +SKIP
{'prompt': 'List 5 ways to save water at home.', 'category': 'lists'}
"""

from __future__ import annotations

import gzip
import importlib
import inspect
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from ..data import prompt_set_path
from . import wordlists as W

CATEGORIES = ("chat", "code", "math", "writing", "knowledge", "lists")
HELDOUT_FILE = prompt_set_path("heldout")  # package data (dflash_edge.data)


@dataclass
class PromptSpec:
    num_train: int = 1200
    num_heldout: int = 60
    seed: int = 0
    man_dir: str = "/usr/share/man/man1"


# ---------------------------------------------------------------- installed sources
def _stdlib_public_members():
    """(module name, member name, object) for the public members of the stdlib modules we read."""

    for mod_name in W.STDLIB_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for name, obj in vars(mod).items():
            if not name.startswith("_"):
                yield mod_name, name, obj


def stdlib_docs(limit: int = 4000) -> list[tuple[str, str]]:
    """(qualified name, first docstring sentence) of public stdlib functions/classes."""

    out = []
    for mod_name, name, obj in _stdlib_public_members():
        if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
            continue
        doc = _first_sentence(inspect.getdoc(obj) or "")
        if 20 <= len(doc) <= 200 and not doc.lower().startswith(("see ", "alias", "deprecated")):
            out.append((f"{mod_name}.{name}", doc))
    return out[:limit]


def stdlib_snippets(limit: int = 400, lines: int = 8) -> list[str]:
    """Short function bodies from the stdlib's Python source."""

    out = []
    for mod_name, _, obj in _stdlib_public_members():
        if not inspect.isfunction(obj) or obj.__doc__ or getattr(obj, "__module__", "") != mod_name:
            continue
        try:
            src = inspect.getsource(obj)
        except (OSError, TypeError):
            continue
        body = src.rstrip().splitlines()
        if 3 <= len(body) <= lines:
            out.append("\n".join(body))
    return out[:limit]


def man_pages(man_dir: str, limit: int = 3000) -> list[tuple[str, str]]:
    """(command, one-line description) from the NAME section of installed man pages."""
    root = Path(man_dir)
    out = []
    for path in sorted(root.glob("*.gz"))[: limit * 2] if root.is_dir() else []:
        try:
            with gzip.open(path, "rt", errors="ignore") as f:
                head = f.read(4000)
        except OSError:
            continue
        m = re.search(r"\.SH \"?NAME\"?\s*\n(.+?)\n", head)
        if m and "\\-" in m.group(1):
            cmd, desc = (s.strip() for s in m.group(1).split("\\-", 1))
            cmd = cmd.split(",")[0].replace("\\", "").strip()
            if re.fullmatch(r"[a-z][a-z0-9_.+-]{1,30}", cmd) and 10 <= len(desc) <= 120:
                out.append((cmd, desc.replace("\\", "")))
    return out[:limit]


def _first_sentence(doc: str) -> str:
    text = " ".join(doc.strip().split("\n\n")[0].split())
    return text.split(". ")[0].rstrip(".")


# ---------------------------------------------------------------- generators, one per category
def gen_code(rng: random.Random, docs, snippets) -> str:
    kind = rng.random()
    if kind < 0.35 and docs:
        name, doc = rng.choice(docs)
        return rng.choice(W.CODE_DOC_TEMPLATES).format(name=name, doc=doc[0].lower() + doc[1:])
    if kind < 0.55 and snippets:
        return rng.choice(W.CODE_SNIPPET_TEMPLATES).format(code=rng.choice(snippets))
    return rng.choice(W.CODE_TASKS).format(
        lang=rng.choice(W.LANGUAGES), thing=rng.choice(W.CODE_THINGS), n=rng.randint(2, 20)
    )


def gen_math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(100, 999)
    return rng.choice(W.MATH_TEMPLATES).format(
        a=a,
        b=b,
        c=c,
        p=rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 75]),
        item=rng.choice(W.ITEMS),
        name=rng.choice(W.NAMES),
        unit=rng.choice(W.UNITS),
        shape=rng.choice(W.SHAPES),
        d=round(rng.uniform(1, 50), 1),
    )


def gen_writing(rng: random.Random, docs) -> str:
    if rng.random() < 0.15 and docs:
        return f'Rewrite this sentence in plain, friendly English: "{rng.choice(docs)[1]}."'
    return rng.choice(W.WRITING_TEMPLATES).format(
        form=rng.choice(W.FORMS),
        subject=rng.choice(W.SUBJECTS),
        audience=rng.choice(W.AUDIENCES),
        tone=rng.choice(W.TONES),
    )


def gen_knowledge(rng: random.Random, mans, docs) -> str:
    kind = rng.random()
    if kind < 0.3 and mans:
        cmd, desc = rng.choice(mans)
        return rng.choice(W.MAN_TEMPLATES).format(cmd=cmd, desc=desc)
    if kind < 0.4:
        return f"What is the Python `{rng.choice(W.STDLIB_MODULES)}` module used for?"
    return rng.choice(W.KNOWLEDGE_TEMPLATES).format(
        topic=rng.choice(W.TOPICS), audience=rng.choice(W.AUDIENCES)
    )


def gen_lists(rng: random.Random) -> str:
    return rng.choice(W.LIST_TEMPLATES).format(
        n=rng.randint(3, 10),
        things=rng.choice(W.LIST_THINGS),
        activity=rng.choice(W.ACTIVITIES),
        topic=rng.choice(W.TOPICS),
    )


def gen_chat(rng: random.Random) -> str:
    return rng.choice(W.CHAT_TEMPLATES).format(
        emotion=rng.choice(W.EMOTIONS),
        situation=rng.choice(W.SITUATIONS),
        activity=rng.choice(W.ACTIVITIES),
        subject=rng.choice(W.SUBJECTS),
        name=rng.choice(W.NAMES),
    )


# ---------------------------------------------------------------- corpus
def build_prompts(spec: PromptSpec) -> tuple[list[dict], list[dict]]:
    """(train, heldout) lists of {"prompt", "category"}; balanced across categories, no
    duplicates."""
    rng = random.Random(spec.seed)
    docs, snippets, mans = stdlib_docs(), stdlib_snippets(), man_pages(spec.man_dir)
    makers = {
        "chat": lambda: gen_chat(rng),
        "code": lambda: gen_code(rng, docs, snippets),
        "math": lambda: gen_math(rng),
        "writing": lambda: gen_writing(rng, docs),
        "knowledge": lambda: gen_knowledge(rng, mans, docs),
        "lists": lambda: gen_lists(rng),
    }
    per_cat = -(-(spec.num_train + spec.num_heldout) // len(CATEGORIES))
    seen: set[str] = set()
    pools = {cat: _unique(make, per_cat, seen) for cat, make in makers.items()}
    held_per_cat = -(-spec.num_heldout // len(CATEGORIES))
    heldout = [
        {"prompt": p, "category": c} for c, pool in pools.items() for p in pool[:held_per_cat]
    ]
    train = [{"prompt": p, "category": c} for c, pool in pools.items() for p in pool[held_per_cat:]]
    rng.shuffle(train)
    return train[: spec.num_train], heldout


def _unique(make, count: int, seen: set[str], tries: int = 50) -> list[str]:
    out = []
    for _ in range(count * tries):
        p = make()
        key = " ".join(p.lower().split())
        if key not in seen:
            seen.add(key)
            out.append(p)
            if len(out) == count:
                break
    return out


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )
    return path


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a prompts file; each needs a `prompt` (and optionally a `category`)."""
    rows = [
        json.loads(line)
        for line in Path(path).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    bad = [i for i, r in enumerate(rows) if not isinstance(r.get("prompt"), str)]
    if bad:
        raise ValueError(f"{path}: line(s) {bad[:5]} lack a string 'prompt' field")
    return rows
