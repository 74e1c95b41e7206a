"""Publish a finished directory atomically: readers see the old one or the new one, never a mix.

Lives in runtime/ (floor 2) so every writer of bundles publishes through it. Where Linux allows,
an existing `out` is swapped with the new folder in one `renameat2(RENAME_EXCHANGE)`: a process
killed at any moment leaves `out` as the old bundle or the new one. Elsewhere the old folder is
moved aside first (`.<name>.old-<pid>-*`): a kill between the two renames leaves no `out` at all.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import tempfile
from pathlib import Path

# .<name>.export-<pid>-*: being written; .<name>.old-<pid>-*: the bundle it replaces
STAGED, OLD = "export", "old"
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def publish_dir(tmp: Path, out: Path) -> None:
    """Make `tmp` world-readable (mkdtemp/mkstemp create owner-only entries) and swap it in as
    `out`."""
    _readable(tmp)
    if not out.exists():
        os.replace(tmp, out)
        return
    if _exchange(tmp, out):  # `tmp` now holds the old bundle
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.{OLD}-{os.getpid()}-", dir=out.parent))
    try:
        # a non-empty directory cannot be replaced: move it aside first
        os.replace(out, old / "dir")
        try:
            os.replace(tmp, out)
        except OSError:
            os.replace(old / "dir", out)
            raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _readable(folder: Path) -> None:
    """Folders 0o755, files 0o644, down into sub-folders (a bundle's flavours)."""
    os.chmod(folder, 0o755)
    for f in folder.iterdir():
        if f.is_dir() and not f.is_symlink():
            _readable(f)
        else:
            os.chmod(f, 0o644)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the OS or file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rename = libc.renameat2
    except (OSError, AttributeError):
        return False
    rename.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return rename(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0
