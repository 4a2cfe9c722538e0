"""Job history from sacct (incremental, cached) and the live queue from squeue.

History: ``sacct -X -P --format=SACCT_FIELDS -S .. -E ..`` over windows of a few days (the
argv and the field list come from the Slurm layer, ``chainrun.slurm``; rows are read by
their header names),
from the last refresh (minus a day, so jobs that were pending or running then are read
again with their final state) up to now. Everyone's jobs with ``-a`` when the cluster
allows it; otherwise our own, i.e. sacct's default, the user it runs as on the cluster
(then queue-state features are left empty, consistently at training and prediction time).
Times are read back as epoch seconds (``SLURM_TIME_FORMAT=%s``) and the window bounds are
given relative to the cluster's "now" (``-S now-Nseconds``), so no time zone, here or there,
enters. Rows are read by the Slurm layer's header mapping and value rules
(chainrun.traces applies them column-wise). The cache is an
``.npz`` of plain arrays, one per canonical column (chainrun.traces), read with
``allow_pickle=False``, plus a small JSON beside it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from chainrun.errors import SlurmError, TransientSlurmError
from chainrun.schedule import IGNORED_JOB_NAMES
from chainrun.slurm.client import SACCT_ENV
from chainrun.slurm.parsers import SACCT_FIELDS
from chainrun.traces import CANONICAL_COLUMNS, parse_trace_text

if TYPE_CHECKING:
    from collections.abc import Callable

    import pandas as pd

    from chainrun.runner.base import Runner

# the one sacct field list (chainrun.slurm.parsers), shared with the watcher
SACCT_FORMAT = SACCT_FIELDS
# the field list of sacct captures made before the lists were one (headerless, -n)
LEGACY_FORMAT = (
    "JobIDRaw,User,Partition,QOS,Account,Submit,Eligible,Start,End,TimelimitRaw,NNodes,NCPUS,"
    "AllocTRES,ReqTRES,State,ExitCode,JobName"
)
WINDOW_DAYS = 7.0
SAVE_EVERY_S = 60.0  # a refresh saves the windows read so far at most this often (service.refresh)
LOOKBACK_DAYS = 60.0
OVERLAP_S = 86400.0
_ENV = SACCT_ENV


@dataclass
class FetchResult:
    frame: "pd.DataFrame"
    all_users: bool
    calls: int


def history_paths(cluster: str, base: Path | None = None) -> tuple[Path, Path]:
    from chainrun.paths import ensure_private_dir, home

    d = ensure_private_dir((base or home()) / "history")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in cluster) or "default"
    return d / f"{safe}.npz", d / f"{safe}.json"


def sacct_argv(start: float, end: float, *, all_users: bool, cluster: str | None = None,
               now: float | None = None) -> list[str]:
    """The history call, built by the Slurm layer (:func:`chainrun.slurm.client.history_argv`)."""
    from chainrun.slurm.client import history_argv

    return history_argv(start, end, all_users=all_users, cluster=cluster, now=now)


def parse_sacct_rows(text: str, *, fields: str = SACCT_FORMAT) -> "pd.DataFrame":
    """Canonical frame from ``sacct -P`` output, keyed by its header line; text without a
    header (``-n``) is read as ``fields``."""
    import pandas as pd

    body = text.strip("\n")  # a million rows: no per-line copies here, the reader splits once
    first = body.split("\n", 1)[0] if body else ""
    if _is_header(first):
        rest = body[len(first):].strip("\n")
        if not rest.strip():
            return pd.DataFrame({c: pd.Series(dtype=object) for c in CANONICAL_COLUMNS})
        return parse_trace_text(body, source="sacct")
    if not body.strip():
        return pd.DataFrame({c: pd.Series(dtype=object) for c in CANONICAL_COLUMNS})
    return parse_trace_text("|".join(fields.split(",")) + "\n" + body, source="sacct")


def _is_header(line: str) -> bool:
    from chainrun.slurm.parsers import SACCT_HEADER_ALIASES

    return line.split("|", 1)[0].strip().lower() in SACCT_HEADER_ALIASES["job_id"]


def fetch_history(runner: "Runner", *, since: float, now: float, cluster: str | None = None,
                  window_days: float = WINDOW_DAYS, timeout: float = 300.0,
                  on_window: "Callable[[pd.DataFrame, float, bool], None] | None" = None) -> FetchResult:
    """sacct over [since, now] in windows; everyone's jobs if ``-a`` works, else our own.

    ``on_window(frame, window_end, all_users)`` after each window read: the refresh keeps what
    was read before a later window fails (a 60-day first read is nine calls)."""
    import pandas as pd

    frames = []
    all_users = True
    calls = 0
    t = since
    while t < now:
        t_end = min(now, t + window_days * 86400.0)
        res = None
        if all_users:
            res = runner.run(sacct_argv(t, t_end, all_users=True, cluster=cluster, now=now), timeout, env=_ENV)
            calls += 1
            if not res.ok and not res.timed_out and res.returncode != 127:
                all_users = False  # the site does not let us see others: fall back to our jobs
                res = None
        if res is None:
            res = runner.run(sacct_argv(t, t_end, all_users=False, cluster=cluster, now=now), timeout, env=_ENV)
            calls += 1
        if not res.ok:
            msg = f"sacct failed: {res.first_error_line()}"
            if res.returncode == 127:
                raise SlurmError(msg, hint="is Slurm installed and on PATH here?")
            raise (TransientSlurmError if res.timed_out else SlurmError)(msg)
        frames.append(parse_sacct_rows(res.stdout))
        if on_window is not None:
            on_window(frames[-1], t_end, all_users)
        t = t_end
    frames = [f for f in frames if len(f)]
    df = pd.concat(frames, ignore_index=True) if frames else parse_sacct_rows("")
    if all_users and len(df) and df["user"].nunique() <= 1 and not _is_privileged(runner):
        # -a was accepted but PrivateData hid everyone else: queue state would be a lie
        all_users = False
    return FetchResult(df, all_users, calls)


def merge_history(old: "pd.DataFrame | None", new: "pd.DataFrame") -> "pd.DataFrame":
    """Union by job id; the newest read of a job wins (it may have started or ended since)."""
    import pandas as pd

    if old is None or not len(old):
        out = new
    else:
        out = pd.concat([old, new], ignore_index=True)
    out = out.drop_duplicates("job_id", keep="last")
    out = out[~out["name"].isin(IGNORED_JOB_NAMES)]  # chainrun's scheduled ticks: not the queue's history
    return out.sort_values(["submit", "job_id"], kind="stable").reset_index(drop=True)


_STR_COLS = ("job_id", "user", "name", "partition", "qos", "account", "state", "exit_code")


def load_cache(cluster: str, base: Path | None = None) -> "tuple[pd.DataFrame | None, dict]":
    import numpy as np
    import pandas as pd

    npz, meta = history_paths(cluster, base)
    info = json.loads(meta.read_text()) if meta.exists() else {}
    if not npz.exists():
        return None, info
    with np.load(npz, allow_pickle=False) as z:  # plain arrays only: no pickle
        df = pd.DataFrame({c: (z[c].astype(object) if c in _STR_COLS else z[c]) for c in CANONICAL_COLUMNS})
    return df, info


def save_cache(cluster: str, df: "pd.DataFrame", info: dict, base: Path | None = None) -> Path:
    import numpy as np

    npz, meta = history_paths(cluster, base)
    arrays = {}
    for c in CANONICAL_COLUMNS:
        v = df[c].to_numpy()
        kind = bool if c == "eligible_known" else ("int64" if c in ("nodes", "gpus", "cpus") else float)
        arrays[c] = v.astype(str) if c in _STR_COLS else np.asarray(v, dtype=kind)
    tmp = npz.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, npz)
    tmpm = meta.with_suffix(".json.tmp")
    tmpm.write_text(json.dumps(info, indent=1, sort_keys=True))
    os.replace(tmpm, meta)
    return npz


def live_snapshot(runner: "Runner", *, timeout: float = 60.0) -> "pd.DataFrame":
    """Pending and running jobs of everyone, from one ``squeue`` call, as canonical rows.

    Jobs pending for a reason other than the queue (dependency, hold, begin time, a limit
    they can never meet) are left out: they are not ahead of anyone. The conversion is
    :func:`chainrun.predict.snapshot.snapshot_from_rows`, shared with the watcher, which
    feeds it from its own single squeue call per tick.
    """
    from chainrun.predict.snapshot import snapshot_from_rows
    from chainrun.slurm.client import SlurmClient

    return snapshot_from_rows(SlurmClient(runner, timeout=timeout).queue(all_users=True))


def _is_privileged(runner: "Runner") -> bool:
    """Root on the machine sacct runs on (the cluster's, over SSH), not on this one."""
    from chainrun.slurm.client import SlurmClient

    try:
        return SlurmClient(runner, timeout=30.0).is_privileged()
    except (SlurmError, OSError):
        return False


def node_count(runner: "Runner") -> int | None:
    """Nodes of the cluster from ``scontrol show node``; None if it cannot be read."""
    from chainrun.slurm.client import SlurmClient

    try:
        n = SlurmClient(runner, timeout=60.0).node_count()
    except (SlurmError, OSError):
        return None
    return n or None


def now() -> float:
    return time.time()
