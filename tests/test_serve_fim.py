"""The editors' protocols (issue 37) on a tiny bundle with Qwen2.5-Coder's FIM tokens, over HTTP:
OpenAI's `suffix` on /v1/completions, llama-server's /infill (whole and streamed, llama.vscode's own
request body), and the named refusals."""

import json

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from fim_tokenizers import fim_tokenizer_dir, with_tokenizer  # noqa: E402

from live_server import LiveServer, serve  # noqa: E402,F401  (serve: a fixture)

PREFIX, SUFFIX = "t5 t6 t7 t8 t9 t10 t11", "t12 t13 t14 t5 t6 t7"
EXTRA = [{"filename": "lib.py", "text": "t20 t21 t22"}, {"filename": "b.py", "text": "t23"}]
VSCODE = {  # what llama.vscode sends (its createRequestPayload), n_indent when the line has one
    "input_prefix": PREFIX,
    "input_suffix": SUFFIX,
    "input_extra": EXTRA,
    "prompt": "t30",
    "n_predict": 12,
    "top_k": 40,
    "top_p": 0.99,
    "stream": False,
    "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 5000,
}


@pytest.fixture(scope="module")
def fim_gen(tiny_bundle, tmp_path_factory):
    return with_tokenizer(
        tiny_bundle("qwen3", 8).generator, fim_tokenizer_dir(tmp_path_factory.mktemp("qwen"))
    )


@pytest.fixture
def fim_server(fim_gen):
    from dflash_edge.serve.app import ServerOptions, build_app

    s = LiveServer(build_app(fim_gen, ServerOptions()))
    yield s
    s.stop()


def test_openai_suffix_is_the_middle(fim_gen, fim_server):
    want = fim_gen.infill(PREFIX, SUFFIX, max_new_tokens=12)
    body = {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 12, "temperature": 0}
    r = httpx.post(f"{fim_server.url}/v1/completions", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["choices"][0]["text"] == want.text
    assert got["dflash"]["token_ids"] == want.token_ids
    assert got["usage"]["prompt_tokens"] == want.stats.prompt_tokens
    plain = {**body, "suffix": ""}  # an empty suffix: a plain completion, as OpenAI reads it
    r = httpx.post(f"{fim_server.url}/v1/completions", json=plain)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 7


def test_infill_whole_and_streamed_match_the_runtime(fim_gen, fim_server):
    extra = tuple((c["filename"], c["text"]) for c in EXTRA)
    want = fim_gen.infill(PREFIX, SUFFIX, extra, max_new_tokens=12, middle="t30")
    r = httpx.post(f"{fim_server.url}/infill", json=VSCODE)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["content"] == want.text and got["stop"] is True
    assert got["tokens_predicted"] == len(want.token_ids)
    assert got["tokens_evaluated"] == want.stats.prompt_tokens
    assert got["stop_type"] in ("eos", "limit") and got["timings"]["predicted_n"] > 0
    assert got["dflash"]["token_ids"] == want.token_ids
    with httpx.stream("POST", f"{fim_server.url}/infill", json={**VSCODE, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == want.text  # no [DONE]: all JSON
    assert events[-1]["tokens_predicted"] == len(want.token_ids)
    warm = httpx.post(f"{fim_server.url}/infill", json={**VSCODE, "n_predict": 0, "samplers": []})
    assert warm.status_code == 200 and warm.json()["content"] == ""
    huge = httpx.post(f"{fim_server.url}/infill", json={**VSCODE, "n_predict": 10**12})
    assert huge.status_code == 200, huge.text  # the context bounds it (or the model's end)
    assert huge.json()["tokens_predicted"] + huge.json()["tokens_evaluated"] <= fim_gen.max_context


@pytest.mark.parametrize(
    "change, param, message",
    [
        ({"min_p": 0.05}, "min_p", "min_p=0.05"),
        ({"lora": [{"id": 0, "scale": 0.5}]}, "lora", "lora"),
        ({"bogus": 1}, "bogus", "unrecognized request argument"),
        ({"temperature": 0.7}, "samplers", "'infill' is not a sampler"),
        ({"input_extra": [{"text": "t1", "path": "a"}]}, "input_extra[0].path", "path"),
        ({"input_extra": "t1"}, "input_extra", "list"),
        ({"n_predict": -2}, "n_predict", ">= -1"),
        ({"n_indent": -1}, "n_indent", ">= 0"),
        (
            {"input_extra": [{"filename": f"f{i}", "text": "t7 " * 30} for i in range(6)]},
            None,
            "input_extra: the fill-in-the-middle prompt",
        ),
    ],
)
def test_infill_refusals_name_the_field(fim_server, change, param, message):
    r = httpx.post(f"{fim_server.url}/infill", json={**VSCODE, **change})
    err = r.json()["error"]
    assert r.status_code == 400 and message in err["message"], err
    if param:
        assert err["param"] == param


def test_a_model_without_fim_tokens_is_refused(serve):
    s = serve()
    r = httpx.post(f"{s.url}/infill", json={"input_prefix": "t5", "input_suffix": "t6"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_suffix"
    assert "no fill-in-the-middle tokens" in r.json()["error"]["message"]
    r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "t5", "suffix": "t6"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    r = httpx.post(f"{s.url}/v1/chat/completions", json={"messages": [], "suffix": "t6"})
    assert r.status_code == 400  # chat has no suffix: refused, as before


def test_keystrokes_reuse_the_cached_prefix_and_answer_as_cold(fim_server):
    """llama.vscode's session: each keystroke extends the prefix; the server reuses what the last
    request left (`tokens_cached`, `timings.cache_n`) and answers as `cache_prompt: false` does."""
    url, typed = f"{fim_server.url}/infill", ""
    httpx.post(url, json={**VSCODE, "cache_prompt": False})
    for key in (" t31", " t32", " t33"):
        typed += key
        body = {**VSCODE, "input_prefix": PREFIX + typed, "temperature": 0}
        warm = httpx.post(url, json=body).json()
        cold = httpx.post(url, json={**body, "cache_prompt": False}).json()
        assert warm["content"] == cold["content"]
        assert cold["tokens_cached"] == 0
        assert warm["tokens_cached"] > 0 and warm["timings"]["cache_n"] == warm["tokens_cached"]
        assert warm["timings"]["prompt_n"] == warm["tokens_evaluated"] - warm["tokens_cached"]
        # the cold request just ran this body: a repeat reuses all of it but the last token
        again = httpx.post(url, json=body).json()
        assert again["tokens_cached"] == again["tokens_evaluated"] - 1


def test_chat_turns_report_cached_tokens_as_openai(fim_server):
    url = f"{fim_server.url}/v1/chat/completions"
    messages = [{"role": "user", "content": "t5 t6 t7 t8 t9 t10 t11 t12"}]
    first = httpx.post(url, json={"messages": messages, "max_tokens": 6, "temperature": 0}).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
    answer = first["choices"][0]["message"]["content"]
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "t13"}]
    body = {"messages": messages, "max_tokens": 6, "temperature": 0}
    second = httpx.post(url, json=body).json()
    cold = httpx.post(url, json={**body, "cache_prompt": False}).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    bad = httpx.post(url, json={**body, "cache_prompt": "yes"})
    assert bad.status_code == 400 and "cache_prompt" in bad.text


def test_an_infill_warm_up_prefills_and_keeps_the_prompt(fim_server):
    """llama.vscode's warm-up (`n_predict: 0`): nothing answered, the prompt prefilled and kept, so
    the request that follows reuses all of it but its last token."""
    url = f"{fim_server.url}/infill"
    other = {**VSCODE, "input_extra": [], "input_prefix": "t40 t41 t42"}
    warm = httpx.post(url, json={**other, "n_predict": 0}).json()
    assert warm["content"] == "" and warm["tokens_predicted"] == 0 and warm["tokens_cached"] == 0
    got = httpx.post(url, json=other).json()
    assert got["tokens_cached"] == got["tokens_evaluated"] - 1 == warm["tokens_evaluated"] - 1
    off = httpx.post(url, json={**other, "input_prefix": "t43", "n_predict": 0, "stream": True})
    assert off.status_code == 200  # a streamed warm-up answers at once, as before
