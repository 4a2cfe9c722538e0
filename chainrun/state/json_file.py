"""A small JSON document kept beside the models (chain/tuned.py's values in force, chain/site_tuned.py's
site margins): read with its own shape check, written atomically, an unreadable one set aside whole.

One implementation for both: a reader that indexes a document must never meet one it cannot use (a
watcher or a submit would stop over it), and nothing a user or an older chainrun wrote is ever lost.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


def read(p: Path, empty: dict, bad: Callable[[object], "str | None"]) -> tuple[dict | None, str | None]:
    """``(document, None)`` (a copy of ``empty`` when there is no file), or ``(None, why)`` when the
    file cannot be used: not readable, not JSON, or a shape ``bad`` names."""
    if not p.exists():
        return json.loads(json.dumps(empty)), None
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as e:  # a folder, no permission, not UTF-8, not JSON
        return None, str(e) or type(e).__name__
    return (doc, None) if (why := bad(doc)) is None else (None, why)


def save(p: Path, doc: dict) -> Path:
    """Atomically: a reader meanwhile sees the old document or the new one, never a part."""
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(tmp, p)
    return p


def set_aside(p: Path, why: str) -> dict:
    """Rename ``p`` to ``<name>.corrupt-<UTC time>`` beside it (one rename in the folder: atomic; never
    over another file, so nothing is lost); what was done."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest, n = p.with_name(f"{p.name}.corrupt-{stamp}"), 1
    while dest.exists() or dest.is_symlink():
        dest, n = p.with_name(f"{p.name}.corrupt-{stamp}-{n}"), n + 1
    os.replace(p, dest)
    return {"file": str(p), "moved_to": str(dest), "why": why}


@contextmanager
def locked(p: Path) -> Iterator[None]:
    """One read-modify-write of ``p`` at a time: an exclusive lock on ``<name>.lock`` beside it, held until
    the new document is in place. Two crons refreshing two clusters both record into the one site margin
    file; without it the later write would drop the earlier one's entry. (A lock file, not ``p`` itself:
    ``save`` replaces ``p``, and a lock on a replaced inode holds nothing.)"""
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p.with_name(p.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
