"""Issue 34 item 4: an export killed with SIGKILL at any moment never leaves a bundle at `--out`
that fails to load; the next export succeeds and removes the partial folders killed runs left.

The kill points are deterministic: export/staging.pause_at stops the exporter at a named stage (it
writes the stage's name to a file and blocks on a FIFO nobody writes), and only then is it killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dflash_edge.cli import main
from dflash_edge.export.staging import PAUSE_AT, PAUSE_FILE, remove_stale
from dflash_edge.models import load_target
from dflash_edge.models.drafter import DraftConfig, new_drafter, save_drafter
from dflash_edge.runtime.bundle import read_bundle

from fixtures_bundle import export_args

WAIT_S = 600  # a guard against a hung test only: reaching the stage ends the wait


def _drafter(tmp_path, ckpt):
    cfg = DraftConfig.for_target(
        load_target(ckpt).config, num_layers=1, block_size=4, mask_token_id=5
    )
    return save_drafter(new_drafter(cfg, seed=1), tmp_path / "draft")


def _args(out, ckpt, draft, force=False) -> list[str]:
    flags = ["--precision", "int4", *(["--force"] if force else [])]
    return export_args(out, ckpt, draft, *flags, context=128, chunk=8)


def _kill_at(stage: str, args: list[str], tmp_path) -> None:
    """Run `dflash-edge ARGS` in a child process, wait until it reaches `stage`, SIGKILL it."""
    marker = tmp_path / "reached"
    os.mkfifo(f"{marker}.go")
    env = {**os.environ, PAUSE_AT: stage, PAUSE_FILE: str(marker)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_edge.cli", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + WAIT_S
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"the export ended before {stage!r}: {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the export did not reach {stage!r}")
        time.sleep(0.05)  # polling for the marker, not standing in for it
    assert marker.read_text() == stage
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    os.unlink(f"{marker}.go")
    marker.unlink()


def _leftovers(out):
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


@pytest.mark.parametrize("stage", ["graphs", "parity", "calibrate", "publish"])
def test_sigkill_leaves_no_broken_bundle_and_the_next_export_cleans_up(
    tiny_checkpoints, tmp_path, stage
):
    ckpt = tiny_checkpoints["qwen3"][1]  # head_dim 16: fused target, int8 cache
    draft = _drafter(tmp_path, ckpt)
    out = tmp_path / "bundles" / "b"
    replacing = stage == "publish"  # --force over a bundle that must stay loadable
    if replacing:
        assert main(_args(out, ckpt, draft)) == 0
        before = read_bundle(out, verify=True).manifest["checksum"]
    _kill_at(stage, _args(out, ckpt, draft, force=replacing), tmp_path)
    if out.exists():
        bundle = read_bundle(out, verify=True)  # complete, every sha256 holds
        assert not replacing or bundle.manifest["checksum"] == before
    assert replacing or not out.exists()
    assert _leftovers(out), "the killed export left its partial folder (the next one removes it)"
    assert main(_args(out, ckpt, draft, force=True)) == 0
    fused = read_bundle(out, verify=True).manifest["graphs"]["target_fused"]
    assert fused["kv_cache"]["dtype"] == "int8"
    assert _leftovers(out) == []


def test_a_live_exports_folder_is_kept(tmp_path):
    out = tmp_path / "b"
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead, live = int(done.stdout), os.getpid()  # a finished process; this one (alive)
    for pid in (dead, live):
        (tmp_path / f".b.export-{pid}-x").mkdir()
    (tmp_path / ".b.old-1x").mkdir()  # not ours: no pid field
    gone = remove_stale(out)
    assert [p.name for p in gone] == [f".b.export-{dead}-x"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".b.export-{live}-x", ".b.old-1x"]
