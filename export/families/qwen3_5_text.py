"""qwen3_5_text: Qwen3.5's text-only layout, written like qwen3_5."""

from .qwen3_5 import mlp_writers, target_writers  # noqa: F401
