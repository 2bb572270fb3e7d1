"""The ``ckptstore`` command line where no checkpoint is needed: the installed script, help texts
and usage errors. Runs without MindSpore (``make test-pure``)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ckptstore.checkpoint.selection import OPTIMIZER_STATE_PREFIXES, TRAINING_COUNTERS
from ckptstore.cli import main
from convert_fixtures import cli_command, run_cli


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_console_script_is_installed():
    assert Path(cli_command()[0]).name == "ckptstore"


def test_convert_help_lists_every_optimizer_state_prefix_and_counter():
    r = run_cli("convert", "--help")
    assert r.returncode == 0, r.stderr
    text = _one_line(r.stdout)
    assert "--drop-optimizer" in text
    prefixes, counters = text.split("State:", 1)[1].split("Counters:", 1)
    for listed, names in ((prefixes, OPTIMIZER_STATE_PREFIXES), (counters, TRAINING_COUNTERS)):
        for name in names:
            assert re.search(rf"(?<![\w.*]){re.escape(name)}(?![\w.*])", listed), name


@pytest.mark.parametrize("command", [["--help"], ["convert", "--help"]], ids=["ckptstore", "convert"])
def test_help_describes_every_source_format_and_store_kind(command):
    r = run_cli(*command)
    assert r.returncode == 0, r.stderr
    text = _one_line(r.stdout.split("Options:", 1)[0])
    for words in (".ckpt", ".safetensors", "Zarr v3", "safetensors files" if len(command) == 1 else
                  "--format safetensors", "'ckptstore index'"):
        assert words in text, words


def test_help_says_which_arguments_may_be_urls_and_where_their_credentials_come_from():
    text = _one_line(run_cli("--help").stdout.split("Typical use:", 1)[0])
    assert ("SRC, STORE, --out and --strategy may be s3://bucket/prefix URLs (obs:// for Huawei OBS), with the "
            "endpoint and credentials from the AWS environment (AWS_ENDPOINT_URL,") in text
    assert "export writes local files." in text


def test_verify_of_a_missing_store_exits_2(tmp_path):
    r = run_cli("verify", tmp_path / "nothing.zarr", process=True)  # the installed script's real stderr
    assert r.returncode == 2
    assert "Traceback" not in r.stderr


def test_info_of_a_missing_path_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["info", str(tmp_path / "nope.ckpt")], catch_exceptions=False)
    assert result.exit_code == 2 and "does not exist" in result.stderr


@pytest.mark.parametrize("args,message", [
    (["convert"], "ckptstore: error: Missing argument 'SRC'. (see 'ckptstore convert --help') [UsageError]"),
    (["export", "s.zarr", "out", "--format", "zip"],
     "ckptstore: error: Invalid value for '--format': 'zip' is not one of 'ckpt', 'safetensors', 'hf'. "
     "(see 'ckptstore export --help') [UsageError]"),
    (["plan", ".", "--rank", "x"],
     "ckptstore: error: Invalid value for '--rank': 'x' is not a valid integer range. "
     "(see 'ckptstore plan --help') [UsageError]"),
    (["frobnicate"], "ckptstore: error: No such command 'frobnicate'. (see 'ckptstore --help') [UsageError]"),
], ids=["missing-argument", "bad-choice", "bad-integer", "unknown-command"])
def test_a_usage_error_is_one_line_and_exit_2(args, message):
    r = run_cli(*args)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", message + "\n")


def test_the_bare_command_prints_its_help():
    r = run_cli()
    assert r.returncode == 0 and r.stdout.startswith("Usage: ckptstore [OPTIONS] COMMAND [ARGS]..."), r.stdout


def test_python_dash_m_ckptstore_is_the_ckptstore_command():
    # where pip's console script is not on PATH, `python -m ckptstore` runs the same command
    out = subprocess.run([sys.executable, "-m", "ckptstore", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: ckptstore [OPTIONS] COMMAND [ARGS]...")
