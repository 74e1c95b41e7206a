"""Tier 1: `bench --report DIR` and the energy fields, on a tiny bundle (a scripted meter stands in
for RAPL)."""

from __future__ import annotations

import functools
import itertools
import json
import sys
from types import SimpleNamespace

import pytest

from dflash_edge.cli import bench_report, main
from dflash_edge.devices import meters
from dflash_edge.runtime.power import MeteredGenerator

PNG = b"\x89PNG\r\n\x1a\n"


class CountingMeter(meters.Meter):
    """A counter meter: 0.5 J per read, like RAPL's energy_uj advancing between reads."""

    name, scope = "counting", "test"

    def __init__(self):
        self.j = 0.0

    def read_j(self):
        self.j += 0.5
        return self.j


@pytest.fixture
def prompts(tmp_path):
    rows = [
        {"id": "a", "category": "chat", "prompt": "t5 t9 t12"},
        {"id": "b", "category": "code", "prompt": "t7 t3"},
        {"id": "c", "category": "chat", "prompt": "t40 t41 t42 t43"},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_bench(tb, prompts, *extra):
    return main(
        [
            "bench",
            str(tb.path),
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "10",
            "--threads",
            "1",
            *extra,
        ]
    )


def test_report_files_with_energy(tiny_bundle, prompts, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(meters, "open_meter", CountingMeter)
    clock = itertools.count(0.0, 0.25).__next__  # each generate call: 0.25 scripted seconds
    monkeypatch.setattr(
        bench_report, "MeteredGenerator", functools.partial(MeteredGenerator, clock=clock)
    )
    out = tmp_path / "report"
    assert run_bench(tiny_bundle("qwen3", 8), prompts, "--report", str(out)) == 0
    printed = json.loads(capsys.readouterr().out)
    for arm in ("plain", "speculative", "always"):  # 3 prompts x 10 tokens, 0.5 J and 0.25 s a call
        assert printed["energy"][arm] == {
            "energy_j_per_token": 0.05,
            "avg_power_w": 2.0,
            "energy_j": 1.5,
            "seconds": 0.75,
            "tokens": 30,
            "calls": 3,
        }
    report = json.loads((out / "report.json").read_text())
    figs = report["figures"]
    assert (
        set(figs["per_category"]) == {"chat", "code"}
        and figs["per_category"]["chat"]["prompts"] == 2
    )
    hist = {int(n): c for n, c in figs["acceptance_histogram"].items()}
    assert sum(hist.values()) > 0 and list(hist) == list(range(1, 9))
    assert figs["acceptance_by_position"] == {  # position k: steps accepting more than k
        str(k): round(sum(c for n, c in hist.items() if n > k) / sum(hist.values()), 4)
        for k in range(1, 8)
    }
    assert (
        figs["ms_per_token"]["plain"]["draft"] == 0
        and figs["ms_per_token"]["speculative"]["draft"] > 0
    )
    assert set(report["plots"]) == {
        "tokens_per_s.png",
        "acceptance_hist.png",
        "acceptance_by_position.png",
        "step_breakdown.png",
        "energy.png",
    }
    for name in report["plots"]:
        assert (out / name).read_bytes()[:8] == PNG
    md = (out / "report.md").read_text()
    assert "| chat | 2 |" in md and "J/token" in md and "![energy.png](energy.png)" in md
    assert (
        run_bench(tiny_bundle("qwen3", 8), prompts, "--report", str(out), "--limit", "1") == 0
    )  # replaced
    assert json.loads((out / "report.json").read_text())["prompts"] == 1


def test_figures_from_known_steps():
    def stats(lengths, new_tokens, draft_s, run_s, wall_s):
        return SimpleNamespace(
            acceptance_lengths=lengths,
            new_tokens=new_tokens,
            draft_run_s=draft_s,
            decode_run_s=run_s,
            decode_s=wall_s,
        )

    raw = [
        {
            "plain": stats([], 11, 0.0, 0.010, 0.012),
            "always": stats([4, 1, 2, 3], 11, 0.002, 0.008, 0.010),
            "default": stats([3], 11, 0.001, 0.006, 0.008),
        },
        {
            "plain": stats([], 6, 0.0, 0.004, 0.005),
            "always": stats([1, 1], 3, 0.001, 0.003, 0.004),
            "default": stats([2], 6, 0.0005, 0.003, 0.004),
        },
    ]
    rows = [
        {
            "category": "chat",
            "default_tokens_per_s": 30.0,
            "plain_tokens_per_s": 10.0,
            "drafter_tokens_per_step": 2.5,
        },
        {
            "category": "code",
            "default_tokens_per_s": 12.0,
            "plain_tokens_per_s": 8.0,
            "drafter_tokens_per_step": None,
        },
    ]
    figs = bench_report.analyse({"rows": rows, "bundle": {"block_size": 4}}, raw)
    assert figs["per_category"] == {
        "chat": {
            "spec_tokens_per_s": 30.0,
            "ar_tokens_per_s": 10.0,
            "mean_acceptance_length": 2.5,
            "prompts": 1,
        },
        "code": {
            "spec_tokens_per_s": 12.0,
            "ar_tokens_per_s": 8.0,
            "mean_acceptance_length": None,
            "prompts": 1,
        },
    }
    assert figs["acceptance_histogram"] == {
        "1": 3,
        "2": 1,
        "3": 1,
        "4": 1,
    }  # the always arm's 6 steps
    assert figs["acceptance_by_position"] == {"1": 0.5, "2": 0.3333, "3": 0.1667}
    # ms per token after the first (10 + 5): draft, target (run - draft), overhead (wall - run)
    assert figs["ms_per_token"]["speculative"] == pytest.approx(
        {"draft": 0.1, "target": 0.5, "overhead": 0.2}
    )
    assert figs["ms_per_token"]["plain"] == pytest.approx(
        {"draft": 0.0, "target": 0.933, "overhead": 0.2}
    )


def test_no_meter_gives_null_fields_with_the_reason(
    tiny_bundle, prompts, tmp_path, monkeypatch, capsys
):
    def absent():
        raise meters.MeterError("no energy meter on this machine (rapl: no RAPL zones under /x)")

    monkeypatch.setattr(meters, "open_meter", absent)
    assert (
        run_bench(tiny_bundle("qwen3", 8), prompts, "--limit", "1", "--report", str(tmp_path / "r"))
        == 0
    )
    energy = json.loads(capsys.readouterr().out)["energy"]
    assert energy["plain"] == {
        "energy_j_per_token": None,
        "avg_power_w": None,
        "reason": "no energy meter on this machine (rapl: no RAPL zones under /x)",
    }
    assert not (tmp_path / "r" / "energy.png").exists()
    assert "not measured (no energy meter" in (tmp_path / "r" / "report.md").read_text()


def test_report_refuses_a_foreign_directory(tiny_bundle, prompts, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert run_bench(tiny_bundle("qwen3", 8), prompts, "--report", str(tmp_path)) == 2
    assert "is not a bench report" in capsys.readouterr().err and (tmp_path / "notes.txt").exists()


def test_report_without_matplotlib_says_how_to_get_it(
    tiny_bundle, prompts, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert run_bench(tiny_bundle("qwen3", 8), prompts, "--report", str(tmp_path / "r")) == 2
    assert "pip install 'dflash-edge[report]'" in capsys.readouterr().err


def test_meter_vanishing_mid_bench(tiny_bundle, prompts, tmp_path, monkeypatch, capsys):
    class Vanishing(CountingMeter):
        def read_j(self):
            if self.j >= 4:  # gone after a few reads, like an unplugged rail
                raise meters.MeterError(
                    "/sys/class/powercap/intel-rapl:0/energy_uj: cannot be read (No such device)"
                )
            return super().read_j()

    monkeypatch.setattr(meters, "open_meter", Vanishing)
    assert (
        run_bench(tiny_bundle("qwen3", 8), prompts, "--report", str(tmp_path / "r")) == 0
    )  # the bench finishes
    out = json.loads(capsys.readouterr().out)
    assert out["prompts"] == 3 and out["energy"]["meter"] is None
    for arm in ("plain", "speculative"):
        assert out["energy"][arm]["energy_j_per_token"] is None
        assert (
            "stopped reading mid-run" in out["energy"][arm]["reason"]
            and "No such device" in out["energy"][arm]["reason"]
        )
    assert (tmp_path / "r" / "report.json").exists() and not (
        tmp_path / "r" / "energy.png"
    ).exists()
