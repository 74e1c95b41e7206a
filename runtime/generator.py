"""`Generator`: the DFlash draft -> verify -> accept -> advance loop over a bundle (numpy + onnxruntime).

    prefill (chunks) -> [draft block -> verify block -> accept prefix + bonus -> move pos] -> ...

Every emitted token is the target's own choice at its position (`sampling.select_token`, keyed by
absolute position, exactly as `export/reference_loop.py`), so output with the drafter equals output
without it, token for token, greedy or sampled. Buffers are preallocated at load (`kv.py`).

>>> gen = Generator.load("bundle/")                                     # doctest: +SKIP
>>> res = gen.generate("Why is the sky blue?", max_new_tokens=64)      # doctest: +SKIP
>>> res.text, res.stats.mean_acceptance_length                          # doctest: +SKIP
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from .bundle import Bundle, BundleError, read_bundle
from .emitter import Emitter
from .errors import ContextOverflowError, DflashEdgeError
from .guard import GenerationGuard
from .io_tables import GRAPHS, io_manifest, model_dims, pick_graph
from .kv import TARGET_MODELS, DraftModel, TargetModel
from .lookup import PromptLookup
from .policy import AdaptivePolicy
from .sampling import SamplingParams, select_token
from .session import SessionConfig, open_graph, shared_initializers
from .stats import GenerationStats
from .trt_profiles import symbol_ranges, trt_profiles
from .tuning import Tuned, check_verify_len, read_tuned
from .validate import GenerationArgs, InvalidArgumentError, check, check_token_ids, check_use_draft


class NonFiniteLogitsError(DflashEdgeError):
    """The target produced NaN or inf logits."""


@dataclass
class GenerationResult:
    text: str                       # generated part only
    token_ids: list[int]            # generated part only
    stats: GenerationStats

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason


@dataclass
class Request:
    """One generation's inputs, resolved (prompt tokenized, sampling validated)."""

    prompt_ids: list[int]
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    use_draft: bool | str = "auto"  # "auto" (policy.py: per step, what pays), True (always draft), False (plain)
    t_call: float = 0.0             # perf_counter() when the call began (TTFT includes tokenizing)
    verify_len: int | None = None   # drafts verified per step (1..B-1); None: tuned / adaptive (True: B-1)


class Stream:
    """Text pieces as they are decoded; `.result` (a GenerationResult) once exhausted.

    Holds its Generator (`guard.py`) until exhausted or closed: `close()`, a `with` block, or dropping it.
    """

    def __init__(self, pieces: Iterator[str], hold=None):
        self._pieces, self._hold = pieces, hold
        self.result: GenerationResult | None = None

    def __iter__(self):
        try:
            self.result = yield from self._pieces
        finally:
            self.close()

    def close(self) -> None:
        """Stop generating (at the current step) and free the Generator for the next generation."""
        self._pieces.close()
        if self._hold is not None:
            self._hold.release()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_pieces", None) is not None:
            self.close()


class TextAssembler:
    """Committed tokens -> text pieces: never half a character, cut at (and never showing) a stop string.

    Decodes a short window of tokens (HF's prefix/read offsets) so a piece is only released once it
    decodes to whole characters; with stop strings, the last len(stop)-1 characters wait until safe.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.tokens: list[int] = []
        self.prefix = self.read = self.shown = 0
        self.text, self.stopped = "", False

    def add(self, token: int) -> str:
        if self.stopped:
            return ""
        self.tokens.append(token)
        before = self.tokenizer.decode(self.tokens[self.prefix:self.read])
        now = self.tokenizer.decode(self.tokens[self.prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):   # a whole character more
            self._append(now[len(before):])
            self.prefix, self.read = self.read, len(self.tokens)
        return self._release(final=False)

    def finish(self) -> str:
        if not self.stopped:
            self._append(self.tokenizer.decode(self.tokens[self.prefix:])[len(
                self.tokenizer.decode(self.tokens[self.prefix:self.read])):])
            self.prefix = self.read = len(self.tokens)
        return self._release(final=True)

    def _append(self, new: str) -> None:
        scan = max(len(self.text) - self.hold, 0)
        self.text += new
        hits = [i for i in (self.text.find(s, scan) for s in self.stop) if i >= 0]
        if hits:
            self.text, self.stopped = self.text[:min(hits)], True

    def _release(self, final: bool) -> str:
        end = len(self.text) if final or self.stopped else max(len(self.text) - self.hold, self.shown)
        piece, self.shown = self.text[self.shown:end], end
        return piece


class Generator:
    """A loaded bundle: target and drafter graphs, their preallocated caches, the tokenizer."""

    def __init__(self, bundle: Bundle, tokenizer, target: TargetModel, drafter: DraftModel,
                 tuned: Tuned | None = None):
        self.bundle, self.tokenizer, self.target, self.drafter = bundle, tokenizer, target, drafter
        self.block_size = bundle.block_size
        self.prefill_chunk = bundle.manifest["prefill_chunk"]
        self.max_context = bundle.max_context
        self.eos = frozenset(bundle.model["eos_token_ids"])
        self.tuned = tuned                                          # tuning.py: None until `dflash-edge tune`
        self._guard = GenerationGuard()             # one sequence at a time (the caches are single-sequence)

    @classmethod
    def load(cls, bundle: str | Path | Bundle, provider: str = "cpu", *, threads: int = 0, spin: bool = True,
             verify: bool = True, target_graph: str | None = None, use_tuned: bool = True,
             share_weights: bool = True) -> "Generator":
        """Open a bundle on `provider` ("cpu", "cuda", "tensorrt"); sha256-checks files unless verify=False.

        `target_graph` ("target" portable, "target_fused"): force a flavour; default: the fused one where
        the provider runs it (io_tables.pick_graph), the portable one elsewhere (TensorRT).
        With `use_tuned`, the bundle's tuned.json (from `dflash-edge tune`) is validated and seeds the policy.
        `share_weights`: the weights both graphs hold (embedding / LM head) are loaded once for both sessions.
        """
        from .tokenizer import ChatTokenizer

        b = bundle if isinstance(bundle, Bundle) else read_bundle(bundle, verify=verify)
        _check_io_tables(b)
        config = SessionConfig(provider, threads, trt_cache_dir=str(b.root / ".trt-cache"), spin=spin)
        dims = model_dims(b.model, b.block_size)
        chunk = b.manifest["prefill_chunk"]
        # room for the live context plus one verify block (or one padded prefill chunk) beyond it
        capacity = b.max_context + max(b.manifest["kv_cache"]["slack"], b.block_size, chunk)
        ranges = symbol_ranges(b.manifest)                          # the shapes the graphs are built for
        profiles = trt_profiles(b) if provider == "tensorrt" else {}
        kv_dtypes = {g: b.graph_kv_dtype(g) for g in b.manifest["graphs"]}    # an int8 fused target: its own
        name = target_graph or pick_graph(b.manifest["graphs"], "target", provider, kv_dtypes)  # fused where it runs
        if name not in b.manifest["graphs"] or name not in TARGET_MODELS:
            raise BundleError(f"target_graph={name!r}: {b.root} has no such target graph; it has "
                              f"{', '.join(n for n in b.manifest['graphs'] if n in TARGET_MODELS)}")
        shared = shared_initializers(b.root, b.manifest, config) if share_weights else {}

        def session(graph: str):   # fp16 graphs get TensorRT's fp16 kernels; shared weights are given, not loaded
            fp16 = b.manifest["graphs"][graph]["precision"] == "fp16"
            return open_graph(b.graph_path(graph), replace(config, fp16=fp16), profiles.get(graph), shared.get(graph))

        runner = session(name)
        _check_cache_dtype(b, name, runner, kv_dtypes[name])
        target = TARGET_MODELS[name](runner, dims, capacity, (*range(1, b.block_size + 1), chunk),
                                     kv_dtypes[name], pad_rows=b.graph_pad_rows(name))  # T = k + 1, k = 0..B-1
        drafter = DraftModel(session("drafter"), dims, capacity,
                             target.hidden, b.model["mask_token_id"], b.kv_dtype, max_ctx_rows=ranges["C"][2])
        return cls(b, ChatTokenizer.from_dir(b.root), target, drafter, read_tuned(b) if use_tuned else None)

    # ---- public API -------------------------------------------------------------------------------
    def generate(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, stop=None, chat: bool = True,
                 use_draft: bool | str = "auto", verify_len: int | None = None) -> GenerationResult:
        """Generate a reply to `prompt` (a string or a list of chat messages).

        `use_draft`: "auto" (default) picks per step plain decoding, the drafter or a prompt lookup and the
        verify length, by what is measured to be fastest here (`policy.py`, seeded by `tuned.json`); True
        drafts every step, False decodes plainly (the baseline). `verify_len` (1..B-1) fixes the drafts
        verified per step. The tokens are the same either way.
        Arguments are checked up front (`validate.py`: InvalidArgumentError names the argument and range).
        Threads: one generation runs at a time per Generator; other threads wait their turn and get the
        tokens a sequential run gives; a second call in the thread holding an open `stream()` raises
        GeneratorBusyError (`guard.py`).
        """
        stream = self.stream(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat, use_draft,
                             verify_len)
        for _ in stream:
            pass
        return stream.result

    def stream(self, prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, seed: int = 0, stop=None, chat: bool = True,
               use_draft: bool | str = "auto", verify_len: int | None = None) -> Stream:
        """Like `generate`, yielding text pieces as tokens are committed (never half a character).

        The stream holds this Generator until exhausted or `close()`d (or used as `with gen.stream(...) as s`).
        """
        t_call = time.perf_counter()
        a = GenerationArgs(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, chat, use_draft).checked()
        req = Request(self.encode(a.prompt, a.chat), a.max_new_tokens,
                      SamplingParams(a.temperature, a.top_k, a.top_p, a.seed), a.stop, a.use_draft, t_call, verify_len)
        self._room(req)                                             # bad input fails here, not mid-iteration
        return Stream(self._text_pieces(req), self._guard.acquire())

    def generate_ids(self, prompt_ids: list[int], max_new_tokens: int = 128,
                     sampling: SamplingParams = SamplingParams(), use_draft: bool | str = "auto",
                     stop_token_ids=None, verify_len: int | None = None) -> GenerationResult:
        """Token ids in, tokens out (no chat template); `stop_token_ids` overrides the eos ids."""
        vocab = self.bundle.model["vocab_size"]
        req = Request(check_token_ids(prompt_ids, vocab), check("max_new_tokens", max_new_tokens), sampling, (),
                      check_use_draft(use_draft), time.perf_counter(), verify_len)
        if not isinstance(sampling, SamplingParams):
            raise InvalidArgumentError("sampling", f"sampling={sampling!r}: expected a SamplingParams")
        eos = None if stop_token_ids is None else frozenset(check_token_ids(stop_token_ids, vocab, "stop_token_ids"))
        self._room(req)
        hold = self._guard.acquire()
        try:
            return self._collect(req, eos)
        finally:
            hold.release()

    def encode(self, prompt, chat: bool = True) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode_chat([{"role": "user", "content": prompt}]) if chat \
                else self.tokenizer.encode(prompt)
        return self.tokenizer.encode_chat(list(prompt))

    # ---- text ------------------------------------------------------------------------------------
    def _text_pieces(self, req: Request) -> Iterator[str]:
        stats, text = GenerationStats(prompt_tokens=len(req.prompt_ids)), TextAssembler(self.tokenizer, req.stop)
        steps = self._loop(req, stats, self.eos)
        tokens: list[int] = []
        for committed in steps:
            for token in committed:          # one at a time: a stop string ends the output at its token
                tokens.append(token)
                if piece := text.add(token):
                    yield piece
                if text.stopped:
                    break
            if text.stopped:
                steps.close()
                stats.finish_reason, stats.new_tokens = "stop", len(tokens)
                break
        if piece := text.finish():
            yield piece
        return GenerationResult(text.text, tokens, stats)

    def _collect(self, req: Request, eos: frozenset[int] | None) -> GenerationResult:
        stats, tokens = GenerationStats(prompt_tokens=len(req.prompt_ids)), []
        for committed in self._loop(req, stats, self.eos if eos is None else eos):
            tokens += committed
        return GenerationResult(self.tokenizer.decode(tokens), tokens, stats)

    # ---- the loop ----------------------------------------------------------------------------------
    def _loop(self, req: Request, stats: GenerationStats, eos: frozenset[int]) -> Iterator[list[int]]:
        """prefill -> [choose -> (draft | look up) -> verify -> accept -> advance]*; yields committed tokens."""
        emit = Emitter(req.max_new_tokens, eos, room=self._room(req))
        emit.push([self._prefill(req.prompt_ids, req.sampling)])
        stats.ttft_s = time.perf_counter() - req.t_call
        clock = _Clock(self, stats)
        policy = AdaptivePolicy(self.block_size, self.tuned, req.verify_len) if req.use_draft == "auto" else None
        lookup = PromptLookup(req.prompt_ids + emit.tokens) if policy else None   # token ids by position
        try:
            yield emit.tokens
            while not emit.reason:
                if policy:
                    tokens = self._adaptive_step(emit, req.sampling, policy, lookup, stats)
                elif req.use_draft:
                    tokens = self._speculative_step(emit.tokens[-1], req.sampling,
                                                    req.verify_len or self.block_size - 1)
                    stats.acceptance_lengths.append(len(tokens))
                else:
                    tokens = self._decode_step(emit.tokens[-1], req.sampling)
                committed = emit.push(tokens)
                if policy:
                    lookup.extend(committed)
                    policy.commit(lookup.history)
                yield committed
        finally:
            clock.stop(emit)

    def _adaptive_step(self, emit: Emitter, sampling: SamplingParams, policy: AdaptivePolicy, lookup: PromptLookup,
                       stats: GenerationStats) -> list[int]:
        """One step of what `policy` expects to be fastest; reports its times and proposals back."""
        last, pos = emit.tokens[-1], self.target.kv.pos                # pos: position of `last` (not yet cached)
        proposal = lookup.propose(self.block_size - 1)
        choice = policy.choose(len(proposal), room=emit.budget - len(emit.tokens), lookup_match=lookup.matched)
        policy.observe("lookup", pos + 1, proposal, lookup.matched)
        draft_s, drafts = 0.0, None
        if choice.source == "drafter" or choice.probe:
            t = time.perf_counter()
            drafts = self.drafter.draft(last, ctx_end=pos)             # [B-1] view
            draft_s = time.perf_counter() - t
            policy.observe("drafter", pos + 1, drafts.tolist())
        t = time.perf_counter()
        if choice.source == "plain":
            tokens = self._decode_step(last, sampling)
            stats.plain_steps += 1
        else:
            tokens = self._verify(last, drafts[:choice.k] if choice.source == "drafter" else proposal[:choice.k],
                                  sampling)
            (stats.acceptance_lengths if choice.source == "drafter" else stats.lookup_lengths).append(len(tokens))
            stats.verify_lens.append(choice.k)
        policy.step_done(choice, time.perf_counter() - t, draft_s)
        stats.probe_steps += choice.probe
        return tokens

    def _speculative_step(self, last: int, sampling: SamplingParams, k: int) -> list[int]:
        """Draft a block after `last`, verify its first k drafts in one target pass."""
        drafts = self.drafter.draft(last, ctx_end=self.target.kv.pos)  # drafter first caches features [.. pos)
        return self._verify(last, drafts[:k], sampling)

    def _verify(self, last: int, proposals, sampling: SamplingParams) -> list[int]:
        """Run `last` + k proposals through the target (T = k + 1); keep the agreeing prefix + a bonus token."""
        start = self.target.kv.pos                                  # position of `last` (not yet cached)
        size = len(proposals) + 1
        step = self.target.steps[size]
        block = step["input_ids"][0]                                # [T]: last token, then T-1 proposals
        block[0] = last
        block[1:] = proposals
        self.target.forward(size, start)
        accepted, bonus = self._accept(step, block, start, sampling)
        self.target.kv.pos = start + accepted + 1                   # rollback: rejected rows are just ignored
        return block[1:1 + accepted].tolist() + [bonus]

    def _decode_step(self, last: int, sampling: SamplingParams) -> list[int]:
        """Plain autoregressive step (the baseline): one token through the same target graph."""
        pos = self.target.kv.pos
        step = self.target.steps[1]
        step["input_ids"][0, 0] = last
        self.target.forward(1, pos)
        self.target.kv.pos = pos + 1
        return [self._select(step, 0, pos + 1, sampling)]

    # ---- helpers -----------------------------------------------------------------------------------
    def _room(self, req: Request) -> int:
        """Tokens the context has left after the prompt (errors name the limit)."""
        prompt_ids = req.prompt_ids
        if req.use_draft not in (True, False, "auto"):
            raise ValueError(f"use_draft={req.use_draft!r}: pass 'auto' (the default: per step, what is measured "
                             f"to pay), True (always draft) or False (plain decoding)")
        if req.verify_len is not None:
            check_verify_len(req.verify_len, self.block_size)
        if req.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={req.max_new_tokens}: ask for at least 1 token")
        if not prompt_ids:
            raise ValueError("the prompt is empty: pass at least one token")
        if len(prompt_ids) >= self.max_context:
            raise ContextOverflowError(f"the prompt has {len(prompt_ids)} tokens but the context holds "
                                       f"{self.max_context}; shorten the prompt or re-export with a larger "
                                       f"--max-context")
        return self.max_context - len(prompt_ids)

    def _prefill(self, ids: list[int], sampling: SamplingParams) -> int:
        """Run the prompt in static chunks of P from an empty cache; returns the first generated token."""
        self.target.kv.pos = self.drafter.kv.pos = 0
        size, n = self.prefill_chunk, len(ids)
        step = self.target.steps[size]
        for start in _chunk_starts(n, size):
            chunk = ids[start:start + size]
            step["input_ids"][0, :len(chunk)] = chunk
            step["input_ids"][0, len(chunk):] = chunk[-1]           # padding (only when n < P): causal, ignored
            self.target.forward(size, start)
        self.target.kv.pos = n
        return self._select(step, n - 1 - start, n, sampling)    # the last chunk's row of token n-1

    def _accept(self, step, block: np.ndarray, start: int, sampling: SamplingParams) -> tuple[int, int]:
        """(number of drafts accepted, the target's token after them); row i predicts position start+1+i."""
        if sampling.greedy:
            target_ids = step["next_ids"][0]                        # [T] fused argmax: no vocab scan here
            match = block[1:] == target_ids[:-1]                    # [T-1]
            accepted = len(match) if match.all() else int(match.argmin())
            return accepted, self._select(step, accepted, start + 1 + accepted, sampling)
        for i in range(len(block)):                                 # sample lazily: stop at the first miss
            token = self._select(step, i, start + 1 + i, sampling)
            if i == len(block) - 1 or block[1 + i] != token:
                return i, token
        raise AssertionError("unreachable")

    def _select(self, step, row: int, position: int, sampling: SamplingParams) -> int:
        """The target's token for logits row `row`, placed at absolute `position`."""
        logits = step["logits"][0, row]                             # [V] view, no copy
        if sampling.greedy:
            token = int(step["next_ids"][0, row])
            bad = not np.isfinite(logits[token])                    # NaN/inf anywhere reaches the argmax
        else:
            bad = not np.isfinite(logits).all()
            token = -1 if bad else select_token(logits, sampling, position)
        if bad:
            raise NonFiniteLogitsError(f"the target graph produced NaN/inf logits for position {position}: the "
                                       f"bundle's weights are corrupt or its precision overflows; re-export it "
                                       f"in fp32 ({self.bundle.graph_path('target')})")
        return token


class _Clock:
    """Decode timing for one generation: wall time and the graphs' own run time over the same span."""

    def __init__(self, gen: Generator, stats: GenerationStats):
        self.runners = (gen.target.runner, gen.drafter.runner)
        self.stats, self.t0 = stats, time.perf_counter()
        self.run0 = [(r.run_s, r.calls) for r in self.runners]

    def stop(self, emit: Emitter) -> None:
        s = self.stats
        s.decode_s = time.perf_counter() - self.t0
        (t_run, t_calls), (d_run, d_calls) = [(r.run_s - a, r.calls - c) for r, (a, c) in zip(self.runners, self.run0)]
        s.decode_run_s, s.draft_run_s, s.target_calls, s.draft_calls = t_run + d_run, d_run, t_calls, d_calls
        s.new_tokens, s.finish_reason = len(emit.tokens), s.finish_reason or emit.reason


def _chunk_starts(n: int, size: int) -> list[int]:
    """Chunk starts covering [0, n): the last chunk overlaps the previous one instead of running past n."""
    starts = list(range(0, n, size))
    if n >= size and starts[-1] + size > n:
        starts[-1] = n - size                     # recomputes a few cached rows (identical K/V), never pads
    return starts


def _check_io_tables(b: Bundle) -> None:
    for name in b.manifest["graphs"]:                  # graphs this version has no table for are not used
        if name in GRAPHS and b.manifest["graphs"][name]["io"] != io_manifest(name, b.graph_kv_dtype(name)):
            raise BundleError(f"{b.root}: graph {name!r} declares inputs/outputs that this runtime does not "
                              f"implement; re-export the bundle with this dflash-edge version")


def _check_cache_dtype(b: Bundle, name: str, runner, dtype: str) -> None:
    """The graph file's cache inputs must have the dtype its manifest entry promises (int8 vs fp32 cache)."""
    have = {i.name: i.type for i in runner.session.get_inputs()}
    cache = have.get("past_key.0", have.get("past_key"))
    if cache is not None and cache != f"tensor({'float' if dtype == 'float32' else dtype})":
        raise BundleError(f"{b.root}: graph {name!r} has a {cache} KV cache but its manifest entry says {dtype}; "
                          f"the manifest does not match the graph: re-export or re-quantise the bundle")
