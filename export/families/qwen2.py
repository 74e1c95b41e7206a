"""qwen2: a dense target, written portable and fused (portable_target.py, fused_target.py)."""

from ..dense_writers import dense_mlps as mlp_writers  # noqa: F401
from ..dense_writers import dense_writers as target_writers  # noqa: F401
