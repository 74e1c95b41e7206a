"""Front door: instant lazy import, CLI listing, user errors without tracebacks (tier 1)."""
import subprocess
import sys

from dflash_edge.cli import COMMANDS, main


def test_import_is_lazy():
    code = "import sys, dflash_edge; print(sorted(m for m in ('torch', 'onnx', 'transformers', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_lists_every_subcommand():
    out = subprocess.run([sys.executable, "-m", "dflash_edge.cli", "--help"], capture_output=True, text=True, check=True)
    for name in COMMANDS:
        assert name in out.stdout


def test_lazy_public_api_resolves():
    import dflash_edge

    assert callable(dflash_edge.speculative_generate) and callable(dflash_edge.load_target)


def test_user_error_is_one_line(tmp_path, capsys):
    rc = main(["generate", "--prompt", "hi", "--target", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "Traceback" not in err
