"""User-facing errors. Every message names the bad thing (file, key, value) and says the fix.

Lives on the lowest floor that raises them so every stage (and the CLI) can share one hierarchy.
"""
from dflash_edge.devices.errors import DflashEdgeError  # noqa: F401  (the base lives on floor 1, devices/)


class ModelFormatError(DflashEdgeError, ValueError):
    """A checkpoint, GGUF, config or weight file is missing, malformed or does not fit."""


class ContextOverflowError(DflashEdgeError, ValueError):
    """A prompt (plus generation) does not fit in the preallocated context."""
