"""A DFlash drafter (models/draft_config.py): the portable drafter graph, no outputs of its own."""

from __future__ import annotations

from ...models.draft_config import DraftConfig as Config
from ..portable_drafter import build_drafter as build

__all__ = ["Config", "build"]
QUANTIZATION_NOTE = None


def check_options(opts) -> None:
    """Every export option applies to a DFlash drafter."""


def manifest_fields(dc) -> dict:
    """No keys beyond the common drafter ones."""
    return {}


def io_dims(dc) -> dict:
    """No symbols beyond the common ones (Ld, Lw)."""
    return {}


def weight_format(fmt, tc):
    """The drafter graph's WeightFormat: the exporter's `fmt` as it is."""
    return fmt


def reference_graph(dc):
    """models/graphs.DrafterGraph; with sliding layers the windowed one (its split cache)."""
    from ...models.drafter import WindowedDrafterGraph
    from ...models.graphs import DrafterGraph

    return WindowedDrafterGraph if dc.window_layers else DrafterGraph


def parity_view(names, got: tuple, want: tuple) -> tuple[tuple, tuple]:
    """Outputs compared as they are."""
    return got, want
