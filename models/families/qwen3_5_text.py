"""Qwen3.5's text-only layout (weights under `model.*`): the qwen3_5 family under its own name."""

from .qwen3_5 import (
    dense_view,  # noqa: F401
)
