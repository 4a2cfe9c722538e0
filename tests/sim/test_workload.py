"""The replay's job list (chainrun/sim/workload.py) from traces with impossible rows: a stray year, jobs
that end before they start. Each is a one-line error naming the row, or a replay that still holds
every job, never an overflow deep in the scheduler."""

from __future__ import annotations

import pytest

from chainrun.errors import UsageError
from chainrun.sim.chain_replay import ChainsConfig, check_window, with_work
from chainrun.sim.workload import build_workload, peak_concurrent_nodes

from .tracegen import T0, frame, steady

H = 3600.0


def _with_stray(t: float, col: str):
    df = frame(steady(20))
    df.loc[7, col] = t
    return df


@pytest.mark.parametrize("t,col", [(-6 * H, "submit"), (0.0, "start"), (4_102_444_800.0, "submit"), (1e14, "start")])
def test_a_stray_year_is_named_before_any_replay(t, col):
    df = _with_stray(t, col)
    with pytest.raises(UsageError, match=f"job {df.loc[7, 'job_id']} has {col} .*far from the others"):
        build_workload(df)
    cfg = with_work(ChainsConfig(chains_every_s=12 * H), work_s=24 * H, segment_s=12 * H)
    with pytest.raises(UsageError, match="more than a replay covers"):  # not a walk over decades of points
        check_window(df, cfg)


def test_a_stray_end_only_lengthens_its_job_to_its_limit():
    df = _with_stray(T0 + 80 * 365 * 86400.0, "end")
    w = build_workload(df)
    assert w.jobs[7][4] == df.loc[7, "timelimit_s"]


def test_jobs_that_end_before_they_start_run_0_s_and_the_peak_still_holds_the_widest():
    rows = steady(3, nodes=2)
    rows[4].update(nodes=16, end=rows[4]["start"] - H)  # a clock change: End before Start
    w = build_workload(frame(rows))
    assert w.jobs[4][4] == 0.0 and w.peak_nodes >= 16
    swapped = frame([{**r, "start": r["end"], "end": r["start"]} for r in steady(3, nodes=2)])
    swapped.loc[4, "nodes"] = 16
    assert peak_concurrent_nodes(swapped) == 16  # before: 1, and a "16-node job, only 1 node" error
    with pytest.raises(UsageError, match="End is not after Start on any row"):
        build_workload(swapped)


def test_limits_of_0_are_unknown_not_a_cut_to_0_s():
    df = frame(steady(3))
    df["timelimit_s"] = 0.0  # before: every run cut to 0 s (the longest limit was 0)
    w = build_workload(df)
    assert all(j[3] == 48 * H and j[4] == 3 * H for j in w.jobs)
