"""The exporter's numeric arguments (`dflash-edge export`, and the verbs that size a draft block:
generate, train, eval-drafter): their ranges, checked by the shared `runtime.validate.check`
(`check(name, value, rules=RULES)`).

>>> from dflash_edge.runtime.validate import check
>>> check("block_size", 16, rules=RULES)
16
"""

from __future__ import annotations

from ..runtime.validate import Number

RULES: dict[str, Number] = {
    "block_size": Number(int, 2, 256, note="the last token plus at least one mask"),
    "max_context": Number(int, 1, 1 << 24),
    "prefill_chunk": Number(int, 1, 1 << 16),
    "draft_vocab": Number(int, 0, None, note="0 = the whole vocabulary"),
}
