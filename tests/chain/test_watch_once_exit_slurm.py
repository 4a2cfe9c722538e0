"""`chainrun watch --once` (what cron runs) exits non-zero when no cluster's tick worked, so cron shows
the failure; one cluster failing among others that worked stays 0 with a warning (docs/exit-codes.md).

Real commands throughout: the local cluster is pointed at a slurm.conf whose controller port is closed
(squeue then says "Unable to contact slurm controller"), a remote cluster at an SSH port nobody listens
on. The chain on the local cluster is a real one, submitted while Slurm answered.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slurm
TOY = REPO / "templates" / "toy_train.sh"
REAL_CONF = Path("/etc/slurm/slurm.conf")


@pytest.fixture
def dead_controller(tmp_path) -> dict:
    """SLURM_CONF for the test cluster with its controller on a port nobody listens on."""
    src = Path(os.environ.get("SLURM_CONF") or REAL_CONF).resolve()
    etc = tmp_path / "dead-etc"
    etc.mkdir()
    for f in src.parent.glob("*.conf"):
        (etc / f.name).write_text(f.read_text())
    conf = etc / "slurm.conf"
    text, n = re.subn(r"(?m)^SlurmctldPort=\d+", f"SlurmctldPort={_closed_port()}", conf.read_text())
    assert n == 1, "the test cluster's slurm.conf names its controller port"
    conf.write_text(text)
    return {"SLURM_CONF": str(conf), "COLUMNS": "400"}  # warnings on one line each


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: nothing listens there


def _submit(home: Path, work: Path) -> str:
    work.mkdir()
    p = run_cli("submit", str(TOY), "--total", "2m", "--signal", "USR2@30", "--policy", "reactive", "--json",
                home=home, cwd=work)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["data"]["chain"]


def _unreachable_cluster(home: Path) -> str:
    """A remote cluster on a closed SSH port, with an active chain recorded on it (none could be
    submitted there: the record is what the tick reads)."""
    from chainrun import paths
    from chainrun.state.records import Chain
    from chainrun.state.store import Store

    p = run_cli("cluster", "add", "far", "--host", "127.0.0.1", "--port", str(_closed_port()), "--user", "nobody",
                "--no-check", home=home)
    assert p.returncode == 0, p.stderr
    store = Store(paths.state_db())
    try:
        store.add_chain(Chain(id="far-00000001", name="far", cluster="far", script="/s", workdir="/w",
                              run_dir="/w/chainrun-runs/far-00000001", checkpoint_dir="/c", total_s=600,
                              segment_s=120, policy="reactive", lead_s=60, signal="USR2", signal_lead_s=30,
                              retries=1, sbatch_args=[], partition="short", created=time.time()))
    finally:
        store.close()
    return "far-00000001"


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("chainrun: error:")]


def test_slurm_not_answering_exits_5_with_one_line(slurm_cluster, chainrun_home, tmp_path, dead_controller):
    chain = _submit(chainrun_home, tmp_path / "work")
    try:
        w = run_cli("watch", "--once", "--plain", home=chainrun_home, env=dead_controller, timeout=180)
        assert w.returncode == 5, (w.stdout, w.stderr)
        assert re.search(r"warning: Slurm did not answer \(squeue failed: .*Unable to contact slurm controller",
                         w.stderr), w.stderr  # the tick's own warning, as before
        # ...said once: the log handler's copy (`chainrun: WARNING: tick skipped: ...`) goes to the log file only
        assert "tick skipped" not in w.stderr and w.stderr.count("Unable to contact slurm controller") == 1, w.stderr
        assert _error_lines(w.stderr) == ["chainrun: error: the tick failed on the only cluster with chains (local: "
                                          "Slurm did not answer); nothing changed, the next tick tries again"]
        j = run_cli("watch", "--once", "--json", home=chainrun_home, env=dead_controller, timeout=180)
        assert j.returncode == 5 and json.loads(j.stdout)["data"]["failed"] is True
        ok = run_cli("watch", "--once", "--plain", home=chainrun_home)  # Slurm answers again: 0
        assert ok.returncode == 0, ok.stderr
    finally:
        run_cli("cancel", chain, home=chainrun_home)


def test_an_unreachable_remote_cluster_exits_8(slurm_cluster, chainrun_home):
    _unreachable_cluster(chainrun_home)
    w = run_cli("watch", "--once", "--plain", home=chainrun_home, env={"COLUMNS": "400"}, timeout=180)
    assert w.returncode == 8, (w.stdout, w.stderr)
    assert _error_lines(w.stderr) == ["chainrun: error: the tick failed on the only cluster with chains (far: cannot "
                                      "be reached); nothing changed, the next tick tries again"]
    assert "warning: far: cannot connect to far" in w.stderr  # the tick's warning has the details


def test_every_cluster_failing_exits_non_zero(slurm_cluster, chainrun_home, tmp_path, dead_controller):
    chain = _submit(chainrun_home, tmp_path / "work")
    _unreachable_cluster(chainrun_home)
    try:
        w = run_cli("watch", "--once", "--plain", home=chainrun_home, env=dead_controller, timeout=180)
        assert w.returncode == 8, (w.stdout, w.stderr)  # the first cluster by name: far
        assert _error_lines(w.stderr) == ["chainrun: error: the tick failed on every cluster (far: cannot be reached; "
                                          "local: Slurm did not answer); nothing changed, the next tick tries again"]
    finally:
        run_cli("cancel", chain, home=chainrun_home)


def test_one_cluster_failing_among_working_ones_stays_0(slurm_cluster, chainrun_home, tmp_path):
    chain = _submit(chainrun_home, tmp_path / "work")
    _unreachable_cluster(chainrun_home)
    try:
        w = run_cli("watch", "--once", "--plain", home=chainrun_home, timeout=180)
        assert w.returncode == 0, (w.stdout, w.stderr)
        assert "warning: far: " in w.stderr and not _error_lines(w.stderr)
        st = json.loads(run_cli("status", chain, "--json", home=chainrun_home).stdout)["data"][0]
        assert st["status"] == "ACTIVE"
    finally:
        run_cli("cancel", chain, home=chainrun_home)


def test_a_held_lease_still_exits_0(slurm_cluster, chainrun_home, tmp_path, dead_controller):
    """Another watcher acts: `--once` skips its tick and exits 0 (documented), Slurm answering or not."""
    chain = _submit(chainrun_home, tmp_path / "work")
    watcher = subprocess.Popen([sys.executable, "-m", "chainrun.cli.main", "watch", "--plain", "--interval", "5"],
                               env={**os.environ, "CHAINRUN_HOME": str(chainrun_home)}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        w = None
        while time.time() < deadline:
            w = run_cli("watch", "--once", "--plain", home=chainrun_home, env=dead_controller, timeout=180)
            if "skipped: held by" in w.stdout:
                break
            time.sleep(1)
        assert w is not None and "skipped: held by" in w.stdout and w.returncode == 0, (w.stdout, w.stderr)
    finally:
        watcher.terminate()
        watcher.wait(timeout=30)
        run_cli("cancel", chain, home=chainrun_home)
