"""Which filesystem a path is on, read from ``/proc/self/mountinfo``: pure functions over its text.

The store needs to know whether the chainrun home is shared between hosts: SQLite's WAL mode
keeps its index in shared memory (``-shm``), which other hosts cannot see, so on a network
filesystem the store uses a rollback journal (``journal_mode=DELETE``) instead.
"""

from __future__ import annotations

import os
from pathlib import Path

# filesystems other hosts may have mounted too (fuse.* covers sshfs, gcsfuse, s3fs, ...)
NETWORK_FS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "glusterfs", "afs",
                        "panfs", "wekafs", "9p"})


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo octal."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and len(field[i + 1:i + 4]) == 3 and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) per line, in the file's order (later mounts stack on earlier ones)."""
    mounts = []
    for line in text.splitlines():
        parts = line.split(" ")
        if "-" not in parts[6:]:
            continue  # not a mountinfo line
        sep = parts.index("-", 6)
        if sep + 1 >= len(parts):
            continue
        mounts.append((_unescape(parts[4]), parts[sep + 1]))
    return mounts


def mount_type(path: str | os.PathLike, mountinfo: str) -> str | None:
    """The filesystem type of the mount that holds ``path`` (absolute, already resolved), or None if unknown."""
    p = str(path).rstrip("/") or "/"
    best: tuple[int, str] | None = None
    for point, fstype in parse_mountinfo(mountinfo):
        point = point.rstrip("/") or "/"
        if p == point or point == "/" or p.startswith(point + "/"):
            if best is None or len(point) >= best[0]:  # the longest prefix; the later of equal ones
                best = (len(point), fstype)
    return best[1] if best else None


def is_network_fs(fstype: str | None) -> bool:
    if fstype is None:
        return False
    return fstype in NETWORK_FS or fstype.startswith("fuse.")


def journal_mode_for(path: str | os.PathLike, mountinfo: str | None) -> str:
    """``DELETE`` on a network filesystem, ``WAL`` on a local one. Without mountinfo (macOS, no /proc) the
    filesystem is unknown: ``DELETE``, which is safe everywhere (WAL only makes readers wait less)."""
    if mountinfo is None:
        return "DELETE"
    fstype = mount_type(path, mountinfo)
    if fstype is None:
        return "DELETE"
    return "DELETE" if is_network_fs(fstype) else "WAL"


def read_mountinfo() -> str | None:
    try:
        return Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None


def existing_parent(path: Path) -> Path:
    """The path itself if it exists, else its nearest existing ancestor, resolved (symlinks followed)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p.resolve()
