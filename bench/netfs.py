"""A loopback network filesystem for a bench's run folders (bench/kill_soak.py --fs).

``nfs``: the kernel's NFS server exports ``ROOT/export`` to 127.0.0.1 and the kernel's NFS client
mounts it on ``ROOT/mnt`` (what production run folders sit on). ``sshfs``: a stand-in where the
kernel has no NFS: FUSE over SFTP to a private sshd on 127.0.0.1 (scripts/start-sshd.sh), with
sshfs's own attribute and directory caches. Both need root. ``mount()`` answers a Mount, or None
and the exact command that refused and what it said; ``Mount.undo()`` takes down only what it set up.
"""

from __future__ import annotations

import gzip
import os
import platform
import pwd
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Mount:
    kind: str
    path: Path
    fstype: str
    options: str
    undo_argv: list = field(default_factory=list)  # run in order by undo()

    def undo(self) -> None:
        for argv, env in self.undo_argv:
            subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def _run(argv: list[str], env: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    """Exit code and the first line the command said (stderr first)."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    except FileNotFoundError:
        return 127, f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, f"no answer in {timeout:.0f} s"
    lines = (p.stderr.strip() or p.stdout.strip()).splitlines()
    return p.returncode, lines[0].strip() if lines else ""


def _refused(argv: list[str], rc: int, said: str) -> str:
    return f"`{' '.join(map(str, argv))}` exited {rc}: {said or '(nothing said)'}"


def _kernel_note() -> str:
    """What the kernel's build says about network filesystems, where it tells (/proc/config.gz)."""
    try:
        conf = gzip.open("/proc/config.gz", "rt").read()
    except OSError:
        return ""
    if "# CONFIG_NETWORK_FILESYSTEMS is not set" in conf:
        return f"; kernel {platform.release()} is built without network filesystems (CONFIG_NETWORK_FILESYSTEMS unset)"
    return ""


def _fstype(path: Path) -> tuple[str, str]:
    p = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,OPTIONS", str(path)], capture_output=True, text=True)
    parts = p.stdout.split(None, 1)
    return (parts[0], parts[1].strip()) if p.returncode == 0 and len(parts) == 2 else ("", "")


def nfs(root: Path) -> tuple[Mount | None, str]:
    export, mnt = root / "export", root / "mnt"
    export.mkdir(parents=True, exist_ok=True)
    mnt.mkdir(parents=True, exist_ok=True)
    undo: list = []
    if not Path("/proc/fs/nfsd/threads").exists():  # the kernel's NFS server is not set up yet
        argv = ["mount", "-t", "nfsd", "nfsd", "/proc/fs/nfsd"]
        rc, said = _run(argv)
        if rc != 0:  # try the client on its own too, so the answer names both halves
            why = "the server: " + _refused(argv, rc, said)
            argv = ["mount", "-t", "nfs4", "127.0.0.1:/", str(mnt)]
            rc, said = _run(argv, timeout=30)
            if rc != 0:
                why += "; the client: " + _refused(argv, rc, said)
            else:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
            return None, why + _kernel_note()
        undo.insert(0, (["umount", "/proc/fs/nfsd"], {}))
    # rpcbind and rpc.mountd stay running afterwards (daemons a host with NFS keeps anyway)
    for argv in (["rpcbind", "-w"], ["exportfs", "-o", "rw,sync,no_root_squash,no_subtree_check",
                                      f"127.0.0.1:{export}"],
                 ["rpc.nfsd", "8"], ["rpc.mountd"], ["mount", "-t", "nfs", "-o", "vers=4.2,hard",
                                                     f"127.0.0.1:{export}", str(mnt)]):
        rc, said = _run(argv)
        if rc != 0:
            Mount("nfs", mnt, "", "", undo).undo()
            return None, _refused(argv, rc, said) + _kernel_note()
        if argv[0] == "exportfs":
            undo.insert(0, (["exportfs", "-u", f"127.0.0.1:{export}"], {}))
        elif argv[0] == "rpc.nfsd":
            undo.insert(0, (["rpc.nfsd", "0"], {}))
        elif argv[0] == "mount":
            undo.insert(0, (["umount", "-l", str(mnt)], {}))
    fstype, options = _fstype(mnt)
    return Mount("nfs", mnt, fstype, options, undo), ""


def sshfs(root: Path, port: int) -> tuple[Mount | None, str]:
    """sshfs as the test user of scripts/start-sshd.sh; its export folder belongs to that user."""
    sshd_dir, export, mnt = root / "sshd", root / "export", root / "mnt"
    env = {"CHAINRUN_SSH_PORT": str(port)}
    argv = ["bash", str(REPO / "scripts" / "start-sshd.sh"), str(sshd_dir)]
    rc, said = _run(argv, env=env, timeout=300)
    if rc != 0:
        return None, _refused(argv, rc, said)
    undo = [(["bash", str(REPO / "scripts" / "stop-sshd.sh"), str(sshd_dir)], env)]
    user = os.environ.get("CHAINRUN_SSH_USER", "chainrun")
    export.mkdir(parents=True, exist_ok=True)
    mnt.mkdir(parents=True, exist_ok=True)
    pw = pwd.getpwnam(user)
    os.chown(export, pw.pw_uid, pw.pw_gid)
    argv = ["sshfs", f"{user}@127.0.0.1:{export}", str(mnt), "-p", str(port), "-o",
            f"IdentityFile={sshd_dir / 'id_ed25519'},UserKnownHostsFile={sshd_dir / 'known_hosts'},"
            "StrictHostKeyChecking=yes,BatchMode=yes,allow_other,reconnect,ServerAliveInterval=5"]
    rc, said = _run(argv)
    if rc != 0:
        Mount("sshfs", mnt, "", "", undo).undo()
        return None, _refused(argv, rc, said)
    undo.insert(0, (["umount", "-l", str(mnt)], {}))
    fstype, options = _fstype(mnt)
    return Mount("sshfs", mnt, fstype, options, undo), ""
