"""What the benches that write docs/results/ share: which commit they measured, and keeping a
doc's rendered block in step with its JSON. Benches run as scripts (``python bench/x.py``), so
this folder is on sys.path and ``from _results import ...`` finds this file."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def head_state(path: str = "chainrun") -> tuple[str, bool]:
    """The commit measured, and whether ``path`` differs from it (then the numbers are not that
    commit's and the JSON says so)."""
    return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--", path))


def run_chainrun(cmd: list[str], from_head: bool) -> tuple[subprocess.CompletedProcess, str, float]:
    """Run ``chainrun <cmd[1:]>`` in a child Python: (the process, the commit it measured, its wall
    seconds). The commit is read before the run (others may commit while it runs); with ``from_head``
    chainrun runs from an export of that commit, not the shared tree's uncommitted edits."""
    exe = [sys.executable, "-c", "import sys; from chainrun.cli.main import run; sys.argv[0] = 'chainrun'; sys.exit(run())"]
    env = dict(os.environ)
    commit = git("rev-parse", "HEAD")
    with tempfile.TemporaryDirectory() as tmp:
        if from_head:
            archive = subprocess.run(["git", "archive", commit, "chainrun"], cwd=REPO, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            env["PYTHONPATH"] = tmp
        t = time.monotonic()
        # `python -c` puts its working directory first on sys.path: run from the export itself
        p = subprocess.run([*exe, *cmd[1:]], capture_output=True, text=True, cwd=tmp if from_head else REPO, env=env)
    return p, commit, round(time.monotonic() - t, 1)


def sync_doc(doc: Path, render: Callable[[str], str], check: bool) -> int:
    """Re-render ``doc`` from its current text. With ``check``: 1 when the file is not what its
    JSON renders to (a doc test runs this), nothing written; otherwise write it if it changed."""
    text = doc.read_text()
    new = render(text)
    if check:
        return 0 if new == text else 1
    if new != text:
        doc.write_text(new)
    return 0
