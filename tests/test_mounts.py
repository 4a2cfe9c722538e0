"""Which filesystem holds the chainrun home, from /proc/self/mountinfo text (pure functions).

tests/data/mountinfo_login_node.txt: the first lines and the fuse.sshfs line were captured on the
test machine; the NFS, Lustre, GPFS, BeeGFS and CIFS lines are in the same format as on HPC login
nodes (optional fields such as ``shared:62`` and ``master:3`` included).
"""

from pathlib import Path

import pytest

from chainrun.state.mounts import is_network_fs, journal_mode_for, mount_type, parse_mountinfo

TEXT = (Path(__file__).parent / "data" / "mountinfo_login_node.txt").read_text()


@pytest.mark.parametrize("path, fstype, mode", [
    ("/root/.local/share/chainrun", "ext4", "WAL"),  # the root filesystem: local
    ("/home/alice/.local/share/chainrun", "nfs4", "DELETE"),  # the usual NFS home
    ("/home", "nfs4", "DELETE"),  # the mount point itself
    ("/home/alice/local disk/chainrun", "xfs", "WAL"),  # a local disk mounted inside the NFS home (\040)
    ("/scratch/alice/cr", "lustre", "DELETE"),
    ("/work/alice", "gpfs", "DELETE"),
    ("/projects/x", "beegfs", "DELETE"),
    ("/share/cr", "cifs", "DELETE"),
    ("/old/home", "nfs", "DELETE"),
    ("/tmp/nfs-h4/sshfs-mnt/home", "fuse.sshfs", "DELETE"),
    ("/tmp/x", "tmpfs", "WAL"),
    ("/scratch2/cr", "nfs4", "DELETE"),  # two mounts on one point: the later one is on top
    ("/scratchy/cr", "ext4", "WAL"),  # /scratch is a prefix of the string, not of the path
    ("/home2/cr", "ext4", "WAL"),
])
def test_mount_type_and_journal_mode(path, fstype, mode):
    assert mount_type(path, TEXT) == fstype
    assert journal_mode_for(path, TEXT) == mode


def test_unknown_filesystem_chooses_the_rollback_journal():
    assert journal_mode_for("/anything", None) == "DELETE"  # no /proc (macOS): safe everywhere
    assert journal_mode_for("/anything", "") == "DELETE"
    assert journal_mode_for("/anything", "garbage line\n\n") == "DELETE"


def test_parse_skips_lines_that_are_not_mountinfo():
    mounts = parse_mountinfo("not a line\n" + TEXT)
    assert ("/", "ext4") in mounts and ("/home/alice/local disk", "xfs") in mounts
    assert len(mounts) == len(TEXT.splitlines())


def test_network_types():
    for t in ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "fuse.sshfs", "fuse.gcsfuse"):
        assert is_network_fs(t), t
    for t in ("ext4", "xfs", "tmpfs", "btrfs", "fuseblk", "overlay", None):
        assert not is_network_fs(t), t
