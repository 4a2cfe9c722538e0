"""chainrun's own Slurm reads and cancels, whatever the user's environment and whatever scancel says.

A user's profile may set SQUEUE_STATES, SQUEUE_FORMAT, ... for their own squeue: chainrun's reads
remove them (locally and over SSH) and keep SLURM_CONF and SBATCH_*; stdout is parsed, a warning
on stderr changes nothing. A failed scancel is retried, and a job it did not stop is never
recorded as cancelled.
"""

from __future__ import annotations

import os
import shlex
import stat
import time

import pytest

from chainrun.chain.cancel import cancel_chain
from chainrun.chain.engine import Engine
from chainrun.chain.segments import submit_segment
from chainrun.runner.base import RunResult
from chainrun.runner.local import LocalRunner
from chainrun.runner.ssh import command_line
from chainrun.slurm.client import UNSET_FOR_READS, SlurmClient, cancel_failures
from chainrun.state.records import ACTIVE, CANCELLED, COMPLETED, ENDED, PENDING, RUNNING, Segment
from chainrun.state.store import Store
from tests.reliability.fakeslurm import SQ_HEAD, FakeSlurm
from tests.reliability.test_engine_faults import make_chain


def test_local_runner_removes_a_variable_given_as_none(monkeypatch):
    monkeypatch.setenv("SQUEUE_STATES", "PD")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm-test.conf")
    res = LocalRunner().run(["env"], 30, env={"SQUEUE_STATES": None, "SLURM_TIME_FORMAT": "%s"})
    lines = set(res.stdout.splitlines())
    assert "SLURM_TIME_FORMAT=%s" in lines and "SLURM_CONF=/etc/slurm-test.conf" in lines
    assert not any(line.startswith("SQUEUE_STATES=") for line in lines)


def test_over_ssh_the_variables_are_removed_with_env_u():
    line = command_line(["squeue", "--me"], {"SQUEUE_STATES": None, "SLURM_TIME_FORMAT": "%s"})
    assert shlex.split(line) == ["env", "-u", "SQUEUE_STATES", "SLURM_TIME_FORMAT=%s", "squeue", "--me"]
    inner = shlex.split(command_line(["sacct"], {"SACCT_FORMAT": None}, login_shell=True))[2]
    assert shlex.split(inner) == ["env", "-u", "SACCT_FORMAT", "sacct"]  # after the profile ran


def _fake_squeue(tmp_path) -> str:
    """A squeue that behaves like the real one under a user's profile: it honours SQUEUE_STATES and
    SQUEUE_FORMAT, and prints a site warning on stderr before its answer."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "squeue"
    row = "7|me|RUNNING|None|1000|1010|1130|2:00|0:10|short|normal|1|1|N/A|(null)|(null)|n1|cr.t-0001.0"
    script.write_text(f"""#!/bin/sh
echo "squeue: warning: site wrapper: config mismatch" >&2
[ -n "$SQUEUE_FORMAT" ] && {{ echo "JOBID"; echo 7; exit 0; }}
[ "$SQUEUE_STATES" = "PD" ] && {{ echo '{SQ_HEAD.replace("COMMENT|NAME", "COMMENT|NODELIST|NAME")}'; exit 0; }}
echo '{SQ_HEAD.replace("COMMENT|NAME", "COMMENT|NODELIST|NAME")}'
echo '{row}'
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(bindir)


def test_squeue_read_ignores_the_users_squeue_variables_and_stderr(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _fake_squeue(tmp_path) + os.pathsep + os.environ["PATH"])
    for k in UNSET_FOR_READS:
        monkeypatch.setenv(k, "PD" if k == "SQUEUE_STATES" else "%i")
    rows = SlurmClient(LocalRunner()).queue()
    assert [(r.job_id, r.state, r.name) for r in rows] == [("7", "RUNNING", "cr.t-0001.0")]


# ------------------------------------------------------------------ scancel
def test_cancel_failures_are_read_per_job():
    res = RunResult(("scancel", "7", "8", "9"), 1, "",
                    "scancel: error: Kill job error on job id 7: Access/permission denied\n"
                    "scancel: error: Kill job error on job id 8: Invalid job id specified\n"
                    "scancel: error: Kill job error on job id 9: Job/step already completing or completed\n", 0.1)
    assert cancel_failures(["7", "8", "9"], res) == {"7": "scancel: error: Kill job error on job id 7: "
                                                           "Access/permission denied"}
    down = RunResult(("scancel", "7", "8"), 1, "", "scancel: error: Unable to contact slurm controller", 0.1)
    assert set(cancel_failures(["7", "8"], down)) == {"7", "8"}  # no job named: none of them is known stopped
    assert set(cancel_failures(["7"], RunResult(("scancel", "7"), -1, "", "", 60.0, timed_out=True))) == {"7"}


class _Flaky(FakeSlurm):
    """A FakeSlurm whose scancel fails for the given jobs (``deny``) or a number of times (``down``)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.deny: set[str] = set()
        self.down = 0

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        argv = tuple(str(a) for a in argv)
        if argv[0] == "scancel" and not any(a.startswith("--signal") for a in argv):
            if self.down:
                self.down -= 1
                self.calls.append(argv)
                return RunResult(argv, 1, "", "scancel: error: Socket timed out on send/recv operation", 0.0)
            denied = [a for a in argv[1:] if a in self.deny]
            if denied:
                res = super().run(tuple(a for a in argv if a not in self.deny), timeout, env=env, stdin=stdin)
                err = "".join(f"scancel: error: Kill job error on job id {j}: Access/permission denied\n"
                              for j in denied)
                return RunResult(argv, 1, res.stdout, err, 0.0)
        return super().run(argv, timeout, env=env, stdin=stdin)


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch):
    monkeypatch.setattr("chainrun.slurm.client.CANCEL_PAUSE_S", 0.0)


def _world(tmp_path):
    fake = _Flaky(now=time.time())
    store = Store(tmp_path / "state.db")
    slurm = SlurmClient(fake)
    eng = Engine(store, slurm, fake, clock=lambda: fake.now, user="root")
    c = make_chain(store)
    submit_segment(store, slurm, c, Segment(chain_id=c.id, idx=0, time_limit_s=120))
    return fake, store, slurm, eng, c


def test_a_transient_scancel_failure_is_retried(tmp_path):
    fake, store, slurm, eng, c = _world(tmp_path)
    fake.down = 2
    (job,) = fake.jobs.values()
    assert slurm.cancel([job.id], pause_s=0) == {}
    assert fake.count("scancel") == 3 and job.state == "CANCELLED"


def test_a_job_scancel_did_not_stop_stays_live_and_is_asked_again(tmp_path):
    fake, store, slurm, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    fake.start(job.id)
    eng.tick()
    fake.deny = {job.id}
    try:
        cancel_chain(store, SlurmClient(fake), store.chain(c.id))
    except Exception as e:  # the user is told; the record says what is true
        assert "did not cancel job(s) " + job.id in str(e)
    else:
        raise AssertionError("a cancel Slurm refused was reported as done")
    (seg,) = store.segments(c.id)
    assert store.chain(c.id).status == CANCELLED and seg.phase == RUNNING and "permission denied" in seg.extra["cancel_failed"]
    assert job.state == "RUNNING"
    eng.tick()  # the watcher asks again; still refused: still live
    assert store.segments(c.id)[0].phase == RUNNING
    fake.deny = set()
    eng.tick()
    (seg,) = store.segments(c.id)
    assert seg.phase == ENDED and seg.slurm_state == "CANCELLED" and job.state == "CANCELLED"
    assert not store.chain(c.id).extra.get("cancel_pending")
    eng.tick()
    assert fake.count("scancel") == 7  # 3 tries by cancel, 3 by the next tick, 1 that worked; none after


def test_a_finished_chain_retries_the_scancel_of_its_queued_successor(tmp_path):
    fake, store, slurm, eng, c = _world(tmp_path)
    (job,) = fake.jobs.values()
    fake.start(job.id)
    eng.tick()
    nxt = Segment(chain_id=c.id, idx=1, time_limit_s=120)
    submit_segment(store, slurm, store.chain(c.id), nxt)
    fake.deny = {nxt.job_id}
    fake.files[f"{c.run_dir}/control/seg-0.outcome"] = f"outcome=done\njob={job.id}\n"
    fake.now += 30
    fake.finish(job.id, "COMPLETED")
    eng.tick()
    assert store.chain(c.id).status == COMPLETED
    seg1 = store.segments(c.id)[1]
    assert seg1.phase == PENDING and seg1.extra.get("cancel_failed") and fake.jobs[nxt.job_id].state == "PENDING"
    fake.deny = set()
    eng.tick()
    seg1 = store.segments(c.id)[1]
    assert seg1.phase == ENDED and fake.jobs[nxt.job_id].state == "CANCELLED"
    assert store.chain(c.id).status == COMPLETED and store.chain(c.id).status != ACTIVE
