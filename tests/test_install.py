"""A non-editable install behaves like the checkout: the shipped drafter and prompt sets are package
data.

The wheel is built from this checkout and installed with `pip install --target` into a folder that
is put first on PYTHONPATH; every command runs from a directory outside the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = [
    "dflash_edge/data/prompts/bench.jsonl",
    "dflash_edge/data/prompts/quote.jsonl",
    "dflash_edge/data/prompts/heldout.jsonl",
    "dflash_edge/data/drafters/smollm2-135m-instruct/config.json",
    "dflash_edge/data/drafters/smollm2-135m-instruct/model.safetensors",
    "dflash_edge/data/drafters/smollm2-135m-instruct/draft_vocab.json",
    "dflash_edge/devices/presets.json",
    "dflash_edge/devices/profiles/jetson-agx-thor.json",
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel, site folder holding the non-editable install)."""
    root = tmp_path_factory.mktemp("install")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            str(REPO),
            "-w",
            str(root / "wheel"),
        ],
        check=True,
        cwd=root,
        capture_output=True,
    )
    wheel = next((root / "wheel").glob("dflash_edge-*.whl"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(root / "site"),
            str(wheel),
        ],
        check=True,
        cwd=root,
        capture_output=True,
    )
    return wheel, root / "site"


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=1800
    )


def _cli(site: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    return _run(
        site, cwd, "-c", "import sys; from dflash_edge.cli import main; sys.exit(main())", *argv
    )


@pytest.mark.tier2
def test_wheel_ships_the_data(installed):
    names = set(zipfile.ZipFile(installed[0]).namelist())
    assert [f for f in SHIPPED if f not in names] == []


@pytest.mark.tier2
def test_installed_package_reads_its_own_data(installed, tmp_path):
    code = (
        "import json, dflash_edge, dflash_edge.data as d\n"
        "print(json.dumps([dflash_edge.__file__, str(d.shipped_drafter(576, 49152, 30)),"
        " len(d.read_prompts(None)), len(d.read_prompts('quote')), "
        "len(d.read_prompts('heldout'))]))"
    )
    out = _run(installed[1], tmp_path, "-c", code)
    assert out.returncode == 0, out.stderr
    init, drafter, bench, quote, heldout = json.loads(out.stdout)
    site = str(installed[1])
    assert init.startswith(site) and drafter.startswith(site), (
        init,
        drafter,
    )  # not the checkout's copies
    checkout = [
        json.loads(line)
        for line in (REPO / "data" / "prompts" / "bench.jsonl").read_text().splitlines()
    ]
    assert (bench, quote, heldout) == (len(checkout), 10, 60)


@pytest.mark.tier2
def test_installed_export_uses_the_shipped_drafter_and_bench_needs_no_prompts(
    installed, smollm2_dir, tmp_path
):
    site = installed[1]
    out = _cli(site, tmp_path, "export", "--out", "b", "--no-verify")
    assert out.returncode == 0, out.stderr
    assert "RANDOMLY INITIALISED" not in out.stderr
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert (
        manifest["source"]["drafter"].startswith(str(site))
        and not manifest["source"]["drafter_random_init"]
    )
    report = tmp_path / "bench.json"
    out = _cli(
        site,
        tmp_path,
        "bench",
        "b",
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
        "--skip-always",
        "--no-power",
        "--json",
        str(report),
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(report.read_text())["rows"]
    assert [r["id"] for r in rows] == ["chat-01", "chat-02"]  # the shipped set's first prompts
    out = _cli(site, tmp_path, "tune", "b", "--budget-s", "5", "--max-new-tokens", "8")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "b" / "tuned.json").is_file()
