"""The drafter graph's runtime wrapper: its context cache (kv.DraftKV), block I/O, `draft`.

The drafter reads the target's features from the target's own `hidden` buffer (targets.py) by
pointer, caching what it has consumed; a DFlash2 drafter also hands out its lattice (lattice.py
walks it)."""

from __future__ import annotations

import numpy as np

from .kv import Device, DeviceBuffer, DraftKV, HostStep, copy_rows, put_rows


class DraftModel:
    """The drafter graph: its context KV cache (DraftKV: positions [0:pos] of the target's features,
    the sliding layers' last W-1 of them) and block I/O."""

    HOST = ("block_ids", "start", "draft_ids")

    def __init__(
        self,
        runner,
        dims: dict[str, int],
        ctx: DeviceBuffer,
        mask_id: int,
        kv_dtype: str,
        max_ctx_rows: int,
    ):
        self.runner = runner
        # as many positions as the target's feature buffer `ctx` holds
        self.kv = DraftKV(ctx.rows, dims, max_ctx_rows, kv_dtype, Device.of(runner))
        self.ctx = ctx
        self.max_ctx_rows = max_ctx_rows  # the C range the graph is built for (trt_profiles)
        lattice = ("candidate_ids", "lattice_scores") if dims.get("Kc") else ()  # DFlash2
        self.step = HostStep(runner, "drafter", dims, self.HOST + lattice)
        self.step["block_ids"][:] = mask_id

    def reset(self) -> None:
        """An empty context (a new sequence)."""
        self.kv.pos = 0

    def rewind(self, keep: int) -> None:
        """Keep the context of the first `keep` positions (context K/V are per position); a sliding
        window cannot roll back, so it re-reads the context from the target's features."""
        self.kv.pos = (
            0 if self.kv.window is not None and keep < self.kv.pos else min(keep, self.kv.pos)
        )

    def save(self, upto: int) -> dict:
        """Its context cache and the target features [pos:upto] it has not read yet (a sliding
        window, which re-reads from 0 on a rewind: [0:upto]) as host copies (prompt_cache.py)."""
        first = 0 if self.kv.window is not None else self.kv.pos
        ctx = copy_rows(self.ctx, first, upto)
        return {"pos": self.kv.pos, "kv": self.kv.save(self.kv.pos), "ctx": (first, ctx)}

    def restore(self, saved: dict) -> None:
        """Make a `save`d context the current one."""
        self.kv.restore(saved["kv"])
        self.kv.pos = saved["pos"]
        put_rows(self.ctx, saved["ctx"][1], saved["ctx"][0])

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
