"""``convert --dec-key-file`` reads a regular file of a key's size, nothing else (issue 37 item 8):
a FIFO, a device or an oversized file is refused (one line, exit 2) before it is read, so a
FIFO no one writes cannot hang the run."""
from __future__ import annotations

import os

import pytest

from convert_fixtures import run_cli

pytestmark = pytest.mark.slow  # each runs the CLI in a process with a timeout (a hang must fail, not block)


def _convert_with_key(tmp_path, key_file):
    (tmp_path / "src").mkdir()
    return run_cli("convert", tmp_path / "src", "--out", tmp_path / "s", "--dec-key-file", key_file, timeout=60)


def test_a_key_file_that_is_a_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    r = _convert_with_key(tmp_path, fifo)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--dec-key-file {fifo} is not a regular file" in r.stderr


def test_a_key_file_larger_than_a_key_is_refused_naming_its_size(tmp_path):
    big = tmp_path / "key"
    big.write_bytes(b"k" * 4096)
    r = _convert_with_key(tmp_path, big)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--dec-key-file {big} is 4096 bytes; a key file holds the 16, 24 or 32 bytes" in r.stderr


def test_a_device_given_as_key_file_is_refused(tmp_path):
    r = _convert_with_key(tmp_path, "/dev/zero")
    assert r.returncode == 2 and "--dec-key-file /dev/zero is not a regular file" in r.stderr, r.stderr
