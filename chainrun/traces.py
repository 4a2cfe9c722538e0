"""Read job histories into one canonical table, whatever printed them.

Two inputs are accepted, told apart by their first line:
- the fixed-width text ``sacct`` prints (header line, a line of dashes, then one job per
  line, fields split on whitespace), as in the LS6 trace (../shared/traces/ls6-a100);
- a ``sacct -P`` dump (``|``-separated, header line first).

Columns are found by header name (case-insensitive, aliases below), never by position.
The meaning of each field is the Slurm layer's (``chainrun.slurm.parsers``: the one sacct
field list ``SACCT_FIELDS``, the header mapping ``SACCT_HEADER_ALIASES``, the row splitter
``split_fields`` and the value rules ``acct_time``, ``acct_limit_s``, ``acct_count``,
``acct_gpus``, ``base_state``, ``is_step``, which the watcher's row parser ``parse_sacct``
uses too). This module applies the same functions column-wise, once per distinct value of a
column, fast enough for a million rows; a value a rule cannot read becomes unknown (NaN)
here, where the watcher's parser would raise.
The result is a pandas DataFrame with these columns, one row per allocation (job steps
such as ``123.batch`` are dropped):

===============  ======================================================================
job_id           str
user             str (User, or UID in pseudonymised traces)
name             str
partition        str ("" when the input has none)
qos              str ("" when unknown)
account          str ("" when unknown)
submit           float, epoch seconds
eligible         float, epoch seconds; equals submit when the input has no Eligible
start            float, epoch seconds; NaN if the job never started
end              float, epoch seconds; NaN while running or never started
timelimit_s      float, requested limit in seconds; NaN if UNLIMITED/unknown
nodes            int
gpus             int (AllocTRES/ReqTRES gres/gpu; else nodes * gpus_per_node)
cpus             int (0 when unknown)
state            str, base state (COMPLETED, TIMEOUT, FAILED, CANCELLED, PENDING, ...)
exit_code        str, ``code:signal``
eligible_known   bool, False when Eligible was missing and copied from Submit
priority         float or NaN -- known only after the fact: never a model feature
===============  ======================================================================

Times without a zone are read as UTC, so they keep the cluster's wall clock (hour of
day, weekday) exactly as it printed them; only differences and calendar fields are used.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import TYPE_CHECKING

from chainrun.errors import UsageError
from functools import partial

from chainrun.slurm.parsers import (
    SACCT_HEADER_ALIASES, acct_count, acct_gpus, acct_limit_s, acct_time, base_state, is_step, split_fields,
)

if TYPE_CHECKING:  # pandas is heavy: imported inside functions only
    import pandas as pd

# canonical column -> accepted header names (lower case): the Slurm layer's one mapping
# (Elapsed and Reason are the watcher's: not read here, a million rows do not need them)
_ALIASES: dict[str, tuple[str, ...]] = {k: v for k, v in SACCT_HEADER_ALIASES.items() if k not in ("elapsed", "reason")}
REQUIRED = ("job_id", "user", "submit", "start", "end", "timelimit")
CANONICAL_COLUMNS = (
    "job_id", "user", "name", "partition", "qos", "account", "submit", "eligible", "start", "end",
    "timelimit_s", "nodes", "gpus", "cpus", "state", "exit_code", "eligible_known", "priority",
)


class TraceFormatError(UsageError):
    """The file is not a job history we can read."""


# traces shipped with chainrun (chainrun/data), by built-in name: `--trace ls6-a100-dev` works from a
# plain install (TACC Lonestar6 A100, Mirage SC'23; CC BY 4.0, attribution in chainrun/data/README.md)
BUILTIN = {"ls6-a100-dev": "ls6-a100-dev.log.xz"}


def builtin_path(name: str) -> Path:
    from importlib import resources

    return Path(str(resources.files("chainrun") / "data" / BUILTIN[name]))


def read_trace(path: str | Path, *, gpus_per_node: int = 3) -> "pd.DataFrame":
    """Read a trace into the canonical table: a file (sacct text or a ``sacct -P`` dump; gzip, xz or
    bzip2 decompressed, told by its first bytes, not its name) or a built-in name (``BUILTIN``; a file
    of that name wins). Every command that takes ``--trace`` reads it here."""
    p = Path(path)
    if str(path) in BUILTIN and not p.exists():
        p = builtin_path(str(path))
    try:
        data = p.read_bytes()  # whole, once: a pipe (/dev/stdin) cannot be read twice
    except FileNotFoundError:
        raise TraceFormatError(f"trace file not found: {p}") from None
    except IsADirectoryError:
        raise TraceFormatError(f"trace path is a folder, not a file: {p}") from None
    except OSError as e:  # unreadable, not a directory on the way
        raise TraceFormatError(f"cannot read trace {p}: {e.strerror or e}") from None
    if (unpack := _unpacker(data[:8], p)) is not None:
        import lzma
        import zlib

        try:
            data = unpack(data)
        except (EOFError, OSError, ValueError, lzma.LZMAError, zlib.error) as e:  # cut or corrupt
            raise TraceFormatError(f"cannot read trace {p}: {e}") from None
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16 with its byte-order mark (saved by Windows tools)
        text = data.decode("utf-16", errors="replace")
    else:
        text = data.decode("utf-8", errors="replace")
    del data
    if "\x00" in text[:4096]:  # a text trace holds no NUL: an archive or binary we cannot read
        raise TraceFormatError(f"{p}: not a text trace (binary content)",
                               hint="sacct text or a sacct -P dump, plain or compressed with gzip, xz or bzip2")
    return parse_trace_text(text, source=str(p), gpus_per_node=gpus_per_node)


# the first bytes of the compressed files we open, and of those we name but cannot
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bz2"))
_UNSUPPORTED = ((b"\x28\xb5\x2f\xfd", "zstd"), (b"PK\x03\x04", "zip"))


_SUFFIX = {".gz": "gzip", ".xz": "xz", ".bz2": "bz2"}


def _unpacker(head: bytes, p: Path):
    """The ``decompress`` for a compressed trace (None: plain text), by its first bytes: a ``.log``
    that is gzip is read, a ``.gz`` that is not is a broken archive."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            import bz2
            import gzip
            import lzma

            return {"gzip": gzip.decompress, "xz": lzma.decompress, "bz2": bz2.decompress}[kind]
    for magic, kind in _UNSUPPORTED:
        if head.startswith(magic):
            raise TraceFormatError(f"{p}: a {kind} archive, which chainrun does not open",
                                   hint="decompress it first, or compress it with gzip or xz")
    if kind := _SUFFIX.get(p.suffix.lower()):
        raise TraceFormatError(f"cannot read trace {p}: its content is not {kind} (a broken or renamed archive?)")
    return None


def parse_trace_text(text: str, *, source: str = "<text>", gpus_per_node: int = 3) -> "pd.DataFrame":
    """Parse the text of a trace; see the module doc for the formats and columns."""
    lines = [ln for ln in text.removeprefix("\ufeff").splitlines() if ln.strip()]  # a UTF-8 BOM is no header
    if not lines:
        raise TraceFormatError(f"{source}: empty trace")
    header = lines[0]
    if "|" in header:
        names = [h.strip() for h in header.split("|")]
        cols = _map_columns(names, source)
        body = _not_headers(lines[1:], header)
        raw = _read_delimited(body, names, cols, source)
        return _build_frame(raw, names, cols, source, gpus_per_node, strip=False, skipped=_skipped(body, raw))
    else:
        names = header.split()
        body = lines[1:]
        spans = None
        if body and set(body[0].replace(" ", "").replace("\t", "")) <= {"-"}:
            spans = [m.span() for m in re.finditer(r"-+", body[0])]
            body = body[1:]
        body = _not_headers(body, header)
        rows = [_split_fixed(ln, len(names), spans) for ln in body]
    cols = _map_columns(names, source)
    raw = _rows_to_raw(rows, len(names), source)
    return _build_frame(raw, names, cols, source, gpus_per_node, skipped=_skipped(body, raw))


def _not_headers(body: list[str], header: str) -> list[str]:
    """The body without the header and dash lines that concatenated sacct outputs repeat (a job
    line starts with its id: the slow test runs on the rare line that starts like the header)."""
    h = header.strip()
    first = (h[:1], "-")

    def repeat(ln: str) -> bool:
        t = ln.strip()
        return t == h or not set(t) - {"-", " ", "\t"}

    return [ln for ln in body if ln.lstrip()[:1] not in first or not repeat(ln)]


def _skipped(body: list[str], raw) -> int:
    """Rows set aside for a wrong field count, steps (``123.batch``: a blank User shifts them) not counted."""
    if len(raw) == len(body):
        return 0

    def job_id(ln: str) -> str:
        f = ln.split("|", 1)[0].split()
        return f[0] if f else ""

    return max(0, len(body) - len(raw) - sum(1 for ln in body if is_step(job_id(ln))))


_US = "\x1f"  # stands in for a "|" inside a job name while pandas splits the line


def _read_delimited(body: list[str], names: list[str], cols: dict[str, int], source: str) -> "pd.DataFrame":
    """``sacct -P`` rows via pandas' C reader (a million rows in seconds, strings only for
    the columns we use). A name holding "|" survives when JobName is the last column;
    rows with too few fields are other tools' noise and are skipped."""
    import csv

    import pandas as pd

    width = len(names)
    name_last = names[-1].lower() in SACCT_HEADER_ALIASES["name"]
    fixed = []
    for ln in body:
        if ln.count("|") == width - 1:  # the common case, exactly what split_fields accepts
            fixed.append(ln)
        elif (parts := split_fields(ln, width, last_may_contain_sep=name_last)) is not None:
            fixed.append("|".join(parts[:-1]) + "|" + parts[-1].replace("|", _US))
    if not fixed:
        raise TraceFormatError(f"{source}: no row has the {width} fields its header names")
    use = sorted(set(cols.values()))
    data = io.BytesIO("\n".join(fixed).encode("utf-8"))  # bytes: a StringIO would hold 4 bytes a char
    del fixed
    raw = pd.read_csv(data, sep="|", encoding="utf-8", header=None, names=[f"c{i}" for i in range(width)],
                      usecols=[f"c{i}" for i in use], dtype=str, keep_default_na=False, na_filter=False,
                      quoting=csv.QUOTE_NONE, engine="c")
    if "name" in cols and name_last:
        c = f"c{cols['name']}"
        raw[c] = raw[c].str.replace(_US, "|", regex=False)
    return raw


def _rows_to_raw(rows: list[list[str]], width: int, source: str) -> "pd.DataFrame":
    import pandas as pd

    good = [r for r in rows if len(r) == width]
    if not good:
        raise TraceFormatError(f"{source}: no row has the {width} fields its header names")
    return pd.DataFrame(good, columns=[f"c{i}" for i in range(width)], dtype=str)


def _split_fixed(line: str, width: int, spans) -> list[str]:
    """Fields of one fixed-width line: split on whitespace, or by the dash line's column
    spans when a value holds spaces ("CANCELLED by 0") or is blank (a step's User)."""
    parts = line.split()
    if len(parts) == width or not spans or len(spans) != width or "\t" in line:
        return parts
    out = [line[a:b].strip() for a, b in spans[:-1]]
    out.append(line[spans[-1][0]:].strip())
    return out


def _map_columns(names: list[str], source: str) -> dict[str, int]:
    lowered = [n.strip().lower() for n in names]
    found: dict[str, int] = {}
    for canon, aliases in _ALIASES.items():
        for a in aliases:
            if a in lowered:
                found[canon] = lowered.index(a)
                break
    missing = [c for c in REQUIRED if c not in found]
    if missing:
        raise TraceFormatError(
            f"{source}: no column for {', '.join(missing)} in the header line",
            hint="expected sacct output with a header, e.g. sacct -P --format=JobID,User,Submit,Eligible,Start,End,TimelimitRaw,NNodes,State",
        )
    return found


def _build_frame(raw, names, cols, source, gpus_per_node, *, strip: bool = True, skipped: int = 0) -> "pd.DataFrame":
    import numpy as np
    import pandas as pd

    def col(canon: str, default: str = "") -> "pd.Series":
        if canon not in cols:
            return pd.Series(default, index=raw.index)
        c = raw[f"c{cols[canon]}"]
        return c.str.strip() if strip else c  # sacct -P values carry no padding

    job_id = col("job_id")
    keep = ~job_id.map(is_step).astype(bool)  # drop steps (123.batch, 123.0)
    raw = raw[keep].reset_index(drop=True)
    job_id = job_id[keep].reset_index(drop=True)

    out = pd.DataFrame({"job_id": job_id})
    out["user"] = col("user")
    out["name"] = col("name")
    out["partition"] = col("partition")
    out["qos"] = col("qos")
    out["account"] = col("account")
    unreadable: dict[str, list] = {}
    for c in ("submit", "eligible", "start", "end"):
        out[c] = _times(col(c), unreadable.setdefault(c, [])) if c in cols else np.nan
    out["eligible_known"] = "eligible" in cols
    if "eligible" not in cols:
        out["eligible"] = out["submit"]
    else:
        out["eligible"] = out["eligible"].fillna(out["submit"])
    out["timelimit_s"] = _by_unique(col("timelimit"), _lenient(acct_limit_s), dtype=float)
    out["nodes"] = _by_unique(col("nodes", "1"), partial(acct_count, default=1), dtype=int)
    out["cpus"] = _by_unique(col("cpus", "0"), partial(acct_count, default=0), dtype=int)
    if "alloc_tres" in cols or "req_tres" in cols:  # a pending job has no AllocTRES yet
        pair = col("alloc_tres").str.cat(col("req_tres"), sep=_US)
        out["gpus"] = _by_unique(pair, lambda v: acct_gpus(*v.split(_US, 1)), dtype=int)
    else:  # traces without TRES (LS6): whole nodes
        out["gpus"] = out["nodes"] * int(gpus_per_node)
    out["exit_code"] = col("exit_code", "0:0").replace("", "0:0")
    out["priority"] = pd.to_numeric(col("priority", ""), errors="coerce")
    # "CANCELLED by 123" -> CANCELLED; "CANCELLED+" (cut to the column width) -> CANCELLED
    state = _by_unique(col("state"), base_state)
    if (state == "").any():  # traces without a State column (LS6): infer it
        state = state.where(state != "", _infer_state(out))
    out["state"] = state
    bad = out["submit"].isna()
    if bad.all():
        raise TraceFormatError(f"{source}: no row has a readable Submit time")
    notes = [f"{skipped} row(s) without the {len(names)} fields the header names: skipped"] if skipped else []
    for c, values in unreadable.items():
        if values:
            n = int(col(c).isin(values).sum())
            notes.append(f"{n} unreadable {c.capitalize()} value(s), e.g. {values[0]!r}: read as unknown")
    if bad.any():
        notes.append(f"{int(bad.sum())} job(s) without a readable Submit time: skipped")
    if n := int((out["end"] < out["start"]).sum()):
        notes.append(f"{n} job(s) end before they start (a clock change?): replayed as 0 s runs")
    out = out[~bad].sort_values(["submit", "job_id"], kind="stable").reset_index(drop=True)[list(CANONICAL_COLUMNS)]
    out.attrs["notes"] = notes
    return out


def trace_notes(df: "pd.DataFrame") -> list[str]:
    """What the reader set aside or read as unknown in a trace, one line each (nothing is dropped
    in silence): rows with the wrong field count, unreadable times, jobs that end before they start."""
    return list(df.attrs.get("notes", []))


def _times(s: "pd.Series", unreadable: list | None = None) -> "pd.Series":
    """Epoch seconds by the Slurm layer's rule (acct_time); zone-less ISO text keeps the trace's
    wall clock (read as UTC). A million epoch strings: about a second per column."""
    return _by_unique(s, _lenient(partial(acct_time, naive_utc=True), unreadable), dtype=float)


def _lenient(rule, unreadable: list | None = None):
    """A value rule whose unreadable input (ValueError; appended to ``unreadable``) or "unknown"
    (None) becomes NaN."""
    def f(v: str) -> float:
        try:
            r = rule(v)
        except ValueError:
            if unreadable is not None:
                unreadable.append(v)
            return float("nan")
        return float("nan") if r is None else r

    return f


def _by_unique(s: "pd.Series", f, dtype=object) -> "pd.Series":
    """Apply ``f`` once per distinct value: a million rows hold a few thousand distinct ones
    (times: up to a million, about a second a column; iterate a plain list, not the pandas array)."""
    import numpy as np
    import pandas as pd

    codes, uniques = pd.factorize(s, use_na_sentinel=False)
    values = [f(str(u)) for u in uniques.tolist()]
    if dtype is object:
        table = np.empty(len(values), dtype=object)
        table[:] = values
    else:
        table = np.asarray(values, dtype=dtype)
    return pd.Series(table[codes], index=s.index, dtype=dtype)


def _infer_state(df: "pd.DataFrame") -> "pd.Series":
    """State for traces without one: not started, running, timed out, failed or completed."""
    import numpy as np
    import pandas as pd

    ran = df["end"] - df["start"]
    code = df["exit_code"].str.split(":").str[0]
    sig = df["exit_code"].str.split(":").str[-1]
    state = pd.Series("COMPLETED", index=df.index)
    state[(code != "0") | (sig != "0")] = "FAILED"
    state[ran >= df["timelimit_s"] - 1.0] = "TIMEOUT"  # ran to its limit (the controller adds 30-90 s)
    state[df["start"].notna() & df["end"].isna()] = "RUNNING"
    state[df["start"].isna()] = np.where(df["end"].isna()[df["start"].isna()], "PENDING", "CANCELLED")
    return state

