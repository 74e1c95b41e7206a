"""`Generator`: the DFlash loop over a bundle (numpy + onnxruntime).

    prefill (chunks) -> [choose -> propose -> verify -> accept -> advance] -> ...

Each step the proposer (proposals.py: the drafter and prompt lookup, and a policy.py policy choosing
among them) names a source and how many of its tokens the target verifies; the target
(targets.py) answers `run(ids)` and `commit(n)`, so the loop never touches a cache position. Greedy,
and sampled with deterministic drafts, every emitted token is the target's own choice at its
position (`sampling.select_token`, keyed by absolute position, as `models/reference_loop.py`), so
the output is the same whatever was proposed, token for token. Sampled DFlash2 drafts are verified
by `sampled_rule` (lattice.py: rejection sampling by default): the target's distribution, but not
plain sampling's tokens, and fixed by a seed only where the steps are (not under "auto"). Buffers
are preallocated at load (`loading.py`, `kv.py`); text assembly is `text.py`; the options and their
checks are `validate.GenerationOptions`.

>>> gen = Generator.load("bundle/")                                     # doctest: +SKIP
>>> res = gen.generate("Why is the sky blue?", max_new_tokens=64)      # doctest: +SKIP
>>> res.text, res.stats.mean_acceptance_length                          # doctest: +SKIP
>>> gen.generate("Hi", GenerationOptions(draft="none", temperature=0.7))   # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .bundle import Bundle
from .draft_model import DraftModel
from .emitter import Emitter
from .errors import ContextOverflowError, DflashEdgeError
from .fim import FimPrompt, find_template, require_template, text_cut
from .guard import GenerationGuard
from .lattice import DEFAULT_RULE, accept_sampled, lattice_drafter, sampled_rule
from .loading import GraphSessions, LoadOptions, checked_bundle, draft_model, target_model
from .policy import make_policy
from .prompt_cache import KeptSequence, PromptCache, common_prefix, state_bytes
from .proposals import Proposer, make_sources
from .sampling import SamplingParams, select_token, token_probs
from .stats import GenerationStats
from .targets import TargetModel
from .text import TextAssembler, text_pieces
from .tuning import Tuned, read_tuned
from .validate import (
    GenerationOptions,
    InvalidArgumentError,
    check,
    check_parse_special,
    check_prompt,
    check_provider,
    check_token_ids,
)


class NonFiniteLogitsError(DflashEdgeError):
    """The target produced NaN or inf logits."""


@dataclass
class GenerationResult:
    text: str  # generated part only
    token_ids: list[int]  # generated part only
    stats: GenerationStats

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason


@dataclass
class Request:
    """One generation's inputs, resolved: prompt tokenized, options checked."""

    prompt_ids: list[int]
    options: GenerationOptions
    t_call: float = 0.0  # perf_counter() when the call began (TTFT includes tokenizing)
    fim: FimPrompt | None = None  # a middle to fill (its stops; its extra files for lookup)
    references: tuple[list[int], ...] = ()  # token runs lookup copies from, outside the prompt


class Stream:
    """Text pieces as they are decoded; `.result` (a GenerationResult) once exhausted.

    Holds its Generator (`guard.py`) until exhausted or closed: `close()`, a `with` block, or
    dropping it."""

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


class Generator:
    """A loaded bundle: target and drafter graphs, their preallocated caches, the tokenizer."""

    def __init__(
        self,
        bundle: Bundle,
        tokenizer,
        target: TargetModel,
        drafter: DraftModel | None,
        tuned: Tuned | None = None,
        target_graph: str = "target",
    ):
        self.bundle, self.tokenizer, self.target, self.drafter = bundle, tokenizer, target, drafter
        self.target_graph = target_graph  # the manifest graph the target runs
        self.block_size = bundle.block_size
        self.prefill_chunk = bundle.manifest["prefill_chunk"]
        self.max_context = bundle.max_context
        self.eos = frozenset(bundle.model["eos_token_ids"])
        self.tuned = tuned  # tuning.py: None until `dflash-edge tune`
        self.fim = find_template(tokenizer)  # fim.py: None when the model has no FIM tokens
        self._guard = GenerationGuard()  # one sequence at a time (the caches are single-sequence)
        self._kept: list[int] = []  # the ids whose caches are valid, by position (_loop keeps it)
        self.prompt_cache: PromptCache | None = None  # other kept sequences (keep_prompts)
        self.sampled_rule = DEFAULT_RULE  # how sampled DFlash2 drafts are verified (lattice.RULES)

    @classmethod
    def load(
        cls,
        bundle: str | Path | Bundle,
        provider: str = "cpu",
        *,
        threads: int = 0,
        spin: bool = True,
        verify: bool = True,
        target_graph: str | None = None,
        use_tuned: bool = True,
        share_weights: bool = True,
        drafter: bool = True,
    ) -> "Generator":
        """Open a bundle on `provider` ("cpu", "cuda", "tensorrt"); sha256-checks files unless
        verify=False.

        `target_graph` ("target" portable, "target_fused"): force a flavour; default: the fused one
        where the provider runs it (io_tables.pick_graph), the portable one elsewhere (TensorRT).
        With `use_tuned`, the bundle's tuned.json (from `dflash-edge tune`) is validated and seeds
        the policy. `share_weights`: the weights both graphs hold (embedding / LM head) are loaded
        once for both sessions. `drafter=False`: the target alone (plain decoding only; what
        KV-cache calibration needs), in less memory. `threads`: intra-op threads per session, 0 =
        one per usable CPU; more than the usable CPUs is lowered to them with a
        ClampedArgumentWarning. Every argument is checked first (InvalidArgumentError names it)."""
        from .tokenizer import ChatTokenizer

        # checked here: a thread count lowered to the usable CPUs warns at the caller's line
        provider, threads = check_provider(provider), check("threads", threads)
        opts = LoadOptions(
            provider, threads, spin, verify, target_graph, use_tuned, share_weights, drafter
        ).checked()
        b, name = checked_bundle(bundle, opts)
        sessions = GraphSessions(b, opts)
        target = target_model(b, name, sessions)
        draft = draft_model(b, target, sessions) if opts.drafter else None
        tokenizer = ChatTokenizer.from_dir(b.root)
        return cls(b, tokenizer, target, draft, read_tuned(b) if opts.use_tuned else None, name)

    # ---- public API
    def keep_prompts(self, max_mb: float) -> None:
        """Keep up to `max_mb` MB of other sequences' caches in RAM (prompt_cache.py; 0: only the
        live one), so that alternating conversations each resume from their own prefix."""
        max_mb = check("cache_ram_mb", max_mb)
        self.prompt_cache = PromptCache(int(max_mb * 1e6)) if max_mb else None

    def generate(
        self, prompt, options: GenerationOptions | None = None, **fields
    ) -> GenerationResult:
        """Generate a reply to `prompt` (a string, a list of chat messages, or a `FimPrompt`: the
        middle between a prefix and a suffix, in the model's FIM template; see `infill`).

        `options` (validate.GenerationOptions), or its fields by keyword (`max_new_tokens=64,
        draft="none"`): the one set of defaults; `draft="auto"` (the default) picks per step plain
        decoding, the drafter or a prompt lookup and the verify length by what is measured to pay.
        The tokens are the same either way. Everything is checked up front (InvalidArgumentError
        names the field and its range). Threads: one generation runs at a time per Generator; other
        threads wait their turn and get the tokens a sequential run gives; a second call in the
        thread holding an open `stream()` raises GeneratorBusyError (`guard.py`).

        >>> gen.generate("Hi", max_new_tokens=16, temperature=0.7, seed=1).text  # doctest: +SKIP
        """
        stream = self.stream(prompt, options, **fields)
        for _ in stream:
            pass
        return stream.result

    def stream(self, prompt, options: GenerationOptions | None = None, **fields) -> Stream:
        """Like `generate`, yielding text pieces as tokens are committed (never half a character).

        The stream holds this Generator until exhausted or `close()`d (or used as `with
        gen.stream(...) as s`).

        >>> for piece in gen.stream("Hi", max_new_tokens=16): print(piece, end="")  # doctest: +SKIP
        """
        t_call = time.perf_counter()
        opts = self._options(options, fields)  # all input checked before iterating
        if isinstance(prompt, FimPrompt):
            req = self._fim_request(prompt, opts, t_call)
        else:
            req = Request(self.encode(prompt, opts.chat, opts.parse_special), opts, t_call)
        self._room(req.prompt_ids)
        return Stream(self._text_pieces(req), self._guard.acquire())

    def infill(
        self, prefix: str, suffix: str = "", extra=(), options=None, **fields
    ) -> GenerationResult:
        """The middle between `prefix` and `suffix` (`extra`: other files as (name, text) pairs),
        in the model's own FIM template (fim.py); InvalidArgumentError when the model has none.
        `fields`: GenerationOptions fields, or FimPrompt's (`max_lines`, `min_indent`, ...).

        >>> gen.infill("def add(a, b):\n    ", "\n\nprint(add(1, 2))").text  # doctest: +SKIP
        """
        fim_fields = {k: fields.pop(k) for k in list(fields) if k in FimPrompt.__dataclass_fields__}
        return self.generate(
            FimPrompt(prefix, suffix, tuple(extra), **fim_fields), options, **fields
        )

    def _fim_request(self, fim: FimPrompt, opts: GenerationOptions, t_call: float) -> Request:
        """A FIM prompt's ids (control ids from the template only), checked to fit the context."""
        template = require_template(self.fim, self.bundle.root.name, fim.label)
        fim = fim.checked()
        if opts.parse_special:
            raise InvalidArgumentError(
                "parse_special",
                "parse_special=True: a fill-in-the-middle prompt is always text; its control "
                "tokens come from the model's FIM template",
            )
        most = self.max_context * self.tokenizer.max_token_chars
        if fim.chars > most:
            raise ContextOverflowError(self._fim_overflow(fim, f"{fim.chars} characters", most))
        ids, references = template.encode(self.tokenizer, fim)
        if len(ids) >= self.max_context:
            raise ContextOverflowError(self._fim_overflow(fim, f"{len(ids)} tokens", None))
        return Request(ids, opts, t_call, fim, tuple(references))

    def _fim_overflow(self, fim: FimPrompt, size: str, most_chars: int | None) -> str:
        where = fim.labels.get("extra", "extra") if fim.extra else fim.label
        holds = f"{self.max_context} tokens" + (
            f" ({most_chars} characters at most)" if most_chars else ""
        )
        return (
            f"{where}: the fill-in-the-middle prompt (prefix, suffix and {len(fim.extra)} extra "
            f"files) has {size}, more than the context of {holds} leaves room for; send fewer "
            f"or shorter extra files, a shorter prefix or suffix, or re-export with a larger "
            f"--max-context"
        )

    def generate_ids(
        self,
        prompt_ids: list[int],
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        *,
        options: GenerationOptions | None = None,
        stop_token_ids=None,
        **fields,
    ) -> GenerationResult:
        """Token ids in, tokens out (no chat template, no stop strings); `stop_token_ids` overrides
        the eos ids.

        `max_new_tokens` and `sampling` may be given positionally (shorthands for those option
        fields).

        >>> gen.generate_ids(  # doctest: +SKIP
        ...     [5, 17, 33], 40, draft="drafter", verify_len=4).token_ids
        """
        t_call = time.perf_counter()
        vocab = self.bundle.model["vocab_size"]
        ids = check_token_ids(prompt_ids, vocab)
        opts = self._options(options, {**fields, **_shorthands(max_new_tokens, sampling)})
        if opts.stop:
            raise InvalidArgumentError(
                "stop",
                f"stop={opts.stop!r}: stop strings are text; generate_ids stops at "
                f"stop_token_ids (use generate() or stream() for stop strings)",
            )
        eos = (
            self.eos
            if stop_token_ids is None
            else frozenset(check_token_ids(stop_token_ids, vocab, "stop_token_ids"))
        )
        req = Request(ids, opts, t_call)
        self._room(ids)
        hold = self._guard.acquire()
        try:
            stats, tokens = GenerationStats(prompt_tokens=len(ids)), []
            for committed in self._loop(req, stats, eos):
                tokens += committed
            return GenerationResult(self.tokenizer.decode(tokens), tokens, stats)
        finally:
            hold.release()

    def encode(self, prompt, chat: bool = True, parse_special: bool = False) -> list[int]:
        """The token ids `generate` runs for `prompt`: a string as one user message in the chat
        template (as is, with chat=False), or a list of messages through the template.

        Prompt text is text: a control-token string in it (`<|im_start|>`) is tokenised as its
        characters; only the template places control tokens. `parse_special=True` (a raw string
        prompt only) parses them: for trusted callers whose raw prompt spells out a template; never
        for text from untrusted users. Checked first (`validate.check_prompt`): InvalidArgumentError
        names what is wrong."""
        prompt = check_prompt(prompt, chat=chat)
        # messages are always chat
        check_parse_special(parse_special, chat or not isinstance(prompt, str))
        self._check_length(prompt)
        if isinstance(prompt, str):
            return (
                self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
                if chat
                else self.tokenizer.encode(prompt, parse_special)
            )
        return self.tokenizer.encode_chat(list(prompt))

    def _options(self, options: GenerationOptions | None, fields: dict) -> GenerationOptions:
        """`options` with `fields` replaced, checked (verify_len against this bundle's block size, a
        draft mode against the graphs loaded)."""
        opts = GenerationOptions.of(options, **fields).checked(block_size=self.block_size)
        if self.drafter is None and opts.draft != "none":
            raise InvalidArgumentError(
                "draft",
                f"draft={opts.draft!r}: this Generator was loaded "
                f"without its drafter (drafter=False); pass draft='none' or "
                f"load it with one",
            )
        return opts

    def _text_pieces(self, req: Request) -> Iterator[str]:
        cut = text_cut(req.fim) if req.fim else None  # a middle's line / indent / time stops
        stats, text = (
            GenerationStats(prompt_tokens=len(req.prompt_ids)),
            TextAssembler(self.tokenizer, req.options.stop, cut),
        )
        eos = self.eos | self.fim.stop_ids if req.fim else self.eos
        loop = self._loop(req, stats, eos)
        try:
            tokens = yield from text_pieces(loop, text)
        finally:
            loop.close()  # a text stop ends the loop now, not when it is collected
        if text.stopped:  # the text ended before the loop did (a cut: a limit, as llama-server)
            stats.finish_reason, stats.new_tokens = (
                "length" if text.was_cut else "stop",
                len(tokens),
            )
        return GenerationResult(text.text, tokens, stats)

    # ---- the loop
    def _loop(
        self, req: Request, stats: GenerationStats, eos: frozenset[int]
    ) -> Iterator[list[int]]:
        """prefill -> [propose -> verify -> accept -> advance]*; yields the tokens committed."""
        opts = req.options
        sampling = SamplingParams(opts.temperature, opts.top_k, opts.top_p, opts.seed)
        emit = Emitter(opts.max_new_tokens, eos, room=self._room(req.prompt_ids))
        clean = False
        try:
            t = time.perf_counter()
            first, stats.cached_tokens = self._prefill(req.prompt_ids, sampling, opts.cache_prompt)
            emit.push([first])
            stats.prefill_s, stats.ttft_s = (
                time.perf_counter() - t,
                time.perf_counter() - req.t_call,
            )
            clock = _Clock(self, stats)
            proposer = self._proposer(opts, req.prompt_ids + emit.tokens, req.references)
            try:
                yield emit.tokens
                while not emit.reason:
                    yield self._step(emit, proposer, sampling, stats)
            finally:
                clock.stop(emit)
            clean = True
        except GeneratorExit:  # the caller stopped between steps: the caches are consistent
            clean = True
            raise
        finally:
            # what the caches hold, by position; nothing after a failure inside a step
            self._kept = (req.prompt_ids + emit.tokens)[: self.target.pos] if clean else []

    def _step(self, emit: Emitter, proposer, sampling: SamplingParams, stats) -> list[int]:
        """propose -> verify -> accept -> advance; the tokens committed."""
        t_step = time.perf_counter()
        last, pos = emit.tokens[-1], self.target.pos  # pos: of `last` (not yet cached)
        choice, proposals = proposer.propose(last, pos, room=emit.budget - len(emit.tokens))
        t = time.perf_counter()
        tokens = self._verify(last, proposals, sampling, proposer.dists())  # verify, accept, commit
        seconds = time.perf_counter() - t
        committed = emit.push(tokens)  # advance (stop id, budget, context end)
        proposer.commit(committed, seconds)
        stats.record_step(choice, len(tokens), time.perf_counter() - t_step)
        return committed

    def _proposer(self, opts: GenerationOptions, history: list[int], references=()) -> Proposer:
        """The proposal sources of `opts.draft` and the policy choosing among them, fresh for one
        generation (`history`: the token ids so far, by absolute position; `references`: token runs
        outside the prompt that lookup may copy from)."""
        limit = self.block_size - 1
        sampling = SamplingParams(opts.temperature, opts.top_k, opts.top_p, opts.seed)
        rule = sampled_rule(self.sampled_rule)
        drafter = lattice_drafter(self.drafter, sampling, rule)  # DFlash2: walked on the host
        sources = make_sources(opts.draft, drafter, history, limit, self.tuned, references)
        policy = make_policy(opts.draft, self.block_size, sources, self.tuned, opts.verify_len)
        return Proposer(sources, policy, limit)

    def _verify(self, last: int, proposals, sampling: SamplingParams, dists=None) -> list[int]:
        """Run `last` + k proposals through the target (T = k + 1); keep the accepted prefix + the
        target's next token. k = 0 is a plain decode step; `dists`: the distributions sampled
        proposals were drawn from (proposals.Proposal.dists), None for deterministic ones."""
        start = self.target.pos  # position of `last` (not yet cached)
        step = self.target.run([last, *proposals])
        block = step["input_ids"][0]  # [T]: last token, then T-1 proposals
        accepted, bonus = self._accept(step, block, start, sampling, dists)
        self.target.commit(accepted + 1)  # the rejected rows roll back
        return block[1 : 1 + accepted].tolist() + [bonus] if accepted else [bonus]

    # ---- helpers
    def _check_length(self, prompt) -> None:
        """Refuse, before tokenising it, a text too long to fit whatever its tokens: no token covers
        more than `max_token_chars` characters, so a text of more than max_context x that many
        cannot fit (a megabyte sent to a server costs no tokeniser pass, nor its memory)."""
        texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
        chars, most = sum(map(len, texts)), self.max_context * self.tokenizer.max_token_chars
        if chars > most:
            raise ContextOverflowError(
                f"the prompt has {chars} characters, more than the {most} that "
                f"{self.max_context} tokens of this model can hold; shorten the prompt or "
                f"re-export with a larger --max-context"
            )

    def _room(self, prompt_ids: list[int]) -> int:
        """Tokens the context has left after the prompt (errors name the limit)."""
        if not prompt_ids:
            raise InvalidArgumentError("prompt", "the prompt is empty: pass at least one token")
        if len(prompt_ids) >= self.max_context:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds "
                f"{self.max_context}; shorten the prompt or re-export with a larger "
                f"--max-context"
            )
        return self.max_context - len(prompt_ids)

    def _prefill(self, ids: list[int], sampling: SamplingParams, reuse: bool) -> tuple[int, int]:
        """Run the prompt past what the last sequence left cached (`reuse`: its longest common
        prefix with `ids`; the last prompt token always runs); (the first new token, the prompt
        tokens reused)."""
        self._switch(ids, reuse)
        cached = self.target.reusable(_common(self._kept, ids)) if reuse else 0
        self._kept = ids[:cached]  # before any graph runs: a failure leaves only what holds
        if self.drafter is not None:
            self.drafter.rewind(cached)
        step, row = self.target.prefill(ids, self.prefill_chunk, start=cached)
        return self._select(step, row, len(ids), sampling), cached

    def _switch(self, ids: list[int], reuse: bool) -> None:
        """Before `ids`' prefill: when a sequence in the prompt cache shares more of `ids` than the
        live one, swap them; when `ids` would overwrite most of the live one, keep it there
        first."""
        if self.prompt_cache is None or not self._kept:
            return
        live = _common(self._kept, ids) if reuse else 0
        index, shared = self.prompt_cache.best(ids[:-1]) if reuse else (-1, 0)
        entry = self.prompt_cache.take(index) if shared > live else None
        if entry is not None or 2 * live < len(self._kept):
            n = self.target.pos
            state = {"target": self.target.save()}
            if self.drafter is not None:
                state["drafter"] = self.drafter.save(n)
            self.prompt_cache.put(KeptSequence(self._kept[:n], state, state_bytes(state)))
        if entry is not None:
            self._kept = []  # a failure while restoring leaves nothing to reuse
            self.target.restore(entry.state["target"])
            if self.drafter is not None:
                self.drafter.restore(entry.state["drafter"])
            self._kept = entry.ids

    def _accept(
        self, step, block: np.ndarray, start: int, sampling: SamplingParams, dists=None
    ) -> tuple[int, int]:
        """(number of drafts accepted, the target's token after them); row i predicts position
        start+1+i. Sampled: by `sampled_rule` (lattice.accept_sampled), rows' p asked lazily."""
        if len(block) == 1:  # a plain decode step: nothing to accept
            return 0, self._select(step, 0, start + 1, sampling)
        if sampling.greedy:
            target_ids = step["next_ids"][0]  # [T] fused argmax: no vocab scan here
            match = block[1:] == target_ids[:-1]  # [T-1]
            accepted = len(match) if match.all() else int(match.argmin())
            return accepted, self._select(step, accepted, start + 1 + accepted, sampling)
        rule = sampled_rule(self.sampled_rule)

        def probs(i):
            return token_probs(self._logits(step, i, start + 1 + i), sampling)

        return accept_sampled(rule, probs, block[1:], dists, sampling, start + 1)

    def _select(self, step, row: int, position: int, sampling: SamplingParams) -> int:
        """The target's token for logits row `row`, placed at absolute `position`."""
        if sampling.greedy:
            token = int(step["next_ids"][0, row])
            self._logits(step, row, position, token)
            return token
        return select_token(self._logits(step, row, position), sampling, position)

    def _logits(self, step, row: int, position: int, token: int | None = None) -> np.ndarray:
        """Logits row `row` [V] (a view), checked finite (at `token` only: NaN/inf anywhere reaches
        the argmax)."""
        logits = step["logits"][0, row]  # [V] view, no copy
        if not (np.isfinite(logits[token]) if token is not None else np.isfinite(logits).all()):
            raise NonFiniteLogitsError(
                f"the target graph produced NaN/inf logits for position {position}: the "
                f"bundle's weights are corrupt or its precision overflows; re-export it "
                f"in fp32 ({self.bundle.graph_path('target')})"
            )
        return logits


class _NoRunner:
    """The drafter's run counters when a Generator has no drafter."""

    run_s, calls = 0.0, 0


class _Clock:
    """Decode timing for one generation: wall time and the graphs' own run time over the same
    span."""

    def __init__(self, gen: Generator, stats: GenerationStats):
        self.runners = (gen.target.runner, gen.drafter.runner if gen.drafter else _NoRunner())
        self.stats, self.t0 = stats, time.perf_counter()
        self.run0 = [(r.run_s, r.calls) for r in self.runners]

    def stop(self, emit: Emitter) -> None:
        s = self.stats
        s.decode_s = time.perf_counter() - self.t0
        (t_run, t_calls), (d_run, d_calls) = [
            (r.run_s - a, r.calls - c) for r, (a, c) in zip(self.runners, self.run0)
        ]
        s.decode_run_s, s.draft_run_s, s.target_calls, s.draft_calls = (
            t_run + d_run,
            d_run,
            t_calls,
            d_calls,
        )
        s.new_tokens, s.finish_reason = len(emit.tokens), s.finish_reason or emit.reason


def _common(kept: list[int], ids: list[int]) -> int:
    """Length of the longest common prefix of `kept` and `ids`, leaving `ids`' last token to run
    (its logits are the first new token's).

    >>> _common([1, 2, 3, 4], [1, 2, 9]), _common([1, 2], [1, 2])
    (2, 1)
    """
    return common_prefix(kept, ids[:-1])


def _shorthands(max_new_tokens: int | None, sampling: SamplingParams | None) -> dict:
    """generate_ids' positional `max_new_tokens` and `sampling` as GenerationOptions fields."""
    fields = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
    if sampling is None:
        return fields
    if not isinstance(sampling, SamplingParams):
        raise InvalidArgumentError("sampling", f"sampling={sampling!r}: expected a SamplingParams")
    return {
        **fields,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
    }
