"""dflash_edge.quantize — bundle -> smaller bundle (+ quality report); see docs/design.md §2.

One module per precision family (`fp16.py`, `int8.py`, `int4.py`, the shared tied embedding / LM head
in `tied_embedding.py`), the bundle-to-bundle orchestrator (`bundle_quant.py`), the quality report
(`quality.py`) and the int8 KV cache (`int8_cache.py`); the CLI verb is dflash_edge/cli/quantize.py. Heavy imports
stay inside the functions.

>>> from dflash_edge.quantize.bundle_quant import QuantizeOptions, quantize_bundle   # doctest: +SKIP
>>> quantize_bundle(QuantizeOptions("bundle/", "bundle-int8/", target="int8", draft="int8"))  # doctest: +SKIP
"""
