"""The SQLite state store: one file per chainrun home, versioned schema.

Each public method is one transaction, and every transaction holds the home's write lease
(chainrun/state/lease.py), so writers on several login nodes take turns. The journal mode
follows the filesystem: WAL on a local disk, a rollback journal (``DELETE``) on a network
filesystem, where WAL's shared-memory index is not shared between hosts; a WAL store found
on a network filesystem is converted once. A store from a newer chainrun (higher schema
version) or a file that is not a chainrun store is refused, never rewritten.

With a rollback journal (a shared home) no transaction trusts the filesystem's caches to show the
last commit: each commit numbers itself in the database (``PRAGMA user_version``) and then, still
under the lease, in a small file beside it (``state.sqlite.commit``). A reader or writer that takes
the lease compares the two: a database older than the record (a stale page cache, attribute cache
or file size) is opened again until it is current, and never written on.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import asdict, fields
from pathlib import Path
from typing import Iterator

from chainrun.errors import NotFoundError, StateError
from chainrun.state.lease import WriteLease, drop_cached_pages, read_uncached
from chainrun.state.mounts import existing_parent, journal_mode_for, read_mountinfo
from chainrun.state.records import CANCELLED, SUBMITTING, Chain, ChainSite, Event, Segment

log = logging.getLogger(__name__)
_READ = object()  # Store(mountinfo=...) default: read /proc/self/mountinfo
# with a rollback journal (a shared home) the connection is opened anew for every write transaction and
# for reads after this long: an open revalidates what another host changed (NFS close-to-open; FUSE
# drops its page cache on open), where a long-open file may keep serving stale pages
FRESH_S = 1.0
# how long a view older than the last commit (see _stale) is re-opened before the store gives up with an
# error: past sshfs's attribute cache (20 s) and well inside the 60 s write lease the waiter holds meanwhile
STALE_WAIT_S = 40.0
COMMIT_RECORD_BYTES = 128  # the commit record is always this long: one same-length pwrite, never a short read

SCHEMA_VERSION = 3

# each entry migrates from version i to i+1; index 0 creates the schema
MIGRATIONS: list[str] = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE chains (
        id TEXT PRIMARY KEY, name TEXT NOT NULL, cluster TEXT NOT NULL, script TEXT NOT NULL,
        workdir TEXT NOT NULL, run_dir TEXT NOT NULL, checkpoint_dir TEXT NOT NULL,
        total_s INTEGER NOT NULL, segment_s INTEGER NOT NULL, policy TEXT NOT NULL, lead_s INTEGER NOT NULL,
        signal TEXT NOT NULL, signal_lead_s INTEGER NOT NULL, retries INTEGER NOT NULL,
        sbatch_args TEXT NOT NULL, partition TEXT NOT NULL,
        status TEXT NOT NULL, reason TEXT NOT NULL, credited_s REAL NOT NULL,
        consecutive_failures INTEGER NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, finished REAL
    );
    CREATE TABLE segments (
        chain_id TEXT NOT NULL REFERENCES chains(id), idx INTEGER NOT NULL,
        phase TEXT NOT NULL, job_id TEXT, slurm_cluster TEXT, slurm_state TEXT NOT NULL,
        outcome TEXT, reason TEXT NOT NULL, time_limit_s INTEGER NOT NULL, dependency TEXT NOT NULL,
        intent_at REAL NOT NULL, submit REAL, eligible REAL, start REAL, "end" REAL, exit_code INTEGER,
        credit_s REAL NOT NULL, overlap_s REAL NOT NULL, predicted_wait_s REAL, predicted_model TEXT NOT NULL,
        is_retry INTEGER NOT NULL, extra TEXT NOT NULL,
        PRIMARY KEY (chain_id, idx)
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, chain_id TEXT NOT NULL,
        idx INTEGER, kind TEXT NOT NULL, message TEXT NOT NULL
    );
    CREATE INDEX events_chain ON events(chain_id, id);
    CREATE INDEX segments_job ON segments(job_id);
    """,
    # 1 -> 2: per-chain state that is not a column of its own (adaptations of the request, ...)
    """
    ALTER TABLE chains ADD COLUMN extra TEXT NOT NULL DEFAULT '{}';
    """,
    # 2 -> 3: a chain may span clusters (issue 26). Each segment says where it ran (NULL: the chain's
    # cluster, as every row before) and each site keeps the chain's own folders and options there
    """
    ALTER TABLE segments ADD COLUMN cluster TEXT;
    CREATE TABLE chain_sites (
        chain_id TEXT NOT NULL REFERENCES chains(id), cluster TEXT NOT NULL, rank INTEGER NOT NULL,
        workdir TEXT NOT NULL, run_dir TEXT NOT NULL, checkpoint_dir TEXT NOT NULL, script TEXT NOT NULL,
        sbatch_args TEXT NOT NULL, extra TEXT NOT NULL,
        PRIMARY KEY (chain_id, cluster)
    );
    """,
]

_CHAIN_COLS = [f.name for f in fields(Chain)]
_SEG_COLS = [f.name for f in fields(Segment)]
_SITE_COLS = [f.name for f in fields(ChainSite)]


class Store:
    def __init__(self, path: str | Path, *, mountinfo: str | None | object = _READ) -> None:
        """``mountinfo``: the text of /proc/self/mountinfo that decides the journal mode (read by default;
        None means unknown, which chooses the rollback journal)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        new = not self.path.exists()
        if new:  # create 0600 before sqlite opens it
            fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        # the acting watcher's lease (lease.ActingLease) once it acts: then every transaction re-reads its epoch
        self.acting = None
        self.write_lease = WriteLease(self.lease_path("write"),
                                      epoch=lambda: self.acting.epoch if self.acting is not None else 0)
        info = read_mountinfo() if mountinfo is _READ else mountinfo
        wanted = journal_mode_for(existing_parent(self.path), info)
        self.converted_from_wal = False
        self._in_tx = False
        # a shared home: reads hold the lease too (below), and the connection is opened afresh
        self.shared = wanted == "DELETE"
        self._reopen_each_time = False  # until the journal mode is set (also: no commit records before)
        self._commit_no = 0  # the database's commit number (user_version) read in the current transaction
        self.journal_mode = wanted
        with self.reading():
            if self.shared:
                self._drop_cached_pages()  # the schema version read below must be current too
            try:
                self._open()
                self.journal_mode = self._set_journal_mode(wanted)
                self._pragmas()
            except sqlite3.DatabaseError as e:
                raise StateError(
                    f"{self.path} is not a chainrun state store ({e})",
                    hint="move it aside; chainrun will not overwrite it",
                ) from None
            self._reopen_each_time = self.journal_mode != "WAL"
            self._migrate()

    def _open(self) -> None:
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._opened_at = time.monotonic()

    def _pragmas(self) -> None:
        self._db.execute("PRAGMA foreign_keys=ON")
        # in WAL mode NORMAL is crash-safe; with a rollback journal only FULL is
        self._db.execute("PRAGMA synchronous=" + ("NORMAL" if self.journal_mode == "WAL" else "FULL"))

    def _reopen(self) -> None:
        self._db.close()
        self._open()
        self._pragmas()

    @property
    def db(self) -> sqlite3.Connection:
        """The connection; on a shared home one opened within the last FRESH_S (see there)."""
        if self._reopen_each_time and not self._in_tx and time.monotonic() - self._opened_at > FRESH_S:
            self._reopen()
        return self._db

    @contextmanager
    def reading(self) -> Iterator[None]:
        """A read of a shared home holds the lease too. SQLite's locks are what keeps a reader from
        taking a writer's live journal for a crashed one (and rolling it back); where the filesystem
        does not carry locks between hosts (FUSE mounts, NFS without lockd), only the lease does.
        Reads take milliseconds, so writers wait no longer for them than for another writer."""
        if not self.shared or self._in_tx:
            yield
            return
        with self.write_lease.held():
            if self._reopen_each_time:  # not during __init__, before the connection is set up
                self._drop_cached_pages()
                self._await_current(in_tx=False)
            yield

    # ---------------------------------------------------------------- the last commit, as a record beside the store
    def commit_record_path(self) -> Path:
        return self.path.with_name(f"{self.path.name}.commit")

    def _last_commit(self) -> int:
        """The commit number the last writer recorded (0: none yet). Read past this host's page cache
        (lease.read_uncached); the record is fixed-size, so a stale file size cannot cut it short."""
        try:
            fd = os.open(self.commit_record_path(), os.O_RDONLY)
            try:
                raw = read_uncached(fd, COMMIT_RECORD_BYTES)
            finally:
                os.close(fd)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ESTALE):
                return 0
            raise
        try:
            return int(json.loads(raw.decode())["version"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return 0  # never written completely (a writer died in the first pwrite): nothing to compare

    def _record_commit(self, version: int) -> None:
        raw = json.dumps({"version": version}).encode().ljust(COMMIT_RECORD_BYTES, b" ")
        try:
            fd = os.open(self.commit_record_path(), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, raw, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:  # the commit stands; later views are only checked against an older number
            log.warning("%s: could not record commit %d", self.commit_record_path(), version, exc_info=True)

    def _drop_cached_pages(self) -> None:
        """This host's cached pages of the database go (lease.drop_cached_pages): SQLite then reads what
        the filesystem holds. Page 1 alone being current would not do: another page may still be old."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return
        try:
            drop_cached_pages(fd)
        finally:
            os.close(fd)

    def _stale(self, db: sqlite3.Connection) -> str | None:
        """Why this connection's view is older than the last commit, or None when it is current. Called
        under the write lease, so nobody commits meanwhile."""
        try:
            self._commit_no = int(db.execute("PRAGMA user_version").fetchone()[0])
            pages = int(db.execute("PRAGMA page_count").fetchone()[0])
            page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
        except sqlite3.DatabaseError as e:  # e.g. "malformed": the header counts more pages than a stale size shows
            return f"unreadable ({e})"
        last = self._last_commit()
        if self._commit_no < last:
            return f"commit {self._commit_no} is seen, the last one recorded is {last}"
        size = self.path.stat().st_size
        # an empty file is a new database (SQLite counts its first page before writing it); a stale empty
        # view of a store that has commits is caught by the number above
        if 0 < size < pages * page_size:
            return f"the file shows {size} bytes, its header counts {pages * page_size}"
        return None

    def _await_current(self, *, in_tx: bool) -> None:
        """Open the store again until it shows the last commit (see the module's docstring). ``in_tx``: a
        ``BEGIN IMMEDIATE`` is open on the connection, and is rolled back and begun again around a reopen."""
        deadline = time.monotonic() + STALE_WAIT_S
        pause = 0.05
        while True:
            why = self._stale(self._db if in_tx else self.db)
            if why is None:
                return
            if time.monotonic() > deadline:
                if in_tx:
                    self._db.execute("ROLLBACK")
                raise StateError(f"{self.path} stays older than its last commit after {STALE_WAIT_S:.0f}s: {why}",
                                 hint="the filesystem serves a stale copy (check its cache options, e.g. NFS "
                                      f"`nocto`); if the store was restored from a backup, remove "
                                      f"{self.commit_record_path()}")
            log.info("%s: the view is older than the last commit (%s); opening it again", self.path, why)
            if in_tx:
                self._db.execute("ROLLBACK")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
            self._drop_cached_pages()
            self._reopen()
            if in_tx:
                self._db.execute("BEGIN IMMEDIATE")

    def lease_path(self, role: str) -> Path:
        """The lease files live beside the store: ``state.sqlite.write.lease``, ``state.sqlite.watch.lease``."""
        return self.path.with_name(f"{self.path.name}.{role}.lease")

    def _set_journal_mode(self, wanted: str) -> str:
        current = str(self.db.execute("PRAGMA journal_mode").fetchone()[0]).upper()
        if current == wanted:
            return current
        if wanted == "WAL":
            return str(self.db.execute("PRAGMA journal_mode=WAL").fetchone()[0]).upper()
        if current != "WAL":  # e.g. an old MEMORY/TRUNCATE choice: leave a working rollback journal alone
            return current
        # a WAL store on a network filesystem: convert once (needs every other connection closed)
        with self.write_lease.held():
            deadline = time.time() + 30
            while True:
                try:
                    got = str(self.db.execute("PRAGMA journal_mode=DELETE").fetchone()[0]).upper()
                except sqlite3.OperationalError:
                    got = "WAL"  # locked by another connection
                if got == "DELETE" or time.time() > deadline:
                    break
                time.sleep(0.5)
        if got != "DELETE":
            raise StateError(f"{self.path} is in WAL mode on a network filesystem and could not be converted "
                             "(another chainrun process has it open)",
                             hint="stop every `chainrun watch` using this home (on every login node) and try again")
        self.converted_from_wal = True
        log.warning("%s: converted from WAL to a rollback journal (the home is on a network filesystem)", self.path)
        return got

    # ---------------------------------------------------------------- schema
    def _version(self) -> int:
        try:
            tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as e:
            raise StateError(f"{self.path} is not a chainrun state store ({e})", hint="move it aside") from None
        if not tables:
            return 0
        if "meta" not in tables:
            raise StateError(f"{self.path} is an SQLite file but not a chainrun state store", hint="move it aside")
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None or not str(row[0]).isdigit():
            raise StateError(f"{self.path}: schema version missing or unreadable", hint="move it aside")
        return int(row[0])

    def _migrate(self) -> None:
        v = self._version()
        if v > SCHEMA_VERSION:
            raise StateError(
                f"{self.path} was written by a newer chainrun (schema {v}, this one knows {SCHEMA_VERSION})",
                hint="upgrade chainrun; the store was left untouched",
            )
        while v < SCHEMA_VERSION:
            with self.tx():
                # executescript would commit on its own: run statement by statement instead
                for stmt in MIGRATIONS[v].split(";"):
                    if stmt.strip():
                        self.db.execute(stmt)
                v += 1
                self.db.execute(
                    "INSERT INTO meta(key, value) VALUES('schema_version', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (str(v),),
                )

    @contextmanager
    def tx(self, *, fenced: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction under the home's write lease. In the acting watcher's store it first
        re-reads the acting epoch (``fenced``): a watcher that lost the role writes nothing."""
        with self.write_lease.held():
            numbered = self._reopen_each_time  # a rollback journal: commits are numbered and checked
            if numbered:
                self._drop_cached_pages()
                self._reopen()  # what other hosts committed, not what this file handle cached
            self._db.execute("BEGIN IMMEDIATE")
            if numbered:
                self._await_current(in_tx=True)  # never write on a view older than the last commit
            db = self._db
            self._in_tx = True
            try:
                if fenced and self.acting is not None:
                    self.acting.check(db)
                yield db
                if numbered:
                    db.execute(f"PRAGMA user_version={self._commit_no + 1}")
                    # the fencing token checked at the last moment: a writer that outlived its lease
                    # (stopped, suspended) may have been overtaken, and its commit would undo the other's
                    self.write_lease.check()
            except BaseException:
                db.execute("ROLLBACK")
                raise
            else:
                db.execute("COMMIT")
                if numbered:
                    self._record_commit(self._commit_no + 1)  # before the lease goes: the next holder reads it
            finally:
                self._in_tx = False

    # ---------------------------------------------------------------- the acting watcher's epoch
    def acting_epoch(self) -> int:
        with self.reading():
            row = self.db.execute("SELECT value FROM meta WHERE key='acting_epoch'").fetchone()
        return int(row[0]) if row is not None and str(row[0]).isdigit() else 0

    def bump_acting_epoch(self) -> int:
        """A new acting watcher's epoch: one more than any before. Every transaction of the previous
        holder that comes after this one sees the new epoch and aborts (lease.ActingLease.check)."""
        with self.tx(fenced=False):
            epoch = self.acting_epoch() + 1
            self.db.execute("INSERT INTO meta(key, value) VALUES('acting_epoch', ?) "
                            "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (str(epoch),))
        return epoch

    # ---------------------------------------------------------------- small keyed values (e.g. schedule.py)
    def get_meta(self, key: str) -> str | None:
        with self.reading():
            row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str | None) -> None:
        """Set (or with None remove) one value; outside the acting watcher's fence: not chain state."""
        if key in ("schema_version", "acting_epoch"):
            raise ValueError(f"{key} is the store's own")
        with self.tx(fenced=False) as db:
            if value is None:
                db.execute("DELETE FROM meta WHERE key=?", (key,))
            else:
                db.execute("INSERT INTO meta(key, value) VALUES(?, ?) "
                           "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))

    def close(self) -> None:
        self._db.close()

    # ---------------------------------------------------------------- chains
    def add_chain(self, chain: Chain, sites: list[ChainSite] = ()) -> None:
        """A new chain, with its sites when it spans clusters (one transaction: never a chain without them)."""
        now = time.time()
        chain.created = chain.created or now
        chain.updated = now
        row = _chain_row(chain)
        with self.tx():
            try:
                self.db.execute(
                    f"INSERT INTO chains({','.join(_CHAIN_COLS)}) VALUES({','.join('?' * len(_CHAIN_COLS))})",
                    [row[c] for c in _CHAIN_COLS],
                )
            except sqlite3.IntegrityError:
                raise StateError(f"a chain named {chain.id!r} exists already") from None
            for site in sites:
                self._upsert_site(site)
            self._event(chain.id, None, "created", f"chain {chain.id} created ({chain.policy})")

    def save_chain(self, chain: Chain) -> None:
        with self.tx():
            self._update_chain(chain)

    def chain(self, chain_id: str) -> Chain:
        with self.reading():
            r = self.db.execute("SELECT * FROM chains WHERE id=?", (chain_id,)).fetchone()
        if r is None:
            matches = [c.id for c in self.chains() if c.id.startswith(chain_id) or c.name == chain_id]
            if len(matches) == 1:
                return self.chain(matches[0])
            if len(matches) > 1:
                raise NotFoundError(f"{chain_id!r} matches several chains: {', '.join(matches)}")
            raise NotFoundError(f"no chain {chain_id!r}", hint="`chainrun status` lists chains")
        return _chain_from(r)

    def chains(self, *, active_only: bool = False) -> list[Chain]:
        q = "SELECT * FROM chains" + (" WHERE status='ACTIVE'" if active_only else "") + " ORDER BY created"
        with self.reading():
            return [_chain_from(r) for r in self.db.execute(q)]

    # ---------------------------------------------------------------- segments
    def segments(self, chain_id: str) -> list[Segment]:
        with self.reading():
            rows = self.db.execute("SELECT * FROM segments WHERE chain_id=? ORDER BY idx", (chain_id,))
            return [_seg_from(r) for r in rows]

    def save_segment(self, seg: Segment) -> None:
        with self.tx():
            self._upsert_segment(seg)

    def _upsert_segment(self, seg: Segment) -> None:
        if seg.phase == SUBMITTING and self.acting is not None:  # which watcher decided this submit (status, tests)
            seg.extra["acting"] = self.acting.label
        if seg.cluster is None and self.db.execute("SELECT 1 FROM chain_sites WHERE chain_id=? LIMIT 1",
                                                   (seg.chain_id,)).fetchone():
            # a chain spanning clusters: its segments always say where they ran (NULL would follow the chain's
            # cluster, which changes with each move); the chain row is current here (save writes it first)
            row = self.db.execute("SELECT cluster FROM chains WHERE id=?", (seg.chain_id,)).fetchone()
            seg.cluster = row["cluster"] if row is not None else None
        row = _seg_row(seg)
        self.db.execute(
            f"INSERT INTO segments({','.join(_q(c) for c in _SEG_COLS)}) VALUES({','.join('?' * len(_SEG_COLS))}) "
            "ON CONFLICT(chain_id, idx) DO UPDATE SET "
            + ",".join(f"{_q(c)}=excluded.{_q(c)}" for c in _SEG_COLS if c not in ("chain_id", "idx")),
            [row[c] for c in _SEG_COLS],
        )

    def _update_chain(self, chain: Chain) -> None:
        # A `chainrun cancel` wins over a tick that read the chain before it: the tick writes the whole
        # row, and would otherwise write a cancelled chain back to ACTIVE (status, reason, end kept).
        was = self.db.execute("SELECT status, reason, finished FROM chains WHERE id=?", (chain.id,)).fetchone()
        if was is not None and was["status"] == CANCELLED and chain.status != CANCELLED:
            chain.status, chain.reason, chain.finished = was["status"], was["reason"], was["finished"]
        chain.updated = time.time()
        row = _chain_row(chain)
        self.db.execute(
            f"UPDATE chains SET {','.join(f'{c}=?' for c in _CHAIN_COLS if c != 'id')} WHERE id=?",
            [row[c] for c in _CHAIN_COLS if c != "id"] + [chain.id],
        )

    def save(self, chain: Chain, segments: list[Segment] = (), events: list[tuple[int | None, str, str]] = ()) -> None:
        """Write a chain, some of its segments and events in one transaction."""
        with self.tx():
            self._update_chain(chain)
            for seg in segments:
                self._upsert_segment(seg)
            for idx, kind, msg in events:
                self._event(chain.id, idx, kind, msg)

    # ---------------------------------------------------------------- sites (a chain spanning clusters)
    def sites(self, chain_id: str) -> list[ChainSite]:
        """The chain's sites in order of preference; empty for a chain on one cluster."""
        with self.reading():
            rows = self.db.execute("SELECT * FROM chain_sites WHERE chain_id=? ORDER BY rank", (chain_id,))
            return [_site_from(r) for r in rows]

    def save_sites(self, sites: list[ChainSite]) -> None:
        with self.tx():
            for site in sites:
                self._upsert_site(site)

    def _upsert_site(self, site: ChainSite) -> None:
        row = _site_row(site)
        self.db.execute(
            f"INSERT INTO chain_sites({','.join(_SITE_COLS)}) VALUES({','.join('?' * len(_SITE_COLS))}) "
            "ON CONFLICT(chain_id, cluster) DO UPDATE SET "
            + ",".join(f"{c}=excluded.{c}" for c in _SITE_COLS if c not in ("chain_id", "cluster")),
            [row[c] for c in _SITE_COLS],
        )

    # ---------------------------------------------------------------- events
    def _event(self, chain_id: str, idx: int | None, kind: str, message: str) -> None:
        self.db.execute(
            "INSERT INTO events(ts, chain_id, idx, kind, message) VALUES(?,?,?,?,?)",
            (time.time(), chain_id, idx, kind, message),
        )

    def add_event(self, chain_id: str, idx: int | None, kind: str, message: str) -> None:
        with self.tx():
            self._event(chain_id, idx, kind, message)

    def events(self, chain_id: str | None = None, *, after_id: int = 0, limit: int = 200,
               kind: str | None = None) -> list[tuple[int, Event]]:
        """The newest ``limit`` events after ``after_id`` (of one chain, of one kind), oldest first."""
        q = ("SELECT * FROM events WHERE id>?" + (" AND chain_id=?" if chain_id else "")
             + (" AND kind=?" if kind else "") + " ORDER BY id DESC LIMIT ?")
        args = (after_id, *([chain_id] if chain_id else []), *([kind] if kind else []), limit)
        with self.reading():
            rows = list(self.db.execute(q, args))[::-1]
        return [(r["id"], Event(r["ts"], r["chain_id"], r["idx"], r["kind"], r["message"])) for r in rows]


def _q(col: str) -> str:
    return f'"{col}"'


def _chain_row(c: Chain) -> dict:
    d = asdict(c)
    d["sbatch_args"] = json.dumps(c.sbatch_args)
    d["extra"] = json.dumps(c.extra)
    return d


def _chain_from(r: sqlite3.Row) -> Chain:
    d = {k: r[k] for k in r.keys()}
    d["sbatch_args"] = json.loads(d["sbatch_args"])
    d["extra"] = json.loads(d.get("extra") or "{}")
    return Chain(**d)


def _site_row(s: ChainSite) -> dict:
    d = asdict(s)
    d["sbatch_args"] = json.dumps(s.sbatch_args)
    d["extra"] = json.dumps(s.extra)
    return d


def _site_from(r: sqlite3.Row) -> ChainSite:
    d = {k: r[k] for k in r.keys()}
    d["sbatch_args"] = json.loads(d["sbatch_args"])
    d["extra"] = json.loads(d["extra"] or "{}")
    return ChainSite(**d)


def _seg_row(s: Segment) -> dict:
    d = asdict(s)
    d["extra"] = json.dumps(s.extra)
    d["is_retry"] = int(s.is_retry)
    return d


def _seg_from(r: sqlite3.Row) -> Segment:
    d = {k: r[k] for k in r.keys()}
    d["extra"] = json.loads(d["extra"] or "{}")
    d["is_retry"] = bool(d["is_retry"])
    return Segment(**d)
