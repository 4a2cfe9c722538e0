"""Pure parsers for the times and durations that sacct, squeue and scontrol print.

Slurm prints durations as ``[D-]HH:MM:SS``, ``MM:SS``, ``MM:SS.mmm`` or a bare number of
minutes (``TimelimitRaw``), and sentinels such as ``UNLIMITED``, ``Partition_Limit``,
``INVALID``, ``N/A``, ``None`` or ``Unknown``; timestamps as ISO local time, or epoch
seconds when we ask for ``SLURM_TIME_FORMAT=%s``. Sentinels become ``None``; text that is
none of these raises ``ValueError`` so a caller can say which field was bad.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

_SENTINELS = {"", "unlimited", "partition_limit", "invalid", "n/a", "none", "unknown", "(null)", "infinite", "nan"}
_DUR_RE = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)")
_DAYS_ONLY_RE = re.compile(r"(\d+)-(\d+)")


def parse_slurm_duration(text: str | None) -> float | None:
    """Seconds for a Slurm duration; None for UNLIMITED, Unknown and the like."""
    if text is None:
        return None
    t = text.strip()
    if t.lower() in _SENTINELS:
        return None
    if t.isdigit():  # TimelimitRaw and squeue %l in minutes-only form
        return float(int(t) * 60)
    if m := _DUR_RE.fullmatch(t):
        d, h, mi, s = m.groups()
        if h is None:  # MM:SS(.mmm) when there is no day part, [D-]HH:MM when there is
            if d is not None:
                return int(d) * 86400 + int(mi) * 3600 + float(s) * 60
            return int(mi) * 60 + float(s)
        return int(d or 0) * 86400 + int(h) * 3600 + int(mi) * 60 + float(s)
    if m := _DAYS_ONLY_RE.fullmatch(t):
        return int(m.group(1)) * 86400 + int(m.group(2)) * 3600.0
    raise ValueError(f"not a Slurm duration: {text!r}")


def parse_slurm_timestamp(text: str | None, *, naive_utc: bool = False) -> float | None:
    """Epoch seconds for a Slurm timestamp; None for Unknown/None/N/A.

    Digits are epoch seconds (``SLURM_TIME_FORMAT=%s``); ISO text without a zone is read
    as this machine's local time, which is what Slurm printed it in, or with ``naive_utc`` as
    UTC (traces from elsewhere: their wall clock kept as printed, see chainrun.traces).
    """
    if text is None:
        return None
    t = text.strip()
    if t.isdigit():  # first: the common case (a million rows a refresh), never a sentinel
        v = float(t)
        return v if v > 0 else None
    if t.lower() in _SENTINELS:
        return None
    try:
        d = datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(f"not a Slurm timestamp: {text!r}") from None
    if naive_utc and d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return d.timestamp()
