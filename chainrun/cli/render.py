"""Rendering helpers shared by commands: times, the JSON envelope, tables."""

from __future__ import annotations

import json
import time
from typing import Any

from chainrun import __version__

# 2: `sim --json` and `model eval --json` moved into the envelope (their object unchanged under "data")
JSON_SCHEMA = 2


def envelope(command: str, data: Any) -> str:
    """Every --json output: a versioned envelope so scripts can rely on its shape."""
    return json.dumps({"chainrun": __version__, "schema": JSON_SCHEMA, "command": command, "data": data},
                      indent=2, default=str)


def clock(ts: float | None, *, now: float | None = None) -> str:
    if ts is None:
        return "-"
    now = time.time() if now is None else now
    lt = time.localtime(ts)
    if abs(now - ts) < 20 * 3600:
        return time.strftime("%H:%M:%S", lt)
    return time.strftime("%m-%d %H:%M", lt)


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def role_line(role) -> str:
    """One line saying whether this watch acts, and if not, which process does (plain and live view)."""
    if role.acting:
        me = f" ({role.holder.label}, lease epoch {role.holder.epoch})" if role.holder else ""
        return f"acting: this watch{me} moves the chains of this home"
    who = f"{role.holder.label} (lease until {clock(role.holder.expires)})" if role.holder else "another watch"
    why = f"{role.why}; " if role.why else ""
    return f"read-only: {why}{who} acts; this watch shows its events and takes over if it stops"
