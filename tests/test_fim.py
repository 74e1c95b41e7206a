"""Fill-in-the-middle in the runtime (issue 37) on a tiny bundle: the template found from the
tokenizer, control tokens only from it, repo context, the stops of a middle, drafts from the code in
view (lossless), and the refusals."""

from types import SimpleNamespace

import pytest
from fim_tokenizers import fim_tokenizer_dir, with_tokenizer

from dflash_edge.runtime.errors import ContextOverflowError
from dflash_edge.runtime.fim import FimPrompt, find_template, text_cut
from dflash_edge.runtime.text import TextAssembler, text_pieces
from dflash_edge.runtime.tokenizer import ChatTokenizer
from dflash_edge.runtime.validate import InvalidArgumentError

PRE, SUF, MID, PAD, REPO, SEP = range(90, 96)  # the Qwen style's ids in the tiny vocabulary
PREFIX, SUFFIX = "t5 t6 t7 t8 t9 t10 t11", "t12 t13 t14 t5 t6 t7"


@pytest.fixture(scope="module")
def qwen_gen(tiny_bundle, tmp_path_factory):
    return with_tokenizer(
        tiny_bundle("qwen3", 8).generator, fim_tokenizer_dir(tmp_path_factory.mktemp("qwen"))
    )


@pytest.mark.parametrize(
    "style, want, ids",
    [
        ("qwen", "qwen", (90, 91, 92)),
        ("starcoder", "starcoder", (91, 92, 93)),
        ("codellama", "codellama", (92, 93, 94)),
        ("none", None, None),
    ],
)
def test_template_found_from_the_special_tokens(tmp_path, style, want, ids):
    template = find_template(ChatTokenizer.from_dir(fim_tokenizer_dir(tmp_path, style)))
    if want is None:
        assert template is None
        return
    assert (template.style, (template.prefix, template.suffix, template.middle)) == (want, ids)
    assert {template.prefix, template.suffix, template.middle} <= template.stop_ids
    if style == "qwen":
        assert {PAD, REPO, SEP} <= template.stop_ids and (template.repo, template.file_sep) == (
            REPO,
            SEP,
        )
    if style == "codellama":  # its end token, spelled with the sentencepiece space
        assert 95 in template.stop_ids and template.file_sep is None


def test_layout_and_typed_control_strings_stay_text(qwen_gen):
    tok = qwen_gen.tokenizer
    ids, refs = qwen_gen.fim.encode(tok, FimPrompt("t5 t6", "t7", middle="t8"))
    assert ids == [PRE, 5, 6, SUF, 7, MID, 8] and refs == []
    hostile = FimPrompt("t5 <|fim_suffix|> t6", "t7 <|file_sep|>")
    ids, _ = qwen_gen.fim.encode(tok, hostile)
    assert [ids.count(t) for t in (PRE, SUF, MID, SEP)] == [1, 1, 1, 0]  # only the template's
    assert ids.index(SUF) > ids.index(6)  # the typed one is text inside the prefix
    repo = FimPrompt("t5", "t6", extra=(("a.py", "t20 t21"), ("b.py", "t22")), file_name="c.py")
    ids, _ = qwen_gen.fim.encode(tok, repo)
    # <|repo_name|>project\n, then <|file_sep|>NAME\n TEXT per file, then <|file_sep|>c.py\n
    assert ids[0] == REPO and ids.count(SEP) == 3
    assert ids[ids.index(PRE) :] == [PRE, 5, SUF, 6, MID] and 22 in ids[: ids.index(PRE)]


def test_infill_is_the_plain_loop_on_the_template_ids_and_lossless(qwen_gen):
    fim = FimPrompt(PREFIX, SUFFIX)
    ids, _ = qwen_gen.fim.encode(qwen_gen.tokenizer, fim)
    stops = sorted(qwen_gen.eos | qwen_gen.fim.stop_ids)
    want = qwen_gen.generate_ids(ids, 24, draft="none", stop_token_ids=stops)
    for draft in ("none", "auto", "lookup", "drafter"):
        got = qwen_gen.generate(fim, max_new_tokens=24, draft=draft)
        assert got.token_ids == want.token_ids, draft
        assert got.stats.prompt_tokens == len(ids)
    assert qwen_gen.infill(PREFIX, SUFFIX, max_new_tokens=24).token_ids == want.token_ids


def test_a_stop_token_ends_the_middle(tiny_bundle, tmp_path):
    """`<|endoftext|>` placed on the id the model emits third: the middle ends there."""
    base = with_tokenizer(tiny_bundle("qwen3", 8).generator, fim_tokenizer_dir(tmp_path / "a"))
    free = base.infill(PREFIX, SUFFIX, max_new_tokens=16, draft="none").token_ids
    prompt_ids = set(base.fim.encode(base.tokenizer, FimPrompt(PREFIX, SUFFIX))[0])
    at = next(i for i, t in enumerate(free) if t not in prompt_ids and t not in free[:i] and t < 90)
    gen = with_tokenizer(base, fim_tokenizer_dir(tmp_path / "b", words={"<|endoftext|>": free[at]}))
    for draft in ("none", "auto"):
        res = gen.infill(PREFIX, SUFFIX, max_new_tokens=16, draft=draft)
        assert res.token_ids == free[: at + 1] and res.finish_reason == "stop"
        assert "endoftext" not in res.text  # a control token is not text


def test_line_and_indent_cuts_release_whole_lines():
    chars = SimpleNamespace(decode=lambda ids: "".join(map(chr, ids)))
    text = "    a = 1\n    b = 2\nc = 3\n"
    for fim, want in (
        (FimPrompt("", max_lines=1), "    a = 1"),
        (FimPrompt("", max_lines=2), "    a = 1\n    b = 2"),
        (FimPrompt("", min_indent=4), "    a = 1\n    b = 2"),
        (FimPrompt("", min_indent=2, max_lines=9), "    a = 1\n    b = 2"),
        (FimPrompt(""), text),
    ):
        asm = TextAssembler(chars, cut=text_cut(fim))
        pieces = list(text_pieces(iter([[ord(c)] for c in text]), asm))
        assert "".join(pieces) == asm.text == want
        assert asm.was_cut == (want != text)
    clock = iter([0.0, 0.5, 2.0]).__next__  # the start, then a reading once a line is done
    cut = text_cut(FimPrompt("", time_limit_s=1.0), clock)
    assert cut("a") is None and cut("a\nb") is None  # a line done, within the limit
    assert cut("a\nb\nc") == 5  # past the limit with a line done: stop, keeping the text


def test_max_lines_on_the_generator(tiny_bundle, tmp_path):
    """A newline-decoding tokenizer: the middle stops before its second line."""
    base = with_tokenizer(tiny_bundle("qwen3", 8).generator, fim_tokenizer_dir(tmp_path / "a"))
    free = base.infill(PREFIX, SUFFIX, max_new_tokens=16, draft="none").token_ids
    gen = copy_with_newline(base, free[2], tmp_path)
    res = gen.infill(PREFIX, SUFFIX, max_new_tokens=16, draft="auto", max_lines=1)
    assert "\n" not in res.text and res.finish_reason == "length"
    assert res.token_ids == free[: len(res.token_ids)] and len(res.token_ids) <= 3


def copy_with_newline(base, token: int, tmp_path):
    """`base` with word `t{token}` decoding to a newline (the tiny tokenizer has no decoder)."""
    gen = with_tokenizer(base, fim_tokenizer_dir(tmp_path / "nl"))
    real = gen.tokenizer

    class NewlineTokenizer:
        def __getattr__(self, name):
            return getattr(real, name)

        def decode(self, ids, skip_special_tokens=True):
            return "".join("\n" if t == token else f"w{t} " for t in ids if t < 90)

    gen.tokenizer = NewlineTokenizer()
    return gen


def test_extra_files_outside_the_template_feed_lookup_only(tiny_bundle, tmp_path):
    gen = with_tokenizer(
        tiny_bundle("qwen3", 8).generator, fim_tokenizer_dir(tmp_path, "codellama")
    )
    fim = FimPrompt(PREFIX, SUFFIX, extra=(("lib.py", "t30 t31 t32 t33"),))
    ids, refs = gen.fim.encode(gen.tokenizer, fim)
    assert refs == [[30, 31, 32, 33]] and 30 not in ids
    plain = gen.generate(fim, max_new_tokens=20, draft="none").token_ids
    assert gen.generate(fim, max_new_tokens=20, draft="lookup").token_ids == plain


def test_refusals_name_the_problem(tiny_bundle, qwen_gen):
    plain = tiny_bundle("qwen3", 8).generator  # word tokens only: no FIM tokens
    with pytest.raises(InvalidArgumentError, match="no fill-in-the-middle tokens") as err:
        plain.infill("t5", "t6")
    assert err.value.argument == "suffix" and plain.bundle.root.name in str(err.value)
    huge = FimPrompt("t5", "t6", extra=tuple((f"f{i}.py", "t7 " * 20) for i in range(8)))
    with pytest.raises(ContextOverflowError, match=r"extra: .* 8 extra files"):
        qwen_gen.generate(huge, max_new_tokens=4)
    with pytest.raises(ContextOverflowError, match=r"^suffix: .* 0 extra files"):
        qwen_gen.infill("t5", "t6 " * 200, max_new_tokens=4)
    with pytest.raises(InvalidArgumentError, match="max_lines"):
        qwen_gen.infill("t5", "t6", max_lines=-1)
    with pytest.raises(InvalidArgumentError, match="extra"):
        qwen_gen.infill("t5", "t6", extra=[("a.py",)])
    with pytest.raises(InvalidArgumentError, match="parse_special"):
        qwen_gen.generate(FimPrompt("t5"), chat=False, parse_special=True)


def test_complete_cli_at_a_cursor(tiny_bundle, qwen_gen, tmp_path, capsys, monkeypatch):
    from dflash_edge.cli import main
    from dflash_edge.runtime.generator import Generator

    src = tmp_path / "app.py"
    src.write_text(f"{PREFIX}\n{SUFFIX}\n")
    path = str(tiny_bundle("qwen3", 8).path)
    assert main(["complete", path, str(src), "--line", "1"]) == 2  # this bundle: no FIM tokens
    assert "no fill-in-the-middle tokens" in capsys.readouterr().err
    assert main(["complete", path, str(src), "--line", "9"]) == 2
    err = capsys.readouterr().err
    assert "--line 9: " in err and "lines 1..3" in err
    monkeypatch.setattr(Generator, "load", classmethod(lambda cls, *a, **k: qwen_gen))
    want = qwen_gen.infill(PREFIX, f"\n{SUFFIX}\n", max_new_tokens=12, file_name="app.py")
    argv = ["complete", path, str(src), "--line", "1", "--max-new-tokens", "12"]
    assert main(argv) == 0
    assert capsys.readouterr().out == want.text + "\n"
    out = tmp_path / "done.py"
    assert main([*argv, "--column", "3", "--output", str(out)]) == 0
    middle = qwen_gen.infill(PREFIX[:2], PREFIX[2:] + f"\n{SUFFIX}\n", max_new_tokens=12).text
    assert out.read_text() == PREFIX[:2] + middle + PREFIX[2:] + f"\n{SUFFIX}\n"
    assert main([*argv, "--column", "99"]) == 2 and "--column 99" in capsys.readouterr().err


def test_code_prompt_set_feeds_bench_and_tune(qwen_gen):
    from dflash_edge.cli.bench import BenchPlan, bench_prompt
    from dflash_edge.cli.common import prompt_of
    from dflash_edge.data import read_prompts
    from dflash_edge.runtime.calibrate import acceptance

    rows = read_prompts("code")
    fims = [r for r in rows if "suffix" in r]
    edits = [r for r in rows if r["category"].startswith("edit-")]
    editor = [r for r in rows if r["category"].startswith("editor-")]
    assert len(fims) >= 8 and len(edits) >= 10 and all(r["expected"] for r in fims)
    assert len(editor) >= 10 and all("only the edited code" in r["prompt"] for r in editor)
    assert isinstance(prompt_of(fims[0]), FimPrompt) and prompt_of(edits[0]) == edits[0]["prompt"]
    for row in (fims[0], edits[0]):
        out, _ = bench_prompt(qwen_gen, row, 0, BenchPlan(("plain", "always", "default"), 8))
        assert out["lossless"] and out["new_tokens"] >= 1
    accepted, used = acceptance(qwen_gen, [prompt_of(fims[1])], 8, deadline=float("inf"))
    assert used == 1 and accepted
