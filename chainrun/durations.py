"""The duration grammar users type: ``72h``, ``90m``, ``3d``, ``1h30m``, ``1-12:00:00``, ``HH:MM:SS``.

Pure functions, no imports beyond the standard library: the CLI parses options with them
on the ``--help`` path. A bare number is refused because Slurm reads it as minutes and
people read it as hours; we make the user say which.
"""

from __future__ import annotations

import math
import re

from chainrun.errors import UsageError

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_UNIT_RE = re.compile(r"(\d+(?:\.\d+)?)([dhms])", re.ASCII)
_UNIT_FULL_RE = re.compile(r"(?:\d+(?:\.\d+)?[dhms])+", re.ASCII)
_CLOCK_RE = re.compile(r"(?:(\d+)-)?(\d+):(\d{1,2})(?::(\d{1,2}))?", re.ASCII)
_DAYS_HOURS_RE = re.compile(r"(\d+)-(\d+)", re.ASCII)

DURATION_HELP = "72h, 90m, 3d, 1h30m, 1-12:00:00 or HH:MM:SS"


def parse_duration(text: str, *, what: str = "duration") -> int:
    """Return whole seconds for a duration the user typed, or raise UsageError."""
    raw = text
    text = (text or "").strip().lower()
    if not text:
        raise UsageError(f"empty {what}", hint=f"use {DURATION_HELP}")
    seconds: float | None = None
    if _UNIT_FULL_RE.fullmatch(text):
        units = [u for _, u in _UNIT_RE.findall(text)]
        if len(set(units)) != len(units):
            raise UsageError(f"invalid {what} {raw!r}: a unit appears twice", hint=f"use {DURATION_HELP}")
        seconds = sum(float(n) * _UNITS[u] for n, u in _UNIT_RE.findall(text))
    elif m := _CLOCK_RE.fullmatch(text):
        days, a, b, c = m.groups()
        if c is None and days is None:
            raise UsageError(
                f"ambiguous {what} {raw!r}: MM:SS or HH:MM?", hint="write HH:MM:SS, or use units like 90m"
            )
        h, mi, s = (int(a), int(b), int(c or 0))
        if mi >= 60 or s >= 60:
            raise UsageError(f"invalid {what} {raw!r}: minutes and seconds must be below 60")
        seconds = int(days or 0) * 86400 + h * 3600 + mi * 60 + s
    elif m := _DAYS_HOURS_RE.fullmatch(text):
        seconds = int(m.group(1)) * 86400 + int(m.group(2)) * 3600
    elif text.replace(".", "", 1).isascii() and text.replace(".", "", 1).isdigit():
        raise UsageError(f"{what} {raw!r} has no unit", hint=f"write e.g. {text}h or {text}m")
    if seconds is None:
        raise UsageError(f"invalid {what} {raw!r}", hint=f"use {DURATION_HELP}")
    if not math.isfinite(seconds) or seconds < 1:
        raise UsageError(f"{what} {raw!r} must be at least one second")
    if seconds > 365 * 86400:
        raise UsageError(f"{what} {raw!r} is longer than a year")
    return int(round(seconds))


def format_duration(seconds: float | None) -> str:
    """Short human form: ``2d3h``, ``4h05m``, ``12m30s``, ``45s``; ``-`` for None."""
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else ""
    s = int(round(abs(seconds)))
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    if d:
        return f"{sign}{d}d{h:02d}h" if h else f"{sign}{d}d"
    if h:
        return f"{sign}{h}h{m:02d}m"
    if m:
        return f"{sign}{m}m{s:02d}s" if s else f"{sign}{m}m"
    return f"{sign}{s}s"


def to_slurm_minutes(seconds: int) -> int:
    """Slurm ``--time`` has minute granularity; round up so a segment never gets less than asked."""
    return max(1, math.ceil(seconds / 60))


def to_slurm_time(seconds: int) -> str:
    """``--time`` value ``D-HH:MM:00`` rounded up to whole minutes."""
    minutes = to_slurm_minutes(seconds)
    d, rem = divmod(minutes, 1440)
    h, m = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:00"
