"""Front door: instant lazy import, CLI listing, user errors without tracebacks (tier 1)."""

import json
import re
import subprocess
import sys

import pytest

from dflash_edge.cli import main


def test_import_is_lazy():
    code = (
        "import sys, dflash_edge; print(sorted(m for m in ('torch', 'onnx', 'transformers', "
        "'numpy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


VERBS = [
    "fetch",
    "generate",
    "export",
    "quantize",
    "build-engines",
    "run",
    "complete",
    "bench",
    "tune",
    "devices",
    "serve",
    "train",
    "eval-drafter",
]  # written out: not read from COMMANDS


def test_help_lists_every_subcommand():
    code = (
        "import sys, json\nfrom dflash_edge.cli import main\ntry:\n    main(['--help'])\nexcept "
        "SystemExit as e:\n"
        "    rc = e.code\nprint(json.dumps({'rc': rc, 'verbs': sorted(m for m in sys.modules "
        "if m.startswith('dflash_edge.cli.'))}), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    listed = re.findall(r"^    (\S+)", out.stdout, re.M)  # argparse's subcommand rows, in order
    assert listed == VERBS
    assert json.loads(out.stderr) == {"rc": 0, "verbs": []}  # --help imported no verb's module


def test_lazy_public_api_resolves():
    import dflash_edge
    from dflash_edge.models import load_target, reference_loop

    assert (
        dflash_edge.speculative_generate is reference_loop.speculative_generate
    )  # the named objects,
    assert dflash_edge.target_generate is reference_loop.target_generate  # not look-alikes
    assert dflash_edge.load_target is load_target
    from dflash_edge.export.exporter import export_bundle
    from dflash_edge.quantize.bundle_quant import quantize_bundle
    from dflash_edge.runtime.generator import Generator
    from dflash_edge.runtime.validate import GenerationOptions

    assert (dflash_edge.Generator, dflash_edge.GenerationOptions) == (Generator, GenerationOptions)
    assert (dflash_edge.export_bundle, dflash_edge.quantize_bundle) == (
        export_bundle,
        quantize_bundle,
    )
    with pytest.raises(AttributeError, match="has no attribute 'nonexistent'"):
        dflash_edge.nonexistent


def test_user_error_is_one_line(tmp_path, capsys):
    rc = main(["generate", "--prompt", "hi", "--target", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "Traceback" not in err
