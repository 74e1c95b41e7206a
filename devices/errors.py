"""The user-facing error base, on the lowest floor that raises one (devices/, floor 1).

`runtime/errors.py` re-exports `DflashEdgeError`, so every stage and the CLI share this one hierarchy.
"""


class DflashEdgeError(Exception):
    """Base for errors the CLI prints without a traceback."""


class DeviceError(DflashEdgeError, ValueError):
    """An unknown device or preset, a malformed profile, or a plan request that cannot be met."""


class MeterError(DflashEdgeError, OSError):
    """A power meter that cannot be read (absent, not permitted, or gone mid-run)."""
