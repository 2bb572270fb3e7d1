"""The README's training examples are whole scripts in ``examples/`` (issue 37 item 11): each
``examples/*.py`` is shown in the README exactly as it is, and each README session that runs one
(``$ python examples/...`` and the commands after it) gives, run in a fresh folder, exactly the
output the README shows."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def _blocks(lang: str, text: str | None = None) -> list[str]:
    """The fenced blocks of language ``lang`` ("" for bare fences) of ``text`` (the README), in order."""
    out, open_lang, body = [], None, ""
    text = (REPO / "README.md").read_text(encoding="utf-8") if text is None else text
    for line in text.splitlines(keepends=True):
        if open_lang is None and line.startswith("```"):
            open_lang, body = line[3:].strip(), ""
        elif open_lang is not None and line.rstrip("\n") == "```":
            if open_lang == lang:
                out.append(body)
            open_lang = None
        elif open_lang is not None:
            body += line
    return out


def _shown_scripts() -> dict[str, str]:
    """``examples/NAME.py`` -> the README block that opens with ``# examples/NAME.py``."""
    out = {}
    for block in _blocks("python"):
        m = re.match(r"# (examples/[\w-]+\.py)\b", block)
        if m:
            out[m.group(1)] = block
    return out


def _sessions() -> list[list[tuple[str, str]]]:
    """Each bare block that starts by running an example: its ``(command, output)`` pairs."""
    out = []
    for block in _blocks(""):
        if not block.startswith("$ python examples/"):
            continue
        steps: list[tuple[str, str]] = []
        for line in block.splitlines(keepends=True):
            if line.startswith("$ "):
                steps.append((line[2:].rstrip("\n"), ""))
            else:
                steps[-1] = (steps[-1][0], steps[-1][1] + line)
        out.append(steps)
    return out


def test_every_example_script_is_in_the_readme_as_it_is():
    shown = _shown_scripts()
    files = sorted(f"examples/{p.name}" for p in EXAMPLES.glob("*.py"))
    assert sorted(shown) == files
    for name in files:
        assert shown[name] == (REPO / name).read_text(encoding="utf-8"), name


def test_every_python_block_of_the_training_section_is_a_whole_example_script():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Save from training"):text.index("\n### MindFormers: StoreCheckpoint")]
    blocks = _blocks("python", section)
    assert blocks and all(re.match(r"# examples/[\w-]+\.py\b", b) for b in blocks), [b[:60] for b in blocks]


def test_every_example_script_is_run_by_a_readme_session():
    run = {steps[0][0].split()[1] for steps in _sessions()}
    assert run == set(_shown_scripts())


@pytest.mark.slow
@pytest.mark.mindspore
@pytest.mark.parametrize("steps", _sessions(), ids=lambda steps: steps[0][0].split()[1])
def test_a_readme_session_gives_the_output_the_readme_shows(steps, tmp_path):
    pytest.importorskip("mindspore")
    (tmp_path / "examples").symlink_to(EXAMPLES, target_is_directory=True)
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command, shown in steps:
        r = subprocess.run(["bash", "-c", command], check=False, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.stdout == shown, f"$ {command}\n{r.stderr[-2000:]}"
