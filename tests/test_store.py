"""The SQLite store: round trips, private files, refusing what it must not touch."""

import os
import sqlite3

import pytest

from chainrun.errors import NotFoundError, StateError
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
