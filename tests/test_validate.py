"""One rule for input (issue 16): every "Why" case gets a named error, up front; the CLI never prints a traceback."""
import math
import subprocess
import sys

import pytest

from dflash_edge.cli import main
from dflash_edge.runtime.sampling import SamplingParams
from dflash_edge.runtime.validate import InvalidArgumentError, check, check_messages, check_stop


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("kwargs, named", [
    ({"temperature": NAN}, r"temperature=nan: expected a finite number >= 0"),
    ({"temperature": INF}, r"temperature=inf: expected a finite number >= 0"),
    ({"temperature": -1.0}, r"temperature=-1.0"),
    ({"temperature": "hot"}, r"temperature='hot'.*got str"),
    ({"max_new_tokens": 2.5}, r"max_new_tokens=2.5: expected an integer >= 1.*got float"),
    ({"max_new_tokens": "ten"}, r"max_new_tokens='ten'"),
    ({"max_new_tokens": True}, r"max_new_tokens=True"),
    ({"max_new_tokens": -5}, r"max_new_tokens=-5"),
    ({"top_p": NAN}, r"top_p=nan: expected a finite number in \(0, 1\]"),
    ({"top_p": 0.0}, r"top_p=0.0"),
    ({"top_k": -1}, r"top_k=-1: expected an integer >= 0"),
    ({"seed": -1}, r"seed=-1"),
    ({"stop": 5}, r"stop=5: expected a string or a list of strings"),
    ({"stop": ["x"] * 17}, r"at most 16 strings"),
    ({"draft": "yes"}, r"draft='yes'"),
    ({"chat": "no"}, r"chat='no': expected true or false"),
])
def test_generate_names_the_bad_argument(tiny_bundle, kwargs, named):
    gen = tiny_bundle("qwen3", 8).generator
    with pytest.raises(InvalidArgumentError, match=named) as err:
        gen.generate("t5 t6", **kwargs)
    assert err.value.argument == next(iter(kwargs))
    with pytest.raises(InvalidArgumentError, match=named):            # the stream refuses at the call, not later
        gen.stream("t5 t6", **kwargs)


@pytest.mark.parametrize("prompt, named", [
    (123, r"prompt=123: expected a string or a list of chat messages"),
    (None, r"prompt=None"),
    ([], r"prompt=\[\]: expected a non-empty list"),
    (["hi"], r"prompt\[0\]='hi'"),
    ([{"role": "wizard", "content": "x"}], r"prompt\[0\].role='wizard': expected one of system, user, assistant"),
    ([{"role": "user", "content": 7}], r"prompt\[0\].content=7: expected a string"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], r"reads text only"),
])
def test_bad_prompts_are_named(tiny_bundle, prompt, named):
    with pytest.raises(InvalidArgumentError, match=named):
        tiny_bundle("qwen3", 8).generator.generate(prompt)


def test_generate_ids_checks_ids_and_budget(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    vocab = gen.bundle.model["vocab_size"]
    with pytest.raises(InvalidArgumentError, match=rf"prompt_ids\[1\]={vocab}: expected an integer token id in \[0, {vocab}\)"):
        gen.generate_ids([5, vocab], 4)
    with pytest.raises(InvalidArgumentError, match=r"max_new_tokens=2.5"):
        gen.generate_ids([5, 6], 2.5)
    with pytest.raises(InvalidArgumentError, match=r"sampling='greedy'"):
        gen.generate_ids([5, 6], 2, sampling="greedy")


def test_sampling_params_refuse_non_finite():
    for kwargs in ({"temperature": NAN}, {"top_p": INF}, {"top_k": 1.5}, {"seed": -3}):
        with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
            SamplingParams(**kwargs)


def test_valid_values_pass_through_normalised():
    import numpy as np

    assert check("temperature", 1) == 1.0 and isinstance(check("temperature", 1), float)
    assert check("max_new_tokens", np.int64(4)) == 4
    assert check("top_p", 1.0) == 1.0 and not math.isnan(check("top_p", 0.5))
    assert check_stop("x") == ("x",) and check_stop(None) == () and check_stop(["a", ""]) == ("a",)
    assert check_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]) \
        == [{"role": "user", "content": "ab"}]


# ---- the command line: one line, exit 2, before the bundle loads ------------------------------------------
@pytest.mark.parametrize("argv, named", [
    (["--max-new-tokens", "0"], "--max-new-tokens=0: expected an integer >= 1"),
    (["--max-new-tokens", "-5"], "--max-new-tokens=-5"),
    (["--temperature", "-1"], "--temperature=-1.0: expected a finite number >= 0"),
    (["--temperature", "inf"], "--temperature=inf"),
    (["--top-p", "2"], "--top-p=2.0: expected a finite number in (0, 1]"),
    (["--top-p", "nan"], "--top-p=nan"),
    (["--threads", "-1"], "--threads=-1: expected an integer in [0, 4096]"),
    (["--seed", "-2"], "--seed=-2"),
])
def test_run_cli_checks_before_loading(tmp_path, capsys, argv, named):
    # the bundle does not exist: a check that ran after loading would report the missing manifest instead
    rc = main(["run", str(tmp_path / "no-bundle"), "--prompt", "hi", *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("dflash-edge run: error: ") and named in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_bench_cli_checks_before_loading(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "no-bundle"), "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens=0" in capsys.readouterr().err


@pytest.mark.parametrize("argv, named", [
    (["--block-size", "0"], "--block-size=0: expected an integer in [2, 256]"),
    (["--max-context", "3"], "--max-context 3: even the shortest chat prompt"),
    (["--prefill-chunk", "0"], "--prefill-chunk=0"),
])
def test_export_cli_checks_before_loading_models(tiny_checkpoints, tmp_path, capsys, argv, named):
    target = tiny_checkpoints["qwen3"][1]
    rc = main(["export", "--out", str(tmp_path / "b"), "--target", str(target), "--draft", "random", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and named in err and "Traceback" not in err, err
    assert not (tmp_path / "b").exists()


def test_export_without_torch_names_the_extra(tiny_checkpoints, tmp_path):
    """A runtime-only install (simulated: torch unimportable) gets the extra to install, not a traceback."""
    target = tiny_checkpoints["qwen3"][1]
    code = ("import sys; sys.modules['torch'] = None\nfrom dflash_edge.cli import main\n"
            f"sys.exit(main(['export', '--out', {str(tmp_path / 'b')!r}, '--target', {str(target)!r}, "
            "'--draft', 'random']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "needs the package 'torch'" in out.stderr and 'pip install "dflash-edge[export]"' in out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1


@pytest.mark.parametrize("argv, named", [
    (["generate", "--prompt", "hi", "--temperature", "nan"], "--temperature=nan"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens=0"),
    (["eval-drafter", "--draft", "x", "--threads", "-1"], "--threads=-1"),
    (["train", "--out", "x", "--block-size", "1"], "--block-size=1"),
])
def test_every_subcommand_checks_its_numbers_first(capsys, argv, named):
    """The dispatcher applies validate.py's rules to every subcommand's options before the command runs."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and err.count("\n") == 1


def test_serve_without_its_extra_names_it(tmp_path):
    code = ("import sys; sys.modules['uvicorn'] = None\nfrom dflash_edge.cli import main\n"
            f"sys.exit(main(['serve', {str(tmp_path / 'b')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2 and 'pip install "dflash-edge[serve]"' in out.stderr and "Traceback" not in out.stderr


def test_runtime_and_cli_never_import_the_web_stack(tiny_bundle):
    code = ("import sys\nfrom dflash_edge.runtime import Generator\nimport dflash_edge.cli\n"
            f"Generator.load({str(tiny_bundle('qwen3', 8).path)!r}).generate('t5', max_new_tokens=3)\n"
            "print(sorted(m for m in ('starlette', 'uvicorn', 'httpx', 'dflash_edge.serve') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
