"""dflash_edge.runtime — numpy + onnxruntime only (docs/design.md §2): bundles, sessions, KV
buffers, the loop.

>>> from dflash_edge.runtime import Generator                           # doctest: +SKIP
>>> Generator.load("bundle/").generate("Hi", max_new_tokens=32).text   # doctest: +SKIP
"""

from __future__ import annotations

import importlib

# public name -> "module:attribute", imported on first use (importing the package stays instant)
_LAZY = {
    "Generator": "generator:Generator",
    "GenerationOptions": "validate:GenerationOptions",
    "GenerationResult": "generator:GenerationResult",
    "GenerationStats": "stats:GenerationStats",
    "SamplingParams": "sampling:SamplingParams",
    "read_bundle": "bundle:read_bundle",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'dflash_edge.runtime' has no attribute {name!r}")
    module, attr = _LAZY[name].split(":")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value
    return value
