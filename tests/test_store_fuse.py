"""The store and its leases on a real network-style mount: a ``fuse.sshfs`` mount of a local folder.

A kernel NFS mount is what users have, but the test machine's kernel has no ``nfs`` filesystem
(``mount.nfs: No such device``); sshfs is a FUSE filesystem (``fuse.*`` in mountinfo), served here by
``sftp-server`` on a pipe (no sshd needed), with sshfs's own attribute and directory caches in the way.
Skipped with the reason where FUSE, sshfs or root is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chainrun.state.lease import Record
from chainrun.state.mounts import mount_type, read_mountinfo
from chainrun.state.store import Store
from tests.test_lease import ENV, RACER, write_record
from tests.test_store import LOCAL, header_modes, make_chain

SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/lib/sftp-server", "/usr/libexec/openssh/sftp-server")


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "mounting sshfs here needs root"
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse (the kernel or container refuses FUSE)"
    if not shutil.which("sshfs"):
        return "sshfs is not installed (apt-get install sshfs)"
    if not any(Path(p).exists() for p in SFTP_SERVERS):
        return "no sftp-server (openssh-sftp-server)"
    return None


@pytest.fixture
def shared_home(tmp_path) -> Path:
    why = _why_not()
    if why:
        pytest.skip(f"no fuse.sshfs mount: {why}")
    export, mnt = tmp_path / "export", tmp_path / "mnt"
    export.mkdir()
    mnt.mkdir()
    server = next(p for p in SFTP_SERVERS if Path(p).exists())
    direct = tmp_path / "sftp-direct"  # sshfs runs this in place of ssh: it speaks SFTP on stdin/stdout
    direct.write_text(f"#!/bin/sh\nexec {server}\n")
    direct.chmod(0o755)
    p = subprocess.run(["sshfs", "-o", f"ssh_command={direct}", f"localhost:{export}", str(mnt)],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        pytest.skip(f"sshfs mount refused: {(p.stderr or p.stdout).strip()[:200]}")
    try:
        yield mnt / "home"
    finally:  # lazily: a store a failed assertion left open must not keep the mount
        subprocess.run(["fusermount", "-u", "-z", str(mnt)], capture_output=True, timeout=60)


def test_the_store_on_a_fuse_mount_uses_a_rollback_journal(shared_home):
    assert mount_type(shared_home.parent, read_mountinfo()) == "fuse.sshfs"
    st = Store(shared_home / "state.sqlite")  # reads the real /proc/self/mountinfo
    assert st.journal_mode == "DELETE"
    st.add_chain(make_chain())
    st.close()
    assert header_modes(shared_home / "state.sqlite") == (1, 1)


def test_a_wal_store_on_the_mount_is_converted(shared_home):
    p = shared_home / "state.sqlite"
    st = Store(p, mountinfo=LOCAL)  # as an older chainrun left it: WAL
    st.add_chain(make_chain())
    st.close()
    if header_modes(p) != (2, 2):
        pytest.skip("this FUSE mount cannot hold a WAL database (no shared mmap): nothing to convert")
    st = Store(p)
    assert st.converted_from_wal and st.journal_mode == "DELETE" and st.chains()[0].id == make_chain().id
    st.close()
    assert header_modes(p) == (1, 1)


COUNTER = r"""
import sys
from chainrun.state.store import Store
st = Store(sys.argv[1])
for _ in range(int(sys.argv[2])):
    with st.tx() as db:  # read-modify-write: a lost update would show in the total
        v = db.execute("SELECT credited_s FROM chains").fetchone()[0]
        db.execute("UPDATE chains SET credited_s=?", (v + 1,))
"""


def test_writers_take_turns_on_the_mount(shared_home):
    db = shared_home / "state.sqlite"
    st = Store(db)
    st.add_chain(make_chain())
    procs = [subprocess.Popen([sys.executable, "-c", COUNTER, str(db), "40"], env=ENV) for _ in range(3)]
    assert [p.wait(300) for p in procs] == [0, 0, 0]
    assert st.chains()[0].credited_s == 120
    st.close()
    assert not (shared_home / "state.sqlite.write.lease").exists()


def test_exactly_one_contender_breaks_an_expired_lease_on_the_mount(shared_home):
    shared_home.mkdir(parents=True)
    path = shared_home / "w.lease"
    write_record(path, "login9", 4242, time.time() - 60)
    go = shared_home / "go"
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(path), str(go)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=ENV) for _ in range(4)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        answers = [p.stdout.readline().strip() for p in procs]
        winners = [p.pid for p, a in zip(procs, answers) if a == "won"]
        assert len(winners) == 1, answers
        assert Record.decode(path.read_bytes()).pid == winners[0]
    finally:
        for p in procs:
            p.kill()
            p.wait()
