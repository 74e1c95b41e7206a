"""Quality report of a re-exported bundle against the bundle it came from (JSON in the bundle,
a table for humans).

Text: held-out prompts (the shipped set `heldout`, dflash_edge.data, unless `prompts` names another
set or a JSONL with "prompt" fields), each followed by the reference (fp32) target's own greedy
reply, teacher-forced through both targets in prefill-sized chunks. Measured on the reply positions:
  top1_agreement  share of positions where both targets' argmax agree
  perplexity      of the reply tokens under each target (low for the reference: they are its
                  own picks)
Then on the first `accept_prompts` prompts, each bundle generates with its drafter (mean acceptance
length, tokens/s) and the quantised one also plainly (ms/token; and whether both outputs are equal).

>>> opts = ReportOptions(positions=2048)                      # doctest: +SKIP
>>> report = quality_report("bundle/", "bundle-int4/", opts)  # doctest: +SKIP
>>> print(format_report(report))                              # doctest: +SKIP
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..export.kv_cache import load_prompts, teacher_forced_logits
from ..runtime import Generator
from ..runtime.bundle import file_entry, read_bundle


@dataclass
class ReportOptions:
    positions: int = 2048  # teacher-forced reply positions (at least; whole replies)
    max_new_tokens: int = 128  # per reference reply
    accept_prompts: int = 8  # prompts for acceptance length and speed
    prompts: str | None = None  # JSONL with "prompt" fields or a shipped set (default: "heldout")
    threads: int = 0  # onnxruntime intra-op threads (0: one per CPU)


def _log_softmax_at(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """log p(tokens[i] | row i) for logits [n, V]."""
    top = logits.max(axis=-1, keepdims=True)  # [n, 1]
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=-1))  # [n]
    return logits[np.arange(len(tokens)), tokens] - lse


def _text_metrics(ref, quant, texts: list[tuple[list[int], list[int]]]) -> dict:
    agree = total = 0
    nll = {"reference": 0.0, "quantized": 0.0}
    for prompt, reply in texts:
        ids, rows = prompt + reply, slice(len(prompt) - 1, len(prompt) + len(reply) - 1)
        tokens = np.asarray(reply)
        # [len(reply), V]
        lr, lq = (
            teacher_forced_logits(ref, ids, rows),
            teacher_forced_logits(quant, ids, rows),
        )
        agree += int((lr.argmax(-1) == lq.argmax(-1)).sum())
        total += len(reply)
        nll["reference"] -= float(_log_softmax_at(lr, tokens).sum())
        nll["quantized"] -= float(_log_softmax_at(lq, tokens).sum())
    return {
        "positions": total,
        "top1_agreement": agree / max(total, 1),
        "perplexity": {k: float(np.exp(v / max(total, 1))) for k, v in nll.items()},
    }


def _ms_per_token(res) -> float:
    s = res.stats
    return 1e3 * s.decode_s / max(s.new_tokens - 1, 1)


def _speeds(ref, quant, texts, opts: ReportOptions, plain_ref_ms: list[float]) -> dict:
    taus = {"reference": [], "quantized": []}
    spec_ms = {"reference": [], "quantized": []}
    plain_q, lossless = [], True
    for prompt, _ in texts[: opts.accept_prompts]:
        for key, gen in (("reference", ref), ("quantized", quant)):
            res = gen.generate_ids(prompt, opts.max_new_tokens, draft="drafter")
            taus[key] += res.stats.acceptance_lengths
            spec_ms[key].append(_ms_per_token(res))
            if key == "quantized":
                plain = gen.generate_ids(prompt, opts.max_new_tokens, draft="none")
                plain_q.append(_ms_per_token(plain))
                lossless &= plain.token_ids == res.token_ids
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return {
        "acceptance_length": {k: mean(v) for k, v in taus.items()},
        "plain_ms_per_token": {
            "reference": statistics.median(plain_ref_ms),
            "quantized": statistics.median(plain_q),
        },
        "speculative_ms_per_token": {k: statistics.median(v) for k, v in spec_ms.items()},
        "speculative_equals_plain": lossless,
        "speed_prompts": len(plain_q),
    }


def quality_report(
    reference: str | Path, quantized: str | Path, opts: ReportOptions, log=sys.stderr
) -> dict:
    """Compare bundle `quantized` with its fp32 `reference` (both bundle folders); returns the
    report dict."""

    ref = Generator.load(reference, threads=opts.threads, verify=False)
    quant = Generator.load(read_bundle(quantized, verify=False), threads=opts.threads)
    texts, plain_ref_ms, positions = [], [], 0
    prompts = load_prompts(opts.prompts)
    for prompt in prompts:
        if positions >= opts.positions:
            break
        ids = ref.encode(prompt)
        res = ref.generate_ids(ids, opts.max_new_tokens, draft="none")
        texts.append((ids, res.token_ids))
        plain_ref_ms.append(_ms_per_token(res))
        positions += len(res.token_ids)
        print(
            f"quality: reference replies {positions}/{opts.positions} positions", file=log, end="\r"
        )
    print(file=log)
    sizes = {
        name: {
            "reference": sum(f["bytes"] for f in ref.bundle.manifest["graphs"][name]["files"]),
            "quantized": sum(f["bytes"] for f in g["files"]),
            "precision": g["precision"],
        }
        for name, g in quant.bundle.manifest["graphs"].items()
    }
    total = {k: sum(s[k] for s in sizes.values()) for k in ("reference", "quantized")}
    return {
        "reference_bundle": str(Path(reference).resolve()),
        "text": {
            "prompts_file": str(opts.prompts or "heldout"),
            "prompts": len(texts),
            "replies": "the reference target's greedy replies",
            "max_new_tokens": opts.max_new_tokens,
        },
        **_text_metrics(ref, quant, texts),
        **_speeds(ref, quant, texts, opts, plain_ref_ms),
        "bytes": {
            "graphs": sizes,
            "total": total,
            "ratio": total["quantized"] / total["reference"],
        },
        "kv_cache": {
            # what each target ran
            k: {
                "graph": g.target.GRAPH,
                "dtype": g.target.kv.key.dtype.name,
            }
            for k, g in (("reference", ref), ("quantized", quant))
        },
        "options": asdict(opts),
    }


def write_report(root: Path, name: str, report: dict) -> dict:
    """Write `root/name` (JSON); returns its manifest entry (path, bytes, sha256)."""

    (root / name).write_text(json.dumps(report, indent=2) + "\n")
    return file_entry(root, name)


def format_report(r: dict) -> str:
    """A short table for humans."""
    ppl, tau = r["perplexity"], r["acceptance_length"]
    plain, spec = r["plain_ms_per_token"], r["speculative_ms_per_token"]
    mb = {k: v / 1e6 for k, v in r["bytes"]["total"].items()}
    rows = [
        ("", "reference", "quantized"),
        (
            "bytes (MB)",
            f"{mb['reference']:.1f}",
            f"{mb['quantized']:.1f} ({r['bytes']['ratio']:.0%})",
        ),
        *(
            [("KV cache", r["kv_cache"]["reference"]["dtype"], r["kv_cache"]["quantized"]["dtype"])]
            if "kv_cache" in r
            else []
        ),
        ("perplexity", f"{ppl['reference']:.3f}", f"{ppl['quantized']:.3f}"),
        ("acceptance length", f"{tau['reference']:.3f}", f"{tau['quantized']:.3f}"),
        ("plain ms/token", f"{plain['reference']:.1f}", f"{plain['quantized']:.1f}"),
        ("speculative ms/token", f"{spec['reference']:.1f}", f"{spec['quantized']:.1f}"),
    ]
    lines = [
        f"top-1 agreement {r['top1_agreement']:.2%} over {r['positions']} positions "
        f"({r['text']['prompts']} prompts); speculative == plain: {r['speculative_equals_plain']}"
    ]
    lines += [f"  {a:<22}{b:>12}{c:>20}" for a, b, c in rows]
    return "\n".join(lines)
