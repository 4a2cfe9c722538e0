"""Several `chainrun watch` of one home on the real Slurm: exactly one acts, the others are views.

The watchers play two login nodes (``CHAINRUN_LEASE_HOST``): a lease of "another host" is judged by
its expiry alone, never by its pid, as on a real cluster. The acting lease is 12 s here
(``CHAINRUN_LEASE_S``; 120 s by default) so a take-over takes seconds, not minutes.
Which segment each watcher submitted is read from the store (every intent is stamped with the
acting watcher's host:pid and epoch) and from sacct (each job name once).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chainrun.state.lease import Record
from chainrun.state.store import Store
from tests.chain.test_chain_slurm import SIGNAL, TOY, Scenario, assert_continuous_and_exclusive
from tests.conftest import run_cli
from tests.test_lease import stopped, wait_for

pytestmark = pytest.mark.slurm

LEASE_S = "12"


class Watch:
    """A `chainrun watch --plain` process whose output lines are collected as they come."""

    def __init__(self, home: Path, host: str, *args: str) -> None:
        env = {**os.environ, "CHAINRUN_HOME": str(home), "CHAINRUN_LEASE_S": LEASE_S, "CHAINRUN_LEASE_HOST": host,
               "COLUMNS": "200"}
        self.host = host
        self.p = subprocess.Popen([sys.executable, "-m", "chainrun.cli.main", "watch", "--plain", "--interval", "2",
                                   *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  stdin=subprocess.DEVNULL)
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    @property
    def label(self) -> str:
        return f"{self.host}:{self.p.pid}"

    def said(self, text: str, after: float = 0.0) -> bool:
        return any(text in line and t >= after for t, line in self.lines)

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def stop(self) -> None:
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGCONT)
            self.p.terminate()
            self.p.wait(30)


def submit(home: Path, work: Path, name: str, *args: str) -> str:
    p = run_cli("submit", str(TOY), "--name", name, "--signal", SIGNAL, "--json", *args, home=home, cwd=work)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["data"]["chain"]


def job_ids(home: Path, chain: str) -> dict[int, str | None]:
    st = Store(home / "state.sqlite")
    try:
        return {s.idx: s.job_id for s in st.segments(chain)}
    finally:
        st.close()


def stamps(home: Path, chain: str) -> dict[int, str]:
    """Who decided each segment's submission (the CLI's first segment has no stamp)."""
    st = Store(home / "state.sqlite")
    try:
        return {s.idx: s.extra.get("acting", "") for s in st.segments(chain)}
    finally:
        st.close()


def job_names(home: Path, chain: str) -> list[str]:
    """The names of every job Slurm knows from segment 0's id on (by id: sacct's time window skips jobs
    that never became eligible, such as a dependent successor cancelled while it waited)."""
    first = int(job_ids(home, chain)[0])
    ids = ",".join(str(i) for i in range(first, first + 300))
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ids, "-o", "JobName"], capture_output=True,
                         text=True, check=True).stdout.split()
    return sorted(n for n in out if n.startswith(f"cr.{chain}."))


def test_two_watchers_at_once_one_acts_and_a_stopped_one_never_submits(slurm_cluster, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    # reactive: segment 1 is submitted only when segment 0 ends, long after the take-over below
    chain = submit(home, work, "lease", "--total", "2m", "--policy", "reactive", "--", "--nodelist=n4")
    a, b = Watch(home, "login1", "--until-done"), Watch(home, "login2", "--until-done")
    try:
        wait_for(lambda: sum(w.said("acting: ") for w in (a, b)) + sum(w.said("read-only: ") for w in (a, b)) == 2,
                 120, "both watchers to say their role")
        actor, view = (a, b) if a.said("acting: ") else (b, a)
        assert not view.said("acting: ") and actor.said(f"acting: this watch ({actor.label}, lease epoch 1)")
        assert view.said(f"read-only: {actor.label} (lease until"), view.output()
        # the actor reads segment 0's start, then sleeps between ticks: stop it there (a suspended laptop)
        wait_for(lambda: actor.said("started"), 180, "segment 0 to start")
        os.kill(actor.p.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(actor.p.pid), 30, "the actor to stop")
        stopped_at = time.time()
        wait_for(lambda: view.said("acting: ", after=stopped_at), 120, "the view to take over")
        took_over = time.time()
        assert took_over - stopped_at >= float(LEASE_S) - 6  # not before the stopped one's lease expired
        os.kill(actor.p.pid, signal.SIGCONT)
        wait_for(lambda: actor.said("read-only: lost the lease", after=took_over), 60, "the stale actor to find out")
        assert a.p.wait(600) == 0 and b.p.wait(120) == 0, (a.output(), b.output())
    finally:
        a.stop()
        b.stop()
    who = stamps(home, chain)
    assert len(who) >= 2 and who[0] == "", who
    # every segment after the first was decided by the watcher that took over, none by the stopped one
    assert all(v.startswith(f"{view.label} epoch ") for i, v in who.items() if i > 0), who
    names = job_names(home, chain)
    assert len(names) == len(set(names)) == len(who), names  # no segment submitted twice
    st = run_cli("status", chain, "--json", home=home)
    result = json.loads(st.stdout)["data"][0]
    assert result["status"] == "COMPLETED", result["reason"]
    assert_continuous_and_exclusive(Scenario("lease", [], {}, chain, result))


def test_a_lease_of_another_host_makes_a_view_and_once_skips(slurm_cluster, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    # dependency: the first acting tick pre-queues segment 1 at once
    chain = submit(home, work, "foreign", "--total", "3m", "--policy", "dependency", "--", "--nodelist=n3")
    theirs = Record("login9", 1, "", 5, time.time() + 25, "f0", "watch")
    (home / "state.sqlite.watch.lease").write_bytes(theirs.encode())
    once = run_cli("watch", "--once", home=home, env={"CHAINRUN_LEASE_S": LEASE_S})
    assert once.returncode == 0, once.stderr
    assert once.stdout.startswith("skipped: held by login9:1 until "), once.stdout
    w = Watch(home, "login1")
    try:
        wait_for(lambda: w.said("read-only: login9:1 (lease until"), 60, "the view line")
        wait_for(lambda: w.said("acting: "), 120, "the take-over after login9's lease expired")
        acted = time.time()
        assert acted >= theirs.expires  # never before login9's lease ran out
        wait_for(lambda: job_ids(home, chain).get(1), 120, "segment 1 to be submitted")
        # a short writer is not starved by the acting watcher: cancel goes through while it ticks
        t0 = time.time()
        c = run_cli("cancel", chain, home=home)
        assert c.returncode == 0, c.stderr
        cancel_s = time.time() - t0
    finally:
        w.stop()
    assert stamps(home, chain)[1].startswith(f"{w.label} epoch "), stamps(home, chain)
    assert cancel_s < 60, cancel_s
    wait_for(lambda: len(job_names(home, chain)) == 2, 30, "sacct to list both jobs")
