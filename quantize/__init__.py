"""dflash_edge.quantize — bundle -> its model re-exported at another precision + quality report.

`bundle_quant.py` re-exports from the checkpoints the bundle records (through export/, the one
writer) and `quality.py` measures the result against the input bundle; the CLI verb is
cli/quantize.py. Floor 5: it calls export/.

>>> from dflash_edge.quantize.bundle_quant import QuantizeOptions, quantize_bundle  # doctest: +SKIP
>>> quantize_bundle(  # doctest: +SKIP
...     QuantizeOptions("bundle/", "bundle-int8/", target="int8", draft="int8"))
"""
