"""Segment 0's sbatch times out (real Slurm): the chain stays active and the watcher settles segment 0.

Two ways a timeout happens: sbatch created the job and its reply was lost, or it never got to create
it. The runner below runs the real sbatch (or not) and then reports a timeout, exactly as
runner/local.py reports one (RunResult.timed_out); slurm/client.py turns it into TransientSlurmError.
Before the fix the chain was marked FAILED at submit and never watched: the job Slurm did create ran
with no successor.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slurm
TOY = REPO / "templates" / "toy_train.sh"


class LostReply:
    """The real local runner, except the first ``sbatch --parsable``: run for real when ``create`` (Slurm
    makes the job) or not at all, then reported as timed out either way."""

    name = "local"

    def __init__(self, create: bool) -> None:
        from chainrun.runner.local import LocalRunner

        self._inner, self.create, self.armed, self.created = LocalRunner(), create, True, ""
        self.job_name = ""  # the job name sbatch was given (cr.<chain>.0): what the test cleans up

    def run(self, argv, timeout=60.0, *, env=None, stdin=None):
        from chainrun.runner.base import RunResult

        if self.armed and argv[0] == "sbatch" and "--parsable" in argv:
            self.armed = False
            self.job_name = next(a.split("=", 1)[1] for a in argv if a.startswith("--job-name="))
            if self.create:
                res = self._inner.run(argv, timeout, env=env, stdin=stdin)
                assert res.ok, res.stderr
                self.created = res.stdout.strip().split(";")[0]
            return RunResult(tuple(argv), -1, "", f"timed out after {timeout:.0f}s", timeout, timed_out=True)
        return self._inner.run(argv, timeout, env=env, stdin=stdin)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _submit(runner: LostReply, work: Path):
    from chainrun import paths
    from chainrun.chain.create import SubmitRequest, create_chain
    from chainrun.slurm.client import SlurmClient
    from chainrun.state.store import Store

    store = Store(paths.state_db())
    req = SubmitRequest(script=str(TOY), script_text=TOY.read_text(), total_s=120, workdir=str(work),
                        signal="USR2@30", policy="reactive")
    return store, create_chain(store, SlurmClient(runner), runner, req)


def _engine(store):
    from chainrun.chain.engine import Engine
    from chainrun.runner.local import LocalRunner
    from chainrun.slurm.client import SlurmClient

    return Engine(store, SlurmClient(LocalRunner()), LocalRunner(), user=getpass.getuser())


def _cleanup(home: Path, chain_id: str) -> None:
    """Cancel the chain, and its jobs by name too: a chain marked FAILED (before the fix) cancels nothing."""
    run_cli("cancel", chain_id, home=home)
    for i in (0, 1):
        subprocess.run(["scancel", "--name", f"cr.{chain_id}.{i}"], capture_output=True)


def _jobs_named(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True).stdout
    return out.split()


def test_a_lost_reply_is_adopted_by_the_next_tick(slurm_cluster, chainrun_home, tmp_path):
    from chainrun.state.records import ACTIVE, PENDING, RUNNING, SUBMITTING

    runner = LostReply(create=True)
    store = None
    try:
        store, res = _submit(runner, tmp_path)
        c = res.chain
        assert runner.created, "the wrapper must have run the real sbatch"
        assert _jobs_named(f"cr.{c.id}.0") == [runner.created]  # Slurm made the job
        assert store.chain(c.id).status == ACTIVE and res.unconfirmed and "adopt" in res.unconfirmed
        [s0] = store.segments(c.id)
        assert s0.phase == SUBMITTING and not s0.job_id
        assert any("sbatch did not answer for segment 0" in ev.message for _, ev in store.events(c.id))

        report = _engine(store).tick()
        assert not report.failed, report.warnings
        [s0] = store.segments(c.id)
        assert s0.job_id == runner.created and s0.phase in (PENDING, RUNNING)
        assert any(ev.kind == "adopted" for _, ev in store.events(c.id))
        assert store.chain(c.id).status == ACTIVE
        assert _jobs_named(f"cr.{c.id}.0") == [runner.created]  # adopted, not submitted twice
    finally:
        _cleanup(chainrun_home, runner.job_name.split(".")[1])
        if store is not None:
            store.close()


def test_a_job_never_created_is_submitted_again(slurm_cluster, chainrun_home, tmp_path, monkeypatch):
    from chainrun.chain import engine, reconcile
    from chainrun.state.records import ACTIVE, CANCELLED_OUT, ENDED, PENDING, RUNNING

    runner = LostReply(create=False)
    store = None
    try:
        store, res = _submit(runner, tmp_path)
        c = res.chain
        assert not _jobs_named(f"cr.{c.id}.0") and store.chain(c.id).status == ACTIVE
        eng = _engine(store)
        eng.tick()  # younger than ADOPT_AFTER_S: not in squeue, so it waits (sacct is not asked yet)
        assert [s.phase for s in store.segments(c.id)] == ["SUBMITTING"]
        monkeypatch.setattr(engine, "ADOPT_AFTER_S", 0)  # the 60 s wait for sacct to know a job
        report = eng.tick()
        assert not report.failed, report.warnings
        s0, s1 = store.segments(c.id)
        assert (s0.phase, s0.outcome, s0.reason) == (ENDED, CANCELLED_OUT, reconcile.UNCONFIRMED)
        assert s1.phase == PENDING and s1.job_id and s1.time_limit_s == c.segment_s  # a full first segment
        assert _jobs_named(f"cr.{c.id}.1") == [s1.job_id]
        ch = store.chain(c.id)
        assert ch.status == ACTIVE and ch.credited_s == 0  # nothing counted as trained
        deadline = time.time() + 90  # it really trains: the toy trainer's first steps in its log
        while time.time() < deadline:
            eng.tick()
            s1 = store.segments(c.id)[1]
            if s1.phase == RUNNING and list((Path(c.run_dir) / "logs").glob(f"cr.{c.id}.1-*.out")):
                break
            time.sleep(3)
        assert s1.phase == RUNNING, s1
        assert store.chain(c.id).status == ACTIVE
    finally:
        _cleanup(chainrun_home, runner.job_name.split(".")[1])
        if store is not None:
            store.close()


def test_submit_cli_exits_0_with_one_warning_and_watch_adopts(slurm_cluster, chainrun_home, tmp_path):
    """The real CLI with an sbatch whose job lands but whose reply says it timed out."""
    real = subprocess.run(["which", "sbatch"], capture_output=True, text=True).stdout.strip()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(f"""#!/bin/bash
if [ ! -e "{bindir}/done" ]; then
  touch "{bindir}/done"; {real} "$@" > "{bindir}/landed" || exit 3
  echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2; exit 1
fi
exec {real} "$@"
""")
    (bindir / "sbatch").chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    work = tmp_path / "work"
    work.mkdir()
    p = run_cli("submit", str(TOY), "--total", "2m", "--signal", "USR2@30", "--policy", "reactive", "--json",
                home=chainrun_home, cwd=work, env=env)
    chains = json.loads(run_cli("status", "--json", home=chainrun_home).stdout)["data"]
    try:
        assert p.returncode == 0, p.stderr
        data = json.loads(p.stdout)["data"]
        assert data["first_job"] is None and "the watcher will adopt the job" in data["unconfirmed"]
        warned = [ln for ln in p.stderr.splitlines() if "sbatch did not answer for segment 0" in ln]
        assert len(warned) == 1 and warned[0].startswith("chainrun: warning: ")
        landed = (bindir / "landed").read_text().strip().split(";")[0]
        plain = run_cli("status", data["chain"], "--json", home=chainrun_home)
        assert json.loads(plain.stdout)["data"][0]["status"] == "ACTIVE"
        w = run_cli("watch", "--once", "--plain", home=chainrun_home, env=env)
        assert w.returncode == 0, w.stderr
        assert f"found job {landed} for segment 0" in w.stdout
    finally:
        for ch in chains:
            _cleanup(chainrun_home, ch["id"])
