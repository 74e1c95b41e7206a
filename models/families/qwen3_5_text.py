"""Qwen3.5's text-only layout (weights under `model.*`): the qwen3_5 family under its own name."""

from .qwen3_5 import (  # noqa: F401  (qwen3_5's interface, re-exported)
    GGUF,
    Config,
    attention_spec,
    check_tensors,
    dense_view,
    manifest_fields,
    mlp_specs,
    planner_dims,
    reference,
    tensors,
    text_prefix,
)
