"""Errors of the device room (floor 1: it imports nothing of ours, so it has its own base).

The CLI prints these, like runtime's `DflashEdgeError`, as one line without a traceback.
"""


class DeviceError(ValueError):
    """An unknown device or preset, a malformed profile, or a plan request that cannot be met."""


class MeterError(OSError):
    """A power meter that cannot be read (absent, not permitted, or gone mid-run)."""
