"""A pending segment's reason in words, from what the real cluster says about its nodes and reservations.

Slurm says "ReqNodeNotAvail, Reserved for maintenance" (or its catch-all "Nodes required for job are DOWN,
DRAINED or reserved ...") whatever the cause; the watcher names the cause and suggests --exclude only
where another node is left.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slurm

TOY = REPO / "templates" / "toy_train.sh"


def _scontrol(*args: str) -> None:
    p = subprocess.run(["scontrol", *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _pending_warning(home, chain: str) -> str:
    from chainrun.state.store import Store

    deadline = time.time() + 120
    while time.time() < deadline:  # squeue says "None" until the scheduler has looked at a new job
        p = run_cli("watch", "--once", "--plain", home=home, timeout=300)
        assert p.returncode == 0, p.stderr
        store = Store(home / "state.sqlite")
        try:
            said = [e.message for _, e in store.events(chain) if e.kind == "warning" and "is pending" in e.message]
        finally:
            store.close()
        if said:
            return said[0]
        time.sleep(3)
    raise AssertionError("no pending warning in 2 minutes")


@pytest.mark.parametrize("where,nodelist,expect,hint", [
    ("ALL", [], "maintenance h3-every holds every node it may use until", "nothing to change"),
    ("n3", ["--nodelist=n3"], "maintenance h3-n3 holds n3 until", "drop --nodelist"),
])
def test_a_maintenance_window_is_named_and_exclude_only_suggested_where_it_helps(
        slurm_cluster, tmp_path, where, nodelist, expect, hint):
    name = "h3-every" if where == "ALL" else "h3-n3"
    _scontrol("create", "reservation", f"reservationname={name}", "starttime=now", "duration=10",
              f"nodes={where}", "flags=maint", "users=root")
    try:
        home = tmp_path / "home"
        p = run_cli("submit", str(TOY), "--total", "3m", "--policy", "reactive", "--signal", "USR2@50", "--json", "--",
                    *nodelist,
                    home=home, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        chain = json.loads(p.stdout)["data"]["chain"]
        said = _pending_warning(home, chain)
        assert expect in said and hint in said, said
        assert "--exclude" not in said and "DOWN, DRAINED" not in said, said
        run_cli("cancel", chain, home=home)
    finally:
        _scontrol("delete", f"reservationname={name}")
