"""The Python code blocks of README.md and docs/*.md run as written.

Every ```python block is preceded by a comment saying how it runs:

    <!-- run: mpiexec -n 8 -->    under mpiexec on 8 ranks (any count)
    <!-- run: python -->          in one process
    <!-- run: gpu, mpiexec -n 2 -->  needs a GPU: skipped, with the reason, where there is none

A block without one fails this test, so a new block cannot go untested. Blocks run from a
temporary directory, with the calibration of `auto` off (FOURD_CALIBRATE=0: faster, and the
result of a block does not depend on it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpirun import ROOT, mpiexec

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(
    r"(?:<!--\s*run:\s*(?P<how>[^>]*?)\s*-->\s*\n)?```python\n(?P<code>.*?)```", re.S
)


def blocks(text: str) -> list[tuple[int, str | None, str]]:
    """(line, how, code) of every python block of a Markdown text."""
    return [
        (text[: m.start()].count("\n") + 1, m.group("how"), m.group("code"))
        for m in _BLOCK.finditer(text)
    ]


def command(how: str, script: Path) -> list[str]:
    """The command that runs a block, from its annotation."""
    how = how.replace("gpu,", "").strip()
    if how == "python":
        return [sys.executable, str(script)]
    m = re.fullmatch(r"mpiexec -n (\d+)", how)
    if not m:
        raise ValueError(f"unknown run annotation {how!r}")
    return [mpiexec(), "-n", m.group(1), sys.executable, "-m", "mpi4py", str(script)]


def run_block(how: str, code: str, cwd: Path, timeout: float = 300):
    script = cwd / "block.py"
    script.write_text(code)
    env = {"FOURD_CALIBRATE": "0", "PYTHONUNBUFFERED": "1"}
    import os

    return subprocess.run(
        command(how, script),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
    )


CASES = [(doc, line, how, code) for doc in DOCS for line, how, code in blocks(doc.read_text())]


def _gpu_missing() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device: torch.cuda is unavailable (torch {torch.__version__})"
    return None


@pytest.mark.parametrize(
    "doc,line,how,code", CASES, ids=[f"{c[0].relative_to(ROOT)}:{c[1]}" for c in CASES]
)
def test_doc_block_runs(doc, line, how, code, tmp_path):
    where = f"{doc.relative_to(ROOT)}:{line}"
    assert how, f"{where}: a python block without a <!-- run: ... --> annotation"
    if how.startswith("gpu"):
        reason = _gpu_missing()
        if reason:
            print(f"skipping {where}: {reason}")
            pytest.skip(reason)
    r = run_block(how, code, tmp_path)
    assert r.returncode == 0, f"{where} failed ({how}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def test_the_check_finds_a_broken_block(tmp_path):
    """The runner itself: a block that raises fails, an annotation is required."""
    text = "<!-- run: python -->\n```python\nraise SystemExit(3)\n```\n\n```python\nx = 1\n```\n"
    found = blocks(text)
    assert [(line, how) for line, how, _ in found] == [(1, "python"), (6, None)]
    r = run_block("python", found[0][2], tmp_path)
    assert r.returncode == 3
    r = run_block("mpiexec -n 2", "import fourd\nfourd.init()\nfourd.all_reduce(1)\n", tmp_path)
    assert r.returncode != 0 and "DTypeError" in r.stderr + r.stdout
