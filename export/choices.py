"""The export's "auto" choices, made once for the Python API and the CLI alike.

`precision="auto"` keeps a low-bit source low-bit: a checkpoint imported from a GGUF carries its
exact blocks (int4 for Q4_*), a mixture-of-experts target is written at int4 (onnxruntime's QMoE is
its only expert kernel whose rows do not depend on the step's length: docs/BENCHMARKS.md), anything
else fp32. With `device` set, the device plan picks the precision and max context that fit
(device_plan.py). `draft_precision=None`: the planner's default for the target's precision.
`kv_cache="auto"`: int8 for int4 / int8 targets that get a fused graph (calibrated on the written
graph: kv_cache.py), else fp32; on a GPU / Jetson device every other float32 cache (the portable
target's, the drafter's) at float16 (kv16.py), and the drafter fp16 (the planner's default; an
overflowing fp16 drafter falls back to int8 weights: exporter.py). `low_bit_ops="auto"`: contrib
(MatMulNBits, the source's own blocks) without a device or for a CPU one, tensorrt (TensorRT's
weight-only blocks) for a GPU / Jetson one.

>>> resolve_choices(ExportOptions(out="b/"))[0].precision       # doctest: +SKIP
'fp32'
"""

from __future__ import annotations

import dataclasses
import sys

from ..devices.errors import DeviceError
from ..devices.planner import default_draft_precision
from ..models.checkpoint import BLOCKS
from ..runtime.errors import DflashEdgeError
from .device_plan import (
    EXPORT_PRECISIONS,
    choose_for_device,
    device_class_of,
    drafter_dims,
    low_bit_ops_for,
)
from .kv_cache import check_kv_cache, check_request
from .sources import open_target

AUTO = "auto"
# the block when the drafter allows it: verify(16) is where a CPU still pays (docs/BENCHMARKS.md)
DEFAULT_BLOCK = 16
SHORTEST_CHAT = [{"role": "user", "content": "Hi"}]


def resolve_choices(opts, target=None):
    """(`opts` (ExportOptions) with each "auto" replaced by its choice, the opened target it read
    to choose: sources.Target, for the writers); checks the shortest chat fits. `target`: one
    opened already (else `opts.target` is opened here)."""
    target = target or open_target(opts.target)
    opts = dataclasses.replace(
        opts, block_size=opts.block_size or default_block(opts.draft, target)
    )
    precision, context = opts.precision, opts.max_context
    if opts.device:  # the device plan picks what fits, or refuses by name
        wanted = EXPORT_PRECISIONS if precision in (None, AUTO) else (precision,)
        precision, context = choose_for_device(
            opts.device, target, opts.draft, opts.block_size, context, wanted
        )
    if precision in (None, AUTO):
        precision = auto_precision(target)
    device_class = device_class_of(opts.device)
    gpu = device_class != "cpu"
    draft = (
        opts.draft_precision
        if opts.draft_precision not in (None, AUTO)
        else default_draft_precision(precision, device_class)
    )
    kv = opts.kv_cache
    if kv in (None, AUTO):
        kv = "fp32" if precision in ("fp32", "fp16") or not opts.fused else "int8"
    check_request(precision, check_kv_cache(kv))
    # a GPU / Jetson: every float32 cache at 16 bits (kv16.py); not for an fp32 target by name
    kv16 = opts.kv16 if opts.kv16 is not None else gpu and precision != "fp32"
    check_shortest_chat(target.tokenizer, opts.block_size, context)
    ops = opts.low_bit_ops
    if ops in (None, AUTO):  # the device plan's: TensorRT's blocks on a GPU / Jetson
        ops = low_bit_ops_for(opts.device)
    chosen = dict(
        precision=precision, draft_precision=draft, kv_cache=kv, max_context=context, kv16=kv16
    )
    return dataclasses.replace(opts, **chosen, low_bit_ops=ops), target


def default_block(draft: str | None, target) -> int:
    """The block a drafter was trained for, at most DEFAULT_BLOCK: a drafter trained at 8 (z-lab's
    DFlash2) exports at 8 unless told otherwise (said on stderr); a random one at DEFAULT_BLOCK."""
    trained = _trained_block(draft, target)
    block = min(DEFAULT_BLOCK, trained or DEFAULT_BLOCK)
    if block != DEFAULT_BLOCK:
        print(
            f"export: block size {block}, the drafter's trained block (--block-size chooses a "
            f"smaller one)",
            file=sys.stderr,
        )
    return block


def _trained_block(draft: str | None, target) -> int | None:
    """The trained block of the drafter export writes for `draft` (device_plan.drafter_dims, as
    the planner reads it); None when its config cannot be read (open_drafter names the problem)."""
    try:
        return drafter_dims(draft, target.config).block_size
    except DeviceError:
        return None


def auto_precision(target) -> str:
    """int4 for a checkpoint with exact low-bit blocks (a GGUF, imported or read in place) or a
    mixture of experts, else fp32; `target`: sources.Target."""
    experts = getattr(target.config, "num_experts", 0)
    low_bit = target.gguf or (target.dir / BLOCKS).is_file() or bool(experts)
    return "int4" if low_bit else "fp32"


def check_shortest_chat(tok, block_size: int, max_context: int) -> None:
    """A one-word chat prompt must fit the context, before ~30 s of loading the models; `tok`: the
    target's ChatTokenizer."""
    n = len(tok.encode_chat(SHORTEST_CHAT) if tok.chat_template else tok.encode("Hi"))
    if n + block_size > max_context:
        raise DflashEdgeError(
            f"--max-context {max_context}: even the shortest chat prompt ({n} "
            f"tokens with the chat template) plus one block of {block_size} does "
            f"not fit; use --max-context >= {n + block_size} (2048: the default)"
        )
