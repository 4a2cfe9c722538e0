"""Scheduled ticks: one periodic ``chainrun watch --once --plain`` run by Slurm's ``scrontab`` or by cron.

A chain of 72 h finishes only if something ticks the watcher for three days. ``watch --install-schedule``
puts one entry in the user's ``scrontab`` where the site enables it (``ScronParameters=enable``), else in
their crontab, and says which and why. chainrun's entries sit between marker lines, so installing again
replaces them and every other line of the table stays as it was (``model refresh --install-cron`` uses the
same code for its refresh entry). The entry carries absolute paths and ``CHAINRUN_HOME``: cron and a
scrontab job start without the user's login environment.

A scrontab tick is a batch job: it queues, is charged, and the next one runs only after it ends. It is named
:data:`TICK_JOB_NAME` (the queue-delay history drops it: :data:`IGNORED_JOB_NAMES`), asks for one CPU and
little memory, and the watch it runs removes the job's ``SLURM_*`` variables before it calls sbatch, so the
tick's allocation does not leak into the segments it submits (:func:`leave_job_env`).

Where ticks come from and when the last one ran are kept in the store's ``meta`` table (no migration): a
crontab line records its host, and a second crontab on another login node is refused. The core never prints.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, MutableMapping

from chainrun.errors import SlurmError, StateError, UsageError

if TYPE_CHECKING:
    from chainrun.runner.base import Runner
    from chainrun.state.store import Store

VIAS = ("scrontab", "cron")
TICK = "tick"  # the watcher's entry; `model refresh --install-cron` adds "model-refresh CLUSTER" entries
TICK_JOB_NAME = "cr.tick"
REFRESH_JOB_NAME = "cr.refresh"
IGNORED_JOB_NAMES = (TICK_JOB_NAME, REFRESH_JOB_NAME)  # not queue history: tiny, chainrun's own, periodic
TICK_ENV = "CHAINRUN_TICK"  # set by the entry: "scrontab" or "cron@HOST"; a watch with it records its tick
DEFAULT_EVERY_S = 300
TICK_MEM = "1G"  # python + chainrun's imports (pandas, lightgbm for the predicted policy) fit with room
TICK_LIMIT_S = 600  # the longest a tick job may run (less where the partition allows less)
# a late tick: none for this many periods (and at least LATE_MIN_S): a scrontab tick may queue a little
LATE_PERIODS = 2
LATE_MIN_S = 120
SLURM_KEEP = ("SLURM_CONF",)  # the only SLURM_* a tick's sbatch may see


def begin_marker(name: str) -> str:
    return f"# chainrun:{name} begin (managed by chainrun; remove with --uninstall-schedule)"


def tick_name(home: Path) -> str:
    """The tick entry of one chainrun home: a user's scrontab is one per cluster and their crontab one per
    host, whatever the home, so each home's entry is its own (installing for one leaves the others)."""
    return f"{TICK} {home}"


def end_marker(name: str) -> str:
    return f"# chainrun:{name} end"


# ---------------------------------------------------------------------------------------------- period
def parse_every(text: str) -> int:
    """``--every``: whole minutes dividing an hour (1m ... 30m) or whole hours dividing a day (1h ... 12h),
    so a cron spec repeats evenly; scrontab and cron tick at most once a minute."""
    from chainrun.durations import parse_duration

    s = parse_duration(text, what="--every", minimum=60)
    m = s // 60
    if s % 60 == 0 and (60 % m == 0 or (m % 60 == 0 and 24 % (m // 60) == 0 and m < 1440)):
        return s
    raise UsageError(f"--every {text}: a schedule repeats evenly only every N minutes dividing 60 or N hours "
                     "dividing 24", hint="e.g. --every 5m, 10m, 15m, 30m, 1h, 2h")


def cron_spec(every_s: int, minute: int = 7) -> str:
    """The five time fields for a tick every ``every_s`` (see :func:`parse_every`); hourly ones at ``minute``."""
    m = every_s // 60
    if m == 1:
        return "* * * * *"
    if m < 60:
        return f"*/{m} * * * *"
    h = m // 60
    return f"{minute} * * * *" if h == 1 else f"{minute} */{h} * * *"


def next_fire(every_s: int, now: float, minute: int = 7) -> float:
    """When :func:`cron_spec`'s entry fires next after ``now`` (local time, as cron reads it)."""
    lt = time.localtime(now)
    start_of_min = now - lt.tm_sec - (now % 1)
    m = every_s // 60
    if m < 60:
        return start_of_min + 60 * (m - lt.tm_min % m)
    h = m // 60
    t = start_of_min - 60 * lt.tm_min + 60 * minute  # this hour at `minute`
    while True:
        hour = time.localtime(t).tm_hour
        if t > now and hour % h == 0:
            return t
        t += 3600


# ---------------------------------------------------------------------------------------------- rendering
def tick_command(*, home: Path, source: str | None, argv: list[str], log: Path, environ: Mapping[str, str]) -> str:
    """The shell command of an entry: the environment it needs spelled out (cron and scrontab start
    without a login profile), the absolute interpreter, the log appended to. ``source``: where a
    watcher's tick comes from (``CHAINRUN_TICK``); None for another entry."""
    env = {"CHAINRUN_HOME": str(home), **({TICK_ENV: source} if source else {}), "PATH": entry_path(environ)}
    for k in ("SLURM_CONF", "PYTHONPATH"):  # a non-default Slurm, a chainrun not installed in the venv
        if environ.get(k):
            env[k] = environ[k]
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    words += [shlex.quote(a) for a in argv]
    line = " ".join(words) + f" >> {shlex.quote(str(log))} 2>&1"
    if "%" in line or "\n" in line:  # cron turns % into a newline; no entry survives a newline
        raise UsageError(f"cannot schedule a command with '%' or a newline in it: {line}",
                         hint="set CHAINRUN_HOME to a path without '%'")
    return line


def entry_path(environ: Mapping[str, str]) -> str:
    """PATH for the entry: where this Python and Slurm's commands are, then the system's."""
    import shutil

    dirs = [str(Path(sys.executable).parent)]
    for tool in ("sbatch", "scrontab", "ssh"):
        found = shutil.which(tool, path=environ.get("PATH"))
        if found:
            dirs.append(str(Path(found).parent))
    dirs += ["/usr/local/bin", "/usr/bin", "/bin"]
    return ":".join(dict.fromkeys(dirs))


def render_block(name: str, via: str, spec: str, command: str, scron: list[str] = ()) -> list[str]:
    """chainrun's entry between its marker lines; ``scron``: sbatch options as ``#SCRON`` lines."""
    lines = [begin_marker(name)]
    if via == "scrontab":
        lines += [f"#SCRON {opt}" for opt in scron]
    lines += [f"{spec} {command}", end_marker(name)]
    return lines


def split_table(text: str, name: str) -> tuple[list[str], list[str]]:
    """(the table without entry ``name``, the lines of that entry). A block ends at its end marker; one
    whose end marker the user deleted ends at its command line, so no line of theirs is taken.
    ``#DISABLED:`` lines (scrontab comments out an entry it could not submit) inside a block are ours."""
    kept: list[str] = []
    ours: list[str] = []
    begin, end = f"# chainrun:{name} begin", end_marker(name)
    state = ""  # "" outside, "in" inside, "cmd" just after our command line
    for line in text.splitlines():
        s = line.strip()
        if state == "cmd":
            state = ""
            if s == end:
                ours.append(line)
                continue
        if not state:
            if s == begin or s.startswith(begin + " "):
                state = "in"
                ours.append(line)
            else:
                kept.append(line)
            continue
        ours.append(line)
        if s == end:
            state = ""
        elif _is_command(s):
            state = "cmd"
    return kept, ours


def _is_command(line: str) -> bool:
    bare = line.removeprefix("#DISABLED:").strip()
    return bool(bare) and not bare.startswith("#")


def merge_table(text: str, name: str, block: list[str]) -> str:
    """``text`` with entry ``name`` replaced by ``block`` (appended; removed when empty)."""
    kept, _ = split_table(text, name)
    kept = [ln for ln in kept if ln.strip() != end_marker(name)]  # an end marker orphaned by a user's edit
    while kept and not kept[-1].strip():
        kept.pop()
    lines = kept + list(block)
    return "\n".join(lines) + "\n" if lines else ""


# ---------------------------------------------------------------------------------------------- tables
@dataclass(frozen=True)
class Choice:
    via: str
    why: str


class Table:
    """One user's table behind ``scrontab`` or ``crontab``: read it, write it whole."""

    def __init__(self, runner: "Runner", via: str) -> None:
        self.runner, self.via = runner, via
        self.tool = "scrontab" if via == "scrontab" else "crontab"

    def read(self) -> str:
        res = self.runner.run([self.tool, "-l"], 60)
        if res.ok:
            return res.stdout
        out = (res.stdout + "\n" + res.stderr).lower()
        if res.returncode == 1 and "no crontab for" in out:
            return ""
        raise SlurmError(f"`{self.tool} -l` failed: {res.first_error_line()}")

    def write(self, text: str) -> None:
        """Replace the whole table; an empty one is removed (``-r``)."""
        empty = not text.strip()
        res = self.runner.run([self.tool, "-r"] if empty else [self.tool, "-"], 60, stdin=None if empty else text)
        if not res.ok and not (empty and "no crontab for" in (res.stderr + res.stdout).lower()):
            raise SlurmError(f"{self.tool} refused the new table: {res.first_error_line()}",
                             hint="nothing else of your table was changed")


def choose_via(runner: "Runner", wanted: str | None = None, *, prefer: str = "scrontab") -> Choice:
    """scrontab where the site enables it, else cron; ``wanted`` forces one (an error if it cannot work).
    ``prefer="cron"`` (``model refresh --install-cron``): the crontab where it answers, else scrontab."""
    if wanted is not None and wanted not in VIAS:
        raise UsageError(f"--via {wanted}: not one of {', '.join(VIAS)}")
    if wanted is None and prefer == "cron":
        cron_ok, cron_why = crontab_allowed(runner)
        if cron_ok:
            return Choice("cron", f"asked for cron; ticks run on {socket.gethostname()} only")
        scron_ok, scron_why = scrontab_allowed(runner)
        if scron_ok:
            return Choice("scrontab", f"crontab is not available here ({cron_why}); the site enables scrontab")
        raise SlurmError(f"no scheduler here: cron: {cron_why}; scrontab: {scron_why}",
                         hint="run the command yourself now and then")
    scron_ok, scron_why = scrontab_allowed(runner)
    if wanted == "scrontab":
        if not scron_ok:
            raise SlurmError(f"cannot use scrontab: {scron_why}", hint="use --via cron, or a `chainrun watch` in tmux")
        return Choice("scrontab", "asked for with --via scrontab")
    if wanted is None and scron_ok:
        return Choice("scrontab", f"the site enables scrontab ({scron_why}); it runs on the cluster, "
                                  "whichever login node is up")
    cron_ok, cron_why = crontab_allowed(runner)
    if not cron_ok and wanted == "cron":
        raise SlurmError(f"cannot use cron: {cron_why}", hint="use --via scrontab where the site enables it, or a "
                         "`chainrun watch` in tmux or screen on a login node")
    if not cron_ok:
        raise SlurmError(f"no scheduler for ticks here: scrontab: {scron_why}; cron: {cron_why}",
                         hint="run `chainrun watch` in tmux or screen on a login node (docs/remote-clusters.md)")
    if wanted == "cron":
        return Choice("cron", f"asked for with --via cron (ticks run on {socket.gethostname()} only)")
    return Choice("cron", f"scrontab is not available ({scron_why}); the crontab of {socket.gethostname()} "
                          "ticks, so this host must stay up")


def scrontab_allowed(runner: "Runner") -> tuple[bool, str]:
    """Whether scrontab works here, and why (``ScronParameters`` from ``scontrol show config``,
    else ``scrontab -l``'s own answer)."""
    from chainrun.slurm.parsers import parse_config_value

    res = runner.run(["scontrol", "show", "config"], 60)
    if res.ok:
        params = parse_config_value(res.stdout, "ScronParameters") or ""
        if "enable" not in params.lower():
            return False, f"ScronParameters={params or '(null)'} in the cluster's config (needs `enable`)"
    probe = runner.run(["scrontab", "-l"], 60)
    answer = (probe.stdout + "\n" + probe.stderr).lower()
    if probe.returncode == 127:
        return False, "the scrontab command is not installed here"
    if probe.ok or "no crontab for" in answer:
        return True, "ScronParameters=enable" if res.ok else "`scrontab -l` answers"
    return False, f"`scrontab -l`: {probe.first_error_line()}"


def crontab_allowed(runner: "Runner") -> tuple[bool, str]:
    res = runner.run(["crontab", "-l"], 30)
    answer = (res.stdout + "\n" + res.stderr).lower()
    if res.returncode == 127:
        return False, "the crontab command is not installed here"
    if res.ok or "no crontab for" in answer:
        return True, "crontab -l answers"
    return False, f"`crontab -l`: {res.first_error_line()}"  # e.g. "You are not allowed to use this program"


# ---------------------------------------------------------------------------------------------- install
@dataclass
class Installed:
    name: str
    via: str
    why: str
    host: str
    every_s: int | None
    lines: list[str]
    changed: bool
    log: str = ""


def install_entry(runner: "Runner", name: str, choice: Choice, block: list[str], *,
                  also_remove: tuple[str, ...] = ()) -> bool:
    """Put ``block`` as entry ``name`` into the chosen table; the same entry is removed from the other
    table (moving from cron to scrontab leaves no second ticker). ``also_remove``: old single lines
    ending with one of these tags (an earlier chainrun's format). Returns whether the table changed."""
    table = Table(runner, choice.via)
    old = table.read()
    text = old
    if also_remove:
        text = "\n".join(ln for ln in text.splitlines() if not ln.rstrip().endswith(also_remove)) + "\n"
    new = merge_table(text, name, block)
    changed = new.strip() != old.strip()
    if changed:
        table.write(new)
    other = "cron" if choice.via == "scrontab" else "scrontab"
    remove_entry(runner, name, other, quiet=True)
    return changed


def remove_entry(runner: "Runner", name: str, via: str, *, quiet: bool = False) -> list[str]:
    """Remove entry ``name`` from one table; the lines removed. ``quiet``: a table that cannot be read
    (scrontab disabled, no crontab command) has nothing of ours."""
    table = Table(runner, via)
    try:
        if via == "scrontab" and not scrontab_allowed(runner)[0]:
            return []
        old = table.read()
    except SlurmError:
        if quiet:
            return []
        raise
    _, ours = split_table(old, name)
    if ours:
        table.write(merge_table(old, name, []))
    return ours


def scron_options(runner: "Runner", every_s: int, site: list[str]) -> list[str]:
    """``#SCRON`` options of a tick job: a fixed name, one CPU, little memory, a short limit within the
    default partition's MaxTime; the site's own options (``[sbatch] local`` in config.toml: account,
    QOS) kept, a partition among them honoured."""
    from chainrun.slurm.client import SlurmClient

    opts = [f"--job-name={TICK_JOB_NAME}", "--cpus-per-task=1", f"--mem={TICK_MEM}", "--output=/dev/null"]
    wanted = _partition_in(site)
    limit = min(TICK_LIMIT_S, max(120, every_s))
    try:
        parts = SlurmClient(runner, timeout=60.0).partitions()
    except SlurmError:
        parts = {}
    part = parts.get(wanted) if wanted else next((p for p in parts.values() if p.is_default), None)
    if part is not None:
        if not wanted:
            opts.append(f"--partition={part.name}")
        if part.max_time_s:
            limit = min(limit, int(part.max_time_s))
    opts.append(f"--time={max(1, limit // 60)}")
    return opts + list(site)


def _partition_in(opts: list[str]) -> str | None:
    for i, o in enumerate(opts):
        if o.startswith("--partition="):
            return o.split("=", 1)[1]
        if o in ("-p", "--partition") and i + 1 < len(opts):
            return opts[i + 1]
        if o.startswith("-p") and len(o) > 2:
            return o[2:]
    return None


def install_ticks(runner: "Runner", store: "Store", *, every_s: int = DEFAULT_EVERY_S, via: str | None = None,
                  environ: Mapping[str, str] | None = None, now: float | None = None) -> Installed:
    """``watch --install-schedule``: one tick entry (scrontab or cron), recorded in the store."""
    from chainrun import paths
    from chainrun.clusters import site_options

    environ = os.environ if environ is None else environ
    now = time.time() if now is None else now
    host = socket.gethostname()
    rec = schedule_record(store, TICK)
    choice = choose_via(runner, via)
    if rec and rec.get("via") == "cron" and rec.get("host") != host:
        raise StateError(f"ticks already come from the crontab on {rec.get('host')} (installed "
                         f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(rec.get('installed', 0)))})",
                         hint=f"run `chainrun watch --uninstall-schedule` on {rec.get('host')} first "
                              "(or here, if that host is gone for good)")
    log = paths.logs_dir() / "tick.log"
    source = "scrontab" if choice.via == "scrontab" else f"cron@{host}"
    argv = [sys.executable, "-m", "chainrun.cli.main", "watch", "--once", "--plain"]
    command = tick_command(home=paths.home(), source=source, argv=argv, log=log, environ=environ)
    scron = scron_options(runner, every_s, site_options("local")) if choice.via == "scrontab" else []
    name = tick_name(paths.home())
    block = render_block(name, choice.via, cron_spec(every_s), command, scron)
    changed = install_entry(runner, name, choice, block)
    changed = changed or rec is None or rec.get("via") != choice.via or rec.get("every_s") != every_s
    record = {"via": choice.via, "host": host, "every_s": every_s, "log": str(log), "why": choice.why,
              "installed": now if changed or not rec else rec.get("installed", now)}
    set_record(store, TICK, record)
    return Installed(name, choice.via, choice.why, host, every_s, block, changed, str(log))


def refresh_name(cluster: str, home: Path) -> str:
    return f"model-refresh {cluster} {home}"  # one per home, as the models are (see tick_name)


def refresh_argv(cluster: str) -> list[str]:
    """The refresh entry's command, for cron and scrontab alike (and what ``--print-cron`` shows):
    niced, because the refresh's tuning replays weeks of the queue (single-threaded off a terminal)."""
    return [shutil.which("nice") or "nice", "-n", "10",
            sys.executable, "-m", "chainrun.cli.main", "-q", "model", "refresh", "--cluster", cluster]


def install_refresh(runner: "Runner", cluster: str, *, old_tag: str = "",
                    environ: Mapping[str, str] | None = None) -> Installed:
    """``model refresh --install-cron``: the same entry machinery as the ticks, for a refresh every 6 h
    (cron where it answers, else scrontab). ``old_tag``: an earlier chainrun's one-line format, replaced."""
    from chainrun import paths

    environ = os.environ if environ is None else environ
    choice = choose_via(runner, prefer="cron")
    log = paths.logs_dir() / "model-refresh.log"
    command = tick_command(home=paths.home(), source=None, argv=refresh_argv(cluster), log=log, environ=environ)
    scron = [f"--job-name={REFRESH_JOB_NAME}", "--cpus-per-task=1", f"--mem={TICK_MEM}", "--time=30",
             "--output=/dev/null"] if choice.via == "scrontab" else []
    name = refresh_name(cluster, paths.home())
    block = render_block(name, choice.via, cron_spec(6 * 3600, minute=17), command, scron)
    changed = install_entry(runner, name, choice, block, also_remove=(old_tag,) if old_tag else ())
    return Installed(name, choice.via, choice.why, socket.gethostname(), 6 * 3600, block,
                     changed, str(log))


@dataclass
class Removed:
    lines: dict[str, list[str]] = field(default_factory=dict)  # via -> lines removed
    record: dict | None = None  # what the store said before
    note: str = ""


def uninstall_ticks(runner: "Runner", store: "Store") -> Removed:
    """``watch --uninstall-schedule``: this home's tick entry out of scrontab and this host's crontab."""
    from chainrun import paths

    out = Removed(record=schedule_record(store, TICK))
    for via in VIAS:
        gone = remove_entry(runner, tick_name(paths.home()), via, quiet=True)
        if gone:
            out.lines[via] = gone
    rec = out.record
    host = socket.gethostname()
    if rec and rec.get("via") == "cron" and rec.get("host") != host:
        out.note = (f"the record said ticks come from the crontab on {rec.get('host')}: its line stays there "
                    "until removed on that host (while it ticks, the acting lease lets one watch act)")
    set_record(store, TICK, None)
    return out


# ---------------------------------------------------------------------------------------------- store
def schedule_record(store: "Store", name: str) -> dict | None:
    raw = store.get_meta(f"schedule:{name}")
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def set_record(store: "Store", name: str, record: dict | None) -> None:
    store.set_meta(f"schedule:{name}", None if record is None else json.dumps(record, sort_keys=True))


def tick_started(store: "Store", environ: MutableMapping[str, str] | None = None,
                 now: float | None = None) -> list[str]:
    """At the start of every ``watch``: inside a Slurm job, drop the job's ``SLURM_*`` (:func:`leave_job_env`);
    a scheduled tick (``CHAINRUN_TICK`` set by the entry) records that it ran. Returns the names removed."""
    environ = os.environ if environ is None else environ
    job = environ.get("SLURM_JOB_ID")
    removed = leave_job_env(environ)
    source = environ.get(TICK_ENV)
    if source:
        now = time.time() if now is None else now
        tick = {"at": now, "source": source, "host": socket.gethostname(), "job": job}
        store.set_meta("schedule:last_tick", json.dumps(tick, sort_keys=True))
    return removed


def leave_job_env(environ: MutableMapping[str, str]) -> list[str]:
    """Inside a Slurm job, remove every ``SLURM_*`` variable except :data:`SLURM_KEEP`: sbatch reads
    some of them (e.g. ``SLURM_MEM_PER_CPU`` beside ``--mem``) and exports all of them into the job it
    submits, where srun would take the tick's one CPU and 1 GB for the segment's steps."""
    if not environ.get("SLURM_JOB_ID"):
        return []
    names = sorted(k for k in environ if k.startswith("SLURM_") and k not in SLURM_KEEP)
    for k in names:
        del environ[k]
    return names


@dataclass
class TickStatus:
    source: str  # "scrontab", "cron on HOST", or "" when no schedule is installed
    every_s: int | None
    last: float | None
    next: float | None
    late: str = ""  # a warning, or ""
    why: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def tick_status(store: "Store", now: float | None = None) -> TickStatus | None:
    """Where ticks come from, the last and next one, and a warning when they run late; None when no
    schedule is installed and no scheduled tick ever ran."""
    now = time.time() if now is None else now
    rec = schedule_record(store, TICK)
    raw = store.get_meta("schedule:last_tick")
    try:
        tick = json.loads(raw) if raw else None
    except ValueError:
        tick = None
    if rec is None and tick is None:
        return None
    if rec is None:
        return TickStatus("", None, tick.get("at"), None, late="", why="no schedule installed "
                          "(`chainrun watch --install-schedule`); the last scheduled tick came from "
                          f"{tick.get('source')}")
    every = int(rec.get("every_s") or DEFAULT_EVERY_S)
    source = "scrontab" if rec.get("via") == "scrontab" else f"cron on {rec.get('host')}"
    last = tick.get("at") if tick else None
    since = max(last or 0.0, float(rec.get("installed") or 0.0))
    nxt = next_fire(every, max(now, since) if last is None else max(last, now - every), 7)
    gap = now - since
    late = ""
    if gap > max(LATE_PERIODS * every, every + LATE_MIN_S):
        what = f"last tick {_ago(now - last)} ago" if last else f"no tick since the install {_ago(gap)} ago"
        where = (f"tick jobs may be queued or held (`squeue --me --name {TICK_JOB_NAME}`), or the entry disabled: "
                 "Slurm comments it out (#DISABLED in `scrontab -l`) when a tick job is cancelled; "
                 "`chainrun watch --install-schedule` puts it back" if rec.get("via") == "scrontab"
                 else f"is cron running on {rec.get('host')}? see {rec.get('log')}")
        late = f"ticks are late: {what}, expected every {_ago(every)}; {where}"
    return TickStatus(source, every, last, nxt, late=late, why=rec.get("why", ""))


def _ago(seconds: float) -> str:
    from chainrun.durations import format_duration

    return format_duration(max(0.0, seconds))
