"""A segment whose node does not see the run folder, on the real cluster.

The test nodes share one host, so "not visible on the node" is made by moving the run folder away
while a held segment is released, and back once it has ended: Slurm cannot create the segment's
output file (<run folder>/logs), the batch script never runs, and sacct says FAILED 0:53; nothing
trains. The watcher (`chainrun watch --once`) names the node and what to fix, keeps that node out of
the next segment, and fails the chain after the second such segment.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from chainrun.state.store import Store
from tests.reliability import harness as h

pytestmark = pytest.mark.slurm


def _sacct(job: str) -> dict:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "State,ExitCode,NodeList"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    state, code, nodes = (out[0].split("|") + ["", "", ""])[:3] if out else ("", "", "")
    return {"state": state.split()[0] if state else "", "exit": code, "node": nodes}


def _blind_segment(run_dir: Path, job: str) -> dict:
    """Release the held ``job`` while its run folder is away; put the folder back once it has ended."""
    away = run_dir.with_name(run_dir.name + ".away")
    run_dir.rename(away)
    try:
        subprocess.run(["scontrol", "release", job], check=True, capture_output=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            got = _sacct(job)
            if got["state"] not in ("", "PENDING", "RUNNING", "COMPLETING") and got["node"] not in ("", "None assigned"):
                return got
            time.sleep(2)
        raise AssertionError(f"job {job} did not end: {_sacct(job)}")
    finally:
        away.rename(run_dir)


def _tick(home: Path) -> None:
    p = h.cli("watch", "--once", "--plain", home=home, timeout=300)
    assert p.returncode == 0, p.stderr


def test_blind_nodes_are_named_excluded_and_fail_the_chain(slurm_cluster, tmp_path):
    home, work = tmp_path / "home", tmp_path / "w"
    work.mkdir()
    # --hold: every segment waits until the test has moved the run folder away and releases it
    p = h.cli("submit", str(h.TOY), "--name", "blind", "--json", "--total", "5m", "--signal", "USR2@30",
              "--policy", "reactive", "--", "--hold", home=home, cwd=work)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    chain, run_dir = data["chain"], Path(data["run_dir"])
    try:
        first = _blind_segment(run_dir, data["first_job"])
        assert (first["state"], first["exit"]) == ("FAILED", "0:53")  # the script never ran
        _tick(home)
        store = Store(home / "state.sqlite")
        assert not any("names another job" in e.message for _, e in store.events(chain))
        s0, s1 = store.segments(chain)
        assert s0.outcome == "no-run-folder" and s0.credit_s == 0
        assert s0.reason.startswith(f"the run folder {run_dir} is not visible on node {first['node']}: "
                                    "put it on a shared filesystem")
        assert f"--exclude={first['node']}" in s1.extra["request"]  # the next segment is kept off that node
        assert not (run_dir / "checkpoint").exists() or not any((run_dir / "checkpoint").iterdir())  # trained nothing
        out = subprocess.run(["scontrol", "show", "job", s1.job_id], capture_output=True, text=True).stdout
        assert f"ExcNodeList={first['node']}" in out  # what Slurm itself holds for it
        second = _blind_segment(run_dir, s1.job_id)
        assert second["node"] != first["node"]
        _tick(home)
        c = Store(home / "state.sqlite").chain(chain)
        assert c.status == "FAILED", c.reason
        assert (f"2 segments could not see the run folder {run_dir} (node(s) "
                f"{', '.join(sorted([first['node'], second['node']]))})") in c.reason
        st = h.cli("status", chain, "--plain", home=home).stdout
        assert "not visible on node" in st or "could not see the run folder" in st
    finally:
        h.cli("cancel", chain, home=home)
        shutil.rmtree(run_dir.with_name(run_dir.name + ".away"), ignore_errors=True)


@pytest.mark.skipif("control/token" not in __import__("chainrun.chain.contract", fromlist=["x"]).wrapper_template(),
                    reason="needs the wrapper that checks control/token (issue 23, wrapper side)")
def test_a_segment_whose_token_vanished_trains_nothing_and_its_node_is_excluded(slurm_cluster, tmp_path):
    """The run folder is there but not the one chainrun made (its control/token is away while the segment
    starts): the wrapper trains nothing and exits 86; the watcher names the node and excludes it."""
    home, work = tmp_path / "home", tmp_path / "w"
    work.mkdir()
    p = h.cli("submit", str(h.TOY), "--name", "notoken", "--json", "--total", "5m", "--signal", "USR2@30",
              "--policy", "reactive", "--", "--hold", home=home, cwd=work)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)["data"]
    chain, run_dir = data["chain"], Path(data["run_dir"])
    token = run_dir / "control" / "token"
    try:
        token.rename(token.with_name("token.away"))
        try:
            subprocess.run(["scontrol", "release", data["first_job"]], check=True, capture_output=True)
            deadline = time.monotonic() + 180
            while _sacct(data["first_job"])["state"] in ("", "PENDING", "RUNNING", "COMPLETING"):
                assert time.monotonic() < deadline, _sacct(data["first_job"])
                time.sleep(2)
        finally:
            token.with_name("token.away").rename(token)
        got = _sacct(data["first_job"])
        assert got["exit"] == "86:0", got
        _tick(home)
        store = Store(home / "state.sqlite")
        s0, s1 = store.segments(chain)
        assert s0.outcome == "no-run-folder" and s0.credit_s == 0
        assert s0.reason.startswith(f"the run folder {run_dir} is not visible on node {got['node']}")
        assert f"--exclude={got['node']}" in s1.extra["request"]
        steps = run_dir / "checkpoint" / "steps.log"
        assert not steps.exists()  # nothing trained
    finally:
        h.cli("cancel", chain, home=home)
