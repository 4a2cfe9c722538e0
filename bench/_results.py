"""What the benches that write docs/results/ share: which commit they measured, and keeping a
doc's rendered block in step with its JSON. Benches run as scripts (``python bench/x.py``), so
this folder is on sys.path and ``from _results import ...`` finds this file."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def head_state(path: str = "chainrun") -> tuple[str, bool]:
    """The commit measured, and whether ``path`` differs from it (then the numbers are not that
    commit's and the JSON says so)."""
    return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--", path))


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
