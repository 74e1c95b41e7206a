"""Preallocated buffers bound by pointer: the KV caches, the drafter's context features, step I/O.

Everything a step touches is allocated once at load (DESIGN.md §4). Caches are sequence-major
`[capacity, L, Hkv, D]`, so the live prefix `[0:pos]` and the new rows `[pos:pos+T]` are contiguous:
the prefix is bound as `past_key` and the new rows as the graph's `new_key` output, both by pointer,
so new K/V land in the cache without a copy and rollback is moving `pos`.

The target's `hidden` output is bound the same way into a `[capacity, N]` buffer; the drafter's
`ctx_hidden` input is the slice of it it has not cached yet: no copy between the two graphs.
Small per-step tensors (ids, `start`, logits, argmax ids) live in host numpy arrays bound once.
"""
from __future__ import annotations

import numpy as np

from .io_tables import GRAPHS, resolve_shape


class DeviceBuffer:
    """A `[rows, *row_shape]` tensor on the runner's device, bound to graphs by row ranges (no copies).

    >>> buf = DeviceBuffer(8, (2, 3), np.float32)
    >>> buf.array[2:4].shape
    (2, 2, 3)
    """

    def __init__(self, rows: int, row_shape: tuple[int, ...], dtype, device: str = "cpu", device_id: int = 0,
                 lead: tuple[int, ...] = ()):
        self.rows, self.row_shape, self.dtype = rows, tuple(row_shape), np.dtype(dtype)
        self.device, self.device_id, self.lead = device, device_id, tuple(lead)   # lead: e.g. (1,) batch dim
        self.row_bytes = int(np.prod(row_shape, dtype=np.int64)) * self.dtype.itemsize
        if device == "cpu":
            self.array = np.zeros((rows, *row_shape), self.dtype)                   # [rows, *row_shape]
            self.ptr = self.array.ctypes.data
        else:   # device memory owned by onnxruntime; bound by pointer arithmetic like the host case
            import onnxruntime as ort

            self.array = None
            self._value = ort.OrtValue.ortvalue_from_shape_and_type((rows, *row_shape), self.dtype, device, device_id)
            self.ptr = self._value.data_ptr()

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def _check(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.rows:
            raise IndexError(f"rows [{start}:{stop}] outside the preallocated buffer of {self.rows} rows")

    def bind_input(self, binding, name: str, start: int, stop: int) -> None:
        self._check(start, stop)
        binding.bind_input(name, self.device, self.device_id, self.dtype, (*self.lead, stop - start, *self.row_shape),
                           self.ptr + start * self.row_bytes)

    def bind_output(self, binding, name: str, start: int, stop: int) -> None:
        self._check(start, stop)
        binding.bind_output(name, self.device, self.device_id, self.dtype, (*self.lead, stop - start, *self.row_shape),
                            self.ptr + start * self.row_bytes)


class KVCache:
    """K and V buffers `[capacity, L, Hkv, D]` and the host-side length `pos` (rollback = assign `pos`)."""

    def __init__(self, capacity: int, layers: int, kv_heads: int, head_dim: int, dtype, device="cpu", device_id=0):
        row = (layers, kv_heads, head_dim)
        self.key = DeviceBuffer(capacity, row, dtype, device, device_id)
        self.value = DeviceBuffer(capacity, row, dtype, device, device_id)
        self.pos = 0

    @property
    def capacity(self) -> int:
        return self.key.rows

    @property
    def nbytes(self) -> int:
        return self.key.nbytes + self.value.nbytes

    def bind(self, binding, start: int, count: int) -> None:
        """past = rows [0:start] (the live prefix), new = rows [start:start+count] (written in place)."""
        self.key.bind_input(binding, "past_key", 0, start)
        self.value.bind_input(binding, "past_value", 0, start)
        self.key.bind_output(binding, "new_key", start, start + count)
        self.value.bind_output(binding, "new_value", start, start + count)


class HostStep:
    """One static step shape of a graph: host arrays for its small tensors, bound once, plus its binding."""

    def __init__(self, runner, graph: str, dims: dict[str, int], host: tuple[str, ...]):
        self.binding = runner.binding()
        self.arrays: dict[str, np.ndarray] = {}
        specs = {s.name: s for side in ("inputs", "outputs") for s in GRAPHS[graph][side]}
        for name in host:
            spec = specs[name]
            arr = np.zeros(resolve_shape(spec, dims), spec.dtype)
            self.arrays[name] = arr
            bind = self.binding.bind_input if spec in GRAPHS[graph]["inputs"] else self.binding.bind_output
            bind(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]


class TargetModel:
    """The target graph with its KV cache, feature buffer and one bound step per static T."""

    HOST = ("input_ids", "start", "logits", "next_ids")

    def __init__(self, runner, dims: dict[str, int], capacity: int, step_sizes: tuple[int, ...], kv_dtype: str):
        self.runner = runner
        self.kv = KVCache(capacity, dims["L"], dims["Hkv"], dims["D"], kv_dtype, runner.device, runner.device_id)
        self.hidden = DeviceBuffer(capacity, (dims["N"],), np.float32, runner.device, runner.device_id, lead=(1,))
        self.steps = {t: HostStep(runner, "target", {**dims, "T": t}, self.HOST) for t in sorted(set(step_sizes))}

    def forward(self, size: int, start: int) -> HostStep:
        """Run the step of `size` tokens (its `input_ids` already filled) placed at positions start.. ."""
        step = self.steps[size]
        step["start"][0] = start
        self.kv.bind(step.binding, start, size)
        self.hidden.bind_output(step.binding, "hidden", start, start + size)
        self.runner.run(step.binding)
        return step


class DraftModel:
    """The drafter graph: its context KV cache (positions [0:pos] of the target's features) and block I/O."""

    HOST = ("block_ids", "start", "draft_ids")

    def __init__(self, runner, dims: dict[str, int], capacity: int, ctx: DeviceBuffer, mask_id: int, kv_dtype: str,
                 max_ctx_rows: int):
        self.runner = runner
        self.kv = KVCache(capacity, dims["Ld"], dims["Hkv"], dims["D"], kv_dtype, runner.device, runner.device_id)
        self.ctx = ctx
        self.max_ctx_rows = max_ctx_rows          # the C range the graph is built for (trt_profiles)
        self.step = HostStep(runner, "drafter", dims, self.HOST)
        self.step["block_ids"][:] = mask_id

    def draft(self, last_token: int, ctx_end: int) -> np.ndarray:
        """Greedy draft tokens [B-1] after `last_token` (a view: valid until the next call).

        Context features of positions [pos:ctx_end] are consumed from the target's buffer and cached;
        a long prompt is consumed in pieces of `max_ctx_rows` (context K/V are per position, so the
        pieces' caches are identical; only the last piece's drafts are used).
        """
        while ctx_end - self.kv.pos > self.max_ctx_rows:
            self._run(last_token, self.kv.pos + self.max_ctx_rows)
        self._run(last_token, ctx_end)
        return self.step["draft_ids"][0]

    def _run(self, last_token: int, ctx_end: int) -> None:
        step, start = self.step, self.kv.pos
        step["block_ids"][0, 0] = last_token
        step["start"][0] = start
        self.ctx.bind_input(step.binding, "ctx_hidden", start, ctx_end)
        self.kv.bind(step.binding, start, ctx_end - start)
        self.runner.run(step.binding)
        self.kv.pos = ctx_end
