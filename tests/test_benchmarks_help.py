"""Every benchmark script answers `--help` (exit 0, a usage line) without doing any work: a script
that no longer runs against the current code shows here, not on the day someone needs its figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def test_benchmarks_found():
    assert len(BENCHMARKS) > 30


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_help(script):
    run = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("usage:"), run.stdout[:500]
