"""dflash-edge: DFlash block-diffusion speculative decoding for edge devices.

The front door only: a lazy public API (nothing heavy is imported until used) and the CLI.

    >>> import dflash_edge
    >>> opts = dflash_edge.ExportOptions(out="bundle/")  # doctest: +SKIP
    >>> dflash_edge.export_bundle(opts)  # as `export`  # doctest: +SKIP
    >>> gen = dflash_edge.Generator.load("bundle/")                             # doctest: +SKIP
    >>> gen.generate("Why is the sky blue?", max_new_tokens=64).text            # doctest: +SKIP
    >>> ckpt = dflash_edge.fetch_default_model()  # SmolLM2-135M-Instruct, cached  # doctest: +SKIP
    >>> target = dflash_edge.load_target(ckpt)  # torch reference model  # doctest: +SKIP
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> "module:attribute"; modules are imported on first use so `import dflash_edge` stays
# instant.
_LAZY = {
    "Generator": "dflash_edge.runtime.generator:Generator",
    "GenerationOptions": "dflash_edge.runtime.validate:GenerationOptions",
    "ExportOptions": "dflash_edge.export.exporter:ExportOptions",
    "export_bundle": "dflash_edge.export.exporter:export_bundle",
    "QuantizeOptions": "dflash_edge.quantize.bundle_quant:QuantizeOptions",
    "quantize_bundle": "dflash_edge.quantize.bundle_quant:quantize_bundle",
    "fetch_default_model": "dflash_edge.models.fetch:fetch_default_model",
    "import_gguf": "dflash_edge.models.gguf_import:import_gguf",
    "load_target": "dflash_edge.models:load_target",
    "load_drafter": "dflash_edge.models.drafter:load_drafter",
    "speculative_generate": "dflash_edge.models.reference_loop:speculative_generate",
    "target_generate": "dflash_edge.models.reference_loop:target_generate",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'dflash_edge' has no attribute {name!r}")
    module, attr = _LAZY[name].split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
