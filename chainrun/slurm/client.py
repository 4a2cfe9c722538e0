"""Slurm commands through a Runner: argv builders, one call each, typed errors.

Every call goes through :meth:`SlurmClient._call`, which counts calls (the watcher's
budget is one ``squeue`` and at most one ``sacct`` per tick, see bench/watch_rpcs.py),
asks for epoch timestamps (``SLURM_TIME_FORMAT=%s``: no time-zone guessing, also over
SSH), removes the user's ``SQUEUE_*``/``SACCT_FORMAT`` settings (:data:`UNSET_FOR_READS`),
and turns "the controller did not answer" into :class:`TransientSlurmError`. Only stdout
is parsed; stderr is read for error words only.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter
from typing import Iterable, Sequence

from chainrun.errors import SlurmError, TransientSlurmError
from chainrun.runner.base import Runner, RunResult
from chainrun.slurm import parsers
from chainrun.slurm.parsers import AcctRow, PartitionInfo, QueueRow

log = logging.getLogger(__name__)

_TRANSIENT_RE = re.compile(
    r"socket timed out|timed out|unable to contact slurm controller|connection refused|"
    r"slurm_load_jobs error: (?:unable|socket)|temporarily unavailable|try again|"
    r"slurmctld.*(?:not responding|down)|slurmdbd.*(?:not responding|down)|zero bytes were transmitted|"
    r"resource temporarily|communication connection failure|could not contact|"
    # the controller or its authentication is unwell, not the job: retry later
    r"connection reset|transport endpoint|broken pipe|network is unreachable|no route to host|"
    r"slurmctld is busy|standby mode|insane message length|protocol authentication error|"
    r"munge|invalid authentication credential|slurm_persist_conn|unable to connect to database|"
    r"accounting storage is not responding",
    re.IGNORECASE,
)
# sbatch refusing this job for what it asks: retrying the same request cannot help
CANCEL_ATTEMPTS = 3
CANCEL_PAUSE_S = 1.0  # then 2 s: a busy controller gets a moment, the tick is not held long
_REFUSED_RE = re.compile(
    r"invalid|not available|unrecognized|unrecognised|violates|permission denied|access denied|"
    r"unable to open file|not permitted|requested .* not|no such|exceeds|too many|must be|illegal|"
    r"batch script contains dos line breaks|script arguments not permitted|does not exist",
    re.IGNORECASE,
)
# a user's profile may set these for their own use of squeue/sacct (squeue(1), sacct(1): ENVIRONMENT
# VARIABLES); they filter rows out (a running owner hidden by SQUEUE_STATES=PD) or change the columns.
# chainrun's reads remove them; SLURM_CONF and the user's SBATCH_* defaults stay.
UNSET_FOR_READS = ("SQUEUE_STATES", "SQUEUE_USERS", "SQUEUE_PARTITION", "SQUEUE_ACCOUNT", "SQUEUE_QOS",
                   "SQUEUE_NAMES", "SQUEUE_FORMAT", "SQUEUE_FORMAT2", "SQUEUE_SORT", "SACCT_FORMAT")
_ENV: dict[str, str | None] = {"SLURM_TIME_FORMAT": "%s", **{k: None for k in UNSET_FOR_READS}}
# sacct reads a wall-clock -S/-E in the zone of the process that runs it (the cluster's, over
# SSH): chainrun gives them relative to the cluster's own "now" instead, which no zone, and no
# profile that resets TZ, can shift; and reads times back as epoch seconds
SACCT_ENV = _ENV


def history_argv(start: float, end: float, *, all_users: bool, cluster: str | None = None,
                 now: float | None = None) -> list[str]:
    """``sacct`` for the jobs of [start, end] (epoch s, by this machine's clock ``now``) with
    :data:`parsers.SACCT_FIELDS` and a header line; run it with :data:`SACCT_ENV`. Everyone's
    jobs with ``all_users`` (``-a``). The user is sacct's default: whoever runs it, here or on
    the cluster."""
    now = time.time() if now is None else now
    argv = ["sacct", "-X", "-P", f"--format={parsers.SACCT_FIELDS}", "-S", ago(start, now, early=True),
            "-E", ago(end, now)]
    if all_users:
        argv.append("-a")
    if cluster:
        argv += ["-M", cluster]
    return argv


def ago(epoch: float, now: float, *, early: bool = False) -> str:
    """``epoch`` as sacct's relative time ``now-Nseconds`` (whole seconds, rounded away from the
    window's inside when ``early``: a start bound may only move earlier)."""
    d = max(0.0, float(now) - float(epoch))
    n = math.ceil(d) if early else math.floor(d)
    return f"now-{n}seconds" if n > 0 else "now"


def is_transient(result: RunResult) -> bool:
    return result.timed_out or bool(_TRANSIENT_RE.search(result.stderr or ""))


def is_refusal(result: RunResult) -> bool:
    """Slurm answered and said no to this request (bad partition, impossible resources, ...)."""
    return not is_transient(result) and bool(_REFUSED_RE.search(result.stderr or ""))


class SlurmRefused(SlurmError):
    """Slurm answered and refused this request for what it asks; the same request would fail again.

    Any other failure that is not :class:`TransientSlurmError` is "unexplained": Slurm may be
    unwell in a way we do not recognise, so callers that loop (the watcher) retry it a bounded
    number of times instead of giving up on the first one.
    """


class Backoff:
    """Capped exponential backoff: ``base``, 2x, 4x, ... up to ``cap`` seconds; ``reset()`` on success."""

    def __init__(self, base: float, cap: float, factor: float = 2.0) -> None:
        self.base, self.cap, self.factor = base, max(base, cap), factor
        self.failures = 0

    def failed(self) -> float:
        """Record one failure; returns how long to wait before the next attempt."""
        self.failures += 1
        return self.delay

    @property
    def delay(self) -> float:
        if self.failures == 0:
            return self.base
        return min(self.cap, self.base * self.factor ** (self.failures - 1))

    def reset(self) -> None:
        self.failures = 0


class SlurmClient:
    def __init__(self, runner: Runner, *, timeout: float = 60.0) -> None:
        self.runner = runner
        self.timeout = timeout
        self.calls: Counter[str] = Counter()

    # -------------------------------------------------------------- plumbing
    def _call(self, argv: Sequence[str], *, what: str, stdin: str | None = None,
              env: dict[str, str | None] | None = None) -> RunResult:
        self.calls[argv[0]] += 1
        res = self.runner.run(argv, self.timeout, env=env or _ENV, stdin=stdin)
        if res.ok:
            return res
        msg = f"{what} failed: {res.first_error_line()}"
        if res.returncode == 127 and not res.timed_out:
            raise SlurmError(msg, hint="is Slurm installed and on PATH here? (sites with modules: use a login shell)")
        if is_transient(res):
            raise TransientSlurmError(msg)
        if is_refusal(res):
            raise SlurmRefused(msg)
        raise SlurmError(msg)

    # -------------------------------------------------------------- queries
    def queue(self, *, all_users: bool = False, user: str | None = None) -> list[QueueRow]:
        """One squeue call: our jobs (or everyone's with ``all_users``) with the fields we track."""
        argv = ["squeue", "--format", parsers.SQUEUE_FORMAT]
        if all_users:
            argv.append("--all")
        elif user:
            argv += ["--user", user]
        else:
            argv.append("--me")
        res = self._call(argv, what="squeue")
        try:
            return parsers.parse_squeue(res.stdout)
        except parsers.SlurmParseError:
            raise
        except Exception as e:  # a parser bug must not look like a crash of the watcher
            raise parsers.SlurmParseError(f"could not read squeue output: {e}") from None

    def accounting(self, job_ids: Iterable[str], *, since: float | None = None) -> list[AcctRow]:
        """One sacct call for many jobs (allocations only)."""
        ids = sorted(set(job_ids), key=lambda j: (len(j), j))
        if not ids:
            return []
        # -D: every run of a requeued job (one row each), so a segment's figures sum its runs
        argv = ["sacct", "-X", "-D", "-P", "--format", parsers.SACCT_FIELDS, "--jobs", ",".join(ids)]
        if since is not None:
            # job ids are reused after a controller reset: look only at jobs from our era
            argv += ["--starttime", _since(since)]
        res = self._call(argv, what="sacct", env=SACCT_ENV)
        return parsers.parse_sacct(res.stdout)

    def accounting_by_name(self, names: Iterable[str], *, since: float) -> list[AcctRow]:
        """One sacct call finding jobs by name: used to adopt a job whose submission we did not record."""
        names = sorted(set(names))
        if not names:
            return []
        argv = ["sacct", "-X", "-P", "--format", parsers.SACCT_FIELDS, "--name", ",".join(names),
                "--starttime", _since(since)]
        return parsers.parse_sacct(self._call(argv, what="sacct", env=SACCT_ENV).stdout)

    def partitions(self) -> dict[str, PartitionInfo]:
        res = self._call(["scontrol", "show", "partition", "--oneliner"], what="scontrol show partition")
        return parsers.parse_partitions(res.stdout)

    def reservations(self) -> list:
        """``scontrol show reservation``: the windows a segment may have to fit before (reservations.py)."""
        from chainrun.slurm.reservations import parse_reservations

        res = self._call(["scontrol", "show", "reservation", "--oneliner"], what="scontrol show reservation")
        return parse_reservations(res.stdout)

    def topology(self):
        """``scontrol show topology`` (slurm/topology.py); an empty Topology where the site has no
        topology plugin (the command then fails or prints no switch)."""
        from chainrun.slurm.topology import Topology, parse_topology

        try:
            res = self._call(["scontrol", "show", "topology"], what="scontrol show topology")
        except TransientSlurmError:
            raise
        except SlurmError:
            return Topology()
        return parse_topology(res.stdout)

    def update_pending(self, job_id: str, fields: dict[str, str]) -> None:
        """``scontrol update JobId=ID Key=Value ...`` on a job of ours (e.g. ExcNodeList, Switches)."""
        argv = ["scontrol", "update", f"JobId={job_id}", *(f"{k}={v}" for k, v in fields.items())]
        self._call(argv, what="scontrol update")

    def node_count(self) -> int:
        """Nodes of the cluster (``scontrol show node``: one record a node)."""
        res = self._call(["scontrol", "show", "node", "--oneliner"], what="scontrol show node")
        return sum(1 for rec in parsers.parse_scontrol_oneliners(res.stdout) if rec.get("NodeName"))

    def node_states(self, partition: str = "") -> dict[str, str]:
        """Node -> its ``State`` (``IDLE+DRAIN``, ``DOWN*``...), only the nodes of ``partition`` when given."""
        res = self._call(["scontrol", "show", "node", "--oneliner"], what="scontrol show node")
        return {rec["NodeName"]: rec.get("State", "") for rec in parsers.parse_scontrol_oneliners(res.stdout)
                if rec.get("NodeName") and (not partition or partition in rec.get("Partitions", "").split(","))}

    def is_privileged(self) -> bool:
        """Whether the account the commands run as (here or on the remote cluster) is root."""
        res = self._call(["id", "-u"], what="id -u")
        return res.stdout.strip() == "0"

    def config_value(self, key: str) -> str | None:
        res = self._call(["scontrol", "show", "config"], what="scontrol show config")
        return parsers.parse_config_value(res.stdout, key)

    # -------------------------------------------------------------- actions
    def submit(
        self, script_path: str, sbatch_args: Sequence[str], *, script_args: Sequence[str] = ()
    ) -> tuple[str, str | None]:
        """``sbatch --parsable ARGS SCRIPT SCRIPT_ARGS`` -> (job id, cluster or None)."""
        argv = ["sbatch", "--parsable", *sbatch_args, script_path, *script_args]
        res = self._call(argv, what="sbatch")
        return parsers.parse_sbatch_parsable(res.stdout)

    def test_only(self, script_path: str, sbatch_args: Sequence[str], *, script_args: Sequence[str] = ()) -> float | None:
        """``sbatch --test-only``: when Slurm would start this request now (epoch s); no job is created."""
        res = self._call(["sbatch", "--test-only", *sbatch_args, script_path, *script_args], what="sbatch --test-only")
        return parsers.parse_test_only(res.stderr + "\n" + res.stdout)

    def cancel(self, job_ids: Iterable[str], *, attempts: int = CANCEL_ATTEMPTS,
               pause_s: float | None = None) -> dict[str, str]:
        """``scancel`` the jobs; returns ``{job id: error}`` for those still not cancelled after
        ``attempts`` tries (each failure logged). A job Slurm no longer knows or that is already
        ending counts as cancelled: it runs no more. Callers record only the others as cancelled."""
        left = sorted(set(job_ids), key=lambda j: (len(j), j))
        pause_s = CANCEL_PAUSE_S if pause_s is None else pause_s
        failed: dict[str, str] = {}
        for attempt in range(1, attempts + 1):
            if not left:
                break
            self.calls["scancel"] += 1
            res = self.runner.run(["scancel", *left], self.timeout, env=_ENV)
            failed = {} if res.ok else cancel_failures(left, res)
            if failed:
                log.warning("scancel %s (attempt %d of %d): %s", " ".join(failed), attempt, attempts,
                            "; ".join(sorted(set(failed.values()))))
                if attempt < attempts:
                    time.sleep(pause_s * attempt)
            left = sorted(failed, key=lambda j: (len(j), j))
        return failed

    def signal(self, job_id: str, signal: str) -> None:
        """Signal the batch shell (``--batch``: a script without steps gets nothing otherwise)."""
        self._call(["scancel", "--batch", f"--signal={signal}", job_id], what="scancel --signal")


# scancel's per-job errors meaning the job runs no more (slurm_errno.c: ESLURM_INVALID_JOB_ID,
# ESLURM_ALREADY_DONE, "Job/step already completing or completed")
_CANCEL_DONE_RE = re.compile(r"invalid job id|already (?:completing|completed|done)|job has already finished",
                             re.IGNORECASE)
_JOB_IN_LINE_RE = re.compile(r"job(?:\s+id)?\s+(\d+(?:_\d+)?)", re.IGNORECASE)


def cancel_failures(ids: Sequence[str], res: RunResult) -> dict[str, str]:
    """``{job id: error}`` for the jobs a failed ``scancel`` did not cancel, from its stderr.

    scancel goes on after a per-job error and names the job in it (``scancel: error: Kill job
    error on job id 74: Access/permission denied``); an error naming no job (the controller did
    not answer, a timeout) leaves every job of the call uncertain: all of them failed."""
    if res.timed_out:
        return {j: "scancel timed out" for j in ids}
    per_job: dict[str, str] = {}
    general = []
    for line in (res.stderr or "").splitlines():
        if not line.strip():
            continue
        m = _JOB_IN_LINE_RE.search(line)
        if m and m.group(1) in ids:
            per_job[m.group(1)] = line.strip()
        else:
            general.append(line.strip())
    if general or not per_job:
        why = general[0] if general else res.first_error_line()
        return {j: per_job.get(j, why) for j in ids if not _CANCEL_DONE_RE.search(per_job.get(j, why))}
    return {j: err for j, err in per_job.items() if not _CANCEL_DONE_RE.search(err)}


def _since(epoch: float) -> str:
    # relative to the cluster's clock (see SACCT_ENV); a day of slack: ids are reused only after a controller reset
    return ago(epoch - 86400, time.time(), early=True)
