"""The SQLite store: round trips, private files, refusing what it must not touch."""

import os
import sqlite3
import threading
import time

import pytest

from chainrun.errors import NotFoundError, StateError
from chainrun.state.lease import Record
from chainrun.state.records import Chain, Segment
from chainrun.state.store import SCHEMA_VERSION, Store


def make_chain(cid="train-1a2b"):
    return Chain(id=cid, name="train", cluster="local", script="/s.sh", workdir="/w", run_dir="/w/r",
                 checkpoint_dir="/w/c", total_s=3600, segment_s=1200, policy="lead", lead_s=60, signal="USR2",
                 signal_lead_s=300, retries=1, sbatch_args=["--gres=gpu:1", "x y"], partition="gpu")


def test_round_trip_and_prefix_lookup(tmp_path):
    s = Store(tmp_path / "s.sqlite")
    c = make_chain()
    s.add_chain(c)
    seg = Segment(chain_id=c.id, idx=0, job_id="12", extra={"gap_s": -3})
    s.save(c, [seg], [(0, "submitted", "x")])
    s.close()
    s = Store(tmp_path / "s.sqlite")
    assert s.chain("train").sbatch_args == ["--gres=gpu:1", "x y"]
    assert s.chain("train-1a").id == c.id
    assert s.segments(c.id)[0].extra == {"gap_s": -3}
    assert [e.kind for _, e in s.events(c.id)] == ["created", "submitted"]
    with pytest.raises(NotFoundError):
        s.chain("nope")
    with pytest.raises(StateError):
        s.add_chain(make_chain())


def test_files_are_private(tmp_path):
    Store(tmp_path / "d" / "s.sqlite")
    assert oct(os.stat(tmp_path / "d" / "s.sqlite").st_mode & 0o777) == "0o600"
    assert oct(os.stat(tmp_path / "d").st_mode & 0o777) == "0o700"


def test_refuses_newer_schema_and_leaves_it_untouched(tmp_path):
    p = tmp_path / "s.sqlite"
    Store(p).close()
    db = sqlite3.connect(p)
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    before = p.read_bytes()
    with pytest.raises(StateError, match="newer chainrun"):
        Store(p)
    assert p.read_bytes() == before


def test_refuses_garbage_and_foreign_sqlite(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateError, match="not a chainrun state store"):
        Store(junk)
    foreign = tmp_path / "foreign.sqlite"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE x(a)")
    db.commit()
    db.close()
    with pytest.raises(StateError, match="not a chainrun state store"):
        Store(foreign)


def test_a_version_1_store_is_migrated_in_place(tmp_path):
    from chainrun.state.store import MIGRATIONS

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    for stmt in MIGRATIONS[0].split(";"):
        if stmt.strip():
            db.execute(stmt)
    db.execute("INSERT INTO meta VALUES('schema_version', '1')")
    c = make_chain()
    cols = [k for k in c.__dict__ if k != "extra"]
    vals = [("[]" if k == "sbatch_args" else getattr(c, k)) for k in cols]
    db.execute(f"INSERT INTO chains({','.join(chr(34) + k + chr(34) for k in cols)}) VALUES({','.join('?' * len(cols))})",
               vals)
    db.commit()
    db.close()
    s = Store(path)
    got = s.chain(c.id)
    assert got.extra == {} and got.total_s == c.total_s
    got.extra["adapt"] = {"exclude": ["n3"]}
    s.save(got)
    assert Store(path).chain(c.id).extra == {"adapt": {"exclude": ["n3"]}}
    assert sqlite3.connect(path).execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(
        SCHEMA_VERSION)


# ---------------------------------------------------------------- journal mode and the write lease
LOCAL = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"


def nfs_over(path) -> str:
    """mountinfo text in which ``path`` is on an NFS mount."""
    return LOCAL + f"115 27 0:47 / {path} rw,relatime shared:62 - nfs4 nfs01:/export/home rw,vers=4.2\n"


def header_modes(path) -> tuple[int, int]:
    """SQLite's file format write/read version bytes: 2/2 in WAL mode, 1/1 with a rollback journal."""
    raw = path.read_bytes()[18:20]
    return raw[0], raw[1]


def test_wal_on_a_local_disk_delete_on_nfs(tmp_path):
    local = Store(tmp_path / "a" / "s.sqlite", mountinfo=LOCAL)
    assert local.journal_mode == "WAL"
    local.close()
    shared = Store(tmp_path / "b" / "s.sqlite", mountinfo=nfs_over(tmp_path / "b"))
    assert shared.journal_mode == "DELETE"
    assert shared.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: NORMAL is not crash-safe here
    shared.add_chain(make_chain())
    shared.close()
    assert header_modes(tmp_path / "b" / "s.sqlite") == (1, 1)
    assert not (tmp_path / "b" / "s.sqlite-wal").exists()


def test_a_wal_store_on_nfs_is_converted_once(tmp_path):
    p = tmp_path / "s.sqlite"
    s = Store(p, mountinfo=LOCAL)
    c = make_chain()
    s.add_chain(c)
    s.save(c, [Segment(chain_id=c.id, idx=0, job_id="7")], [(0, "submitted", "x")])
    s.close()
    assert header_modes(p) == (2, 2)
    s = Store(p, mountinfo=nfs_over(tmp_path))
    assert s.journal_mode == "DELETE" and s.converted_from_wal
    assert s.segments(c.id)[0].job_id == "7" and len(s.events(c.id)) == 2  # nothing lost
    s.close()
    assert header_modes(p) == (1, 1) and not (tmp_path / "s.sqlite-wal").exists()
    again = Store(p, mountinfo=nfs_over(tmp_path))
    assert again.journal_mode == "DELETE" and not again.converted_from_wal
    assert sqlite3.connect(p).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_every_transaction_holds_the_write_lease_and_frees_it(tmp_path):
    s = Store(tmp_path / "s.sqlite")
    lease = s.lease_path("write")
    seen = []
    with s.tx():
        seen.append(lease.read_bytes())
    assert b'"role": "write"' in seen[0] and f'"pid": {os.getpid()}'.encode() in seen[0]
    assert not lease.exists()  # released after the commit
    with pytest.raises(RuntimeError):
        with s.tx():
            raise RuntimeError("rolled back")
    assert not lease.exists()  # and after a rollback


# ---------------------------------------------------------------- a shared home: never write on an old view
def _credit(store: Store) -> None:
    with store.tx() as db:  # read-modify-write, as the four writers of tests/test_store_shared_mount.py do
        v = db.execute("SELECT credited_s FROM chains").fetchone()[0]
        db.execute("UPDATE chains SET credited_s=?", (v + 1,))


def test_each_commit_is_numbered_in_the_store_and_beside_it(tmp_path):
    s = Store(tmp_path / "s.sqlite", mountinfo=nfs_over(tmp_path))
    s.add_chain(make_chain())
    before = s.db.execute("PRAGMA user_version").fetchone()[0]
    _credit(s)
    after = s.db.execute("PRAGMA user_version").fetchone()[0]
    assert after == before + 1 and s._last_commit() == after  # the record beside the store says the same
    assert len(s.commit_record_path().read_bytes()) == 128  # fixed size: a stale size cannot cut it short
    local = Store(tmp_path / "l" / "s.sqlite", mountinfo=LOCAL)  # WAL on a local disk: one page cache, no record
    local.add_chain(make_chain())
    assert not local.commit_record_path().exists()


def test_a_view_older_than_the_last_commit_waits_until_it_is_current(tmp_path, monkeypatch):
    """A stale copy (what a page or attribute cache may show) is opened again until the file is current,
    then written on: the increment lands on the last commit, not on the old copy."""
    p = tmp_path / "s.sqlite"
    s = Store(p, mountinfo=nfs_over(tmp_path))
    s.add_chain(make_chain())
    _credit(s)
    old = p.read_bytes()
    _credit(s)
    _credit(s)
    current = p.read_bytes()
    p.write_bytes(old)  # the filesystem serves the view of two commits ago ...
    timer = threading.Timer(1.0, p.write_bytes, (current,))  # ... until its cache expires
    timer.start()
    try:
        _credit(s)
    finally:
        timer.join()
    assert s.chains()[0].credited_s == 4  # 3 + 1, not 1 + 1


def test_a_view_that_stays_old_is_refused_and_left_untouched(tmp_path, monkeypatch):
    p = tmp_path / "s.sqlite"
    s = Store(p, mountinfo=nfs_over(tmp_path))
    s.add_chain(make_chain())
    old = p.read_bytes()
    _credit(s)
    p.write_bytes(old)  # e.g. restored from a backup behind chainrun's back
    monkeypatch.setattr("chainrun.state.store.STALE_WAIT_S", 1.0)
    with pytest.raises(StateError, match="older than its last commit") as err:
        _credit(s)
    assert str(s.commit_record_path()) in err.value.hint
    assert not s._db.in_transaction  # rolled back: the connection is usable as it is
    with pytest.raises(StateError, match="older than its last commit"):
        s.chains()  # nor is it read as if it were current
    assert p.read_bytes() == old
    assert not s.lease_path("write").exists()
    s.commit_record_path().unlink()  # what the hint says to do after a restore
    _credit(s)
    assert s.chains()[0].credited_s == 1


def test_a_transaction_that_outlived_its_write_lease_commits_nothing(tmp_path):
    """The write lease is a fencing token checked just before COMMIT: a writer stopped past the expiry
    (whose lease another writer may have broken and taken) rolls back instead of overwriting."""
    from chainrun.state.lease import LeaseLost
    s = Store(tmp_path / "s.sqlite", mountinfo=nfs_over(tmp_path))
    s.add_chain(make_chain())
    lease = s.lease_path("write")
    with pytest.raises(LeaseLost, match="broken during the transaction"):
        with s.tx() as db:
            db.execute("UPDATE chains SET credited_s=99")
            other = Record("login2", 4242, "other-boot", 0, time.time() + 60, "feedc0de", "write")
            lease.write_bytes(other.encode())  # broken and taken by a writer on another host meanwhile
    assert lease.read_bytes() == other.encode()  # the other's lease is left alone
    lease.unlink()
    assert s.chains()[0].credited_s == 0
    with pytest.raises(LeaseLost, match="expired"):
        with s.tx() as db:
            db.execute("UPDATE chains SET credited_s=99")
            s.write_lease.file.clock = lambda: time.time() + 3600  # stopped (SIGSTOP, a suspended laptop) an hour
    s.write_lease.file.clock = time.time
    assert s.chains()[0].credited_s == 0


def test_a_cancel_wins_over_a_tick_that_read_the_chain_before_it(tmp_path):
    """A watcher tick writes the whole chain row; a `chainrun cancel` between its read and its write stays."""
    s = Store(tmp_path / "s.sqlite")
    s.add_chain(make_chain())
    tick_copy = s.chain("train-1a2b")  # the tick reads the chain ...
    cancel_copy = s.chain("train-1a2b")  # ... `chainrun cancel` reads it too and cancels it first
    cancel_copy.status, cancel_copy.reason, cancel_copy.finished = "CANCELLED", "cancelled by the user", 123.0
    s.save_chain(cancel_copy)
    tick_copy.credited_s = 600.0  # the tick's own news is kept
    s.save(tick_copy, [], [(None, "continue", "segment 0 checkpointed")])
    now = s.chain("train-1a2b")
    assert (now.status, now.reason, now.finished) == ("CANCELLED", "cancelled by the user", 123.0)
    assert now.credited_s == 600.0
    assert tick_copy.status == "CANCELLED"  # the tick's copy agrees with what was written
    for later in ("COMPLETED", "FAILED", "ACTIVE"):
        tick_copy.status = later
        s.save_chain(tick_copy)
        assert s.chain("train-1a2b").status == "CANCELLED"


def test_a_version_2_store_is_migrated_to_sites(tmp_path):
    """Schema 3 (issue 26): segments.cluster (NULL for the old rows: the chain's cluster) and chain_sites."""
    from chainrun.state.records import ChainSite
    from chainrun.state.store import MIGRATIONS

    path = tmp_path / "v2.sqlite"
    db = sqlite3.connect(path)
    for script in MIGRATIONS[:2]:  # exactly what a chainrun of schema 2 created
        for stmt in script.split(";"):
            if stmt.strip():
                db.execute(stmt)
    db.execute("INSERT INTO meta VALUES('schema_version', '2')")
    c = make_chain()
    cols = list(c.__dict__)
    vals = [("[]" if k == "sbatch_args" else "{}" if k == "extra" else getattr(c, k)) for k in cols]
    db.execute(f"INSERT INTO chains({','.join(chr(34) + k + chr(34) for k in cols)}) VALUES({','.join('?' * len(cols))})",
               vals)
    seg_cols = [k for k in Segment(chain_id=c.id, idx=0).__dict__ if k != "cluster"]
    old = Segment(chain_id=c.id, idx=0, job_id="41", phase="ENDED")
    db.execute(f"INSERT INTO segments({','.join(chr(34) + k + chr(34) for k in seg_cols)}) "
               f"VALUES({','.join('?' * len(seg_cols))})",
               [("{}" if k == "extra" else int(v) if isinstance(v, bool) else v)
                for k, v in ((k, getattr(old, k)) for k in seg_cols)])
    db.commit()
    db.close()

    s = Store(path)
    (seg,) = s.segments(c.id)
    assert seg.job_id == "41" and seg.cluster is None  # an old row: the chain's cluster
    assert s.sites(c.id) == []
    s.save(s.chain(c.id), [Segment(chain_id=c.id, idx=1, job_id="7", cluster="crh9")])
    s.save_sites([ChainSite(chain_id=c.id, cluster="crh9", rank=1, workdir="/h", run_dir="/h/r",
                            checkpoint_dir="/h/r/checkpoint", script="/h/r/t.sh", sbatch_args=["--account=x"],
                            extra={"segment_s": 120})])
    s.close()
    s = Store(path)
    assert [x.cluster for x in s.segments(c.id)] == [None, "crh9"]
    (site,) = s.sites(c.id)
    assert site.sbatch_args == ["--account=x"] and site.extra == {"segment_s": 120} and site.rank == 1
    assert s.get_meta("schema_version") == "3" == str(SCHEMA_VERSION)


def test_a_chain_and_its_sites_are_written_together(tmp_path):
    from chainrun.state.records import ChainSite

    s = Store(tmp_path / "s.sqlite")
    c = make_chain()
    sites = [ChainSite(chain_id=c.id, cluster=n, rank=i, workdir="/w", run_dir=f"/w/{n}", checkpoint_dir="/c",
                       script="/s.sh") for i, n in enumerate(["b", "a"])]
    s.add_chain(c, sites)
    assert [x.cluster for x in s.sites(c.id)] == ["b", "a"]  # by rank, not by name
    with pytest.raises(StateError):  # the chain exists: nothing of the second attempt is kept
        s.add_chain(make_chain(), [ChainSite(chain_id=c.id, cluster="z", rank=5, workdir="/w", run_dir="/z",
                                             checkpoint_dir="/c", script="/s.sh")])
    assert [x.cluster for x in s.sites(c.id)] == ["b", "a"]


def test_a_spanning_chains_segments_always_say_their_cluster(tmp_path):
    """NULL means "the chain's cluster" only for chains on one cluster: a spanning chain's cluster changes
    with each move, so each of its segments is written with the cluster it was planned on."""
    from chainrun.state.records import ChainSite

    s = Store(tmp_path / "s.sqlite")
    one, two = make_chain("one-1a2b"), make_chain("two-1a2b")
    s.add_chain(one)
    s.add_chain(two, [ChainSite(chain_id=two.id, cluster=n, rank=i, workdir="/w", run_dir=f"/w/{n}",
                                checkpoint_dir="/c", script="/s.sh") for i, n in enumerate(["local", "b"])])
    s.save(one, [Segment(chain_id=one.id, idx=0)])
    s.save(two, [Segment(chain_id=two.id, idx=0)])
    two.cluster = "b"  # a move (the driver's): later segments are b's, the first stays local's
    s.save(two, [Segment(chain_id=two.id, idx=1)])
    assert [x.cluster for x in s.segments(one.id)] == [None]
    assert [x.cluster for x in s.segments(two.id)] == ["local", "b"]
