"""User-facing errors. Every message names the bad thing (file, key, value) and says the fix.

`DflashEdgeError` is the base of every error the CLI prints without a traceback. devices/ (floor 1,
below this one) has its own `DeviceError`; the CLI treats both alike (cli/__init__.py: USER_ERRORS).
"""


class DflashEdgeError(Exception):
    """Base for errors the CLI prints without a traceback."""


class ModelFormatError(DflashEdgeError, ValueError):
    """A checkpoint, GGUF, config or weight file is missing, malformed or does not fit."""


class CorruptFileError(ModelFormatError):
    """A GGUF / safetensors file whose header declares counts, sizes or offsets its bytes cannot
    hold: truncated or corrupt (re-download it). Raised before anything is allocated from them."""

    @classmethod
    def at(cls, path, what: str) -> "CorruptFileError":
        """`path: what — the file is truncated or corrupt: re-download it`, one line."""
        return cls(f"{path}: {what} — the file is truncated or corrupt: re-download it")


class ContextOverflowError(DflashEdgeError, ValueError):
    """A prompt (plus generation) does not fit in the preallocated context."""


class UnsafeTemplateError(DflashEdgeError, ValueError):
    """A chat template reached for something the sandbox forbids (Python internals, unsafe
    attributes); nothing it asked for was run."""
