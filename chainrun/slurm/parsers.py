"""Pure parsers over the text sbatch, squeue, sacct and scontrol print.

Every tabular parser is keyed by the header line Slurm prints, never by column position,
so a site that adds or reorders fields does not shift our meaning. Times are whatever
:mod:`chainrun.slurm.timefmt` accepts (we ask for epoch seconds with
``SLURM_TIME_FORMAT=%s``, but ISO text parses too). A value we cannot read raises
:class:`SlurmParseError` naming the field and the value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from chainrun.errors import SlurmError
from chainrun.slurm.timefmt import parse_slurm_duration, parse_slurm_timestamp


class SlurmParseError(SlurmError):
    """Slurm printed something we do not understand."""


_PARSABLE_RE = re.compile(r"^(\d+)(?:_\d+)?(?:;([A-Za-z0-9_.-]+))?$")


def parse_sbatch_parsable(stdout: str) -> tuple[str, str | None]:
    """``sbatch --parsable`` prints ``jobid`` or ``jobid;cluster`` (plus, at some sites, warnings first)."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    for line in reversed(lines):
        if m := _PARSABLE_RE.match(line):
            return m.group(1), m.group(2)
    raise SlurmParseError(f"sbatch printed no job id: {stdout.strip()[:200]!r}")


def parse_table(text: str, *, sep: str = "|", last_may_contain_sep: bool = False) -> list[dict[str, str]]:
    """Rows of a delimited table with a header line, as dicts keyed by upper-case header names.

    With ``last_may_contain_sep`` the last column (a job name) may itself contain ``sep``.
    Rows with the wrong number of fields are skipped: they are other users' oddities.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = [h.strip().upper() for h in lines[0].split(sep)]
    n = len(header)
    rows = []
    for line in lines[1:]:
        parts = split_fields(line, n, sep=sep, last_may_contain_sep=last_may_contain_sep)
        if parts is not None:
            rows.append(dict(zip(header, (p.strip() for p in parts))))
    return rows


def split_fields(line: str, width: int, *, sep: str = "|", last_may_contain_sep: bool = False) -> list[str] | None:
    """The ``width`` fields of one row, or None when it has too few (or, unless the last field
    may hold ``sep``, too many). The one row-splitting rule: the columnar reader
    (chainrun.traces) calls it for every row that does not have exactly ``width - 1`` separators."""
    parts = line.split(sep, width - 1) if last_may_contain_sep else line.split(sep)
    return parts if len(parts) == width else None


def _ts(row: dict[str, str], key: str) -> float | None:
    try:
        return parse_slurm_timestamp(row.get(key))
    except ValueError:
        raise SlurmParseError(f"unreadable {key} {row.get(key)!r} for job {row.get('JOBID') or row.get('JOBIDRAW')}") from None


def _dur(row: dict[str, str], key: str) -> float | None:
    try:
        return parse_slurm_duration(row.get(key))
    except ValueError:
        raise SlurmParseError(f"unreadable {key} {row.get(key)!r} for job {row.get('JOBID') or row.get('JOBIDRAW')}") from None


def _int(row: dict[str, str], key: str, default: int = 0) -> int:
    return acct_count(row.get(key), default)


_TRES_GPU_RE = re.compile(r"^(?:gres[/:])?gpu(?::([^:=()]+))?[:=](\d+)(?:\(.*\))?$", re.IGNORECASE)


def gpus_from_tres(text: str | None) -> int:
    """GPU count from a TRES or GRES string: ``gres/gpu=4``, ``gres:gpu:2``, ``gpu:a100:2(IDX:0-1)``,
    ``cpu=8,gres/gpu=4,gres/gpu:a100=4``.

    The one TRES reader (the watcher, the model's history and the trace reader all use it).
    Slurm lists a typed GPU request twice, as the total (``gres/gpu=4``) and per type
    (``gres/gpu:a100=4``): the untyped total wins; without one, the typed counts add up.
    """
    if not text:
        return 0
    untyped, typed, seen = 0, 0, False
    for entry in str(text).split(","):
        m = _TRES_GPU_RE.match(entry.strip())
        if not m:
            continue
        if m.group(1) is None:
            untyped += int(m.group(2))
            seen = True
        else:
            typed += int(m.group(2))
    return untyped if seen else typed


def base_state(text: str | None) -> str:
    """``CANCELLED by 0`` -> CANCELLED; ``CANCELLED+`` (cut to a column width) -> CANCELLED."""
    return (str(text or "").split() or [""])[0].upper().rstrip("+")


# ------------------------------------------------------------------ sacct values
# One function per rule. The watcher's row parser (parse_sacct) calls them once per row; the
# columnar reader (chainrun.traces: the model's history and the replay's traces, a million
# rows) calls the same functions once per distinct value of a column. Unreadable text raises
# ValueError: the row parser turns it into SlurmParseError naming the field, the columnar
# reader into "unknown" (NaN), since a history holds other people's oddities.

def is_step(job_id: str) -> bool:
    """``123.batch``, ``123.0``, ``123.extern``: a step of job 123, not an allocation."""
    return "." in job_id


# Epoch seconds of a sacct time: epoch digits (``SLURM_TIME_FORMAT=%s``, what chainrun asks for)
# or ISO text; None for Unknown, None and 0; ``naive_utc`` as in parse_slurm_timestamp. The same
# function, not a wrapper: the columnar reader calls it up to four million times a refresh.
acct_time = parse_slurm_timestamp


def acct_limit_s(text: str | None) -> float | None:
    """Seconds of a time limit: TimelimitRaw (minutes) or Timelimit (a duration); None for
    UNLIMITED, Partition_Limit and TimelimitRaw's NO_VAL/INFINITE (2**32-2, 2**32-1)."""
    d = parse_slurm_duration(text)
    return None if d is None or d >= NO_VAL_MINUTES * 60.0 else d


def acct_count(text: str | None, default: int) -> int:
    """A whole count (NNodes, NCPUS); anything else (blank, garbage, absurdly large) is ``default``."""
    v = (text or "").strip()
    return int(v) if v.isascii() and v.isdigit() and len(v) < 10 else default


def acct_gpus(alloc_tres: str | None, req_tres: str | None) -> int:
    """GPUs of a job: what it was given (AllocTRES), else what it asks for (ReqTRES: pending jobs)."""
    return gpus_from_tres(alloc_tres or req_tres)


# ------------------------------------------------------------------ squeue

SQUEUE_FORMAT = "%i|%u|%T|%r|%V|%S|%e|%l|%M|%P|%q|%D|%C|%b|%E|%k|%N|%j"
"""Fields we ask squeue for; NAME last because a name may contain the separator."""


@dataclass(frozen=True)
class QueueRow:
    job_id: str
    user: str
    state: str
    reason: str
    submit: float | None
    start: float | None  # for pending jobs: the scheduler's estimate, if any
    end: float | None  # for running jobs: the real expected end (honours --time-min)
    time_limit_s: float | None
    elapsed_s: float | None
    partition: str
    qos: str
    nodes: int
    cpus: int
    gpus: int
    dependency: str
    comment: str
    name: str
    nodelist: str = ""  # %N: the nodes of a running job, compressed (``n[1-3],gpu07``); "" while pending


def expand_hostlist(text: str) -> list[str]:
    """``n[1-3,7],gpu-a[01-02]`` -> n1 n2 n3 n7 gpu-a01 gpu-a02 (zero padding kept); junk is skipped."""
    out: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text or ""):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not m:
            out.append(item)
            continue
        head, ranges, tail = m.groups()
        for part in ranges.split(","):
            a, _, b = part.partition("-")
            if not a.isdigit() or (b and not b.isdigit()) or (b and int(b) - int(a) > 100_000):
                continue
            for n in range(int(a), int(b or a) + 1):
                out += [f"{head}{str(n).zfill(len(a))}{t}" for t in expand_hostlist(tail) or [""]] if tail else [
                    f"{head}{str(n).zfill(len(a))}"]
    return out


def parse_squeue(text: str) -> list[QueueRow]:
    rows = []
    for r in parse_table(text, last_may_contain_sep=True):
        jid = r.get("JOBID", "")
        if not jid:
            continue
        dep = r.get("DEPENDENCY", "")
        com = r.get("COMMENT", "")
        rows.append(
            QueueRow(
                job_id=jid,
                user=r.get("USER", ""),
                state=r.get("STATE", "").split()[0] if r.get("STATE") else "",
                reason=r.get("REASON", ""),
                submit=_ts(r, "SUBMIT_TIME"),
                start=_ts(r, "START_TIME"),
                end=_ts(r, "END_TIME"),
                time_limit_s=_dur(r, "TIME_LIMIT"),
                elapsed_s=_dur(r, "TIME"),
                partition=r.get("PARTITION", ""),
                qos=r.get("QOS", ""),
                nodes=_int(r, "NODES", 1),
                cpus=_int(r, "CPUS", 0),
                gpus=gpus_from_tres(r.get("TRES_PER_NODE")) * max(1, _int(r, "NODES", 1)),
                dependency="" if dep == "(null)" else dep,
                comment="" if com == "(null)" else com,
                name=r.get("NAME", ""),
                nodelist="" if r.get("NODELIST", "") in ("", "(null)") else r.get("NODELIST", ""),
            )
        )
    return rows


# ------------------------------------------------------------------ sacct

SACCT_FIELDS = (
    "JobIDRaw,User,Partition,QOS,Account,Submit,Eligible,Start,End,Elapsed,TimelimitRaw,"
    "NNodes,NCPUS,AllocTRES,ReqTRES,State,ExitCode,Reason,NodeList,JobName"
)
"""The one sacct field list: the watcher's job checks, the model's history and ``chainrun.traces``
read the same fields (by header name). JobName last: a name may contain the separator."""


@dataclass(frozen=True)
class AcctRow:
    job_id: str
    name: str
    user: str
    partition: str
    qos: str
    submit: float | None
    eligible: float | None
    start: float | None
    end: float | None
    elapsed_s: float | None
    time_limit_s: float | None
    nodes: int
    cpus: int
    gpus: int
    state: str  # base state: "CANCELLED by 0" -> CANCELLED
    exit_code: int
    exit_signal: int
    reason: str
    state_detail: str  # the full text, e.g. "CANCELLED by 0"
    account: str = ""
    nodelist: str = ""  # the nodes it ran on, compressed (``n[1-2]``); "" or "None assigned" if it never ran

    @property
    def wait_s(self) -> float | None:
        if self.start is None or self.eligible is None:
            return None
        return max(0.0, self.start - self.eligible)


# sacct header name (lower case) for each field, in order of preference: the one mapping the
# watcher (parse_sacct) and the columnar history/trace reader (chainrun.traces) both use
SACCT_HEADER_ALIASES: dict[str, tuple[str, ...]] = {
    "job_id": ("jobidraw", "jobid", "job_id"),
    "user": ("user", "uid", "username"),
    "name": ("jobname", "name"),
    "partition": ("partition",),
    "qos": ("qos",),
    "account": ("account",),
    "submit": ("submit", "submittime"),
    "eligible": ("eligible", "eligibletime"),
    "start": ("start", "starttime"),
    "end": ("end", "endtime"),
    "elapsed": ("elapsed",),
    "timelimit": ("timelimitraw", "timelimitr", "timelimit"),
    "nodes": ("nnodes", "allocnodes", "reqnodes", "nodes"),
    "cpus": ("ncpus", "alloccpus", "reqcpus"),
    "alloc_tres": ("alloctres",),
    "req_tres": ("reqtres",),
    "state": ("state",),
    "exit_code": ("exitcode",),
    "reason": ("reason",),
    "nodelist": ("nodelist",),
    "priority": ("priority",),
}
NO_VAL_MINUTES = 4294967294  # NO_VAL / INFINITE in TimelimitRaw: no limit


def _key(r: dict[str, str], field: str) -> str | None:
    """The upper-case header under which row ``r`` has ``field`` (see SACCT_HEADER_ALIASES)."""
    for alias in SACCT_HEADER_ALIASES[field]:
        if alias.upper() in r:
            return alias.upper()
    return None


def _get(r: dict[str, str], field: str, default: str = "") -> str:
    k = _key(r, field)
    return r[k] if k is not None else default


def _rule(r: dict[str, str], field: str, f, *args):
    """Value rule ``f`` on ``field`` of row ``r`` (None when the header lacks it)."""
    k = _key(r, field)
    if k is None:
        return None
    try:
        return f(r[k], *args)
    except ValueError:
        raise SlurmParseError(f"unreadable {k} {r[k]!r} for job {_get(r, 'job_id')}") from None


def parse_sacct(text: str) -> list[AcctRow]:
    """Rows of ``sacct -X -P --format=SACCT_FIELDS`` (header line required, fields found by
    SACCT_HEADER_ALIASES, values read by the rules above); steps are skipped."""
    rows = []
    for r in parse_table(text, last_may_contain_sep=True):
        jid = _get(r, "job_id")
        if not jid or is_step(jid):
            continue
        code, _, sig = (_get(r, "exit_code") or "0:0").partition(":")
        state_text = _get(r, "state")
        rows.append(
            AcctRow(
                job_id=jid,
                name=_get(r, "name"),
                user=_get(r, "user"),
                partition=_get(r, "partition"),
                qos=_get(r, "qos"),
                submit=_rule(r, "submit", acct_time),
                eligible=_rule(r, "eligible", acct_time),
                start=_rule(r, "start", acct_time),
                end=_rule(r, "end", acct_time),
                elapsed_s=_rule(r, "elapsed", parse_slurm_duration),
                time_limit_s=_rule(r, "timelimit", acct_limit_s),
                nodes=acct_count(_get(r, "nodes"), 1),
                cpus=acct_count(_get(r, "cpus"), 0),
                gpus=acct_gpus(_get(r, "alloc_tres"), _get(r, "req_tres")),
                state=base_state(state_text),
                exit_code=int(code) if code.strip().isdigit() else 0,
                exit_signal=int(sig) if sig.strip().isdigit() else 0,
                reason=_get(r, "reason"),
                state_detail=state_text,
                account=_get(r, "account"),
                nodelist="" if _get(r, "nodelist") in ("", "None assigned", "(null)") else _get(r, "nodelist"),
            )
        )
    return rows


# ------------------------------------------------------------------ scontrol

_KV_RE = re.compile(r"(\S+?)=(.*?)(?=\s+\S+?=|$)")


def parse_scontrol_oneliners(text: str) -> list[dict[str, str]]:
    """``scontrol show ... -o``: one record per line of ``Key=Value`` pairs."""
    out = []
    for line in text.splitlines():
        if "=" not in line:
            continue
        out.append({k: v.strip() for k, v in _KV_RE.findall(line.strip())})
    return out


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    max_time_s: float | None  # None: UNLIMITED
    default_time_s: float | None
    is_default: bool
    state: str
    total_nodes: int
    nodes: str = ""  # Nodes=, compressed (``n[1-4]``): partitions that share nodes share a queue


def parse_partitions(text: str) -> dict[str, PartitionInfo]:
    parts = {}
    for rec in parse_scontrol_oneliners(text):
        name = rec.get("PartitionName")
        if not name:
            continue
        try:
            max_t = parse_slurm_duration(rec.get("MaxTime"))
            def_t = parse_slurm_duration(rec.get("DefaultTime"))
        except ValueError as e:
            raise SlurmParseError(f"partition {name}: {e}") from None
        parts[name] = PartitionInfo(
            name=name,
            max_time_s=max_t,
            default_time_s=def_t,
            is_default=rec.get("Default", "NO").upper() == "YES",
            state=rec.get("State", ""),
            total_nodes=_int(rec, "TotalNodes", 0),
            nodes=rec.get("Nodes", "") if rec.get("Nodes", "") != "(null)" else "",
        )
    return parts


def parse_config_value(text: str, key: str) -> str | None:
    """A value from ``scontrol show config`` (``Key = value`` lines)."""
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip().lower() == key.lower():
            return v.strip()
    return None


# ------------------------------------------------------------------ test-only

_TEST_ONLY_RE = re.compile(r"Job (\d+) to start at (\S+) using (\d+) processors on nodes (\S+) in partition (\S+)")


def parse_test_only(stderr: str) -> float | None:
    """Expected start (epoch) from ``sbatch --test-only``'s stderr; None if it printed none."""
    m = _TEST_ONLY_RE.search(stderr or "")
    if not m:
        return None
    try:
        return parse_slurm_timestamp(m.group(2))
    except ValueError:
        return None
