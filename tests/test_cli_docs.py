"""docs/cli.md is the verbs' own `--help`, regenerated and compared (tier 1)."""

import re
import sys
from pathlib import Path

import pytest

from dflash_edge.cli import docs

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def test_cli_page_matches_the_help():
    committed = PAGE.read_text()
    made = re.search(r"argparse of Python (\d+)\.(\d+)", committed)
    if made and tuple(map(int, made.groups())) != sys.version_info[:2]:
        pytest.skip(f"docs/cli.md is from Python {made[1]}.{made[2]}; argparse differs")
    assert docs.render() == committed, f"docs/cli.md is out of date; regenerate: {docs.COMMAND}"


def test_cli_page_does_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = docs.render()
    monkeypatch.setenv("COLUMNS", "250")
    assert docs.render() == narrow
