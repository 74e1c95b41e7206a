"""Where an export is written before it is published, and what a killed export leaves behind.

An export writes into one folder beside `--out`, named `.<name>.export-<pid>-<random>`, and
publishes it with an atomic rename (runtime/publish.py: a swap where the OS allows, so a replaced
bundle stays loadable until the rename). A SIGKILL leaves that folder, never a bundle at
`--out`; the next export beside it removes the folders whose owning process is gone (a concurrent
export's folder is kept).

`pause_at(stage)` lets a test stop the export at a named stage (graphs, parity, calibrate, publish)
and kill it there: with DFLASH_EDGE_PAUSE_AT=<stage> and DFLASH_EDGE_PAUSE_FILE=<path> the export
writes the stage's name to <path> and then blocks opening the FIFO <path>.go, which no one writes.

>>> tmp = staging_dir(Path("bundles/b"))      # bundles/.b.export-4242-k2j3   # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from ..runtime.publish import OLD, STAGED

PAUSE_AT, PAUSE_FILE = "DFLASH_EDGE_PAUSE_AT", "DFLASH_EDGE_PAUSE_FILE"


def staging_dir(out: Path) -> Path:
    """A new, empty folder beside `out` that names this process as its owner."""
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.{STAGED}-{os.getpid()}-", dir=out.parent))


def stale_dirs(out: Path) -> list[Path]:
    """Folders beside `out` that exports (or publishes) of `out` left and whose process is gone."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.(?:{STAGED}|{OLD})-(\d+)-[^/]+")
    found = []
    for path in out.parent.iterdir() if out.parent.is_dir() else ():
        match = pattern.fullmatch(path.name)
        if match and path.is_dir() and not _alive(int(match.group(1))):
            found.append(path)
    return sorted(found)


def remove_stale(out: Path) -> list[Path]:
    """Remove `stale_dirs(out)`; returns what went."""
    gone = stale_dirs(out)
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, not ours to judge
        return True
    return True


def pause_at(stage: str) -> None:
    """Test hook: stop here for good when DFLASH_EDGE_PAUSE_AT names `stage` (module doc)."""
    if os.environ.get(PAUSE_AT) != stage:
        return
    path = Path(os.environ[PAUSE_FILE])
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(stage)
    partial.replace(path)  # the test sees the whole name or nothing
    with open(f"{path}.go"):  # a FIFO: blocks until a writer comes (none does)
        pass
