"""The runtime loop over exported bundles: lossless vs the torch reference, buffers, text, bad input
(tier 1).

Tier 2 (SmolLM2 end to end, a runtime-only install in a fresh venv) is marked `tier2`.
"""

import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from dflash_edge.runtime.bundle import BundleError
from dflash_edge.runtime.errors import ContextOverflowError
from dflash_edge.runtime.sampling import SamplingParams

from fixtures_bundle import MAX_CONTEXT
from runtime_cases import PROMPTS, SAMPLERS, reference
from tiny import check_two_token_distribution, drafted_pairs

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py (so is the `oracle` fixture)


def late_stop(tokens, at):
    """Stop ids: a token first occurring at index >= `at` (so the run stops there), else none."""
    fresh = [t for i, t in enumerate(tokens) if i >= at and t not in tokens[:i]]
    return tuple(fresh[:1])


# ---- lossless ------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("block", [4, 8])
def test_greedy_equals_torch_reference(tiny_bundle, variant, block):
    tb = tiny_bundle(variant, block)
    for prompt in PROMPTS:
        free = reference(tb, prompt, stop=())
        stop = late_stop(free.token_ids, 17)  # a stop token the output is known to reach
        want = reference(tb, prompt, stop=stop)
        spec = tb.generator.generate_ids(prompt, 40, draft="drafter", stop_token_ids=stop)
        ar = tb.generator.generate_ids(prompt, 40, draft="none", stop_token_ids=stop)
        assert spec.token_ids == want.token_ids == ar.token_ids
        assert (
            spec.finish_reason
            == ar.finish_reason
            == want.finish_reason
            == ("stop" if stop else "length")
        )
        steps = spec.stats.acceptance_lengths
        assert (
            steps and all(1 <= a <= block for a in steps) and sum(steps) + 1 >= len(spec.token_ids)
        )


@pytest.mark.parametrize("hit", [0.0, 0.9])
def test_auto_drafting_is_lossless_and_switches_between_modes(tiny_bundle, oracle, hit):
    tb = tiny_bundle("qwen3", 8)
    prompt = PROMPTS[1]
    ref = reference(tb, prompt, 60, stop=())
    oracle(tb.generator, prompt + ref.token_ids, hit)
    got = tb.generator.generate_ids(prompt, 60, stop_token_ids=(), draft="auto")
    assert got.token_ids == ref.token_ids
    s = got.stats
    assert (
        s.target_calls == len(s.acceptance_lengths) + len(s.lookup_lengths) + s.plain_steps
    )  # one of the three
    assert s.plain_steps and s.probe_steps  # decode cost, then a drafter probe
    if hit:
        assert (
            max(s.acceptance_lengths + s.lookup_lengths) > 1
        )  # a good proposal source is then used
    with pytest.raises(ValueError, match="draft='sometimes'"):
        tb.generator.generate_ids(prompt, 8, draft="sometimes")


@pytest.mark.parametrize("block", [4, 8])
@pytest.mark.parametrize("hit", [1.0, 0.8])
def test_long_acceptances_roll_back_correctly(tiny_bundle, oracle, block, hit):
    tb = tiny_bundle("qwen3", block)
    for i, prompt in enumerate(PROMPTS):
        ref = reference(tb, prompt, 60, stop=())
        stop = late_stop(ref.token_ids, 45)
        want = reference(tb, prompt, 60, stop=stop)
        oracle(tb.generator, prompt + ref.token_ids, hit, seed=i)
        got = tb.generator.generate_ids(prompt, 60, draft="drafter", stop_token_ids=stop)
        assert got.token_ids == want.token_ids
        steps = got.stats.acceptance_lengths
        assert max(steps) > 1 and all(1 <= a <= block for a in steps)
        if hit == 1.0:
            assert all(a == block for a in steps[:-1])


def test_budget_ends_inside_a_block(tiny_bundle, oracle):
    tb = tiny_bundle("qwen3", 8)
    ref = reference(tb, PROMPTS[0], 50, stop=())
    oracle(tb.generator, PROMPTS[0] + ref.token_ids, 1.0)
    got = tb.generator.generate_ids(PROMPTS[0], 13, draft="drafter", stop_token_ids=())
    assert got.token_ids == ref.token_ids[:13] and got.finish_reason == "length"


@pytest.mark.parametrize("sampling", SAMPLERS)
def test_sampling_same_seed_same_tokens_as_reference(tiny_bundle, oracle, sampling):
    tb = tiny_bundle("llama", 8)
    want = reference(tb, PROMPTS[1], 48, sampling, stop=())
    assert (
        reference(tb, PROMPTS[1], 48, sampling, stop=(), speculative=True).token_ids
        == want.token_ids
    )
    ar = tb.generator.generate_ids(PROMPTS[1], 48, sampling, draft="none", stop_token_ids=())
    plain = tb.generator.generate_ids(PROMPTS[1], 48, sampling, stop_token_ids=())
    oracle(tb.generator, PROMPTS[1] + want.token_ids, 0.9)
    spec = tb.generator.generate_ids(PROMPTS[1], 48, sampling, draft="drafter", stop_token_ids=())
    assert ar.token_ids == plain.token_ids == spec.token_ids == want.token_ids
    assert max(spec.stats.acceptance_lengths) > 1


def test_sampling_distribution_matches_target(tiny_bundle):
    """Joint distribution of the first two sampled tokens over many seeds vs the exact target
    one."""
    tb = tiny_bundle("qwen3", 4)
    check_two_token_distribution(tb.target, PROMPTS[0], drafted_pairs(tb.generator, PROMPTS[0]))


# ---- context end, buffers
# ----------------------------------------------------------------------------
def test_generation_stops_cleanly_at_context_end(tiny_bundle):
    tb = tiny_bundle("qwen2", 8)
    prompt = PROMPTS[3]
    want = reference(tb, prompt, 500, stop=())
    for draft in ("drafter", "none"):
        got = tb.generator.generate_ids(prompt, 500, draft=draft, stop_token_ids=())
        assert got.finish_reason == want.finish_reason == "context"
        assert got.token_ids == want.token_ids and len(got.token_ids) == MAX_CONTEXT - len(prompt)


def test_prompt_longer_than_context_names_the_limit(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    with pytest.raises(
        ContextOverflowError, match=f"the prompt has 130 tokens but the context holds {MAX_CONTEXT}"
    ):
        gen.generate_ids([3] * 130, 10)
    with pytest.raises(ContextOverflowError, match=f"holds {MAX_CONTEXT}"):
        gen.generate(
            " ".join(["t7"] * MAX_CONTEXT), chat=False
        )  # within the character bound, over in tokens


def test_a_text_too_long_for_any_tokenisation_is_refused_before_tokenising(
    tiny_bundle, monkeypatch
):
    """No token stands for more characters than the longest vocabulary string: beyond max_context x
    that, the text cannot fit, and is refused without a tokeniser pass (a megabyte sent to the
    server costs nothing)."""
    gen = tiny_bundle("qwen3", 8).generator
    longest = max(len(s) for s in gen.tokenizer.tokenizer.get_vocab(with_added_tokens=True))
    calls = []
    monkeypatch.setattr(
        type(gen.tokenizer), "encode_chat", lambda self, *a, **k: calls.append(a) or [3]
    )
    monkeypatch.setattr(type(gen.tokenizer), "encode", lambda self, *a, **k: calls.append(a) or [3])
    limit = MAX_CONTEXT * longest
    for prompt, chat in (
        ("x" * (limit + 1), False),
        ("x" * (limit + 1), True),
        ([{"role": "user", "content": "x" * limit}, {"role": "user", "content": "y"}], True),
    ):
        with pytest.raises(
            ContextOverflowError, match=f"more than the {limit} that {MAX_CONTEXT} tokens"
        ):
            gen.encode(prompt, chat=chat)
    assert calls == []
    assert gen.encode("x" * limit, chat=False) == [3] and len(calls) == 1  # at the bound: tokenised


def test_steps_allocate_nothing_of_cache_size(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    ptrs = (
        gen.target.kv.key.ptr,
        gen.target.kv.value.ptr,
        gen.drafter.kv.key.ptr,
        gen.target.hidden.ptr,
    )
    gen.generate_ids(PROMPTS[1], 30, stop_token_ids=())  # warm-up
    kv_bytes = gen.target.kv.key.nbytes
    for draft, sampling in [
        ("drafter", SamplingParams()),
        ("none", SamplingParams()),
        ("drafter", SAMPLERS[1]),
    ]:
        tracemalloc.start()
        gen.generate_ids(PROMPTS[1], 60, sampling, draft=draft, stop_token_ids=())
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < kv_bytes / 4, (
            f"a generation allocated {peak} bytes (one K cache is {kv_bytes})"
        )
    assert ptrs == (
        gen.target.kv.key.ptr,
        gen.target.kv.value.ptr,
        gen.drafter.kv.key.ptr,
        gen.target.hidden.ptr,
    )


# ---- text, chat, stop strings
# ----------------------------------------------------------------------
def test_generate_text_chat_and_stream(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    res = gen.generate("t5 t6 t7", max_new_tokens=20)
    assert res.token_ids == gen.generate_ids(gen.encode("t5 t6 t7"), 20).token_ids
    assert res.text == gen.tokenizer.decode(res.token_ids)
    msgs = [{"role": "user", "content": "t5 t6 t7"}]
    assert gen.generate(msgs, max_new_tokens=20).token_ids == res.token_ids
    assert (
        gen.generate("t1 t5 t6 t7 t2 t3", max_new_tokens=20, chat=False).token_ids == res.token_ids
    )
    stream = gen.stream(msgs, max_new_tokens=20)
    assert "".join(stream) == res.text and stream.result.token_ids == res.token_ids
    s = res.stats  # the default (adaptive) arm's accounting
    assert (
        s.prompt_tokens == 6 and s.new_tokens == 20 and s.finish_reason == "length"
    )  # t1 t5 t6 t7 t2 t3
    assert (
        1 + sum(s.acceptance_lengths) + sum(s.lookup_lengths) + s.plain_steps == 20
    )  # prefill's + each step's
    assert (
        s.target_calls == len(s.acceptance_lengths) + len(s.lookup_lengths) + s.plain_steps
    )  # a pass a step
    assert (
        s.draft_calls >= len(s.acceptance_lengths) + s.probe_steps
    )  # drafter steps and probes (+ catching up)
    assert len(s.verify_lens) == len(s.acceptance_lengths) + len(s.lookup_lengths)
    assert s.prefill_s > 0 and s.decode_s > 0


def test_stop_string_cuts_text_and_tokens(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    full = gen.generate("t5 t6 t7", max_new_tokens=30)
    words = full.text.split()
    stop = " ".join(words[6:8])  # occurs after the 6th token
    cut = full.text.index(stop)
    for draft in ("drafter", "none"):
        res = gen.generate("t5 t6 t7", max_new_tokens=30, stop=[stop], draft=draft)
        assert res.text == full.text[:cut] and res.finish_reason == "stop"
        assert res.token_ids == full.token_ids[:8]
        assert (
            "".join(gen.stream("t5 t6 t7", max_new_tokens=30, stop=stop, draft=draft)) == res.text
        )


class _ByteTokenizer:
    """ids are UTF-8 bytes: multi-byte characters span several tokens."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_text_pieces_never_split_a_character():
    from dflash_edge.runtime.text import TextAssembler

    text = "héllo wörld — 日本語 ok 🙂!"
    asm = TextAssembler(_ByteTokenizer(), stop=("ok 🙂",))
    pieces = [asm.add(b) for b in text.encode()]
    pieces.append(asm.finish())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == asm.text == "héllo wörld — 日本語 "
    asm = TextAssembler(_ByteTokenizer())
    assert "".join([asm.add(b) for b in text.encode()] + [asm.finish()]) == text


# ---- bad input
# -------------------------------------------------------------------------------------
def _copy_bundle(tb, tmp_path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(tb.path, dst)
    return dst


def test_missing_or_corrupt_bundle(tiny_bundle, tmp_path):
    from dflash_edge.runtime import Generator

    with pytest.raises(BundleError, match="manifest.json not found"):
        Generator.load(tmp_path / "nope")
    path = _copy_bundle(tiny_bundle("qwen3", 8), tmp_path)
    data = path / "target.onnx.data"
    good = data.read_bytes()
    data.write_bytes(good[:100] + bytes([good[100] ^ 0xFF]) + good[101:])
    with pytest.raises(BundleError, match=r"target\.onnx\.data is corrupt"):
        Generator.load(path)
    data.write_bytes(good)
    (path / "drafter.onnx").unlink()
    with pytest.raises(BundleError, match=r"drafter\.onnx is missing"):
        Generator.load(path)


def test_unknown_manifest_version(tiny_bundle, tmp_path):
    from dflash_edge.runtime import Generator

    path = _copy_bundle(tiny_bundle("qwen3", 8), tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["manifest_version"] = 99
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="manifest_version 99 is not supported"):
        Generator.load(path)


def test_unavailable_provider_lists_available(tiny_bundle):
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.session import ProviderUnavailableError, available_providers

    assert "cpu" in available_providers()
    with pytest.raises(
        ProviderUnavailableError, match="provider='tpu': expected one of .*available here: cpu"
    ):
        Generator.load(tiny_bundle("qwen3", 8).path, provider="tpu")
    if "cuda" not in available_providers():
        with pytest.raises(
            ProviderUnavailableError, match="provider 'cuda' is not available.*available: cpu"
        ):
            Generator.load(tiny_bundle("qwen3", 8).path, provider="cuda")


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLERS[0]])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_logits_raise(tiny_bundle, monkeypatch, sampling, bad):
    from dflash_edge.runtime.generator import NonFiniteLogitsError

    gen = tiny_bundle("qwen3", 8).generator
    runner, real_run = gen.target.runner, gen.target.runner.run

    def poisoned(binding):
        real_run(binding)
        for step in gen.target.steps.values():
            step["logits"][...] = bad

    monkeypatch.setattr(runner, "run", poisoned)
    with pytest.raises(NonFiniteLogitsError, match="NaN/inf logits"):
        gen.generate_ids(PROMPTS[0], 10, sampling)


def test_empty_prompt_or_no_tokens_asked(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    with pytest.raises(ValueError, match="the prompt is empty"):
        gen.generate_ids([], 5)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        gen.stream("t5", max_new_tokens=0)


# ---- light install
# -------------------------------------------------------------------------------------
def test_runtime_never_imports_torch_or_transformers(tiny_bundle):
    code = (
        "import sys\nfrom dflash_edge.runtime import Generator\n"
        f"g = Generator.load({str(tiny_bundle('qwen3', 8).path)!r})\n"
        "r = g.generate('t5 t6', max_new_tokens=12)\nassert len(r.token_ids) == 12\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.tier2
def test_runtime_only_install_runs_a_bundle(tiny_bundle, tmp_path):
    """`pip install ".[runtime]"` in a fresh venv (numpy, onnxruntime, tokenizers, jinja2) runs a
    bundle."""
    repo = Path(__file__).resolve().parents[1]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", f"{repo}[runtime]"], check=True, cwd=tmp_path
    )
    code = (
        "import sys\nfrom dflash_edge.runtime import Generator\n"
        f"r = Generator.load({str(tiny_bundle('qwen3', 8).path)!r}).generate('t5 t6', "
        "max_new_tokens=12)\n"
        "assert len(r.token_ids) == 12, r\nprint('ok', 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [str(py), "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok False"


# ---- tier 2: the default model
# ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def smollm2_bundle(smollm2_dir, tmp_path_factory):
    from dflash_edge.export.exporter import ExportOptions, export_bundle

    out = tmp_path_factory.mktemp("smol") / "bundle"
    return export_bundle(
        ExportOptions(
            out=out,
            target=str(smollm2_dir),
            draft="random",
            block_size=16,
            max_context=1024,
            verify=False,
            precision="fp32",
        ),
        progress=False,
    )


@pytest.mark.tier2
def test_smollm2_greedy_equals_torch_reference(smollm2, smollm2_bundle):
    from dflash_edge.models.reference_loop import GenerationConfig, target_generate
    from dflash_edge.runtime import Generator

    gen = Generator.load(smollm2_bundle)
    for prompt in [
        "Why is the sky blue?",
        "Write a Python function that reverses a string.",
        "List three prime numbers and explain why they are prime.",
    ]:
        ids = gen.encode(prompt)
        want = target_generate(smollm2, ids, GenerationConfig(max_new_tokens=64)).token_ids
        assert gen.generate_ids(ids, 64).token_ids == want
        assert gen.generate_ids(ids, 64, draft="none").token_ids == want


# ---- CLI
# -------------------------------------------------------------------------------------------------
def test_run_cli_streams_text_and_prints_stats(tiny_bundle, capsys):
    from dflash_edge.cli import main

    tb = tiny_bundle("qwen3", 8)
    capsys.readouterr()  # the bundle's export report, when built just now
    assert (
        main(
            [
                "run",
                str(tb.path),
                "--prompt",
                "t5 t6 t7",
                "--max-new-tokens",
                "12",
                "--always-draft",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert out.strip() == tb.generator.generate("t5 t6 t7", max_new_tokens=12).text
    steps = tb.generator.generate(
        "t5 t6 t7", max_new_tokens=12, draft="drafter"
    ).stats.acceptance_lengths
    speed, drafted, ran = err.splitlines()  # three lines: speed, what drafted, what ran
    assert re.fullmatch(
        r"12 tokens at \d+\.\d tokens/s, speed against plain decoding unknown \(run `dflash-edge "
        r"tune "
        rf"{re.escape(str(tb.path))}` to measure it\); TTFT \d+ ms \(prompt 6 tokens\); finish: "
        r"length",
        speed,
    ), speed  # no tuned.json, no plain step: says so
    assert (
        drafted
        == f"drafted: drafter {sum(steps) / len(steps):.2f} tokens/step over {len(steps)} steps"
    )
    assert ran == "ran: target_fused fp32, fp32 KV cache; drafter fp32; cpu, 1 thread"
    assert (
        main(
            [
                "run",
                str(tb.path),
                "--prompt",
                "t5",
                "--no-draft",
                "--temperature",
                "0.8",
                "--seed",
                "2",
                "--max-new-tokens",
                "5",
            ]
        )
        == 0
    )
    speed, drafted, _ = capsys.readouterr().err.splitlines()
    assert speed.startswith("5 tokens at ") and "plain decoding (the baseline)" in speed
    assert drafted == "drafted: nothing (every step decoded plainly)"


def test_run_summary_compares_with_plain_decoding(tiny_bundle):
    """Against tune's decode time when the bundle has one, else this run's plain steps; it says
    which."""
    from types import SimpleNamespace

    from dflash_edge.cli.run import summary
    from dflash_edge.runtime.stats import GenerationStats

    gen = tiny_bundle("qwen3", 8).generator
    stats = GenerationStats(
        prompt_tokens=9,
        new_tokens=41,
        decode_s=0.5,
        acceptance_lengths=[3, 2, 4],
        lookup_lengths=[5, 1],
        plain_steps=11,
        plain_s=0.25,
        plain_timed_steps=10,
        finish_reason="stop",
    )  # 80 tokens/s; plain steps: 40 tokens/s
    tuned = SimpleNamespace(
        tuned=SimpleNamespace(decode_ms=50.0), bundle=gen.bundle, target_graph="target"
    )
    lines = summary(stats, tuned, "cpu", 2).splitlines()
    assert lines[0].startswith(
        "41 tokens at 80.0 tokens/s, 4.00x plain decoding (20.0 tokens/s, estimated from tune)"
    )
    assert lines[1] == (
        "drafted: drafter 3.00 tokens/step over 3 steps, prompt lookup 3.00 tokens/step over 2 "
        "steps, "
        "11 plain steps"
    )
    assert lines[2] == "ran: target fp32, fp32 KV cache; drafter fp32; cpu, 2 threads"
    measured = summary(
        stats, SimpleNamespace(tuned=None, bundle=gen.bundle, target_graph="target_fused")
    )
    assert "2.00x plain decoding (40.0 tokens/s, measured on this run's 10 plain steps)" in measured


def test_plain_steps_are_timed_for_the_comparison(tiny_bundle):
    stats = (
        tiny_bundle("qwen3", 8).generator.generate("t5 t6", max_new_tokens=9, draft="none").stats
    )
    assert stats.plain_steps == stats.plain_timed_steps == 8  # the first token comes from prefill
    assert 0 < stats.plain_s <= stats.decode_s and stats.plain_tokens_per_s > 0


def test_bench_cli_report(tiny_bundle, tmp_path, capsys):
    from dflash_edge.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"x{i}", "category": "c", "prompt": f"t{i} t{i + 3}"}) + "\n"
            for i in range(5, 9)
        )
    )
    out = tmp_path / "bench.json"
    argv = [
        "bench",
        str(tiny_bundle("llama", 4).path),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "16",
        "--limit",
        "3",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert (
        report["lossless"] is True
        and report["prompts"] == 3
        and [r["id"] for r in rows] == ["x5", "x6", "x7"]
    )
    for r in rows:  # chat template: t1 tI tJ t2 t3
        assert (r["prompt_tokens"], r["new_tokens"], r["finish_reason"], r["lossless"]) == (
            5,
            16,
            "length",
            True,
        )
        assert r["speedup"] == pytest.approx(
            r["default_tokens_per_s"] / r["plain_tokens_per_s"], abs=2e-3
        )
    assert report["speedup"] == round(statistics.median(r["speedup"] for r in rows), 3)
    assert report["ar_tokens_per_s"] == round(
        statistics.median(r["plain_tokens_per_s"] for r in rows), 3
    )
    gen = tiny_bundle("llama", 4).generator  # tau: the always-draft arm's acceptance lengths
    taus = [
        a
        for i in (5, 6, 7)
        for a in gen.generate(
            f"t{i} t{i + 3}", max_new_tokens=16, draft="drafter"
        ).stats.acceptance_lengths
    ]
    assert report["mean_acceptance_length_arm"] == "always"
    assert report["mean_acceptance_length"] == round(statistics.mean(taus), 3)
    assert report["arms"] == ["plain", "always", "default"] and set(
        report["python_overhead"]
    ) == set(report["arms"])
    assert {k: report["bundle"][k] for k in ("block_size", "max_context", "family")} == {
        "block_size": 4,
        "max_context": MAX_CONTEXT,
        "family": "llama",
    }
    assert (report["provider"], report["max_new_tokens"], report["verify_len_override"]) == (
        "cpu",
        16,
        None,
    )
    assert (
        report["machine"]["python"] == platform.python_version()
        and 50 < report["peak_rss_mb"] < 65536
    )  # MB
    assert json.loads(capsys.readouterr().out)["lossless"] is True
    prompts.write_text('{"text": "no prompt field"}\n')
    assert main(argv) == 2 and "needs a string field 'prompt'" in capsys.readouterr().err


def test_shipped_benchmark_prompts():
    from dflash_edge.data import read_prompts as load_prompts

    rows = load_prompts(None)
    assert len(rows) >= 40 and len({r["prompt"] for r in rows}) == len(rows)
    assert {r["category"] for r in rows} >= {
        "chat",
        "code",
        "math",
        "writing",
        "knowledge",
        "lists",
    }
