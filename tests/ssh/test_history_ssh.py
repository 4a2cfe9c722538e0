"""The model's sacct history through the real OpenSSH server and the real Slurm test cluster.

The remote account (``chainrun``) is not this process's (root): the history must be the
cluster's view (its user, its root-ness), and its window must not depend on any time zone.
One tiny job on the ``short`` partition per transport (paramiko, and the system ssh over a
ControlMaster); well under a minute each unless the cluster is busy.
"""

from __future__ import annotations

import time
import uuid

import pytest

from chainrun.predict import ingest
from chainrun.runner.local import LocalRunner
from chainrun.slurm.client import SlurmClient
from chainrun.slurm.parsers import parse_sacct

from tests.ssh.test_runner import make_runner  # noqa: F401 (a fixture: both transports)
from tests.ssh.conftest import REMOTE_USER

pytestmark = [pytest.mark.slurm, pytest.mark.ssh]


@pytest.fixture
def far_east_zone(monkeypatch):
    """This process (and the sacct it runs locally) 14 h ahead of UTC: a wall-clock -S/-E read
    in the wrong zone would miss the last 14 hours."""
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_history_over_ssh_is_the_clusters_view(ssh_server, slurm_cluster, far_east_zone, make_runner):
    r = make_runner(ssh_server, ssh_server.known_hosts)
    try:
        name = f"crhist-{uuid.uuid4().hex[:8]}"
        client = SlurmClient(r, timeout=60)
        sub = r.run(["sbatch", "--parsable", "-p", "short", "-t", "1", "-J", name, "-o", "/dev/null",
                     "--wrap", "true"], 60)
        assert sub.ok, sub.stderr
        job = sub.stdout.strip().split(";")[0]
        since = time.time() - 600
        deadline = time.time() + 300  # the cluster is shared: queueing is allowed for
        while time.time() < deadline:
            rows = client.accounting([job], since=since)
            if rows and rows[0].end is not None:
                break
            time.sleep(3)
        else:
            pytest.fail(f"job {job} did not end within 5 minutes")

        # a windowed sacct (-S/-E) lists a job some seconds after `sacct -j` shows it ended
        # (seen on the test cluster with absolute bounds too): poll, bounded
        for _ in range(30):
            now = time.time()
            hist = ingest.fetch_history(r, since=since, now=now)
            mine = hist.frame[hist.frame["job_id"] == job]
            if len(mine):
                break
            time.sleep(2)
        assert len(mine) == 1 and mine["user"].item() == REMOTE_USER and mine["name"].item() == name
        assert mine["state"].item() == "COMPLETED" and since - 60 <= mine["submit"].item() <= now + 60
        # root here, not there: the root-ness that decides whether -a can be trusted is the cluster's
        assert not client.is_privileged()

        # our own jobs only: sacct's default user is whoever runs it on the cluster, not this process's
        own = r.run(ingest.sacct_argv(since, now, all_users=False, now=now), 60, env=ingest._ENV)
        assert own.ok, own.stderr
        frame = ingest.parse_sacct_rows(own.stdout)
        assert job in set(frame["job_id"]) and set(frame["user"]) == {REMOTE_USER}
        # the watcher's row parser reads the same remote text the same way
        row = {a.job_id: a for a in parse_sacct(own.stdout)}[job]
        assert (row.user, row.name, row.submit, row.start, row.end) == (
            REMOTE_USER, name, mine["submit"].item(), mine["start"].item(), mine["end"].item())
    finally:
        r.close()

    # the same window from this machine, whose zone is 14 h off: the job is still in it
    local = ingest.fetch_history(LocalRunner(), since=since, now=time.time())
    assert job in set(local.frame["job_id"])


def test_model_status_of_a_remote_cluster_answers_for_the_remote_user(ssh_home, slurm_cluster):
    """`model status --cluster lo` says which model answers for *you*: on lo you are its login user
    (chainrun), not this process's user (root), as `predict` and the watcher already take it."""
    import json

    from tests.conftest import run_cli

    p = run_cli("model", "refresh", "--cluster", "lo", "--no-tune", "--json", home=ssh_home, timeout=300)
    assert p.returncode == 0, p.stderr
    s = run_cli("model", "status", "--cluster", "lo", "--json", home=ssh_home)
    assert s.returncode == 0, s.stderr
    m = json.loads(s.stdout)["data"]["model"]
    assert m["user"] == REMOTE_USER, m["user"]
    assert m["answers_for_you"] == (f"user:{REMOTE_USER}" if REMOTE_USER in m["user_models"] else "cluster")
