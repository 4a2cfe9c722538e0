"""The home's leases with real processes and real SQLite: exactly one contender breaks an expired
lease, a live holder is never broken, a stopped holder that lost the role writes and submits nothing.

Timings are short (a 6 s acting lease) but no assertion depends on the machine being fast: the
tests wait for events (a line printed, a process seen stopped, a lease taken), with generous limits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from chainrun.state.lease import ActingLease, LeaseFile, LeaseLost, Record, Timing, boot_id, this_host
from chainrun.state.records import Segment
from chainrun.state.store import Store
from tests.conftest import REPO
from tests.test_store import make_chain

SHORT = Timing(6.0, 1.0, 0.5)  # the acting lease of these tests: what CHAINRUN_LEASE_S=6 gives
ENV = {**os.environ, "PYTHONPATH": str(REPO), "CHAINRUN_LEASE_S": "6"}


def wait_for(cond, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def stopped(pid: int) -> bool:
    """The process is in state T (stopped by a signal)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def write_record(path: Path, host: str, pid: int, expires: float, epoch: int = 1) -> Record:
    rec = Record(host, pid, "other-boot", epoch, expires, uuid.uuid4().hex[:16], "watch")
    path.write_bytes(rec.encode())
    return rec


# ---------------------------------------------------------------- the lease file
RACER = r"""
import os, sys, time
from pathlib import Path
from chainrun.state.lease import LeaseFile, Timing
path, go = Path(sys.argv[1]), Path(sys.argv[2])
f = LeaseFile(path, "watch", Timing(30.0, 5.0, 1.0))
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
other = f.try_take()
print("won" if other is None else f"lost {other.label}", flush=True)
sys.stdin.read()  # hold it until the test is done
"""


def test_exactly_one_contender_breaks_an_expired_lease(tmp_path):
    for round_ in range(4):
        path = tmp_path / f"r{round_}.lease"
        write_record(path, "login9", 4242, time.time() - 60)  # expired a minute ago, on another host
        go = tmp_path / f"go{round_}"
        procs = [subprocess.Popen([sys.executable, "-c", RACER, str(path), str(go)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=ENV) for _ in range(6)]
        try:
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            go.touch()
            answers = [p.stdout.readline().strip() for p in procs]
            winners = [p.pid for p, a in zip(procs, answers) if a == "won"]
            assert len(winners) == 1, answers
            holder = Record.decode(path.read_bytes())
            assert holder.pid == winners[0] and holder.host == this_host()
            assert all(a == f"lost {this_host()}:{winners[0]}" for a in answers if a != "won"), answers
            assert not list(tmp_path.glob(f"r{round_}.lease.broken.*"))  # the broken lease was cleaned up
        finally:
            for p in procs:
                p.kill()
                p.wait()


def test_a_lease_of_another_host_is_respected_until_it_expires(tmp_path):
    path = tmp_path / "w.lease"
    t = Timing(3.0, 0.5, 0.5)
    theirs = write_record(path, "login9", 1, time.time() + 3)
    f = LeaseFile(path, "watch", t)
    assert f.try_take() == theirs  # login9's pid 1 cannot be checked from here: only its expiry counts
    wait_for(lambda: f.try_take() is None, 30, "the expired lease to be taken")
    assert f.mine is not None and Record.decode(path.read_bytes()).nonce == f.mine.nonce
    assert time.time() > theirs.expires + t.skew_s  # never before expiry plus the skew allowance


HOLDER = r"""
import sys
from pathlib import Path
from chainrun.state.lease import LeaseFile, Timing
f = LeaseFile(Path(sys.argv[1]), "watch", Timing(600.0, 100.0, 10.0))
assert f.try_take() is None
print("held", flush=True)
sys.stdin.read()
"""


def test_a_live_holder_here_is_kept_and_a_dead_one_is_taken_over_at_once(tmp_path):
    path = tmp_path / "w.lease"
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=ENV)
    try:
        assert p.stdout.readline().strip() == "held"
        f = LeaseFile(path, "watch", Timing(600.0, 100.0, 10.0))
        assert f.try_take().pid == p.pid  # alive, ten minutes left: kept
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert f.try_take() is None  # same host, same boot, pid gone: no need to wait ten minutes
        assert Record.decode(path.read_bytes()).pid == os.getpid()
    finally:
        p.kill()
        p.wait()


def test_a_same_named_host_of_another_boot_is_not_judged_by_pid(tmp_path):
    """Two machines (or containers) may share a host name: a pid is only checked on its own boot."""
    path = tmp_path / "w.lease"
    rec = Record(this_host(), 999_999, "another-boot", 1, time.time() + 600, "n1", "watch")
    path.write_bytes(rec.encode())
    assert LeaseFile(path, "watch", Timing(600.0, 100.0, 10.0)).try_take() == rec
    assert boot_id() != "another-boot"


def test_renewal_keeps_the_file_and_a_record_length(tmp_path):
    f = LeaseFile(tmp_path / "w.lease", "watch", SHORT)
    assert f.try_take() is None
    ino, size = os.stat(f.path).st_ino, os.stat(f.path).st_size
    first = f.mine.expires
    time.sleep(0.05)
    f.renew()
    assert f.mine.expires > first
    assert (os.stat(f.path).st_ino, os.stat(f.path).st_size) == (ino, size)  # rewritten in place, same length
    f.release()
    assert not f.path.exists()


# ---------------------------------------------------------------- the acting lease and the store's epoch
def test_a_view_writes_nothing_and_the_holder_stamps_its_intents(tmp_path):
    db = tmp_path / "state.sqlite"
    a_store, b_store = Store(db), Store(db)
    c = make_chain()
    a_store.add_chain(c)
    a, b = ActingLease(a_store, timing=SHORT), ActingLease(b_store, timing=SHORT)
    assert a.try_acquire() is None and a.epoch == 1
    assert b.try_acquire().pid == os.getpid()  # a holds it
    with pytest.raises(LeaseLost, match="does not act"):
        b_store.save(c, [Segment(chain_id=c.id, idx=0)])
    assert a_store.segments(c.id) == []
    a_store.save(c, [Segment(chain_id=c.id, idx=0)])  # SUBMITTING: an intent, stamped with who decided it
    assert a_store.segments(c.id)[0].extra["acting"] == f"{this_host()}:{os.getpid()} epoch 1"


STALE = r"""
import os, signal, sys
from chainrun.state.lease import ActingLease, LeaseLost
from chainrun.state.records import Segment
from chainrun.state.store import Store
st = Store(sys.argv[1])
lease = ActingLease(st)
assert lease.try_acquire() is None
c = st.chains()[0]
print("acting", lease.epoch, flush=True)
if sys.argv[2] == "after-intent":
    st.save(c, [Segment(chain_id=c.id, idx=0)])  # the intent is recorded; stopped before sbatch
os.kill(os.getpid(), signal.SIGSTOP)  # a suspended laptop, a SIGSTOP: here, deterministically
try:
    if sys.argv[2] == "after-intent":
        from chainrun.chain.watcher import FencedSlurm
        from chainrun.runner.local import LocalRunner
        from chainrun.slurm.client import SlurmClient
        slurm = FencedSlurm(SlurmClient(LocalRunner()), lease)
        slurm.submit(sys.argv[3], ["-J", sys.argv[4], "-p", "short", "-t", "1"])
        print("submitted", flush=True)
    else:
        st.save(c, [Segment(chain_id=c.id, idx=0)])
        print("saved", flush=True)
except LeaseLost as e:
    print("lost:", e, flush=True)
"""


def run_stale(tmp_path: Path, mode: str, *extra: str) -> tuple[subprocess.Popen, Store, ActingLease]:
    """A process takes the lease and stops itself; this test takes the lease over once it expired."""
    db = tmp_path / "state.sqlite"
    st = Store(db)
    st.add_chain(make_chain())
    p = subprocess.Popen([sys.executable, "-c", STALE, str(db), mode, *extra], stdout=subprocess.PIPE, text=True,
                         env=ENV)
    assert p.stdout.readline().split() == ["acting", "1"]
    wait_for(lambda: stopped(p.pid), 30, "the holder to stop itself")
    lease = ActingLease(st, timing=SHORT)
    assert lease.try_acquire().pid == p.pid  # stopped, but alive and within its lease: kept
    wait_for(lambda: lease.try_acquire() is None, 60, "the stopped holder's lease to expire and be taken over")
    assert lease.epoch == 2
    return p, st, lease


def test_a_holder_stopped_past_its_expiry_records_no_intent(tmp_path):
    p, st, lease = run_stale(tmp_path, "before-intent")
    c = st.chains()[0]
    st.save(c, [Segment(chain_id=c.id, idx=0)])  # the new holder decides segment 0
    os.kill(p.pid, signal.SIGCONT)
    out = p.communicate(timeout=60)[0]
    assert out.startswith("lost:") and "expired" in out, out
    segs = st.segments(c.id)
    assert len(segs) == 1 and segs[0].extra["acting"] == f"{this_host()}:{os.getpid()} epoch 2"


@pytest.mark.slurm
def test_a_holder_stopped_between_intent_and_sbatch_submits_nothing(slurm_cluster, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsleep 1\n")
    name = f"cr-fence-{uuid.uuid4().hex[:8]}"
    p, st, lease = run_stale(tmp_path, "after-intent", str(script), name)
    os.kill(p.pid, signal.SIGCONT)
    out = p.communicate(timeout=120)[0]
    assert out.startswith("lost:"), out
    time.sleep(2)  # sacct records a submission within a second; give it two
    jobs = subprocess.run(["sacct", "-X", "-n", "-P", "--name", name, "-S", "now-1hour", "-o", "JobID"],
                          capture_output=True, text=True, check=True).stdout.split()
    queued = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True,
                            check=True).stdout.split()
    assert jobs == [] and queued == [], (jobs, queued)
    # the intent it recorded before it stopped stays for the new holder to settle (adopt or plan again)
    assert st.segments(st.chains()[0].id)[0].extra["acting"].endswith("epoch 1")
    assert lease.acting


def test_a_break_token_left_by_a_dead_contender_blocks_only_for_one_lease_period(tmp_path):
    path = tmp_path / "w.lease"
    t = Timing(20.0, 5.0, 1.0)
    old = write_record(path, "login9", 1, time.time() - 60)
    token = tmp_path / f"w.lease.break.{old.nonce}"
    token.touch()  # a contender took the token and died before its rename
    f = LeaseFile(path, "watch", t)
    assert f.try_take() == old  # the token is fresh: someone may be breaking it right now
    os.utime(token, (time.time() - 30, time.time() - 30))  # older than a lease period: its maker is gone
    wait_for(lambda: f.try_take() is None, 30, "the stale token to be cleared and the lease taken")
