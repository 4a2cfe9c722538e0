"""Small hand-made traces in the canonical columns (and as a sacct -P dump for the CLI)."""

from __future__ import annotations

import pandas as pd

from chainrun.traces import CANONICAL_COLUMNS

T0 = 1_700_000_000.0  # an arbitrary epoch second


def frame(rows: list[dict]) -> pd.DataFrame:
    """rows: dicts with submit/start/end (seconds after T0), limit_s, nodes and optional user."""
    out = []
    for i, r in enumerate(rows):
        out.append({
            "job_id": str(1000 + i), "user": r.get("user", f"u{i % 5}"), "name": "j", "partition": "", "qos": "",
            "account": "", "submit": T0 + r["submit"], "eligible": T0 + r["submit"], "start": T0 + r["start"],
            "end": T0 + r["end"], "timelimit_s": float(r["limit_s"]), "nodes": int(r.get("nodes", 1)),
            "gpus": 3 * int(r.get("nodes", 1)), "cpus": 0, "state": "COMPLETED", "exit_code": "0:0",
            "eligible_known": False, "priority": float("nan"),
        })
    return pd.DataFrame(out)[list(CANONICAL_COLUMNS)]


def steady(days: float, *, every_s: float = 1800.0, run_s: float = 3 * 3600.0, nodes: int = 1,
           users: int = 5) -> list[dict]:
    """A steady stream of jobs, recorded as starting on submit (the replay decides its own starts)."""
    rows, t, i = [], 0.0, 0
    while t < days * 86400:
        rows.append({"submit": t, "start": t, "end": t + run_s, "limit_s": 2 * run_s, "nodes": nodes,
                     "user": f"u{i % users}"})
        t += every_s
        i += 1
    return rows


def sacct_dump(df: pd.DataFrame) -> str:
    """The frame as `sacct -P --format=JobID,User,Submit,Start,End,TimelimitRaw,NNodes,State`."""
    iso = lambda s: pd.to_datetime(s, unit="s").strftime("%Y-%m-%dT%H:%M:%S")  # noqa: E731
    lines = ["JobID|User|Submit|Start|End|TimelimitRaw|NNodes|State"]
    for r in df.itertuples():
        lines.append(f"{r.job_id}|{r.user}|{iso(r.submit)}|{iso(r.start)}|{iso(r.end)}|"
                     f"{int(r.timelimit_s // 60)}|{r.nodes}|{r.state}")
    return "\n".join(lines) + "\n"
