"""Publish a finished directory atomically: readers see the old one or the new one, never a mix.

Lives in runtime/ (floor 2) so both export/ and quantize/ (floor 3) write bundles through it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def publish_dir(tmp: Path, out: Path) -> None:
    """Make `tmp` world-readable (mkdtemp/mkstemp create owner-only entries) and swap it in as `out`."""
    os.chmod(tmp, 0o755)
    for f in tmp.iterdir():
        os.chmod(f, 0o644)
    if not out.exists():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    try:
        os.replace(out, old / "dir")   # a non-empty directory cannot be replaced: move it aside first
        try:
            os.replace(tmp, out)
        except OSError:
            os.replace(old / "dir", out)
            raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
