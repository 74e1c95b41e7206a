"""Preallocated buffers bound by pointer: the KV caches, the drafter's context features, step I/O.

Everything a step touches is allocated once at load (DESIGN.md §4). Caches are sequence-major
`[capacity, L, Hkv, D]`, so the live prefix `[0:pos]` and the new rows `[pos:pos+T]` are contiguous:
the prefix is bound as `past_key` and the new rows as the graph's `new_key` output, both by pointer,
so new K/V land in the cache without a copy and rollback is moving `pos`.

The target's `hidden` output is bound the same way into a `[capacity, N]` buffer; the drafter's
`ctx_hidden` input is the slice of it it has not cached yet: no copy between the two graphs.
Small per-step tensors (ids, `start`, logits, argmax ids) live in host numpy arrays bound once.

The fused target flavour (`FusedTargetModel`, issue 12) keeps its cache per layer, head-major
(`LayerKV`: layer i is `[1, Hkv, capacity, D]`), each slab bound as both the past input and the present
output of onnxruntime's GroupQueryAttention: the op reads the prefix in place and writes only the new
rows, so a step's cost grows with what attention reads, not with copying the cache.
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


class LayerKV:
    """Per-layer head-major K and V buffers, layer i = `[1, Hkv, capacity, D]`, and the host-side `pos`.

    For the fused target (GroupQueryAttention): each layer's slab is bound as BOTH `past_key.{i}` and
    `present_key.{i}`; the op sees past and present share memory, reads the live rows `[0:pos]` in place
    and writes the new ones after them. Bound once per step shape; rollback = assign `pos`.
    """

    def __init__(self, capacity: int, layers: int, kv_heads: int, head_dim: int, dtype, device="cpu", device_id=0):
        row = (kv_heads, capacity, head_dim)
        self.key = DeviceBuffer(layers, row, dtype, device, device_id)          # [L, Hkv, capacity, D]
        self.value = DeviceBuffer(layers, row, dtype, device, device_id)
        self.pos = 0

    @property
    def capacity(self) -> int:
        return self.key.row_shape[1]

    @property
    def nbytes(self) -> int:
        return self.key.nbytes + self.value.nbytes

    def bind(self, binding) -> None:
        for i in range(self.key.rows):                      # layer i -> shape [1, Hkv, capacity, D]
            for kind, buf in (("key", self.key), ("value", self.value)):
                buf.bind_input(binding, f"past_{kind}.{i}", i, i + 1)
                buf.bind_output(binding, f"present_{kind}.{i}", i, i + 1)


class TargetModel:
    """The target graph with its KV cache, feature buffer and one bound step per T (made on first use)."""

    GRAPH = "target"
    HOST = ("input_ids", "start", "logits", "next_ids")
    PAD_ROWS = 0

    def __init__(self, runner, dims: dict[str, int], capacity: int, step_sizes: tuple[int, ...], kv_dtype: str,
                 pad_rows: int | None = None):
        self.runner, self.dims = runner, dims
        self.pad_rows = self.PAD_ROWS if pad_rows is None else pad_rows
        self.kv = self._new_cache(capacity, kv_dtype)
        self.hidden = DeviceBuffer(capacity, (dims["N"],), np.float32, runner.device, runner.device_id, lead=(1,))
        self.steps: dict[int, HostStep] = {}
        for size in sorted(set(step_sizes)):
            self.add_step(size)

    def _new_cache(self, capacity: int, kv_dtype: str):
        d = self.dims
        return KVCache(capacity, d["L"], d["Hkv"], d["D"], kv_dtype, self.runner.device, self.runner.device_id)

    def add_step(self, size: int) -> HostStep:
        """Bind a step of `size` new tokens (the graph is dynamic in T: any size works)."""
        self.steps[size] = HostStep(self.runner, self.GRAPH, {**self.dims, "T": size}, self.HOST)
        return self.steps[size]

    def step(self, size: int) -> HostStep:
        return self.steps.get(size) or self.add_step(size)

    def _place(self, step: HostStep, size: int, start: int) -> None:
        step["start"][0] = start
        self.kv.bind(step.binding, start, size)

    def forward(self, size: int, start: int) -> HostStep:
        """Run the step of `size` tokens (its `input_ids` already filled) placed at positions start.. ."""
        step = self.step(size)
        self._place(step, size, start)
        self.hidden.bind_output(step.binding, "hidden", start, start + size)
        self.runner.run(step.binding)
        return step


class FusedTargetModel(TargetModel):
    """`target_fused`: GroupQueryAttention over `LayerKV` (bound once per step; only lengths change).

    The cache is fp32 (or the bundle's dtype), or int8 with per-channel scales inside the graph
    (`quantize --kv-cache int8`): the buffers are then int8 and the runtime never reads them.
    """

    GRAPH = "target_fused"
    HOST = ("input_ids", "seqlens_k", "total_sequence_length", "logits", "next_ids")

    def _new_cache(self, capacity: int, kv_dtype: str):
        d = self.dims
        return LayerKV(capacity, d["L"], d["Hkv"], d["D"], kv_dtype, self.runner.device, self.runner.device_id)

    def add_step(self, size: int) -> HostStep:
        step = super().add_step(size)
        self.kv.bind(step.binding)
        return step

    # pad_rows: zero rows the graph appends to attention's input, whose K/V take the slots after the live
    # ones (1 with an fp32 cache, export/fused_target.py; 0 with an int8 cache, quantize/int8_cache.py)
    PAD_ROWS = 1

    def _place(self, step: HostStep, size: int, start: int) -> None:
        end = start + size + self.pad_rows
        if not (0 <= start and end <= self.kv.capacity):
            raise IndexError(f"positions [{start}:{end}] outside the preallocated cache of {self.kv.capacity}")
        step["seqlens_k"][0] = start + size - 1                     # GQA: total length - 1
        step["total_sequence_length"][...] = start + size


TARGET_MODELS = {"target": TargetModel, "target_fused": FusedTargetModel}   # graph name -> its runtime wrapper


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
