"""The tuned verify length: the cost model, the choice of k, and `tuned.json` (read, validate,
write).

A speculative step verifying k drafts costs `draft + verify(k)` (the target runs T = k + 1 tokens)
and commits `1 + S(1) + ... + S(k)` tokens on average, S(j) being the share of steps whose first j
drafts are all accepted. Plain decoding commits 1 token per `decode`. `choose_verify_len` picks the
k with the most expected tokens per second, or 0 ("do not draft") when plain decoding wins.

`dflash-edge tune` (calibrate.py) measures those numbers on this machine and stores them next to the
bundle's hashed files in `tuned.json`, linked to the manifest it was measured on by a sha256: a
tuned file from another bundle, or from a bundle changed since, is refused with an error that says
the fix.

>>> choose_verify_len(decode_ms=50, draft_ms=15, verify_ms={1: 52, 2: 54}, acceptance=[0.9, 0.8])[0]
2
>>> choose_verify_len(decode_ms=50, draft_ms=15, verify_ms={1: 52, 2: 54}, acceptance=[0.1, 0.0])[0]
0
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .bundle import Bundle, BundleError, inside

TUNED = "tuned.json"
FORMAT = "dflash-edge-tuned"
VERSION = 1


class TunedFileError(BundleError):
    """A bundle's tuned.json that is stale, foreign, unreadable or out of range."""


def expected_tokens(acceptance: list[float], k: int) -> float:
    """Tokens one step verifying k drafts commits on average: the bonus token plus S(1..k)."""
    return 1.0 + sum(acceptance[:k])


def choose_verify_len(
    decode_ms: float, draft_ms: float, verify_ms: dict[int, float], acceptance: list[float]
) -> tuple[int, dict[int, float]]:
    """(best k, expected tokens/s for each k); k = 0 is plain decoding."""
    rates = {0: 1e3 / decode_ms}
    for k, ms in sorted(verify_ms.items()):
        if k <= len(acceptance):
            rates[k] = 1e3 * expected_tokens(acceptance, k) / (draft_ms + ms)
    # ties: the shorter (cheaper, less memory-bound) k
    best = max(rates, key=lambda k: (rates[k], -k))
    return best, rates


def survival(accepted_drafts: list[int], max_drafts: int) -> list[float]:
    """S(j) for j = 1..max_drafts from the number of drafts accepted at each step.

    >>> survival([0, 2, 1, 3], 3)
    [0.75, 0.5, 0.25]
    """
    n = len(accepted_drafts)
    return [
        sum(a >= j for a in accepted_drafts) / n if n else 0.0 for j in range(1, max_drafts + 1)
    ]


def monotone(values: list[float]) -> list[float]:
    """The non-decreasing least-squares fit (pool adjacent violators): a step of more tokens never
    costs less, so noise that says otherwise (a busy machine) is averaged out instead of picked.

    >>> monotone([3.0, 2.0, 4.0, 6.0, 5.0])
    [2.5, 2.5, 4.0, 5.5, 5.5]
    """
    blocks: list[list[float]] = []  # [sum, count] of pooled runs
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(count)]


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON: it covers every graph's sha256, dims and block
    size."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


@dataclass
class Tuned:
    """What `dflash-edge tune` measured and chose (times in ms; k = drafts verified per step, 0 =
    plain)."""

    verify_len: int
    decode_ms: float
    draft_ms: float
    verify_ms: dict[int, float]  # k -> target step of T = k + 1 tokens
    acceptance: list[float]  # S(1..B-1)
    manifest_sha256: str
    expected_tokens_per_s: dict[int, float] = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)  # prompts, steps, context, machine, created

    def to_json(self) -> dict:
        out = asdict(self)
        out["verify_ms"] = {str(k): v for k, v in self.verify_ms.items()}
        out["expected_tokens_per_s"] = {str(k): v for k, v in self.expected_tokens_per_s.items()}
        return {"format": FORMAT, "version": VERSION, **out}


def read_tuned(bundle: Bundle) -> Tuned | None:
    """The bundle's validated tuned.json, or None when it has none."""
    path = inside(bundle.root, TUNED, TUNED, TunedFileError)
    if not path.is_file():
        return None
    fix = f"run `dflash-edge tune {bundle.root}` again (or delete {path})"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TunedFileError(f"{path} is unreadable ({err}); {fix}") from err
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise TunedFileError(f"{path} is not a version-{VERSION} {FORMAT!r} file; {fix}")
    if data.get("manifest_sha256") != manifest_digest(bundle.manifest):
        raise TunedFileError(
            f"{path} was measured on another bundle or on this bundle before it changed (its "
            f"manifest_sha256 does not match {bundle.root / 'manifest.json'}); {fix}"
        )
    try:
        tuned = Tuned(
            verify_len=data["verify_len"],
            decode_ms=data["decode_ms"],
            draft_ms=data["draft_ms"],
            verify_ms={int(k): v for k, v in data["verify_ms"].items()},
            acceptance=data["acceptance"],
            manifest_sha256=data["manifest_sha256"],
            expected_tokens_per_s={
                int(k): v for k, v in data.get("expected_tokens_per_s", {}).items()
            },
            calibration=data.get("calibration", {}),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise TunedFileError(f"{path}: missing or malformed field ({err!r}); {fix}") from err
    _check_ranges(tuned, bundle.block_size, f"{path}", fix)
    return tuned


def _check_ranges(t: Tuned, block_size: int, where: str, fix: str) -> None:
    def bad(what: str):
        return TunedFileError(f"{where}: {what}; {fix}")

    def positive(x) -> bool:
        return (
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
        )

    if (
        isinstance(t.verify_len, bool)
        or not isinstance(t.verify_len, int)
        or not 0 <= t.verify_len < block_size
    ):
        raise bad(
            f"verify_len {t.verify_len!r} is outside 0..{block_size - 1} (block size {block_size})"
        )
    if not positive(t.decode_ms) or not positive(t.draft_ms):
        raise bad(
            f"decode_ms {t.decode_ms!r} and draft_ms {t.draft_ms!r} must be positive finite numbers"
        )
    if not t.verify_ms or any(
        not 1 <= k < block_size or not positive(v) for k, v in t.verify_ms.items()
    ):
        raise bad(
            f"verify_ms needs positive times keyed by k in 1..{block_size - 1}, got {t.verify_ms!r}"
        )
    if t.verify_len and t.verify_len not in t.verify_ms:
        raise bad(f"verify_len {t.verify_len} has no measured verify_ms")
    if (
        not isinstance(t.acceptance, list)
        or len(t.acceptance) != block_size - 1
        or any(
            isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= 1
            for a in t.acceptance
        )
    ):
        raise bad(f"acceptance must list {block_size - 1} shares in [0, 1], got {t.acceptance!r}")


def write_tuned(bundle: Bundle, tuned: Tuned) -> Path:
    """Validate and write `bundle/tuned.json` atomically (temp file, then rename); hashed files are
    untouched."""
    _check_ranges(tuned, bundle.block_size, "tune result", "this is a bug in the measurement")
    path = bundle.root / TUNED
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tuned.", dir=bundle.root)
    except OSError as err:
        raise TunedFileError(
            f"cannot write {path} ({err}); copy the bundle to a writable directory and tune "
            f"that copy"
        ) from err
    with os.fdopen(fd, "w") as f:
        json.dump(tuned.to_json(), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path
