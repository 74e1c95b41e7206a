"""Property-based fuzzing (hypothesis, issue 16, tier 1): the manifest reader, sampling parameters,
stop strings, chat messages and request bodies either work or raise our named errors — never a bare
Python exception."""

import json
import math
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_edge.runtime.bundle import (
    MAX_DIM,
    MAX_KV_BYTES,
    BundleError,
    PathEscapeError,
    escape_reason,
    kv_cache_bytes,
    read_bundle,
)
from dflash_edge.runtime.sampling import SamplingParams, select_token, token_probs
from dflash_edge.runtime.text import TextAssembler
from dflash_edge.runtime.validate import ROLES, InvalidArgumentError, check_messages

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
ANY = JSON | st.binary(max_size=4) | st.tuples(st.integers())


@pytest.fixture(scope="module")
def bundle_dir(tiny_bundle, tmp_path_factory):
    dst = tmp_path_factory.mktemp("fuzz") / "bundle"
    shutil.copytree(tiny_bundle("qwen3", 8).path, dst)
    return dst


def _paths(node, prefix=()):
    """Every (key path) into a JSON tree."""
    yield prefix
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for k, v in items:
        yield from _paths(v, prefix + (k,))


@st.composite
def mutated(draw, manifest):
    """The manifest with one node replaced, deleted, or given an extra key."""
    m = json.loads(json.dumps(manifest))
    path = draw(st.sampled_from([p for p in _paths(m) if p]))
    parent = m
    for k in path[:-1]:
        parent = parent[k]
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "replace":
        parent[path[-1]] = draw(JSON)
    elif action == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=6))] = draw(JSON)
    return m


def test_manifest_reader_fuzz(bundle_dir):
    good_text = (bundle_dir / "manifest.json").read_text()
    good = json.loads(good_text)

    @FUZZ
    @given(data=st.data())
    def run(data):
        m = data.draw(mutated(good))
        (bundle_dir / "manifest.json").write_text(json.dumps(m))
        for verify in (True, False):
            try:
                read_bundle(bundle_dir, verify=verify)
            except BundleError:
                continue
            legacy = {
                k: v for k, v in good.items() if k != "checksum"
            }  # a pre-checksum bundle: still loads
            assert not verify or m in (good, legacy), "a changed manifest was accepted"

    try:
        run()
    finally:
        (bundle_dir / "manifest.json").write_text(good_text)


def test_manifest_bytes_fuzz(bundle_dir):
    good_bytes = (bundle_dir / "manifest.json").read_bytes()

    @FUZZ
    @given(cut=st.integers(0, len(good_bytes)), junk=st.binary(max_size=8))
    def run(cut, junk):
        raw = good_bytes[:cut] + junk + good_bytes[cut + len(junk) :]
        (bundle_dir / "manifest.json").write_bytes(raw)
        try:
            read_bundle(bundle_dir)
        except BundleError:
            return
        assert json.loads(raw) == json.loads(
            good_bytes
        )  # accepted only when the content is unchanged

    try:
        run()
    finally:
        (bundle_dir / "manifest.json").write_bytes(good_bytes)


SIZE_KEYS = [
    ("max_context",),
    ("block_size",),
    ("trained_block_size",),
    ("prefill_chunk",),
    ("kv_cache", "slack"),
    *[
        ("model", k)
        for k in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "draft_num_layers",
            "max_position_embeddings",
        )
    ],
]
INFLATED = st.one_of(
    st.sampled_from([0, -1, 2**31, 2**62, 2**63, -(2**63), 2**64 + 1, 2**31 - 1]),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)
ESCAPES = st.sampled_from(
    ["../x", "/etc/passwd", "a/../../b", "C:\\x", "\\\\host\\share", "..", "x\x00y", ""]
)


def _at(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def test_manifest_inflated_sizes_fuzz(bundle_dir):
    """Sizes set to absurd values (several at once: overflowing products): a one-line
    BundleError, or accepted only with every size in range and a KV cache under MAX_KV_BYTES;
    never another exception."""
    good_text = (bundle_dir / "manifest.json").read_text()

    @FUZZ
    @given(sizes=st.dictionaries(st.sampled_from(SIZE_KEYS), INFLATED, min_size=1, max_size=4))
    def run(sizes):
        m = json.loads(good_text)
        for path, value in sizes.items():
            _at(m, path[:-1])[path[-1]] = value
        (bundle_dir / "manifest.json").write_text(json.dumps(m))
        try:
            read_bundle(bundle_dir, verify=False)
        except BundleError as err:
            assert "\n" not in str(err)
            return
        assert all(type(_at(m, p)) is int and 0 <= _at(m, p) <= MAX_DIM for p in SIZE_KEYS)
        assert kv_cache_bytes(m) <= MAX_KV_BYTES

    try:
        run()
    finally:
        (bundle_dir / "manifest.json").write_text(good_text)


def test_manifest_path_values_fuzz(bundle_dir):
    """Each path-valued key given an escaping (or random) path: PathEscapeError naming the key."""
    good_text = (bundle_dir / "manifest.json").read_text()
    good = json.loads(good_text)
    keys = [
        p for p in _paths(good) if p and p[-1] in ("path", "file") and isinstance(_at(good, p), str)
    ]

    @FUZZ
    @given(key=st.sampled_from(keys), value=ESCAPES | st.text(max_size=12))
    def run(key, value):
        m = json.loads(good_text)
        _at(m, key[:-1])[key[-1]] = value
        (bundle_dir / "manifest.json").write_text(json.dumps(m))
        try:
            read_bundle(bundle_dir)
        except PathEscapeError as err:
            assert escape_reason(value) is not None and str(key[-1]) in str(err)
            return
        except BundleError:
            assert escape_reason(value) is None
            return
        assert value == _at(good, key)

    try:
        run()
    finally:
        (bundle_dir / "manifest.json").write_text(good_text)


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)


@FUZZ
@given(
    temperature=NUMBERS,
    top_k=NUMBERS,
    top_p=NUMBERS,
    seed=NUMBERS,
    logits=st.lists(st.floats(-50, 50), min_size=2, max_size=40),
    position=st.integers(0, 10**6),
)
def test_sampling_parameters_fuzz(temperature, top_k, top_p, seed, logits, position):
    try:
        params = SamplingParams(temperature, top_k, top_p, seed)
    except InvalidArgumentError as err:
        assert err.argument in ("temperature", "top_k", "top_p", "seed")
        return
    assert (
        math.isfinite(params.temperature)
        and 0 < params.top_p <= 1
        and params.top_k >= 0
        and params.seed >= 0
    )
    z = np.asarray(logits, dtype=np.float32)
    token = select_token(z, params, position)
    assert 0 <= token < len(logits) and token == select_token(
        z, params, position
    )  # keyed by position
    if not params.greedy:
        p = token_probs(z, params)
        if np.isfinite(p).all():  # a tiny temperature may overflow exp(): the argmax row still wins
            assert abs(p.sum() - 1) < 1e-9 and p[token] > 0


class CharTokenizer:
    """Token i is the character chr(i): one character per token, so the reference cut is exact."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def _reference_cut(text: str, stops) -> str:
    """Output text: cut before the stop string that completes first (the leftmost, if several
    complete together)."""
    for end in range(1, len(text) + 1):
        starts = [end - len(s) for s in stops if text.endswith(s, 0, end)]
        if starts:
            return text[: min(starts)]
    return text


@FUZZ
@given(
    text=st.text(alphabet="ab\nc.é", max_size=40),
    stops=st.lists(st.text(alphabet="ab\nc.é", max_size=4), max_size=4),
)
def test_stop_strings_fuzz(text, stops):
    asm = TextAssembler(CharTokenizer(), tuple(s for s in stops if s))
    pieces = [asm.add(ord(c)) for c in text] + [asm.finish()]
    want = _reference_cut(text, [s for s in stops if s])
    assert "".join(pieces) == asm.text == want
    assert not any(s and s in want for s in stops)


@FUZZ
@given(messages=JSON)
def test_chat_messages_fuzz(messages):
    try:
        out = check_messages(messages)
    except InvalidArgumentError as err:
        assert err.argument.startswith("messages") and str(err).startswith(err.argument)
        return
    assert out and all(m["role"] in ROLES and isinstance(m["content"], str) for m in out)


def test_valid_chat_messages_always_encode(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(ROLES), "content": st.text(max_size=30)}
    )

    @FUZZ
    @given(messages=st.lists(message, min_size=1, max_size=4))
    def run(messages):
        ids = gen.encode(check_messages(messages))
        assert ids and all(isinstance(i, int) for i in ids)

    run()


@FUZZ
@given(
    body=st.dictionaries(
        st.sampled_from(
            [
                "messages",
                "max_tokens",
                "temperature",
                "top_p",
                "seed",
                "stop",
                "stream",
                "n",
                "model",
                "stream_options",
                "draft",
                "top_k",
            ]
        ),
        JSON,
        max_size=8,
    )
)
def test_request_bodies_fuzz(body):
    from dflash_edge.serve.protocol import parse_request

    try:
        job = parse_request(body, chat=True)
    except InvalidArgumentError as err:
        assert err.argument and str(err)
        return
    assert job.options.max_new_tokens >= 1 and math.isfinite(job.options.temperature)
