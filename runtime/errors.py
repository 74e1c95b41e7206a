"""User-facing errors. Every message names the bad thing (file, key, value) and says the fix.

Lives on the lowest floor that raises them so every stage (and the CLI) can share one hierarchy.
"""


class DflashEdgeError(Exception):
    """Base for errors the CLI prints without a traceback."""


class ModelFormatError(DflashEdgeError, ValueError):
    """A checkpoint, GGUF, config or weight file is missing, malformed or does not fit."""


class ContextOverflowError(DflashEdgeError, ValueError):
    """A prompt (plus generation) does not fit in the preallocated context."""
