"""Qwen3.5's text-only layout (weights under `model.*`): the qwen3_5 family under its own name."""

from .qwen3_5 import *  # noqa: F403  (qwen3_5's interface: its __all__)
