"""One rule for input (issue 16): every "Why" case gets a named error, up front; the CLI never
prints a traceback."""

import math
import os
import subprocess
import sys

import pytest

from dflash_edge.cli import main
from dflash_edge.runtime.generator import Generator
from dflash_edge.runtime.sampling import SamplingParams
from dflash_edge.runtime.validate import InvalidArgumentError, check, check_messages, check_stop

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "kwargs, named",
    [
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
    ],
)
def test_generate_names_the_bad_argument(tiny_bundle, kwargs, named):
    gen = tiny_bundle("qwen3", 8).generator
    with pytest.raises(InvalidArgumentError, match=named) as err:
        gen.generate("t5 t6", **kwargs)
    assert err.value.argument == next(iter(kwargs))
    with pytest.raises(
        InvalidArgumentError, match=named
    ):  # the stream refuses at the call, not later
        gen.stream("t5 t6", **kwargs)


@pytest.mark.parametrize(
    "fields, argument",
    [
        ({"draft": "drafter"}, "draft"),  # needs the drafter that was not loaded
        ({"draft": "auto"}, "draft"),
        ({"verify_len": 8}, "verify_len"),  # outside this bundle's 1..7
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"parse_special": True}, "parse_special"),  # only for a raw prompt
    ],
)
def test_stream_checks_every_input_at_the_call(tiny_bundle, fields, argument):
    """Issue 35: a bad option raises when stream() is called, before any iteration or model pass."""
    gen = Generator.load(tiny_bundle("qwen3", 8).path, drafter=False)
    calls = gen.target.runner.calls
    with pytest.raises(InvalidArgumentError) as err:
        gen.stream("t5 t6", **fields)
    assert err.value.argument == argument and gen.target.runner.calls == calls
    assert gen.generate("t5 t6", max_new_tokens=3, draft="none").token_ids  # it is free again


@pytest.mark.parametrize(
    "prompt, named",
    [
        (123, r"prompt=123: expected a string or a list of chat messages"),
        (None, r"prompt=None"),
        ([], r"prompt=\[\]: expected a non-empty list"),
        (["hi"], r"prompt\[0\]='hi'"),
        (
            [{"role": "wizard", "content": "x"}],
            r"prompt\[0\].role='wizard': expected one of system, user, assistant",
        ),
        ([{"role": "user", "content": 7}], r"prompt\[0\].content=7: expected a string"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
            r"reads text only",
        ),
    ],
)
def test_bad_prompts_are_named(tiny_bundle, prompt, named):
    with pytest.raises(InvalidArgumentError, match=named):
        tiny_bundle("qwen3", 8).generator.generate(prompt)


def test_generate_ids_checks_ids_and_budget(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    vocab = gen.bundle.model["vocab_size"]
    with pytest.raises(
        InvalidArgumentError,
        match=rf"prompt_ids\[1\]={vocab}: expected an integer token id in \[0, {vocab}\)",
    ):
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
    assert check_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    ) == [{"role": "user", "content": "ab"}]


# ---- the command line: one line, exit 2, before the bundle loads
# ------------------------------------------
@pytest.mark.parametrize(
    "argv, named",
    [
        (["--max-new-tokens", "0"], "--max-new-tokens=0: expected an integer >= 1"),
        (["--max-new-tokens", "-5"], "--max-new-tokens=-5"),
        (["--temperature", "-1"], "--temperature=-1.0: expected a finite number >= 0"),
        (["--temperature", "inf"], "--temperature=inf"),
        (["--top-p", "2"], "--top-p=2.0: expected a finite number in (0, 1]"),
        (["--top-p", "nan"], "--top-p=nan"),
        (
            ["--threads", "-1"],
            "--threads=-1: expected an integer >= 0 (0 = one per usable CPU; CPUs this process "
            "may use: ",
        ),
        (["--seed", "-2"], "--seed=-2"),
    ],
)
def test_run_cli_checks_before_loading(tmp_path, capsys, argv, named):
    # the bundle does not exist: a check that ran after loading would report the missing manifest
    # instead
    rc = main(["run", str(tmp_path / "no-bundle"), "--prompt", "hi", *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("dflash-edge run: error: ") and named in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_bench_cli_checks_before_loading(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "no-bundle"), "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens=0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--block-size", "0"], "--block-size=0: expected an integer in [2, 256]"),
        (["--max-context", "3"], "--max-context 3: even the shortest chat prompt"),
        (["--prefill-chunk", "0"], "--prefill-chunk=0"),
    ],
)
def test_export_cli_checks_before_loading_models(tiny_checkpoints, tmp_path, capsys, argv, named):
    target = tiny_checkpoints["qwen3"][1]
    rc = main(
        [
            "export",
            "--out",
            str(tmp_path / "b"),
            "--target",
            str(target),
            "--draft",
            "random",
            *argv,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and named in err and "Traceback" not in err, err
    assert not (tmp_path / "b").exists()


def test_export_without_torch_names_the_extra(tiny_checkpoints, tmp_path):
    """A runtime-only install (simulated: torch unimportable) gets the extra to install, not a
    traceback."""
    target = tiny_checkpoints["qwen3"][1]
    code = (
        "import sys; sys.modules['torch'] = None\nfrom dflash_edge.cli import main\n"
        f"sys.exit(main(['export', '--out', {str(tmp_path / 'b')!r}, '--target', {str(target)!r}, "
        "'--draft', 'random']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert (
        "needs the package 'torch'" in out.stderr
        and 'pip install "dflash-edge[export]"' in out.stderr
    )
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "argv, named",
    [
        (["generate", "--prompt", "hi", "--temperature", "nan"], "--temperature=nan"),
        (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens=0"),
        (["eval-drafter", "--draft", "x", "--threads", "-1"], "--threads=-1"),
        (["train", "--out", "x", "--block-size", "1"], "--block-size=1"),
    ],
)
def test_every_subcommand_checks_its_numbers_first(capsys, argv, named):
    """The dispatcher applies validate.py's rules to every subcommand's options before the command
    runs."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and err.count("\n") == 1


def test_serve_without_its_extra_names_it(tmp_path):
    code = (
        "import sys; sys.modules['uvicorn'] = None\nfrom dflash_edge.cli import main\n"
        f"sys.exit(main(['serve', {str(tmp_path / 'b')!r}]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (
        out.returncode == 2
        and 'pip install "dflash-edge[serve]"' in out.stderr
        and "Traceback" not in out.stderr
    )


def test_runtime_and_cli_never_import_the_web_stack(tiny_bundle):
    code = (
        "import sys\nfrom dflash_edge.runtime import Generator\nimport dflash_edge.cli\n"
        f"Generator.load({str(tiny_bundle('qwen3', 8).path)!r}).generate('t5', max_new_tokens=3)\n"
        "print(sorted(m for m in ('starlette', 'uvicorn', 'httpx', 'dflash_edge.serve') if m in "
        "sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# ---- issue 28: every argument of Generator.load, typed; text that is not text; train without torch
# ------------
@pytest.mark.parametrize(
    "kwargs, named",
    [
        (
            {"threads": -1},
            r"threads=-1: expected an integer >= 0 \(0 = one per usable CPU; CPUs this process "
            r"may use: \d+\)",
        ),
        ({"threads": "2"}, r"threads='2': expected an integer >= 0.*got str"),
        ({"threads": 2.0}, r"threads=2.0: .*got float"),
        ({"threads": True}, r"threads=True"),
        (
            {"provider": "tpu"},
            r"provider='tpu': expected one of cpu, cuda, tensorrt \(available here: .*cpu",
        ),
        ({"provider": None}, r"provider=None: expected one of cpu"),
        ({"spin": "no"}, r"spin='no': expected true or false"),
        ({"verify": 1}, r"verify=1: expected true or false"),
        ({"use_tuned": None}, r"use_tuned=None"),
        ({"share_weights": "yes"}, r"share_weights='yes'"),
        ({"drafter": "no"}, r"drafter='no': expected true or false"),
        ({"target_graph": 3}, r"target_graph=3: expected a graph name"),
    ],
)
def test_load_checks_every_argument_before_reading_the_bundle(tmp_path, kwargs, named):
    # the bundle does not exist: a check that ran after reading it would report the missing manifest
    # instead
    with pytest.raises(InvalidArgumentError, match=named) as err:
        Generator.load(tmp_path / "no-bundle", **kwargs)
    assert err.value.argument == next(iter(kwargs))
    with pytest.raises(InvalidArgumentError, match="bundle=5: expected a bundle directory"):
        Generator.load(5)


def test_unknown_provider_is_still_a_provider_error(tmp_path):
    from dflash_edge.runtime.session import ProviderUnavailableError

    with pytest.raises(ProviderUnavailableError):
        Generator.load(tmp_path, provider="tpu")


def test_more_threads_than_cpus_are_lowered_with_one_warning(tiny_bundle):
    from dflash_edge.runtime.session import default_threads
    from dflash_edge.runtime.validate import ClampedArgumentWarning

    cpus = default_threads()
    with pytest.warns(ClampedArgumentWarning) as caught:
        gen = Generator.load(tiny_bundle("qwen3", 8).path, threads=999)
    assert [str(w.message) for w in caught] == [
        f"threads=999 is more than the {cpus} CPUs this process may use; using {cpus}"
    ]
    assert gen.target.runner.session.get_session_options().intra_op_num_threads == cpus
    assert (
        check("threads", cpus) == cpus and check("threads", 0) == 0
    )  # in range: as given, no warning


def test_cli_threads_above_the_cpus_warn_in_one_line(tmp_path, capsys):
    from dflash_edge.runtime.session import default_threads

    cpus = default_threads()
    assert main(["run", str(tmp_path / "no-bundle"), "--prompt", "hi", "--threads", "999"]) == 2
    warning, error = (
        capsys.readouterr().err.splitlines()
    )  # the same words as the API, then the bundle error
    assert warning == (
        f"dflash-edge run: warning: --threads=999 is more than the {cpus} CPUs this process may "
        "use; "
        f"using {cpus}"
    )
    assert error.startswith("dflash-edge run: error: ") and "no-bundle" in error


def test_verify_len_of_the_wrong_type_says_it_expects_an_integer(tiny_bundle):
    gen = tiny_bundle("qwen3", 8).generator
    with pytest.raises(
        InvalidArgumentError, match=r"verify_len='x': expected an integer in \[1, 7\].*got str"
    ) as err:
        gen.generate("t5", verify_len="x")
    assert "outside" not in str(err.value)
    with pytest.raises(InvalidArgumentError, match=r"verify_len=2.0: expected an integer"):
        gen.generate("t5", verify_len=2.0)
    with pytest.raises(InvalidArgumentError, match=r"verify_len=9: verify length outside 1..7"):
        gen.generate("t5", verify_len=9)


@pytest.mark.parametrize(
    "call, argument",
    [
        (lambda g: g.generate("", chat=False), "prompt"),
        (lambda g: g.stream("", chat=False), "prompt"),
        (lambda g: g.generate("t5 \ud800"), "prompt"),
        (lambda g: g.generate("t5 \udcff", chat=False), "prompt"),
        (lambda g: g.generate(b"t5"), "prompt"),
        (lambda g: g.generate([{"role": "user", "content": "t5 \ud800"}]), "prompt[0].content"),
        (
            lambda g: g.generate(
                [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]
            ),
            "prompt[0].content",
        ),
        (lambda g: g.generate("t5", stop=["\ud800"]), "stop"),
    ],
)
def test_empty_and_undecodable_prompts_are_invalid_arguments(tiny_bundle, call, argument):
    with pytest.raises(InvalidArgumentError) as err:
        call(tiny_bundle("qwen3", 8).generator)
    assert err.value.argument == argument


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--raw", "--prompt", ""], "--prompt='': a raw prompt (chat=False) needs some text"),
        (
            ["--prompt", "t5 \udcff"],
            "--prompt='t5 \\udcff': not valid text (a lone surrogate '\\udcff' at character 3",
        ),
        (
            ["--prompt", "t5", "--parse-special"],
            "--parse-special=True: only a raw prompt (chat=False)",
        ),
    ],
)
def test_run_cli_bad_prompts_in_one_line(tiny_bundle, capsys, argv, named):
    path = str(tiny_bundle("qwen3", 8).path)
    capsys.readouterr()  # the bundle's export report, when built just now
    assert main(["run", path, *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and err.count("\n") == 1, err


def test_run_cli_undecodable_argv_bytes_in_one_line(tmp_path):
    """Bytes that are not UTF-8 on a real command line (Python keeps them as lone surrogates)."""
    out = subprocess.run(
        [
            sys.executable.encode(),
            b"-m",
            b"dflash_edge.cli",
            b"run",
            str(tmp_path).encode(),
            b"--prompt",
            b"caf\xe9",
        ],
        capture_output=True,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
    )
    err = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 2 and "--prompt='caf\\udce9': not valid text" in err, err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, rc", [(["train", "--out", "x"], 2), (["train", "--help"], 0)])
def test_train_without_torch_names_the_extra(tmp_path, argv, rc):
    """A runtime-only install (simulated: torch unimportable): the train extra to install, never a
    traceback."""
    code = (
        "import sys; sys.modules['torch'] = None\nfrom dflash_edge.cli import main\n"
        f"sys.exit(main({argv!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == rc, out.stderr
    assert (
        "Traceback" not in out.stderr
        and 'pip install "dflash-edge[train]"' in out.stderr + out.stdout
    )
    if rc == 2:
        assert out.stderr == (
            "dflash-edge train: error: this command needs the package 'torch', which is not "
            "installed "
            "here; install the 'train' extra: pip install \"dflash-edge[train]\"\n"
        )
