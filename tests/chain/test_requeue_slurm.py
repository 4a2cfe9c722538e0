"""`scontrol requeue` of a segment that has trained a few steps, on the real cluster: the job goes back
to PENDING under the same id, the watcher keeps it the same segment (no new submission, no foreign
job), reads the rerun's start and end, and the chain completes. Checked from the toy trainer's own
per-step record: no two runs ever trained at once, each run resumed from the last checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from chainrun.state.store import Store
from tests.reliability import harness as h

pytestmark = pytest.mark.slurm


def _runs(steps_log: Path) -> list[dict]:
    """The trainer's record cut into runs: consecutive lines of one job id and SLURM_RESTART_COUNT (a
    requeued job runs again under its id, with the count one higher)."""
    runs: list[dict] = []
    for line in steps_log.read_text().splitlines():
        kind, _seg, step, t, job, restart = (line.split() + ["0"])[:6]
        if not runs or (runs[-1]["job"], runs[-1]["restart"]) != (job, restart):
            runs.append({"job": job, "restart": restart, "steps": [], "saves": [], "first": float(t), "last": float(t)})
        r = runs[-1]
        r["last"] = float(t)
        (r["steps"] if kind == "step" else r["saves"]).append(int(step))
    return runs


def _job_pids(job: str) -> list[int]:
    """Processes of a Slurm job on this host: those with its SLURM_JOB_ID in their environment."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"SLURM_JOB_ID={job}".encode() in env:
                out.append(int(d.name))
    return out


def _trained(steps_log: Path) -> int:
    runs = _runs(steps_log) if steps_log.exists() else []
    return len(runs[0]["steps"]) if runs else 0


def _until(what, check, timeout=240, home=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if home is not None:
            h.cli("watch", "--once", "--plain", home=home, timeout=300)
        got = check()
        if got:
            return got
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_requeued_segment_stays_one_segment_and_the_chain_completes(slurm_cluster, tmp_path):
    home, work = tmp_path / "home", tmp_path / "w"
    env = {"TOY_STEP_SECONDS": "0.5"}
    chain = h.submit(home, work, "requeue", "--total", "80s", "--signal", "USR2@40", "--policy", "reactive",
                     "--", "--exclude=n4", env=env)
    store = Store(home / "state.sqlite")
    try:
        s0 = store.segments(chain)[0]
        ckpt = Path(store.chain(chain).checkpoint_dir)
        steps_log = ckpt / "steps.log"
        _until("segment 0 to train 6 steps", lambda: _trained(steps_log) >= 6,
               home=home)
        assert store.segments(chain)[0].phase == "RUNNING"
        subprocess.run(["scontrol", "requeue", s0.job_id], check=True, capture_output=True, text=True)
        _until("the watcher to see the requeue",
               lambda: Store(home / "state.sqlite").segments(chain)[0].extra.get("requeues") == 1, home=home)
        seg = Store(home / "state.sqlite").segments(chain)
        assert len(seg) == 1 and seg[0].job_id == s0.job_id and seg[0].phase == "PENDING"  # no new submission
        # skip Slurm's requeue delay (BeginTime ~2 min on): the watcher's part is what is tested
        h.release_requeued(s0.job_id)
        watcher = subprocess.run(h.watch_argv(3), env={**os.environ, "CHAINRUN_HOME": str(home)}, capture_output=True,
                                 text=True, timeout=900, stdin=subprocess.DEVNULL)
        assert watcher.returncode == 0, watcher.stdout + watcher.stderr
        store = Store(home / "state.sqlite")
        c, segs = store.chain(chain), store.segments(chain)
        assert c.status == "COMPLETED", c.reason
        messages = [e.message for _, e in store.events(chain)]
        assert not any("names another job" in m or "second copy" in m or "two copies" in m for m in messages)
        assert sum(f"was requeued by Slurm" in m for m in messages) == 1
        assert segs[0].job_id == s0.job_id and segs[0].extra["requeues"] == 1
        acct = subprocess.run(["sacct", "-X", "-n", "-P", "-j", s0.job_id, "-o", "Start,End"], capture_output=True,
                              text=True, env={**os.environ, "SLURM_TIME_FORMAT": "%s"}).stdout.split("|")
        assert (segs[0].start, segs[0].end) == (float(acct[0]), float(acct[1]))  # the rerun's, as Slurm has them
        runs = _runs(steps_log)
        # it trained, was requeued, trained again: two runs of one job, told apart by SLURM_RESTART_COUNT
        assert [(r["job"], r["restart"]) for r in runs][:2] == [(s0.job_id, "0"), (s0.job_id, "1")]
        _assert_runs_add_up(store, chain, segs[0], runs)
        last_saved = 0
        for prev, run in zip([None] + runs, runs):
            if prev is not None:
                assert run["first"] > prev["last"], f"two runs trained at once: {prev['job']} and {run['job']}"
            if run["steps"]:
                assert run["steps"][0] == last_saved + 1, f"a run resumed at {run['steps'][0]}, saved {last_saved}"
                assert run["steps"] == list(range(run["steps"][0], run["steps"][-1] + 1))
            last_saved = max(run["saves"], default=last_saved)
    finally:
        h.cli("cancel", chain, home=home)


def _assert_runs_add_up(store: Store, chain: str, seg, runs: list[dict]) -> None:
    """The segment's credit is what both runs of its job trained (the wrapper's per-run records), never
    only the last; what the first run held is sacct's row of it (sacct -D)."""
    ctl = Path(store.chain(chain).run_dir) / "control"
    run0 = dict(ln.split("=", 1) for ln in (ctl / "seg-0.run-0").read_text().splitlines())
    last = dict(ln.split("=", 1) for ln in (ctl / "seg-0.outcome").read_text().splitlines())
    assert (run0["restart"], last["restart"]) == ("0", "1") and "payload_end" in run0, (run0, last)
    recorded = sum(float(r["payload_end"]) - float(r["payload_start"]) for r in (run0, last))
    assert abs(seg.credit_s - recorded) < 1e-6, (seg.credit_s, run0, last)
    # ... and what the trainer itself logged: each run's steps lie within its payload's window
    mine = [r for r in runs if r["job"] == seg.job_id]
    logged = sum(r["last"] - r["first"] for r in mine)
    assert logged <= seg.credit_s + 1 and seg.credit_s - logged < 2 * 15, (seg.credit_s, logged)  # + 2 startups
    rows = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-j", seg.job_id, "-o", "Start,End,State"],
                          capture_output=True, text=True, env={**os.environ, "SLURM_TIME_FORMAT": "%s"}).stdout.split()
    first = rows[0].split("|")
    assert len(rows) == 2 and first[2] == "REQUEUED", rows
    assert seg.extra["held_before_s"] == float(first[1]) - float(first[0]), (seg.extra, rows)
    assert seg.extra["earlier_runs"][0]["trained_s"] == float(run0["payload_end"]) - float(run0["payload_start"])
    c = store.chain(chain)
    assert abs(c.credited_s - sum(s.credit_s for s in store.segments(chain))) < 1e-6  # one shape: rate 1
    assert any("1 earlier run(s) of the job before Slurm requeued it add" in e.message
               for _, e in store.events(chain) if e.idx == 0), [e.message for _, e in store.events(chain)]


def test_no_requeue_a_node_failure_after_training_is_retried_as_a_new_job(slurm_cluster, tmp_path):
    """With --no-requeue Slurm ends a segment whose node fails (NODE_FAIL) instead of requeueing it: the
    watcher retries it as a new job, and spends a retry because it trained. The node "fails" as a frozen
    node does: its slurmd is stopped (SIGSTOP, pid file under the test cluster's folder) and the node set
    DOWN, so Slurm gives the job up while nothing on the node can react (no outcome is written)."""
    home, work = tmp_path / "home", tmp_path / "w"
    chain = h.submit(home, work, "nodefail", "--total", "60s", "--signal", "USR2@40", "--policy", "reactive",
                     "--retries", "1", "--", "--no-requeue", env={"TOY_STEP_SECONDS": "0.5"})
    store = Store(home / "state.sqlite")
    s0 = store.segments(chain)[0]
    steps_log = Path(store.chain(chain).checkpoint_dir) / "steps.log"
    slurmd_pid, node = None, ""
    try:
        _until("segment 0 to train 4 steps", lambda: _trained(steps_log) >= 4, home=home)
        node = subprocess.run(["squeue", "-h", "-j", s0.job_id, "-o", "%N"], capture_output=True,
                              text=True).stdout.strip()
        assert node in ("n1", "n2", "n3", "n4"), node
        slurmd_pid = int((Path(os.environ["SLURM_CONF"]).parents[1] / "slurmd" / f"{node}.pid").read_text())
        os.kill(slurmd_pid, signal.SIGSTOP)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=chainrun-node-fail-test"],
                       check=True, capture_output=True)
        _until("segment 0 to end", lambda: Store(home / "state.sqlite").segments(chain)[0].phase == "ENDED", home=home)
        _until("its retry to be submitted", lambda: len(Store(home / "state.sqlite").segments(chain)) == 2, home=home)
    finally:
        h.cli("cancel", chain, home=home)
        if slurmd_pid:
            os.kill(slurmd_pid, signal.SIGCONT)
        for pid in _job_pids(s0.job_id):  # what the frozen node left running (it may end meanwhile)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if node:
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
    store = Store(home / "state.sqlite")
    segs, c = store.segments(chain), store.chain(chain)
    assert segs[0].slurm_state == "NODE_FAIL" and segs[0].outcome == "crash", segs[0].reason
    assert segs[0].reason.startswith("lost its node (NODE_FAIL) after ") and segs[0].credit_s > 0
    assert len(segs) == 2 and segs[1].job_id != s0.job_id  # retried as a new job
    messages = [e.message for _, e in store.events(chain)]
    assert any("failed (lost its node (NODE_FAIL) after" in m and "retrying (0 retries left after this)" in m
               for m in messages)  # it trained: one retry spent
