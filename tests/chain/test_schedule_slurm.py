"""Scheduled ticks on the real Slurm: a chain completes with scrontab ticking and no watcher running.

The test cluster enables scrontab (scripts/start-cluster.sh: ``ScronParameters=enable``, and a
``scrontab`` built from Debian's source). The user's own scrontab entry, seeded first, must come out
untouched. The payload records its ``SLURM_*`` environment: a tick job's allocation (one CPU,
``--cpus-per-task=1``) must not reach the segments it submits (sbatch exports the caller's
environment, and ``SLURM_CPUS_PER_TASK`` is not one a job without ``-c`` gets set anew).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from chainrun.schedule import TICK_JOB_NAME, begin_marker, tick_name
from chainrun.state.store import Store
from tests.chain.test_chain_slurm import SIGNAL, TOY, Scenario, assert_continuous_and_exclusive
from tests.conftest import run_cli

pytestmark = pytest.mark.slurm

EVERY_S = 60  # the shortest period scrontab has
SEED = "#SCRON --job-name=seed.user --partition=long --time=1\n17 3 * * * /bin/true  # the user's own\n"


def scrontab(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["scrontab", *args], input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture
def seeded_scrontab(slurm_cluster):
    """The user's scrontab holds an entry of their own for the test; whatever was there is put back."""
    before = scrontab("-l")
    assert before.returncode == 0 or "no crontab for" in before.stdout, before.stderr
    assert scrontab("-", stdin=SEED).returncode == 0
    try:
        yield SEED
    finally:
        if before.returncode == 0:
            scrontab("-", stdin=before.stdout)
        else:
            scrontab("-r")


def wait_for(cond, timeout: float, what: str, every: float = 5.0):
    """Poll ``cond`` (a `chainrun status` subprocess each time: not 10 times a second)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def payload(tmp: Path) -> Path:
    """The toy trainer, after writing the job's SLURM_* variables where the checks below read them."""
    script = tmp / "train_env.sh"
    script.write_text("#!/bin/bash\n#SBATCH --mem=100M\n"
                      'env | grep "^SLURM_" | sort > "$CHAINRUN_CHECKPOINT_DIR/env.$SLURM_JOB_ID"\n'
                      f"exec python3 {TOY.parent / 'toy_trainer.py'}\n")
    return script


def test_scrontab_ticks_complete_a_chain_without_a_watcher(seeded_scrontab, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    p = run_cli("watch", "--install-schedule", "--every", "1m", "--via", "scrontab", "--json", home=home)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)["data"]
    assert got["via"] == "scrontab" and got["changed"] and got["every_s"] == EVERY_S
    table = scrontab("-l").stdout
    assert table.startswith(SEED) and begin_marker(tick_name(home)) in table and f"--job-name={TICK_JOB_NAME}" in table
    again = run_cli("watch", "--install-schedule", "--every", "1m", "--via", "scrontab", "--json", home=home)
    assert again.returncode == 0 and not json.loads(again.stdout)["data"]["changed"]
    assert scrontab("-l").stdout == table  # repeating is safe

    # a lead chain whose successor starts early and must hand off (tests/chain/test_chain_slurm.py "handoff"):
    # 3-minute segments on `long` train 100-130 s to the hand-over point (the signal 50-80 s before the
    # limit): two are needed for 150 s. With a lead of 120 s any tick after segment 0 starts submits
    # segment 1, and a 1-minute schedule gives at least one such tick even when a tick job queues a while
    t0 = time.time()
    p = run_cli("submit", str(payload(tmp_path)), "--name", "sched", "--signal", SIGNAL, "--total", "150s",
                "--segment", "3m", "--policy", "lead", "--lead", "120s", "--json", "--", "--partition=long",
                "--nodelist=n3", "--export=ALL,CHAINRUN_ADAPTIVE_HANDOFF=0", home=home, cwd=work)
    assert p.returncode == 0, p.stderr
    chain = json.loads(p.stdout)["data"]["chain"]

    def state() -> dict:
        st = run_cli("status", chain, "--json", home=home)
        assert st.returncode == 0, st.stderr
        return json.loads(st.stdout)["data"][0]

    try:
        # no watcher runs: only the scrontab ticks move the chain
        wait_for(lambda: state()["status"] != "ACTIVE", 900, "the chain to end with scrontab ticks alone")
        took = time.time() - t0
        view = state()
        assert view["status"] == "COMPLETED", view
        segs = view["segments_detail"]
        assert len(segs) >= 2, segs
        # hand-offs included: the trainer's own record shows no two jobs training at once and no step lost
        assert_continuous_and_exclusive(Scenario("sched", [], {}, chain, view))
        # its expected time: each segment within its 3-minute limit (+30 s: the controller checks limits
        # every 30 s), plus two tick periods, plus a minute for a loaded host
        assert took <= len(segs) * 210 + 2 * EVERY_S + 60, (took, segs)
        # the ticks were Slurm jobs named cr.tick, recorded in the store, and `status` says where they come from
        st = Store(home / "state.sqlite")
        try:
            last = json.loads(st.get_meta("schedule:last_tick"))
            kinds = [ev.kind for _, ev in st.events(chain)]
        finally:
            st.close()
        assert last["source"] == "scrontab" and last["job"], last
        assert "handoff" in kinds, kinds
        # a scrontab job runs again under its id each period: -D lists every run
        ticks = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "--name", TICK_JOB_NAME, "-S",
                                f"now-{int(took) + 60}seconds", "-o", "JobID,State,Elapsed"],
                               capture_output=True, text=True, check=True).stdout.split()
        runs = [t for t in ticks if t.split("|")[0] == last["job"]]
        assert len(runs) >= 2, ticks  # the last tick's job ran (at least) twice
        plain = run_cli("status", "--plain", home=home, env={"COLUMNS": "200"})
        assert "ticks: scrontab every 1m; last " in plain.stdout and "ticks are late" not in plain.stdout, plain.stdout
        # the segments a tick submitted did not inherit the tick job's allocation
        envs = sorted(Path(view["checkpoint_dir"]).glob("env.*"))
        assert len(envs) >= 2
        for f in envs:
            text = f.read_text()
            assert "SLURM_CPUS_PER_TASK=" not in text and f"={TICK_JOB_NAME}\n" not in text, (f.name, text)
    finally:
        p = run_cli("watch", "--uninstall-schedule", home=home)
        run_cli("cancel", chain, home=home)
    assert p.returncode == 0, p.stderr
    assert "removed from your scrontab" in p.stdout
    assert scrontab("-l").stdout == SEED  # the user's own entry, untouched
