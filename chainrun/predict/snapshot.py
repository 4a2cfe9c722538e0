"""The live queue as canonical rows: what the model sees at prediction time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chainrun.traces import CANONICAL_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

    from chainrun.slurm.parsers import QueueRow

# pending for a reason other than the queue: not ahead of anyone
HELD_REASONS = ("Dependency", "DependencyNeverSatisfied", "JobHeldUser", "JobHeldAdmin", "BeginTime",
                "PartitionTimeLimit", "AssocMaxWallDurationPerJobLimit", "QOSMaxWallDurationPerJobLimit",
                "InvalidAccount", "InvalidQOS", "PartitionDown", "Reservation")


_EMPTY: list = []  # the frame of no rows, built once (the replay asks with no rows on every cached state)


def snapshot_from_rows(rows: "list[QueueRow]") -> "pd.DataFrame":
    """Pending and running jobs of everyone, from parsed ``squeue --all`` rows."""
    keep = [r for r in rows if r.state in ("PENDING", "RUNNING")
            and not (r.state == "PENDING" and r.reason.split(",")[0].strip("()") in HELD_REASONS)]
    if keep:
        return _frame(keep)
    if not _EMPTY:
        _EMPTY.append(_frame([]))
    return _EMPTY[0].copy()  # a copy: the caller may change it


def _frame(keep: "list[QueueRow]") -> "pd.DataFrame":
    import numpy as np
    import pandas as pd

    return pd.DataFrame({
        "job_id": [r.job_id for r in keep], "user": [r.user for r in keep], "name": [r.name for r in keep],
        "partition": [r.partition for r in keep], "qos": [r.qos for r in keep], "account": "",
        "submit": [np.nan if r.submit is None else r.submit for r in keep],
        "eligible": [np.nan if r.submit is None else r.submit for r in keep],
        "start": [np.nan if (r.start is None or r.state == "PENDING") else r.start for r in keep],
        "end": np.nan,
        "timelimit_s": [np.nan if r.time_limit_s is None else r.time_limit_s for r in keep],
        "nodes": [r.nodes for r in keep], "gpus": [r.gpus for r in keep], "cpus": [r.cpus for r in keep],
        "state": [r.state for r in keep], "exit_code": "0:0", "eligible_known": True, "priority": np.nan,
    }, columns=list(CANONICAL_COLUMNS))
