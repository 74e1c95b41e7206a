"""Preallocated buffers bound by pointer: the KV caches, the drafter's context features, step I/O.

Everything a step touches is allocated once at load (docs/design.md §4). Caches are sequence-major
`[capacity, L, Hkv, D]`, so the live prefix `[0:pos]` and the new rows `[pos:pos+T]` are contiguous:
the prefix is bound as `past_key` and the new rows as the graph's `new_key` output, both by pointer,
so new K/V land in the cache without a copy and rollback is moving `pos`.

The target's `hidden` output is bound the same way into a `[capacity, N]` buffer; the drafter's
`ctx_hidden` input is the slice of it it has not cached yet: no copy between the two graphs. Small
per-step tensors (ids, `start`, logits, argmax ids) live in host numpy arrays bound once
(`HostStep`). A drafter's sliding-window layers (models/draft_config.py) keep only the W-1
positions their block queries can see (`WindowKV`, a buffer of W-1 + C rows that slides), beside
the full layers' cache (`DraftKV`).

The fused target flavour (targets.FusedTargetModel, issue 12) keeps its cache per layer,
head-major (`LayerKV`: layer i is `[1, Hkv, capacity, D]`), each slab bound as both the past input
and the present output of onnxruntime's GroupQueryAttention: the op reads the prefix in place and
writes only the new rows, so a step's cost grows with what attention reads, not with copying the
cache.

A hybrid target (targets.HybridTargetModel, issue 26) caches K/V for its full-attention layers
only; its linear layers' conv and recurrent states (`LinearState`: fixed size whatever the context)
are handed from call to call with the last call's per-token rows, and rollback is telling the next
call how many of those tokens to keep.

The graph wrappers that own these buffers (the targets, the drafter) are targets.py and
draft_model.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .io_tables import GRAPHS, resolve_shape


@dataclass(frozen=True)
class Device:
    """Where buffers live, as onnxruntime names it: "cpu" (host numpy arrays) or "cuda" and its id.

    >>> Device("cuda", 1)
    Device(name='cuda', id=1)
    """

    name: str = "cpu"
    id: int = 0

    @classmethod
    def of(cls, runner) -> "Device":
        """The device a graph runner's buffers live on (session.OrtGraph: `device`, `device_id`)."""
        return cls(runner.device, runner.device_id)


CPU = Device()


class KVShape(NamedTuple):
    """One position's K (or V) rows in a cache: layers, KV heads, head dim."""

    layers: int
    kv_heads: int
    head_dim: int


class DeviceBuffer:
    """A `[rows, *row_shape]` tensor on the runner's device, bound to graphs by row ranges (no
    copies).

    >>> buf = DeviceBuffer(8, (2, 3), np.float32)
    >>> buf.array[2:4].shape
    (2, 2, 3)
    """

    def __init__(
        self,
        rows: int,
        row_shape: tuple[int, ...],
        dtype,
        device: Device = CPU,
        lead: tuple[int, ...] = (),
    ):
        self.rows, self.row_shape, self.dtype = rows, tuple(row_shape), np.dtype(dtype)
        # lead: e.g. (1,) batch dim
        self.device, self.device_id, self.lead = device.name, device.id, tuple(lead)
        self.row_bytes = int(np.prod(row_shape, dtype=np.int64)) * self.dtype.itemsize
        if device.name == "cpu":
            self.array = np.zeros((rows, *row_shape), self.dtype)  # [rows, *row_shape]
            self.ptr = self.array.ctypes.data
        else:  # device memory owned by onnxruntime; bound by pointer arithmetic like the host case
            import onnxruntime as ort

            self.array = None
            self._value = ort.OrtValue.ortvalue_from_shape_and_type(
                (rows, *row_shape), self.dtype, device.name, device.id
            )
            self.ptr = self._value.data_ptr()

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def host(self) -> np.ndarray:
        """The contents on the host: the buffer itself on the CPU, a copy of a device buffer (write
        it back with `store`)."""
        return self.array if self.array is not None else self._value.numpy()

    def store(self, host: np.ndarray) -> None:
        """Write `host` (from `host()`, changed) back: nothing to do on the CPU, a copy to the
        device otherwise."""
        if self.array is None:
            self._value.update_inplace(host)

    def _check(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.rows:
            raise IndexError(
                f"rows [{start}:{stop}] outside the preallocated buffer of {self.rows} rows"
            )

    def bind_input(self, binding, name: str, start: int, stop: int) -> None:
        """Bind rows [start:stop] as graph input `name` (shape `[*lead, stop - start, *row]`)."""
        self._bind(binding.bind_input, name, start, stop)

    def bind_output(self, binding, name: str, start: int, stop: int) -> None:
        """Bind rows [start:stop] as graph output `name`: the graph writes them in place."""
        self._bind(binding.bind_output, name, start, stop)

    def _bind(self, bind, name: str, start: int, stop: int) -> None:
        self._check(start, stop)
        shape = (*self.lead, stop - start, *self.row_shape)
        bind(
            name, self.device, self.device_id, self.dtype, shape, self.ptr + start * self.row_bytes
        )


def copy_rows(buf: DeviceBuffer, start: int, stop: int, axis: int = 0) -> np.ndarray:
    """A host copy of `buf`'s positions [start:stop] along `axis` of its array."""
    return np.array(buf.host()[(slice(None),) * axis + (slice(start, stop),)])


def put_rows(buf: DeviceBuffer, rows: np.ndarray, start: int, axis: int = 0) -> None:
    """Write `rows` (from copy_rows) back at positions start.. along `axis`."""
    host = buf.host()
    host[(slice(None),) * axis + (slice(start, start + rows.shape[axis]),)] = rows
    buf.store(host)


class _KeyValue:
    """A K and a V buffer of the same shape: what every cache here holds. `save(count)` copies
    positions [0:count] out (a kept sequence: prompt_cache.py), `restore` writes them back."""

    AXIS = 0  # the position axis of the buffers' arrays

    def __init__(self, rows: int, row: tuple[int, ...], dtype, device: Device):
        self.key = DeviceBuffer(rows, row, dtype, device)
        self.value = DeviceBuffer(rows, row, dtype, device)

    @property
    def nbytes(self) -> int:
        return self.key.nbytes + self.value.nbytes

    def save(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        return tuple(copy_rows(b, 0, count, self.AXIS) for b in (self.key, self.value))

    def restore(self, saved: tuple[np.ndarray, np.ndarray]) -> None:
        for buf, rows in zip((self.key, self.value), saved):
            put_rows(buf, rows, 0, self.AXIS)


class KVCache(_KeyValue):
    """K and V buffers `[capacity, L, Hkv, D]` and the host-side length `pos` (rollback = assign
    `pos`)."""

    def __init__(self, capacity: int, shape: KVShape, dtype, device: Device = CPU):
        super().__init__(capacity, tuple(shape), dtype, device)
        self.pos = 0

    @property
    def capacity(self) -> int:
        return self.key.rows

    def bind(self, binding, start: int, count: int) -> None:
        """past = rows [0:start] (the live prefix), new = rows [start:start+count] (written in
        place)."""
        self.key.bind_input(binding, "past_key", 0, start)
        self.value.bind_input(binding, "past_value", 0, start)
        self.key.bind_output(binding, "new_key", start, start + count)
        self.value.bind_output(binding, "new_value", start, start + count)


class WindowKV(_KeyValue):
    """The drafter's sliding-window layers' context K/V: only the `keep` = W-1 positions before each
    run's `start` (the most any block query of those layers sees, models/draft_config.py), so memory
    and cost stop growing.

    Buffers `[keep + max_new, Lw, Hkv, D]`; row r holds position `base + r` (rows of negative
    positions are empty and masked by the graph). A run binds the `keep` rows before `start` as
    `window_key` and the `count` rows after them as `new_window_key` (both by pointer). When the
    next run would not fit, the `keep` rows before its start move to the front (`slide`: one copy of
    W-1 rows every ~max_new positions, never the context).

    >>> win = WindowKV(keep=3, max_new=4, shape=KVShape(1, 1, 2), dtype=np.float32)
    >>> win.rows_for(start=0, count=4)
    (0, 3, 7)
    >>> win.rows_for(start=4, count=2)        # rows 4..6 (positions 1..3) move to the front
    (0, 3, 5)
    """

    def __init__(self, keep: int, max_new: int, shape: KVShape, dtype, device: Device = CPU):
        super().__init__(keep + max_new, tuple(shape), dtype, device)
        self.keep = keep
        self.base = -keep  # position of row 0: the window before position 0 is empty

    def rows_for(self, start: int, count: int) -> tuple[int, int, int]:
        """(first window row, first new row, end row) for `count` new positions at `start`, sliding
        first if needed."""
        row = start - self.base
        if row < self.keep or row + count > self.key.rows:
            self.slide(start)
            row = self.keep
        return row - self.keep, row, row + count

    def slide(self, start: int) -> None:
        """Make rows [0:keep] hold positions start-keep .. start-1 (zeros where they were never
        written: a reset to position 0, or a jump past what is held, as cost benchmarks do)."""
        lo, hi = start - self.keep - self.base, start - self.base
        for buf in (self.key, self.value):
            host = buf.host()  # a device buffer: via the host
            if 0 <= lo and hi <= buf.rows:
                host[: self.keep] = host[lo:hi]  # numpy handles the overlap
            else:
                host[: self.keep] = 0
            buf.store(host)
        self.base = start - self.keep

    def save(self, count: int = 0) -> tuple:
        """All its rows (at most W-1 + C) and the position of row 0."""
        return (*super().save(self.key.rows), self.base)

    def restore(self, saved: tuple) -> None:
        super().restore(saved[:2])
        self.base = saved[2]

    def bind(self, binding, start: int, count: int) -> None:
        first, row, end = self.rows_for(start, count)
        self.key.bind_input(binding, "window_key", first, row)
        self.value.bind_input(binding, "window_value", first, row)
        self.key.bind_output(binding, "new_window_key", row, end)
        self.value.bind_output(binding, "new_window_value", row, end)


class DraftKV(KVCache):
    """The drafter's context cache: a KVCache of its full-attention layers (every position) plus,
    when some layers slide, a WindowKV of those (`window`); one host-side `pos` (positions consumed)
    for both."""

    def __init__(
        self, capacity: int, dims: dict[str, int], max_new: int, dtype, device: Device = CPU
    ):
        super().__init__(capacity, KVShape(dims["Ld"], dims["Hkv"], dims["D"]), dtype, device)
        self.window = (
            WindowKV(
                dims["Wm1"], max_new, KVShape(dims["Lw"], dims["Hkv"], dims["D"]), dtype, device
            )
            if dims.get("Lw")
            else None
        )

    @property
    def nbytes(self) -> int:
        return super().nbytes + (self.window.nbytes if self.window else 0)

    def save(self, count: int) -> tuple:
        return super().save(count), self.window.save() if self.window else None

    def restore(self, saved: tuple) -> None:
        super().restore(saved[0])
        if self.window is not None:
            self.window.restore(saved[1])

    def bind(self, binding, start: int, count: int) -> None:
        if self.key.row_shape[0]:  # a drafter whose layers all slide has no past_key input
            super().bind(binding, start, count)
        if self.window is not None:
            self.window.bind(binding, start, count)


class HostStep:
    """One static step shape of a graph: host arrays for its small tensors, bound once, plus its
    binding."""

    def __init__(self, runner, graph: str, dims: dict[str, int], host: tuple[str, ...]):
        self.binding = runner.binding()
        self.arrays: dict[str, np.ndarray] = {}
        specs = {s.name: s for side in ("inputs", "outputs") for s in GRAPHS[graph][side]}
        for name in host:
            spec = specs[name]
            arr = np.zeros(resolve_shape(spec, dims), spec.dtype)
            self.arrays[name] = arr
            bind = (
                self.binding.bind_input
                if spec in GRAPHS[graph]["inputs"]
                else self.binding.bind_output
            )
            bind(name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]


class LayerKV(_KeyValue):
    """Per-layer head-major K and V buffers, layer i = `[1, Hkv, capacity, D]`, and the host-side
    `pos`.

    For the fused target (GroupQueryAttention): each layer's slab is bound as BOTH `past_key.{i}`
    and `present_key.{i}`; the op sees past and present share memory, reads the live rows `[0:pos]`
    in place and writes the new ones after them. Bound once per step shape; rollback = assign `pos`.
    """

    AXIS = 2

    def __init__(self, capacity: int, shape: KVShape, dtype, device: Device = CPU):
        # [L, Hkv, capacity, D]
        super().__init__(shape.layers, (shape.kv_heads, capacity, shape.head_dim), dtype, device)
        self.pos = 0

    @property
    def capacity(self) -> int:
        return self.key.row_shape[1]

    def bind(self, binding) -> None:
        for i in range(self.key.rows):  # layer i -> shape [1, Hkv, capacity, D]
            for kind, buf in (("key", self.key), ("value", self.value)):
                buf.bind_input(binding, f"past_{kind}.{i}", i, i + 1)
                buf.bind_output(binding, f"present_{kind}.{i}", i, i + 1)


class LinearState:
    """A hybrid target's linear-attention carry between calls (io_tables `target_hybrid`): the
    states at a call's start and its per-token rows, twice (the call reads one set and writes the
    other; `swap` flips them), and how many of the last call's tokens the next one keeps (its
    rollback: export/hybrid_target.py rebuilds the state).

    >>> st = LinearState({"Ll": 1, "Cv": 4, "Km1": 3, "Hv": 2, "Dk": 2, "Dv": 2}, max_tokens=8)
    >>> st.sets[0]["rec_base"].array.shape, st.sets[0]["prev_k"].array.shape
    ((1, 2, 2, 2), (8, 1, 2, 2))
    """

    BASES = {
        "conv_base": ("conv_start", ("Cv", "Km1")),
        "rec_base": ("rec_start", ("Hv", "Dk", "Dv")),
    }
    ROWS = {
        "prev_qkv": ("qkv", ("Ll", "Cv")),
        "prev_k": ("delta_k", ("Ll", "Hv", "Dk")),
        "prev_u": ("delta_u", ("Ll", "Hv", "Dv")),
        "prev_decay": ("decay", ("Ll", "Hv")),
    }

    def __init__(self, dims: dict[str, int], max_tokens: int, device: Device = CPU):
        self.sets = [self._buffers(dims, max_tokens, device) for _ in range(2)]
        self.reset()

    def _buffers(self, dims: dict[str, int], max_tokens: int, device: Device) -> dict:
        """One set: bases `[Ll, ...]`, per-token rows `[max_tokens, Ll, ...]`."""
        rows = {**{n: dims["Ll"] for n in self.BASES}, **{n: max_tokens for n in self.ROWS}}
        return {
            n: DeviceBuffer(rows[n], tuple(dims[d] for d in shape), np.float32, device)
            for n, (_, shape) in {**self.BASES, **self.ROWS}.items()
        }

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for bufs in self.sets for b in bufs.values())

    def reset(self) -> None:
        """Zero states, no previous tokens."""
        self.cur, self.last, self.kept = 0, 0, 0
        for buf in self.sets[0].values():
            host = buf.host()
            host[...] = 0
            buf.store(host)

    def bind(self, binding, count: int) -> None:
        """Inputs: the current set (the last call's `last` rows); outputs: the other set (`count`
        rows)."""
        now, nxt = self.sets[self.cur], self.sets[1 - self.cur]
        for name, (out, _) in self.BASES.items():
            now[name].bind_input(binding, name, 0, now[name].rows)
            nxt[name].bind_output(binding, out, 0, nxt[name].rows)
        for name, (out, _) in self.ROWS.items():
            now[name].bind_input(binding, name, 0, self.last)
            nxt[name].bind_output(binding, out, 0, count)

    def save(self) -> tuple[dict, int, int]:
        """The current set's copy and its (last, kept) rows: what the next call starts from."""
        bufs = self.sets[self.cur]
        return {n: np.array(b.host()) for n, b in bufs.items()}, self.last, self.kept

    def restore(self, saved: tuple[dict, int, int]) -> None:
        arrays, self.last, self.kept = saved
        for name, buf in self.sets[self.cur].items():
            put_rows(buf, arrays[name], 0)

    def advance(self, count: int) -> None:
        """After a call of `count` tokens: its outputs are the next inputs; all of them kept unless
        told less."""
        self.cur, self.last, self.kept = 1 - self.cur, count, count
