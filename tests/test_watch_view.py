"""`chainrun watch` while another watcher holds the home's acting lease: the live view and the plain
lines say which host:pid acts and until when, the engine is never ticked, and the lease is taken
over once it expired. Real store and lease files; the engine is a counter (Slurm is not needed:
the real-Slurm proof is tests/chain/test_watch_lease_slurm.py)."""

from __future__ import annotations

import io
import re
import time

from chainrun.chain.engine import TickReport
from chainrun.state.lease import ActingLease, Record
from chainrun.state.store import Store

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Counting:
    def __init__(self, store) -> None:
        self.store, self.ticks = store, 0

    def tick(self) -> TickReport:
        self.ticks += 1
        return TickReport()


def foreign(store: Store, expires: float) -> Record:
    rec = Record("login9", 1, "", 3, expires, "n9", "watch")
    store.lease_path("watch").write_bytes(rec.encode())
    return rec


def live(store, lease, engine) -> str:
    from rich.console import Console

    from chainrun.cli.live import live_watch

    con = Console(file=io.StringIO(), width=120, force_terminal=True)
    live_watch(engine, interval=5, until_done=False, console=con, sleep=lambda s: None, max_ticks=2, lease=lease)
    return ANSI.sub("", con.file.getvalue())


def test_live_view_is_read_only_while_another_host_acts_then_takes_over(tmp_path):
    store = Store(tmp_path / "state.sqlite")
    engine = Counting(store)
    foreign(store, time.time() + 600)
    out = live(store, ActingLease(store), engine)
    assert engine.ticks == 0
    assert "read-only: login9:1 (lease until" in out and "takes over if it stops" in out, out
    assert "last look" in out
    foreign(store, time.time() - 60)  # login9 stopped renewing a minute ago
    lease = ActingLease(store)
    out = live(store, lease, engine)
    assert engine.ticks == 2 and "acting: this watch" in out and "lease epoch 1" in out, out
    assert not store.lease_path("watch").exists()  # released when the view ended


def test_plain_watch_says_who_acts_and_never_notifies_as_a_view(tmp_path, capsys):
    from chainrun.cli.chain_cmd import _plain_watch

    store = Store(tmp_path / "state.sqlite")
    engine = Counting(store)
    rec = foreign(store, time.time() + 600)
    # --until-done: with no active chain the view returns after its first look
    _plain_watch(store, engine, interval=1, once=False, until_done=True, json_out=False, lease=ActingLease(store))
    out = capsys.readouterr().out
    assert "read-only: login9:1 (lease until" in out and engine.ticks == 0, out
    assert store.db.execute("SELECT value FROM meta WHERE key LIKE 'notify%'").fetchone() is None  # wrote nothing
    assert Record.decode(store.lease_path("watch").read_bytes()) == rec  # and left login9's lease alone


def test_a_view_writes_no_file_on_the_cluster_and_calls_no_mutating_slurm_command(tmp_path):
    import pytest

    from chainrun.chain.watcher import FencedRunner, FencedSlurm
    from chainrun.runner.local import LocalRunner
    from chainrun.slurm.client import SlurmClient
    from chainrun.state.lease import LeaseLost

    store = Store(tmp_path / "state.sqlite")
    foreign(store, time.time() + 600)
    lease = ActingLease(store)
    assert lease.try_acquire() is not None  # login9 acts: this process is a view
    runner = FencedRunner(LocalRunner(), lease)
    with pytest.raises(LeaseLost):
        runner.write_file(str(tmp_path / "rule"), "x")
    assert not (tmp_path / "rule").exists()
    slurm = FencedSlurm(SlurmClient(LocalRunner()), lease)
    with pytest.raises(LeaseLost):
        slurm.cancel(["1"])  # refused before scancel runs
    assert slurm.calls["scancel"] == 0
    foreign(store, time.time() - 60)
    assert lease.try_acquire() is None
    runner.write_file(str(tmp_path / "rule"), "x")  # acting now: written
    assert (tmp_path / "rule").read_text() == "x"
