"""Preallocated buffers bound by pointer: the KV caches, the drafter's context features, step I/O.

Everything a step touches is allocated once at load (docs/design.md §4). Caches are sequence-major
`[capacity, L, Hkv, D]`, so the live prefix `[0:pos]` and the new rows `[pos:pos+T]` are contiguous:
the prefix is bound as `past_key` and the new rows as the graph's `new_key` output, both by pointer,
so new K/V land in the cache without a copy and rollback is moving `pos`.

The target's `hidden` output is bound the same way into a `[capacity, N]` buffer; the drafter's
`ctx_hidden` input is the slice of it it has not cached yet: no copy between the two graphs. Small
per-step tensors (ids, `start`, logits, argmax ids) live in host numpy arrays bound once. A
drafter's sliding-window layers (models/draft_config.py) keep only the W-1 positions their block
queries can see (`WindowKV`, a buffer of W-1 + C rows that slides), beside the full layers' cache
(`DraftKV`).

The fused target flavour (`FusedTargetModel`, issue 12) keeps its cache per layer, head-major
(`LayerKV`: layer i is `[1, Hkv, capacity, D]`), each slab bound as both the past input and the
present output of onnxruntime's GroupQueryAttention: the op reads the prefix in place and writes
only the new rows, so a step's cost grows with what attention reads, not with copying the cache.

A hybrid target (`HybridTargetModel`, issue 26) caches K/V for its full-attention layers only; its
linear layers' conv and recurrent states (`LinearState`: fixed size whatever the context) are handed
from call to call with the last call's per-token rows, and rollback is telling the next call how
many of those tokens to keep."""

from __future__ import annotations

import numpy as np

from .io_tables import GRAPHS, resolve_shape


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
        device: str = "cpu",
        device_id: int = 0,
        lead: tuple[int, ...] = (),
    ):
        self.rows, self.row_shape, self.dtype = rows, tuple(row_shape), np.dtype(dtype)
        # lead: e.g. (1,) batch dim
        self.device, self.device_id, self.lead = (
            device,
            device_id,
            tuple(lead),
        )
        self.row_bytes = int(np.prod(row_shape, dtype=np.int64)) * self.dtype.itemsize
        if device == "cpu":
            self.array = np.zeros((rows, *row_shape), self.dtype)  # [rows, *row_shape]
            self.ptr = self.array.ctypes.data
        else:  # device memory owned by onnxruntime; bound by pointer arithmetic like the host case
            import onnxruntime as ort

            self.array = None
            self._value = ort.OrtValue.ortvalue_from_shape_and_type(
                (rows, *row_shape), self.dtype, device, device_id
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
        self._check(start, stop)
        binding.bind_input(
            name,
            self.device,
            self.device_id,
            self.dtype,
            (*self.lead, stop - start, *self.row_shape),
            self.ptr + start * self.row_bytes,
        )

    def bind_output(self, binding, name: str, start: int, stop: int) -> None:
        self._check(start, stop)
        binding.bind_output(
            name,
            self.device,
            self.device_id,
            self.dtype,
            (*self.lead, stop - start, *self.row_shape),
            self.ptr + start * self.row_bytes,
        )


class KVCache:
    """K and V buffers `[capacity, L, Hkv, D]` and the host-side length `pos` (rollback = assign
    `pos`)."""

    def __init__(
        self,
        capacity: int,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype,
        device="cpu",
        device_id=0,
    ):
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
        """past = rows [0:start] (the live prefix), new = rows [start:start+count] (written in
        place)."""
        self.key.bind_input(binding, "past_key", 0, start)
        self.value.bind_input(binding, "past_value", 0, start)
        self.key.bind_output(binding, "new_key", start, start + count)
        self.value.bind_output(binding, "new_value", start, start + count)


class WindowKV:
    """The drafter's sliding-window layers' context K/V: only the `keep` = W-1 positions before each
    run's `start` (the most any block query of those layers sees, models/draft_config.py), so memory
    and cost stop growing.

    Buffers `[keep + max_new, Lw, Hkv, D]`; row r holds position `base + r` (rows of negative
    positions are empty and masked by the graph). A run binds the `keep` rows before `start` as
    `window_key` and the `count` rows after them as `new_window_key` (both by pointer). When the
    next run would not fit, the `keep` rows before its start move to the front (`slide`: one copy of
    W-1 rows every ~max_new positions, never the context).

    >>> win = WindowKV(keep=3, max_new=4, layers=1, kv_heads=1, head_dim=2, dtype=np.float32)
    >>> win.rows_for(start=0, count=4)
    (0, 3, 7)
    >>> win.rows_for(start=4, count=2)        # rows 4..6 (positions 1..3) move to the front
    (0, 3, 5)
    """

    def __init__(
        self,
        keep: int,
        max_new: int,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype,
        device="cpu",
        device_id=0,
    ):
        row = (layers, kv_heads, head_dim)
        self.keep = keep
        self.key = DeviceBuffer(keep + max_new, row, dtype, device, device_id)
        self.value = DeviceBuffer(keep + max_new, row, dtype, device, device_id)
        self.base = -keep  # position of row 0: the window before position 0 is empty

    @property
    def nbytes(self) -> int:
        return self.key.nbytes + self.value.nbytes

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
        self, capacity: int, dims: dict[str, int], max_new: int, dtype, device="cpu", device_id=0
    ):
        super().__init__(capacity, dims["Ld"], dims["Hkv"], dims["D"], dtype, device, device_id)
        self.window = (
            WindowKV(
                dims["Wm1"], max_new, dims["Lw"], dims["Hkv"], dims["D"], dtype, device, device_id
            )
            if dims.get("Lw")
            else None
        )

    @property
    def nbytes(self) -> int:
        return super().nbytes + (self.window.nbytes if self.window else 0)

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


class LayerKV:
    """Per-layer head-major K and V buffers, layer i = `[1, Hkv, capacity, D]`, and the host-side
    `pos`.

    For the fused target (GroupQueryAttention): each layer's slab is bound as BOTH `past_key.{i}`
    and `present_key.{i}`; the op sees past and present share memory, reads the live rows `[0:pos]`
    in place and writes the new ones after them. Bound once per step shape; rollback = assign `pos`.
    """

    def __init__(
        self,
        capacity: int,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype,
        device="cpu",
        device_id=0,
    ):
        row = (kv_heads, capacity, head_dim)
        self.key = DeviceBuffer(layers, row, dtype, device, device_id)  # [L, Hkv, capacity, D]
        self.value = DeviceBuffer(layers, row, dtype, device, device_id)
        self.pos = 0

    @property
    def capacity(self) -> int:
        return self.key.row_shape[1]

    @property
    def nbytes(self) -> int:
        return self.key.nbytes + self.value.nbytes

    def bind(self, binding) -> None:
        for i in range(self.key.rows):  # layer i -> shape [1, Hkv, capacity, D]
            for kind, buf in (("key", self.key), ("value", self.value)):
                buf.bind_input(binding, f"past_{kind}.{i}", i, i + 1)
                buf.bind_output(binding, f"present_{kind}.{i}", i, i + 1)


class TargetModel:
    """The target graph with its KV cache, feature buffer and one bound step per T (made on first
    use)."""

    GRAPH = "target"
    HOST = ("input_ids", "start", "logits", "next_ids")
    PAD_ROWS = 0

    def __init__(
        self,
        runner,
        dims: dict[str, int],
        capacity: int,
        step_sizes: tuple[int, ...],
        kv_dtype: str,
        pad_rows: int | None = None,
    ):
        self.runner, self.dims = runner, dims
        self.pad_rows = self.PAD_ROWS if pad_rows is None else pad_rows
        self.kv = self._new_cache(capacity, kv_dtype)
        self.ran = 0  # tokens of the last `run`, not yet committed
        self.hidden = DeviceBuffer(
            capacity, (dims["N"],), np.float32, runner.device, runner.device_id, lead=(1,)
        )
        self.steps: dict[int, HostStep] = {}
        for size in sorted(set(step_sizes)):
            self.add_step(size)

    def _new_cache(self, capacity: int, kv_dtype: str):
        d = self.dims
        return KVCache(
            capacity, d["L"], d["Hkv"], d["D"], kv_dtype, self.runner.device, self.runner.device_id
        )

    def add_step(self, size: int) -> HostStep:
        """Bind a step of `size` new tokens (the graph is dynamic in T: any size works)."""
        self.steps[size] = HostStep(self.runner, self.GRAPH, {**self.dims, "T": size}, self.HOST)
        return self.steps[size]

    def step(self, size: int) -> HostStep:
        return self.steps.get(size) or self.add_step(size)

    # Whether a prefill chunk may re-run positions already cached (the last chunk overlapping the
    # previous one
    # instead of padding): harmless for a KV cache (identical rows), not for a recurrent state.
    RERUN_OK = True

    # ---- the target protocol (what the loop calls): reset, prefill, run, commit, pos ----------
    @property
    def pos(self) -> int:
        """Positions cached and kept: the next `run` places its first token here."""
        return self.kv.pos

    def reset(self) -> None:
        """An empty sequence (the next call starts at position 0)."""
        self.kv.pos, self.ran = 0, 0

    def prefill(self, ids: list[int], chunk: int) -> tuple[HostStep, int]:
        """From an empty cache, run `ids` in static chunks of `chunk` and keep them all; (the last
        chunk's step, its row for the last token)."""
        self.reset()
        n = len(ids)
        for start in chunk_starts(n, chunk, self.RERUN_OK):
            part = ids[start : start + chunk]
            step = self.step(chunk if self.RERUN_OK else len(part))  # else: a shorter last chunk
            step["input_ids"][0, : len(part)] = part
            step["input_ids"][0, len(part) :] = part[-1]  # padding (only when n < P): causal
            self.forward(step["input_ids"].shape[1], start)
        self.kv.pos, self.ran = n, 0
        return step, n - 1 - start

    def run(self, ids) -> HostStep:
        """Run `ids` (T tokens) at positions pos.. : the step's `logits` [1, T, V], `next_ids`
        [1, T] and hidden rows; none of the tokens is kept until `commit`."""
        step = self.step(len(ids))
        step["input_ids"][0] = ids  # [T]
        self.ran = len(ids)
        return self.forward(len(ids), self.kv.pos)

    def commit(self, count: int) -> None:
        """Keep the last `run`'s first `count` tokens (1..T); the rest roll back (a KV cache: by
        moving `pos`, a recurrent state: rebuilt after them by the next call)."""
        if not 1 <= count <= self.ran:
            raise ValueError(
                f"commit({count}): the last run had {self.ran} tokens; commit 1..{self.ran}"
            )
        self.keep(count)
        self.kv.pos, self.ran = self.kv.pos + count, 0

    def keep(self, count: int) -> None:
        """The last call's first `count` tokens are accepted: a KV cache rolls back by `pos`
        alone."""

    def _place(self, step: HostStep, size: int, start: int) -> None:
        step["start"][0] = start
        self.kv.bind(step.binding, start, size)

    def forward(self, size: int, start: int) -> HostStep:
        """Run the step of `size` tokens (its `input_ids` already filled) placed at positions
        start.. ."""
        step = self.step(size)
        self._place(step, size, start)
        self.hidden.bind_output(step.binding, "hidden", start, start + size)
        self.runner.run(step.binding)
        return step


class FusedTargetModel(TargetModel):
    """`target_fused`: GroupQueryAttention over `LayerKV` (bound once per step; only lengths
    change).

    The cache is fp32 (or the bundle's dtype), or int8 with per-channel scales inside the graph
    (`quantize --kv-cache int8`): the buffers are then int8 and the runtime never reads them.
    """

    GRAPH = "target_fused"
    HOST = ("input_ids", "seqlens_k", "total_sequence_length", "logits", "next_ids")

    def _new_cache(self, capacity: int, kv_dtype: str):
        d = self.dims
        return LayerKV(
            capacity, d["L"], d["Hkv"], d["D"], kv_dtype, self.runner.device, self.runner.device_id
        )

    def add_step(self, size: int) -> HostStep:
        step = super().add_step(size)
        self.kv.bind(step.binding)
        return step

    # pad_rows: zero rows the graph appends to attention's input, whose K/V take the slots after the
    # live
    # ones (1 with an fp32 cache, export/fused_target.py; 0 with an int8 cache, export/kv_cache.py)
    PAD_ROWS = 1

    def _place(self, step: HostStep, size: int, start: int) -> None:
        end = start + size + self.pad_rows
        if not (0 <= start and end <= self.kv.capacity):
            raise IndexError(
                f"positions [{start}:{end}] outside the preallocated cache of {self.kv.capacity}"
            )
        step["seqlens_k"][0] = start + size - 1  # GQA: total length - 1
        step["total_sequence_length"][...] = start + size


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

    def __init__(self, dims: dict[str, int], max_tokens: int, device="cpu", device_id=0):
        def buffers() -> dict[str, DeviceBuffer]:  # bases [Ll, ...]; rows [max_tokens, Ll, ...]
            out = {
                n: DeviceBuffer(
                    dims["Ll"], tuple(dims[d] for d in shape), np.float32, device, device_id
                )
                for n, (_, shape) in self.BASES.items()
            }
            out.update(
                {
                    n: DeviceBuffer(
                        max_tokens, tuple(dims[d] for d in shape), np.float32, device, device_id
                    )
                    for n, (_, shape) in self.ROWS.items()
                }
            )
            return out

        self.sets = [buffers(), buffers()]
        self.reset()

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

    def advance(self, count: int) -> None:
        """After a call of `count` tokens: its outputs are the next inputs; all of them kept unless
        told less."""
        self.cur, self.last, self.kept = 1 - self.cur, count, count


class HybridTargetModel(TargetModel):
    """`target_hybrid` (export/hybrid_target.py): the full-attention layers' KV cache (Lf layers) as
    `target`'s, plus the linear layers' `LinearState`. Rollback after a verify is `keep(accepted +
    1)`: the next call rebuilds the recurrent state after exactly those tokens, so prefill chunks
    must never re-run a position (RERUN_OK)."""

    GRAPH = "target_hybrid"
    HOST = ("input_ids", "start", "kept", "logits", "next_ids")
    RERUN_OK = False

    def __init__(
        self,
        runner,
        dims: dict[str, int],
        capacity: int,
        step_sizes: tuple[int, ...],
        kv_dtype: str,
        pad_rows: int | None = None,
    ):
        self.state = LinearState(dims, max(step_sizes), runner.device, runner.device_id)
        super().__init__(runner, dims, capacity, step_sizes, kv_dtype, pad_rows)

    def _new_cache(self, capacity: int, kv_dtype: str):
        d = self.dims
        return KVCache(
            capacity, d["Lf"], d["Hkv"], d["D"], kv_dtype, self.runner.device, self.runner.device_id
        )

    def reset(self) -> None:
        super().reset()
        self.state.reset()

    def keep(self, count: int) -> None:
        if not 1 <= count <= self.state.last:
            raise ValueError(
                f"keep({count}): the last call ran {self.state.last} tokens; keep "
                f"1..{self.state.last}"
            )
        self.state.kept = count

    def _place(self, step: HostStep, size: int, start: int) -> None:
        super()._place(step, size, start)
        step["kept"][0] = self.state.kept
        self.state.bind(step.binding, size)

    def forward(self, size: int, start: int) -> HostStep:
        step = super().forward(size, start)
        self.state.advance(size)
        return step


# graph name -> its runtime wrapper
TARGET_MODELS = {
    "target": TargetModel,
    "target_fused": FusedTargetModel,
    "target_hybrid": HybridTargetModel,
}


class DraftModel:
    """The drafter graph: its context KV cache (DraftKV: positions [0:pos] of the target's features,
    the sliding layers' last W-1 of them) and block I/O."""

    HOST = ("block_ids", "start", "draft_ids")

    def __init__(
        self,
        runner,
        dims: dict[str, int],
        capacity: int,
        ctx: DeviceBuffer,
        mask_id: int,
        kv_dtype: str,
        max_ctx_rows: int,
    ):
        self.runner = runner
        self.kv = DraftKV(capacity, dims, max_ctx_rows, kv_dtype, runner.device, runner.device_id)
        self.ctx = ctx
        self.max_ctx_rows = max_ctx_rows  # the C range the graph is built for (trt_profiles)
        lattice = ("candidate_ids", "lattice_scores") if dims.get("Kc") else ()  # DFlash2
        self.step = HostStep(runner, "drafter", dims, self.HOST + lattice)
        self.step["block_ids"][:] = mask_id

    def reset(self) -> None:
        """An empty context (a new sequence)."""
        self.kv.pos = 0

    def draft(self, last_token: int, ctx_end: int) -> np.ndarray:
        """Greedy draft tokens [B-1] after `last_token` (a view: valid until the next call).

        Context features of positions [pos:ctx_end] are consumed from the target's buffer and
        cached; a long prompt is consumed in pieces of `max_ctx_rows` (context K/V are per position,
        so the pieces' caches are identical; only the last piece's drafts are used)."""
        while ctx_end - self.kv.pos > self.max_ctx_rows:
            self._run(last_token, self.kv.pos + self.max_ctx_rows)
        self._run(last_token, ctx_end)
        return self.step["draft_ids"][0]

    def lattice(self) -> tuple[np.ndarray, np.ndarray]:
        """A DFlash2 drafter's last lattice (views): candidates [B-1, Kc], scores [B-1, Kc, Kc]."""
        return self.step["candidate_ids"][0], self.step["lattice_scores"][0]

    def _run(self, last_token: int, ctx_end: int) -> None:
        step, start = self.step, self.kv.pos
        step["block_ids"][0, 0] = last_token
        step["start"][0] = start
        self.ctx.bind_input(step.binding, "ctx_hidden", start, ctx_end)
        self.kv.bind(step.binding, start, ctx_end - start)
        self.runner.run(step.binding)
        self.kv.pos = ctx_end


def chunk_starts(n: int, size: int, rerun_ok: bool = True) -> list[int]:
    """Chunk starts covering [0, n): the last chunk overlaps the previous one instead of running
    past n (unless re-running a position is not allowed: then it is shorter).

    >>> chunk_starts(10, 4), chunk_starts(10, 4, rerun_ok=False)
    ([0, 4, 6], [0, 4, 8])
    """
    starts = list(range(0, n, size))
    if rerun_ok and n >= size and starts[-1] + size > n:
        starts[-1] = n - size  # recomputes a few cached rows (identical K/V), never pads
    return starts
