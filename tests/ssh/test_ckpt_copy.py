"""Checkpoint copies between real sites (chainrun/chain/ckpt_copy.py): this machine (the driver,
LocalRunner), and two folders of the `chainrun` user reached over the OpenSSH transport (aliases
cra and crb of the test sshd on 127.0.0.1:2222; each its own ControlMaster). The remote files are
on this machine too, so a test looks at them directly as an independent witness.

Proven here: a copy verified and renamed into place, by both routes (through the driver: pull,
stage, push; direct: the source's login node runs rsync to the destination with its own key); a
copy killed mid-transfer leaves the destination's latest unchanged and a re-run completes it
(sending only the rest); a byte corrupted on arrival fails verification and nothing is made
latest; the one-line errors (rsync missing, permission denied, no direct login, disk full);
a copied template checkpoint resumes the template; unused copies are cleaned up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from chainrun.chain import ckpt_cleanup, ckpt_copy, ckpt_manifest
from chainrun.clusters import Cluster
from chainrun.errors import CopyError, CopyPermissionDenied, DiskFull, RsyncMissing, VerifyMismatch
from chainrun.runner.local import LocalRunner
from chainrun.runner.openssh import OpenSSHRunner
from tests.conftest import REPO
from tests.ssh.conftest import REMOTE_HOME, REMOTE_USER, host_block

pytestmark = pytest.mark.ssh


def make_checkpoint(ckpt: Path, generation: int, step: int, sizes: dict[str, int], *, owner: str | None = None) -> Path:
    """A checkpoint laid out as the templates' publish() leaves it: the folder, then its marker."""
    folder = ckpt / f"step-{step:09d}.g{generation}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in sizes.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(os.urandom(size))
    rec = {"generation": generation, "step": step, "folder": folder.name, "files": sizes, "time": time.time(),
           "job": None, "segment": "0"}
    (ckpt / f"latest.g{generation}.json").write_text(json.dumps(rec))
    if owner:
        subprocess.run(["chown", "-R", f"{owner}:{owner}", str(ckpt)], check=True)
    return folder


def same_tree(a: Path, b: Path) -> bool:
    files = lambda root: {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}  # noqa: E731
    return files(a) == files(b)


@pytest.fixture
def sites(tmp_path, ssh_server, openssh_env):
    """here (this machine), a and b (folders of the chainrun user over OpenSSH), and their paths."""
    openssh_env(host_block("cra", ssh_server) + host_block("crb", ssh_server))
    base = REMOTE_HOME / f"cr-ckpt-{uuid.uuid4().hex[:10]}"
    base.mkdir()
    shutil.chown(base, REMOTE_USER, REMOTE_USER)
    ra = OpenSSHRunner(Cluster(name="a", host="cra", transport="openssh"))
    rb = OpenSSHRunner(Cluster(name="b", host="crb", transport="openssh"))
    s = {
        "here": ckpt_copy.site_for("here", LocalRunner(), str(tmp_path / "here")),
        "a": ckpt_copy.site_for("a", ra, str(base / "a")),
        "b": ckpt_copy.site_for("b", rb, str(base / "b")),
        "base": base,
        "staging": tmp_path / "staging",
    }
    yield s
    shutil.rmtree(base, ignore_errors=True)


def test_manifest_over_ssh_is_the_newest_complete_checkpoint(sites):
    a = Path(sites["a"].ckpt_dir)
    make_checkpoint(a, 1, 500, {"model.pt": 3000})
    make_checkpoint(a, 2, 100, {"model.pt": 2000, "opt/state.pt": 1000}, owner=REMOTE_USER)
    (a / "step-000000200.g2").mkdir()  # a save killed before its marker: never the newest
    m = ckpt_manifest.manifest(sites["a"].runner, str(a))
    assert (m.kind, m.name, m.generation, m.step, m.marker) == ("folder", "step-000000100.g2", 2, 100, "latest.g2.json")
    assert {f.path: f.size for f in m.files} == {"model.pt": 2000, "opt/state.pt": 1000}
    assert m.marker_text == (a / "latest.g2.json").read_text()
    # the size alone (what a first move is weighed by, chain/ckpt_size_probe.py): the same checkpoint's bytes
    assert ckpt_manifest.newest_size(sites["a"].runner, str(a)) == 3000
    assert ckpt_manifest.newest_size(sites["a"].runner, str(a / "none-yet")) is None  # no folder: none saved


def test_through_the_driver_remote_to_remote_is_verified_and_renamed(sites):
    a, b = Path(sites["a"].ckpt_dir), Path(sites["b"].ckpt_dir)
    src = make_checkpoint(a, 3, 300, {"model.pt": 3 << 20, "opt/state.pt": 1 << 20}, owner=REMOTE_USER)
    seen: list[dict] = []
    r = ckpt_copy.copy_checkpoint(sites["a"], sites["b"], staging_dir=sites["staging"], poll_s=0.2,
                                  on_progress=lambda p: seen.append(p.to_dict()),
                                  progress_file=sites["staging"].parent / "progress.json")
    assert r.route == "driver" and [leg.name for leg in r.legs] == ["pull", "push"]
    assert all(leg.bytes_moved == 4 << 20 for leg in r.legs) and r.throughput_Bps > 0
    assert same_tree(src, b / src.name) and (b / "latest.g3.json").read_text() == (a / "latest.g3.json").read_text()
    assert not [p for p in b.iterdir() if p.name.startswith(ckpt_copy.INCOMING)]  # the partial name is gone
    assert not (sites["staging"] / "a-b" / src.name).exists()  # the staging copy too
    assert all(p.stat().st_uid == (b / "..").stat().st_uid for p in b.rglob("*"))  # the chainrun user's files
    states = [s["state"] for s in seen]
    assert states[0] == "manifest" and "copying" in states and states[-2:] == ["verifying", "done"]
    done = json.loads((sites["staging"].parent / "progress.json").read_text())
    assert done["state"] == "done" and done["bytes_done"] == done["bytes_total"] == 2 * (4 << 20)
    again = ckpt_copy.copy_checkpoint(sites["a"], sites["b"], staging_dir=sites["staging"])
    assert again.already and again.legs == ()


def test_direct_route_site_to_site_with_the_source_sites_own_key(sites, ssh_server):
    base = sites["base"]
    key, kh = base / "key", base / "known_hosts"  # what a user puts on site a to reach site b
    shutil.copy(ssh_server.key, key)
    shutil.copy(ssh_server.known_hosts, kh)
    for p in (key, kh):
        shutil.chown(p, REMOTE_USER, REMOTE_USER)
    key.chmod(0o600)
    to_b = ckpt_copy.DirectRoute(f"{REMOTE_USER}@127.0.0.1", ("-p", str(ssh_server.port), "-i", str(key), "-o",
                                 "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={kh}"))
    src_site = ckpt_copy.CopySite(**{**sites["a"].__dict__, "direct": {"b": to_b}})
    a, b = Path(src_site.ckpt_dir), Path(sites["b"].ckpt_dir)
    src = make_checkpoint(a, 4, 40, {"model.pt": 2 << 20}, owner=REMOTE_USER)
    r = ckpt_copy.copy_checkpoint(src_site, sites["b"], poll_s=None)
    assert r.route == "direct" and [leg.name for leg in r.legs] == ["direct"]
    assert same_tree(src, b / src.name) and (b / "latest.g4.json").exists()

    no_key = ckpt_copy.DirectRoute(f"{REMOTE_USER}@127.0.0.1", ("-p", str(ssh_server.port), "-i", str(base / "nokey"),
                                   "-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={kh}"))
    make_checkpoint(a, 5, 50, {"model.pt": 1000}, owner=REMOTE_USER)
    with pytest.raises(CopyPermissionDenied) as e:
        ckpt_copy.copy_checkpoint(ckpt_copy.CopySite(**{**src_site.__dict__, "direct": {"b": no_key}}), sites["b"])
    assert "a cannot log in to b without a prompt" in str(e.value) and "\n" not in str(e.value)
    assert not (b / "latest.g5.json").exists()
    assert src_site.runner.run(["true"]).ok  # the inner ssh's refusal is not taken for the transport's own

    no_rsync = ckpt_copy.CopySite(**{**src_site.__dict__, "rsync": "/nonexistent/rsync"})
    with pytest.raises(RsyncMissing) as e:
        ckpt_copy.copy_checkpoint(no_rsync, sites["b"])
    assert "rsync is not installed on a" in str(e.value) and "\n" not in str(e.value)


def _rsync_pids(marker: str) -> list[int]:
    """Our own rsync processes (children of this test) whose command line names ``marker``."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if argv and argv[0].endswith(b"rsync") and ppid == os.getpid() and any(marker.encode() in a for a in argv):
            out.append(int(d.name))
    return out


def test_a_copy_killed_mid_transfer_leaves_latest_and_a_rerun_completes_it(sites):
    here, b = Path(sites["here"].ckpt_dir), Path(sites["b"].ckpt_dir)
    old = make_checkpoint(b, 1, 100, {"model.pt": 1000}, owner=REMOTE_USER)  # the destination's latest so far
    old_marker = (b / "latest.g1.json").read_text()
    src = make_checkpoint(here, 2, 200, {"model.pt": 24 << 20})
    partial = b / f"{ckpt_copy.INCOMING}{src.name}"
    failed: dict = {}

    def copy() -> None:
        try:
            ckpt_copy.copy_checkpoint(sites["here"], sites["b"], bwlimit_kbps=2048, poll_s=0.5)
        except CopyError as e:
            failed["error"] = e

    t = threading.Thread(target=copy)
    t.start()
    try:
        end = time.monotonic() + 120
        while sum(p.stat().st_size for p in partial.rglob("*") if p.is_file()) < 2 << 20:  # ~1 s of sending
            assert time.monotonic() < end and t.is_alive(), failed
            time.sleep(0.1)
        pids = _rsync_pids(str(partial))
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGTERM)
    finally:
        t.join(120)
    assert "interrupted" in str(failed["error"]) and "\n" not in str(failed["error"])
    assert (b / "latest.g1.json").read_text() == old_marker and not (b / "latest.g2.json").exists()
    assert not (b / src.name).exists() and old.exists()
    kept = sum(p.stat().st_size for p in partial.rglob("*") if p.is_file())
    assert 0 < kept < 24 << 20  # --partial kept what had arrived

    r = ckpt_copy.copy_checkpoint(sites["here"], sites["b"], poll_s=None)
    assert same_tree(src, b / src.name) and (b / "latest.g2.json").exists() and not partial.exists()
    assert r.legs[0].bytes_moved <= (24 << 20) - kept + (1 << 20)  # only the rest was sent (and a block)


def test_a_byte_corrupted_on_arrival_fails_verification_and_nothing_is_latest(sites):
    a, b = Path(sites["a"].ckpt_dir), Path(sites["b"].ckpt_dir)
    src = make_checkpoint(a, 2, 20, {"model.pt": 1 << 20, "rng.pt": 100}, owner=REMOTE_USER)
    man = ckpt_manifest.manifest(sites["a"].runner, str(a))
    partial, _ = ckpt_copy.send(sites["a"], sites["b"], man, staging_dir=sites["staging"], poll_s=None)
    bad = Path(partial) / "model.pt"
    data = bytearray(bad.read_bytes())
    data[12345] ^= 0x01  # one bit, same size, same mtime: rsync's quick check would never see it
    bad.write_bytes(bytes(data))
    os.utime(bad, ns=(src.joinpath("model.pt").stat().st_atime_ns, src.joinpath("model.pt").stat().st_mtime_ns))
    with pytest.raises(VerifyMismatch) as e:
        ckpt_copy.land(sites["b"], man, partial, source="a")
    assert "model.pt sha256 differs" in str(e.value) and "not made latest" in str(e.value)
    assert not (b / "latest.g2.json").exists() and not (b / src.name).exists()
    assert not bad.exists() and (Path(partial) / "rng.pt").exists()  # the bad file goes; the good one stays
    r = ckpt_copy.copy_checkpoint(sites["a"], sites["b"], staging_dir=sites["staging"], poll_s=None)
    assert same_tree(src, b / src.name) and (b / "latest.g2.json").exists() and not r.already
    # the re-run resumed both legs: the staged files were complete, and only the removed file went again
    assert [(leg.name, leg.bytes_moved) for leg in r.legs] == [("pull", 0), ("push", 1 << 20)]


def test_one_line_errors_rsync_missing_permission_denied_disk_full(sites, tmp_path):
    a = Path(sites["a"].ckpt_dir)
    make_checkpoint(a, 1, 10, {"model.pt": 3 << 20}, owner=REMOTE_USER)
    no_rsync = ckpt_copy.CopySite(**{**sites["b"].__dict__, "rsync": "/nonexistent/rsync"})
    with pytest.raises(RsyncMissing) as e:
        ckpt_copy.copy_checkpoint(sites["a"], no_rsync, staging_dir=sites["staging"], poll_s=None)
    assert "rsync is not installed on b" in str(e.value) and "\n" not in str(e.value)

    locked = ckpt_copy.CopySite(**{**sites["b"].__dict__, "ckpt_dir": "/root/chainrun-not-yours/ckpt"})
    with pytest.raises(CopyPermissionDenied) as e:
        ckpt_copy.copy_checkpoint(sites["a"], locked, staging_dir=sites["staging"], poll_s=None)
    assert "Permission denied" in str(e.value) and "\n" not in str(e.value)

    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)]).returncode != 0:
        pytest.fail("cannot mount a 1 MB tmpfs (the disk-full case needs root)")
    try:
        full = ckpt_copy.site_for("tiny", LocalRunner(), str(small / "ckpt"))
        with pytest.raises(DiskFull) as e:
            ckpt_copy.copy_checkpoint(sites["a"], full, poll_s=None)
        assert "no space left" in str(e.value) and "\n" not in str(e.value)
        assert not (small / "ckpt" / "latest.g1.json").exists()
    finally:
        subprocess.run(["umount", str(small)])


def test_a_copied_template_checkpoint_resumes_the_template_and_unused_copies_are_cleaned_up(sites, tmp_path):
    pytest.importorskip("torch")  # the templates extra (scripts/test.sh installs it; `--core` does not)
    here = Path(sites["here"].ckpt_dir)
    env = {**os.environ, "CHAINRUN_CHECKPOINT_DIR": str(here), "CHAINRUN_GENERATION": "3", "MAX_STEPS": "30",
           "SAVE_EVERY": "10", "CHAINRUN_DONE_FILE": str(tmp_path / "done")}
    train = REPO / "chainrun" / "templates" / "pytorch" / "train.py"
    p = subprocess.run([sys.executable, str(train)],
                       env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    ckpt_copy.copy_checkpoint(sites["here"], sites["a"], poll_s=None)  # push to a...
    back = ckpt_copy.site_for("back", LocalRunner(), str(tmp_path / "back"))
    r = ckpt_copy.copy_checkpoint(sites["a"], back, poll_s=None)  # ...and pull to another folder here
    assert (r.manifest.generation, r.manifest.step) == (3, 30)
    env.update(CHAINRUN_CHECKPOINT_DIR=back.ckpt_dir, CHAINRUN_GENERATION="4", MAX_STEPS="40")
    p = subprocess.run([sys.executable, str(train)], env=env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert p.returncode == 0 and "resumed from step 30 (step-000000030.g3)" in p.stdout, p.stdout + p.stderr

    a = Path(sites["a"].ckpt_dir)
    trained = make_checkpoint(a, 5, 50, {"model.pt": 100}, owner=REMOTE_USER)  # one a trained itself
    stale = a / f"{ckpt_copy.INCOMING}step-000000060.g3"  # a copy abandoned mid-way
    stale.mkdir()
    shutil.chown(stale, REMOTE_USER, REMOTE_USER)
    kept = ckpt_cleanup.cleanup_unused(sites["a"], keep=["step-000000030.g3"], partial_age_s=3600)
    assert (a / "step-000000030.g3").exists() and stale.exists() and kept.remove == ()
    gone = ckpt_cleanup.cleanup_unused(sites["a"], partial_age_s=0)
    assert set(gone.remove) == {"latest.g3.json", "step-000000030.g3", ".chainrun-copied.step-000000030.g3.json",
                                stale.name}
    assert sorted(p.name for p in a.iterdir()) == ["latest.g5.json", trained.name]
