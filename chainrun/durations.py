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


MIN_S = 1
MAX_S = 365 * 86400


def parse_duration(text: str, *, what: str = "duration", minimum: int = MIN_S, maximum: int = MAX_S) -> int:
    """Return whole seconds for a duration the user typed, or raise UsageError.

    ``minimum`` and ``maximum`` are the option's bounds; every hint suggests a value inside them.
    """
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
        raise UsageError(f"{what} {raw!r} has no unit", hint=_unit_hint(text, minimum, maximum))
    if seconds is None:
        raise UsageError(f"invalid {what} {raw!r}", hint=f"use {DURATION_HELP}")
    if not math.isfinite(seconds) or seconds < max(minimum, 1):
        least = "one second" if minimum <= 1 else format_duration(minimum)
        raise UsageError(f"{what} {raw!r} must be at least {least}", hint=f"e.g. {_round_up(minimum)}")
    if seconds > maximum:
        longest = "a year" if maximum == MAX_S else format_duration(maximum)
        raise UsageError(f"{what} {raw!r} is longer than {longest}", hint=f"e.g. {_round_down(maximum)}")
    return int(round(seconds))


def _in_bounds(seconds: float, minimum: int, maximum: int) -> bool:
    return math.isfinite(seconds) and max(minimum, 1) <= seconds <= maximum


def _unit_hint(number: str, minimum: int, maximum: int) -> str:
    """``write e.g. 72h or 72m`` for a bare number, naming only values the option accepts."""
    def valid(n: str) -> list[str]:
        return [f"{n}{u}" for u in ("h", "m") if _in_bounds(float(n) * _UNITS[u], minimum, maximum)]

    if ok := valid(number):
        return "write e.g. " + " or ".join(ok)
    if float(number) * _UNITS["h"] < max(minimum, 1):  # too short in any unit
        ok = valid("1") or [_round_up(minimum)]
        return f"at least {format_duration(max(minimum, 1))}: write e.g. " + " or ".join(ok)
    return f"at most {format_duration(maximum)}: write e.g. {_round_down(maximum)}"


def _round_up(seconds: int) -> str:
    """A short valid example at or just above ``seconds``: ``1h``, ``5m``, ``30s``."""
    seconds = max(seconds, 1)
    for unit in ("d", "h", "m"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s" if seconds < 60 else f"{math.ceil(seconds / 60)}m"


def _round_down(seconds: int) -> str:
    """A short valid example at or just below ``seconds``."""
    for unit in ("d", "h", "m"):
        if seconds >= _UNITS[unit]:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{max(seconds, 1)}s"


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
