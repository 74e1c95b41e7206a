"""The target graph's runtime wrappers: its caches (kv.py), its bound steps, the target protocol.

The loop (generator.py) calls a target through five names only: `reset`, `prefill(ids, chunk)`,
`run(ids)`, `commit(n)` and `pos`; rollback of rejected drafts is the wrapper's business. A `run`
computes logits for all its rows (a verify reads them all), a prefill chunk for its last row only
(the graph's `logits_from` input: the LM head is ~15% of a row's work on a 1.5B). One class
per target graph flavour (io_tables.GRAPHS), found by graph name in `TARGET_MODELS`:

- `TargetModel` (`target`): a sequence-major KVCache bound as `past_key` / `new_key`;
- `FusedTargetModel` (`target_fused`): GroupQueryAttention over a head-major LayerKV, bound once
  per step shape, fp32 or int8;
- `HybridTargetModel` (`target_hybrid`): the full-attention layers' KVCache plus the linear
  layers' LinearState, rolled back by `keep(n)`.

Each also fills the `[capacity, N]` feature buffer `hidden` the drafter reads (draft_model.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kv import Device, DeviceBuffer, HostStep, KVCache, KVShape, LayerKV, LinearState


@dataclass(frozen=True)
class TargetSpec:
    """What a target's buffers are sized for: `capacity` positions, the step sizes bound up front
    (`run` steps with logits on every row; more steps are bound on first use), the cache dtype, the
    zero rows the graph appends to attention's input (None: the flavour's own `PAD_ROWS`; a bundle
    says 0 for an int8 fused target) and the prefill chunk (bound with logits on its last row)."""

    capacity: int
    step_sizes: tuple[int, ...]
    kv_dtype: str
    pad_rows: int | None = None
    prefill_chunk: int | None = None


class TargetModel:
    """The target graph with its KV cache, feature buffer and one bound step per T (made on first
    use)."""

    GRAPH = "target"
    HOST = ("input_ids", "logits_from", "start", "logits", "next_ids")
    PAD_ROWS = 0
    # the cache class and the dims key of the layers it holds
    CACHE, CACHE_LAYERS = KVCache, "L"

    def __init__(self, runner, dims: dict[str, int], spec: TargetSpec):
        self.runner, self.dims, self.spec = runner, dims, spec
        self.device = Device.of(runner)
        self.pad_rows = self.PAD_ROWS if spec.pad_rows is None else spec.pad_rows
        self.kv = self._new_cache(spec.capacity, spec.kv_dtype)
        self.ran = 0  # tokens of the last `run`, not yet committed
        self.hidden = DeviceBuffer(spec.capacity, (dims["N"],), np.float32, self.device, lead=(1,))
        # (T, R) -> the step of T tokens computing logits for its last R
        self.steps: dict[tuple[int, int], HostStep] = {}
        for size in sorted(set(spec.step_sizes)):
            self.add_step(size)
        if spec.prefill_chunk:
            self.add_step(spec.prefill_chunk, rows=1)

    def _new_cache(self, capacity: int, kv_dtype: str):
        shape = KVShape(self.dims[self.CACHE_LAYERS], self.dims["Hkv"], self.dims["D"])
        return self.CACHE(capacity, shape, kv_dtype, self.device)

    def add_step(self, size: int, rows: int | None = None) -> HostStep:
        """Bind a step of `size` new tokens with logits for its last `rows` (default all; the graph
        is dynamic in T and R: any sizes work)."""
        rows = size if rows is None else rows
        step = HostStep(self.runner, self.GRAPH, {**self.dims, "T": size, "R": rows}, self.HOST)
        step["logits_from"][0] = size - rows
        self.steps[size, rows] = step
        return step

    def step(self, size: int, rows: int | None = None) -> HostStep:
        rows = size if rows is None else rows
        return self.steps.get((size, rows)) or self.add_step(size, rows)

    # ---- the target protocol (what the loop calls): reset, prefill, run, commit, pos
    @property
    def pos(self) -> int:
        """Positions cached and kept: the next `run` places its first token here."""
        return self.kv.pos

    def reset(self) -> None:
        """An empty sequence (the next call starts at position 0)."""
        self.kv.pos, self.ran = 0, 0

    def prefill(self, ids: list[int], chunk: int, start: int = 0) -> tuple[HostStep, int]:
        """Run `ids[start:]` in chunks of `chunk` tokens (the last one shorter: no row is re-run or
        padded) after the `start` positions already cached (0: from an empty cache) and keep them
        all; (the last chunk's step, the logits row of the last token: 0)."""
        self.rewind(start)
        n = len(ids)
        for first in range(start, n, chunk):
            part = ids[first : first + chunk]
            step = self.step(len(part), rows=1)
            step["input_ids"][0] = part  # [T]
            self.forward(len(part), first, rows=1)
            self._chunk_done(first, n, chunk)
        self.kv.pos, self.ran = n, 0
        return step, 0

    def _chunk_done(self, first: int, n: int, chunk: int) -> None:
        """After prefill's chunk at `first` (of `n` positions in chunks of `chunk`): a KV cache
        needs nothing kept."""

    def reusable(self, common: int) -> int:
        """Of a next sequence's first `common` tokens (equal to the cached ones), how many it keeps:
        all that are cached (a KV cache rolls back by `pos`)."""
        return min(common, self.pos)

    def rewind(self, start: int) -> None:
        """Keep the first `start` cached positions (0: an empty sequence)."""
        if not 0 <= start <= self.pos:
            raise ValueError(f"rewind({start}): {self.pos} positions are cached")
        if start == 0:
            self.reset()
        self.kv.pos, self.ran = start, 0

    def save(self) -> dict:
        """The cached sequence's state (positions [0:pos]) as host copies (prompt_cache.py)."""
        return {"pos": self.pos, "kv": self.kv.save(self.pos)}

    def restore(self, saved: dict) -> None:
        """Make a `save`d sequence the cached one."""
        self.reset()
        self.kv.restore(saved["kv"])
        self.kv.pos = saved["pos"]

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

    def forward(self, size: int, start: int, rows: int | None = None) -> HostStep:
        """Run the step of `size` tokens and `rows` logits rows (its `input_ids` already filled)
        placed at positions start.. ."""
        step = self.step(size, rows)
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
    HOST = ("input_ids", "logits_from", "seqlens_k", "total_sequence_length", "logits", "next_ids")
    CACHE = LayerKV

    def add_step(self, size: int, rows: int | None = None) -> HostStep:
        step = super().add_step(size, rows)
        self.kv.bind(step.binding)
        return step

    # pad_rows: zero rows the graph appends to attention's input, whose K/V take the slots after the
    # live ones (1 with an fp32 cache, export/fused_target.py; 0 with an int8 cache,
    # export/kv_cache.py)
    PAD_ROWS = 1

    def _place(self, step: HostStep, size: int, start: int) -> None:
        end = start + size + self.pad_rows
        if not (0 <= start and end <= self.kv.capacity):
            raise IndexError(
                f"positions [{start}:{end}] outside the preallocated cache of {self.kv.capacity}"
            )
        step["seqlens_k"][0] = start + size - 1  # GQA: total length - 1
        step["total_sequence_length"][...] = start + size


class HybridTargetModel(TargetModel):
    """`target_hybrid` (export/hybrid_target.py): the full-attention layers' KV cache (Lf layers) as
    `target`'s, plus the linear layers' `LinearState`. Rollback after a verify is `keep(accepted +
    1)`: the next call rebuilds the recurrent state after exactly those tokens (prefill chunks
    never re-run a position).

    A recurrent state cannot roll back further than the last call's start (`live`), so the last
    prefill chunks' states are kept (`snapshots`, the newest SNAPSHOTS and at most SNAPSHOT_BYTES):
    a next sequence that parts from this one inside them (an edited chat message, a keystroke
    before the suffix) resumes from the nearest, not from position 0."""

    GRAPH = "target_hybrid"
    HOST = ("input_ids", "logits_from", "start", "kept", "logits", "next_ids")

    CACHE_LAYERS = "Lf"
    SNAPSHOTS, SNAPSHOT_BYTES = 8, 256 << 20

    def __init__(self, runner, dims: dict[str, int], spec: TargetSpec):
        rows = max(*spec.step_sizes, spec.prefill_chunk or 0)  # the longest call's per-token rows
        self.state = LinearState(dims, rows, Device.of(runner))
        one = self.state.nbytes // 2  # a snapshot: one of the state's two sets
        self.max_snapshots = max(1, min(self.SNAPSHOTS, self.SNAPSHOT_BYTES // max(one, 1)))
        self.snapshots: list[StateSnapshot] = []
        self.live = 0  # the position the last call started at: the live state resumes live..pos
        super().__init__(runner, dims, spec)

    def reset(self) -> None:
        super().reset()
        self.state.reset()
        self.snapshots, self.live = [], 0

    def _resumable(self, count: int) -> tuple[int, "StateSnapshot | None"]:
        """The furthest position at or below `count` a state is known at, and the snapshot that
        holds it (None: the live state, or position 0)."""
        best = (self.live + min(count - self.live, self.state.kept), None)
        if self.live > count or self.pos == 0:
            best = (0, None)
        for snap in self.snapshots:
            at = snap.start + min(snap.rows, count - snap.start)
            if snap.start <= count and at > best[0]:
                best = (at, snap)
        return best

    def reusable(self, common: int) -> int:
        """Of a next sequence's first `common` tokens (equal to the cached ones), the most a state
        is known after: the live state's or a snapshot's (`_resumable`)."""
        return self._resumable(min(common, self.pos))[0]

    def rewind(self, start: int) -> None:
        at, snap = self._resumable(start)
        if at != start:
            raise ValueError(
                f"rewind({start}): a recurrent state is known at {at} at most (reusable())"
            )
        if start == 0:
            return self.reset()
        self.snapshots = [s.cut(start) for s in self.snapshots if s.start <= start]
        if snap is not None:
            snap.restore(self.state)
            self.live = snap.start
        self.state.kept = start - self.live
        self.kv.pos, self.ran = start, 0

    def _chunk_done(self, first: int, n: int, chunk: int) -> None:
        """Keep the state of each of a prefill's last `max_snapshots` chunks."""
        if first >= n - chunk * self.max_snapshots:
            self.snapshots.append(StateSnapshot(first, self.state.kept, self.state.save()))
            del self.snapshots[: -self.max_snapshots]

    def save(self) -> dict:
        return {**super().save(), "state": self.state.save(), "live": self.live}

    def restore(self, saved: dict) -> None:
        super().restore(saved)
        self.state.restore(saved["state"])
        self.live = saved["live"]

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

    def forward(self, size: int, start: int, rows: int | None = None) -> HostStep:
        step = super().forward(size, start, rows)
        self.state.advance(size)
        self.live = start
        return step


@dataclass(frozen=True)
class StateSnapshot:
    """A hybrid's LinearState after a call at `start` whose first `rows` tokens are kept: it
    resumes at any position start..start+rows (LinearState.save's copy)."""

    start: int
    rows: int
    saved: tuple

    def cut(self, count: int) -> "StateSnapshot":
        """Valid up to position `count` only (the ids after it changed)."""
        return StateSnapshot(self.start, min(self.rows, count - self.start), self.saved)

    def restore(self, state: LinearState) -> None:
        """Make it the live state, its `rows` kept (the caller may keep fewer)."""
        state.restore(self.saved)
        state.kept = self.rows


# graph name -> its runtime wrapper
TARGET_MODELS = {
    "target": TargetModel,
    "target_fused": FusedTargetModel,
    "target_hybrid": HybridTargetModel,
}
