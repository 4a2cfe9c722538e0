"""The home's leases: one writer at a time, and one watcher that acts.

A chainrun home is often on NFS and used from several login nodes (an interactive
`chainrun watch` on one, cron on another, `submit` on a third). ``flock`` and SQLite's
own locks are not to be trusted across hosts there, so two files beside the store arbitrate:

- ``<store>.write.lease``: held by every writer for one transaction (milliseconds), then
  removed. Short CLI writers (submit, cancel) therefore wait at most one transaction of the
  watcher, never a whole tick. The store checks it once more just before COMMIT
  (:meth:`WriteLease.check`): a transaction that outlived its lease commits nothing.
- ``<store>.watch.lease``: the *acting* role, held by the one watcher that moves chains.
  Its holder renews it every tick (and while it sleeps); every other `watch` is a read-only
  view that takes over only once the lease has expired.

Both are created with ``O_EXCL`` (atomic on the NFS server since v3) and record host, pid,
boot id, epoch, expiry and a random nonce. A record is always read past this host's page cache
(:func:`read_uncached`): an old record of a holder since gone would let a live lease be broken.
An expired lease is broken by renaming it aside:
a token named after the expired lease (``O_EXCL``) lets exactly one contender rename it, and
whoever then creates the lease again with ``O_EXCL`` holds it. The acting epoch lives in the store itself
(``meta.acting_epoch``), bumped in a transaction by each new holder; every transaction of the
acting watcher re-reads it, so a watcher that was stopped or suspended past its expiry finds
another epoch there and aborts before it records a submit intent (:class:`LeaseLost`).

Timing (seconds; ``CHAINRUN_LEASE_S`` scales the acting lease, e.g. for tests):

- acting lease ``L = 120``, renewed every ``L/6 = 20`` and at every tick. A contender may see
  the file's content up to the NFS attribute-cache time old (``acregmax`` 60 by default): with
  renewals every 20 s the expiry it reads is at least ``L - 20 - 60 = 40`` ahead of the holder's
  last renewal, so no holder that is alive and renewing is ever broken.
- clock skew allowance ``SKEW = min(10, L/12)``: a holder stops acting ``SKEW`` before its
  expiry by its own clock, and a contender breaks only ``SKEW`` after it by its clock, so hosts
  whose clocks differ by less than ``SKEW`` (NTP keeps clusters within milliseconds) never both act.
- a holder that cannot renew (a stalled NFS server, a slow machine) keeps its role for
  ``L - L/6 - SKEW = 90`` s without a renewal; a dead holder on another host is taken over after
  ``L + SKEW = 130`` s plus one poll of the standby; a dead holder on the *same* host (same boot
  id, pid gone) is taken over at once.
- write lease ``60``: no transaction takes near that long, and a writer killed on another host
  blocks the others at most ``60 + SKEW``; the same host's dead writers are broken at once.

All times are wall-clock (``time.time``): a monotonic clock stops while a laptop is
suspended, which is exactly when expiry must still advance.
"""

from __future__ import annotations

import errno
import json
import os
import random
import secrets
import socket
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from chainrun.errors import StateError

RECORD_BYTES = 512  # every record is padded to this size, so a renewal is one same-length pwrite
ACT_LEASE_S = 120.0
WRITE_LEASE_S = 60.0
MAX_SKEW_S = 10.0
_HELD: set[str] = set()  # nonces of the leases this process holds now (any LeaseFile object)


class LeaseLost(StateError):
    """This process no longer holds the lease it acted under: it must not write or submit."""


class LeaseHeld(StateError):
    """Another process holds the lease."""

    def __init__(self, holder: "Record") -> None:
        super().__init__(f"held by {holder.label} until {_hhmmss(holder.expires)}")
        self.holder = holder


@dataclass(frozen=True)
class Timing:
    lease_s: float
    renew_s: float
    skew_s: float


def act_timing() -> Timing:
    raw = os.environ.get("CHAINRUN_LEASE_S", "")
    try:
        lease = float(raw) if raw else ACT_LEASE_S
    except ValueError:
        lease = ACT_LEASE_S
    lease = max(lease, 6.0)
    return Timing(lease, lease / 6, min(MAX_SKEW_S, lease / 12))


def write_timing() -> Timing:
    return Timing(WRITE_LEASE_S, WRITE_LEASE_S, MAX_SKEW_S)


@dataclass(frozen=True)
class Record:
    host: str
    pid: int
    boot: str
    epoch: int
    expires: float
    nonce: str
    role: str

    @property
    def label(self) -> str:
        return f"{self.host}:{self.pid}"

    def encode(self) -> bytes:
        raw = json.dumps(asdict(self), sort_keys=True).encode()
        return raw.ljust(RECORD_BYTES, b" ")[:RECORD_BYTES] if len(raw) <= RECORD_BYTES else raw

    @staticmethod
    def decode(raw: bytes) -> "Record | None":
        try:
            d = json.loads(raw.decode())
            return Record(str(d["host"]), int(d["pid"]), str(d["boot"]), int(d["epoch"]), float(d["expires"]),
                          str(d["nonce"]), str(d["role"]))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None


def this_host() -> str:
    """The host name written into leases (``CHAINRUN_LEASE_HOST`` overrides it: tests play a second host)."""
    return os.environ.get("CHAINRUN_LEASE_HOST") or socket.gethostname()


def boot_id() -> str:
    """Tells two machines (or two boots) that share a host name apart: a pid is only checked on its own boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _hhmmss(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))



def drop_cached_pages(fd: int) -> None:
    """Forget this host's cached pages of the file, so the next read asks the filesystem. An open is
    supposed to do that where another host may have written the file (NFS close-to-open), but a FUSE
    mount with ``kernel_cache`` (or a same-second mtime under ``auto_cache``) keeps serving old pages
    from an earlier open; POSIX_FADV_DONTNEED drops clean pages on any Linux filesystem."""
    if hasattr(os, "posix_fadvise"):  # not on macOS: there the open's own revalidation is all there is
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def read_uncached(fd: int, size: int) -> bytes:
    """``pread`` from offset 0 of what the filesystem holds now, not of this host's page cache."""
    drop_cached_pages(fd)
    return os.pread(fd, size, 0)


def create_exclusive(path) -> int:
    """``open(O_CREAT|O_EXCL)``; raises FileExistsError when the file exists. sshfs (SFTP) reports a
    lost create race as EPERM ("Operation not permitted"), not EEXIST: when the file is there, that is
    the same answer, and treating it as a failure crashed a writer under load."""
    try:
        return os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except PermissionError:
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "exists", str(path)) from None
        raise

class LeaseFile:
    """One lease file: take (O_EXCL), break when expired (rename aside), renew, release.

    Holds no state across processes but the file; ``mine`` is this process's current record.
    """

    def __init__(self, path: Path, role: str, timing: Timing, *, clock: Callable[[], float] = time.time,
                 sync: bool = True, reclaim_own: bool = False) -> None:
        self.path = Path(path)
        self.sync = sync
        # the acting lease: a record of this very process that it no longer holds (it expired while this
        # process was stopped) is broken at once; never for write leases, which two Store objects share
        self.reclaim_own = reclaim_own
        self.role, self.timing, self.clock = role, timing, clock
        self._mine: Record | None = None
        self.renewed_at = 0.0

    @property
    def mine(self) -> Record | None:
        """This process's record while it holds the lease."""
        return self._mine

    @mine.setter
    def mine(self, rec: Record | None) -> None:
        if self._mine is not None:
            _HELD.discard(self._mine.nonce)
        if rec is not None:
            _HELD.add(rec.nonce)
        self._mine = rec

    # ------------------------------------------------------------ reading
    def read(self) -> tuple[Record | None, float | None]:
        """The record in the file (None if missing or unreadable) and the file's mtime (None if missing)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                mtime = os.fstat(fd).st_mtime
                raw = read_uncached(fd, 4 * RECORD_BYTES)  # an old record read here could break a live lease
            finally:
                os.close(fd)
        except OSError as e:
            # ENOENT also after a successful open: sshfs asks the server for the attributes by path, and the
            # holder may have released (removed) the file in between (a writer crashed on it under load);
            # ESTALE: NFS, the file was replaced under a cached handle. Either way: no lease there now.
            if e.errno in (errno.ENOENT, errno.ESTALE):
                return None, None
            raise
        return Record.decode(raw), mtime

    def breakable(self, rec: Record | None, mtime: float | None, now: float) -> bool:
        """May a contender break this lease? Expired (with the skew allowance), or its holder died on this host."""
        if mtime is None:
            return False  # gone meanwhile: just try to create it
        if rec is None:  # unreadable: a holder died mid-write, or a write we caught half-way: judge by mtime
            return now > mtime + self.timing.lease_s + self.timing.skew_s
        if now > rec.expires + self.timing.skew_s:
            return True
        if self.reclaim_own and rec.host == this_host() and rec.boot == boot_id() and rec.pid == os.getpid():
            return rec.nonce not in _HELD
        return rec.host == this_host() and rec.boot == boot_id() and rec.pid != os.getpid() and not _pid_alive(rec.pid)

    def holder(self) -> Record | None:
        return self.read()[0]

    # ------------------------------------------------------------ taking
    def _record(self, epoch: int) -> Record:
        return Record(this_host(), os.getpid(), boot_id(), epoch, self.clock() + self.timing.lease_s,
                      secrets.token_hex(8), self.role)

    def try_take(self, epoch: int = 0) -> Record | None:
        """One attempt. Returns None when this process now holds the lease, else the holder's record
        (or a placeholder for a holder caught between break and create)."""
        settle = time.time() + 5  # another contender half-way (token taken, lease not yet created) finishes in ms
        while True:
            rec = self._record(epoch)
            try:
                fd = create_exclusive(self.path)
            except FileExistsError:
                pass
            else:
                try:
                    os.write(fd, rec.encode())
                    if self.sync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                self.mine, self.renewed_at = rec, self.clock()
                return None
            current, mtime = self.read()
            if self.breakable(current, mtime, self.clock()):
                if self._break(current, mtime or 0.0):
                    continue  # moved aside: create it now
            elif current is not None:
                return current
            if time.time() > settle:
                return current or Record("?", 0, "", 0, (mtime or self.clock()) + self.timing.lease_s, "", self.role)
            time.sleep(0.01)  # another contender is half-way (breaking, or created and not yet written)

    def _break(self, judged: Record | None, mtime: float) -> bool:
        """Break the expired lease ``judged``; True when this process moved exactly that lease aside.

        First a token named after the judged lease is created with O_EXCL, so only one contender
        ever renames that lease: one that read it long ago and comes late cannot rename the fresh
        lease a faster contender created meanwhile. Then the rename aside; should it still have
        moved another lease (its holder released it and a new one was taken in between), that
        lease is put back.
        """
        token = self.path.with_name(f"{self.path.name}.break.{judged.nonce if judged else f'm{mtime:.6f}'}")
        try:
            os.close(create_exclusive(token))
        except FileExistsError:
            try:  # a contender that died between token and rename (milliseconds) must not block it for good
                if self.clock() - token.stat().st_mtime > self.timing.lease_s + self.timing.skew_s:
                    token.unlink()
            except OSError:
                pass
            return False  # another contender breaks this one
        aside = self.path.with_name(f"{self.path.name}.broken.{this_host()}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        try:
            fd = os.open(aside, os.O_RDONLY)
            try:  # past the page cache: this mount may hold the pages of the lease it judged, not of the one moved
                raw = read_uncached(fd, 4 * RECORD_BYTES)
            finally:
                os.close(fd)
            moved = Record.decode(raw)
            if judged is not None and (moved is None or moved.nonce != judged.nonce):
                self._put_back(aside, raw)
                return False
        finally:
            aside.unlink(missing_ok=True)
        self._sweep_tokens()
        return True

    def _put_back(self, aside: Path, raw: bytes) -> None:
        """Restore a lease moved aside by mistake, unless yet another exists (the store's epoch then rules)."""
        try:
            os.link(aside, self.path)
            return
        except FileExistsError:
            return
        except OSError:
            pass  # no hard links here (sshfs, some FUSE mounts): an exclusive copy does the same
        try:
            fd = create_exclusive(self.path)
        except FileExistsError:
            return
        try:
            os.write(fd, raw)
        finally:
            os.close(fd)

    def _sweep_tokens(self) -> None:
        """Break tokens are kept long enough that no late contender can still hold the lease they name."""
        cutoff = self.clock() - max(10 * self.timing.lease_s, 600)
        for t in self.path.parent.glob(f"{self.path.name}.break.*"):
            try:
                if t.stat().st_mtime < cutoff:
                    t.unlink()
            except OSError:
                pass

    # ------------------------------------------------------------ holding
    def valid_for(self, now: float | None = None) -> float:
        """Seconds this process may still act under its lease (by its own clock, less the skew allowance)."""
        if self.mine is None:
            return 0.0
        return self.mine.expires - self.timing.skew_s - (self.clock() if now is None else now)

    def renew(self, epoch: int | None = None) -> Record:
        """Push the expiry out. LeaseLost if the lease expired (it must be taken anew) or is someone else's."""
        if self.mine is None:
            raise LeaseLost(f"this process does not hold {self.path.name}")
        now = self.clock()
        if self.valid_for(now) <= 0:
            lost = self.mine
            self.mine = None
            raise LeaseLost(f"the lease expired at {_hhmmss(lost.expires)} (this process was stopped, suspended "
                            "or too slow to renew it)")
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            self.mine = None
            raise LeaseLost("the lease file is gone (broken by another process)") from None
        try:
            current = Record.decode(read_uncached(fd, 4 * RECORD_BYTES))
            if current is None or current.nonce != self.mine.nonce:
                self.mine = None
                raise LeaseLost(f"the lease is now held by {current.label if current else 'another process'}")
            rec = Record(self.mine.host, self.mine.pid, self.mine.boot, self.mine.epoch if epoch is None else epoch,
                         now + self.timing.lease_s, self.mine.nonce, self.role)
            os.pwrite(fd, rec.encode(), 0)  # same length as before: readers never see a short record
            if self.sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self.mine, self.renewed_at = rec, now
        return rec

    def release(self) -> None:
        if self.mine is None:
            return
        current = self.holder()
        if current is not None and current.nonce == self.mine.nonce:
            self.path.unlink(missing_ok=True)
        self.mine = None


class WriteLease:
    """Held by every writer of the store for one transaction (see the module's docstring)."""

    def __init__(self, path: Path, *, epoch: Callable[[], int] = lambda: 0) -> None:
        self.file = LeaseFile(path, "write", write_timing(), sync=False)  # a crash frees it anyway
        self._epoch = epoch
        self._depth = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        if self._depth:  # re-entrant within one process (a transaction inside a migration step)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        t = self.file.timing
        deadline = time.time() + t.lease_s + 2 * t.skew_s + 5  # a live holder releases within its lease
        pause = 0.005
        while True:
            holder = self.file.try_take(self._epoch())
            if holder is None:
                break
            if time.time() > deadline:
                raise StateError(f"the state store's write lease is {LeaseHeld(holder)}",
                                 hint=f"if that process is gone, remove {self.file.path}")
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 0.5)
        self._depth = 1
        try:
            yield
        finally:
            self._depth = 0
            self.file.release()

    def check(self) -> None:
        """Just before a commit: does this process still hold the lease? A transaction that outlived it
        (the process was stopped, suspended or starved past the expiry) may have been overtaken by a writer
        that broke the lease; its commit would then overwrite that writer's. LeaseLost (the caller rolls back)."""
        mine = self.file.mine
        if mine is None:
            raise LeaseLost("this process does not hold the state store's write lease")
        if self.file.valid_for() <= 0:
            raise LeaseLost(f"the state store's write lease expired at {_hhmmss(mine.expires)} during the "
                            "transaction (this process was stopped or too slow); nothing was written")
        current, _ = self.file.read()
        if current is None or current.nonce != mine.nonce:
            raise LeaseLost("the state store's write lease was broken during the transaction "
                            f"(now held by {current.label if current else 'nobody'}); nothing was written")


class ActingLease:
    """The role of the watcher that moves chains (see the module's docstring).

    ``try_acquire`` takes the role if it is free or expired; the new holder bumps the store's acting
    epoch and installs itself as the store's fence, so every later transaction of this process
    checks that the epoch is still its own (``check``). A process that does not act (a read-only
    view) keeps the fence too: it can write nothing.
    """

    def __init__(self, store, *, timing: Timing | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.file = LeaseFile(store.lease_path("watch"), "watch", timing or act_timing(), clock=clock,
                              reclaim_own=True)
        self.epoch = 0
        store.acting = self

    @property
    def timing(self) -> Timing:
        return self.file.timing

    @property
    def acting(self) -> bool:
        return self.file.mine is not None

    @property
    def label(self) -> str:
        mine = self.file.mine
        return f"{mine.host}:{mine.pid} epoch {self.epoch}" if mine else "nobody"

    def holder(self) -> Record | None:
        return self.file.holder()

    def try_acquire(self) -> Record | None:
        """None when this process acts (taken now, or renewed); else the record of the process that acts."""
        if self.file.mine is not None:
            try:
                self.renew()
                return None
            except LeaseLost:
                pass
        other = self.file.try_take(0)
        if other is not None:
            return other
        try:
            self.epoch = self.store.bump_acting_epoch()
            self.file.renew(epoch=self.epoch)
        except BaseException:
            self.file.release()
            self.epoch = 0
            raise
        return None

    def renew(self) -> None:
        """Push the expiry out; LeaseLost if this process lost the role (expired, broken, or a newer epoch)."""
        if self.file.mine is None:
            raise LeaseLost("this watcher does not act")
        self.file.renew()
        if self.store.acting_epoch() != self.epoch:
            self.file.mine = None
            raise LeaseLost(f"another watcher acts now (epoch {self.store.acting_epoch()})")

    def renew_if_due(self) -> None:
        if self.file.mine is None:
            raise LeaseLost("this watcher does not act")
        if self.file.clock() - self.file.renewed_at >= self.timing.renew_s:
            self.renew()

    def check(self, db) -> None:
        """Inside a transaction of this process: still the acting watcher? Else LeaseLost (the caller rolls back)."""
        mine = self.file.mine
        if mine is None:
            raise LeaseLost("this watcher does not act: it writes nothing")
        if self.file.clock() - self.file.renewed_at >= self.timing.renew_s:
            self.file.renew()  # LeaseLost if it expired meanwhile (stopped, suspended) or was broken
        elif self.file.valid_for() <= 0:
            self.file.mine = None
            raise LeaseLost(f"the lease expired at {_hhmmss(mine.expires)} (this process was stopped or suspended)")
        row = db.execute("SELECT value FROM meta WHERE key='acting_epoch'").fetchone()
        epoch = int(row[0]) if row is not None and str(row[0]).isdigit() else 0
        if epoch != self.epoch:
            self.file.mine = None
            raise LeaseLost(f"another watcher took over (epoch {epoch}, this one had {self.epoch})")

    def assert_acting(self) -> None:
        """Outside a transaction (just before and after sbatch): the same questions, the epoch read afresh."""
        with self.store.reading():
            self.check(self.store.db)
        current = self.file.holder()
        if current is None or self.file.mine is None or current.nonce != self.file.mine.nonce:
            self.file.mine = None
            raise LeaseLost(f"the lease is now held by {current.label if current else 'nobody'}")

    def release(self) -> None:
        self.file.release()
