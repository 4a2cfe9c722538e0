"""Throughput of checkpoint copies (chainrun/chain/ckpt_copy.py) over the local test sshd, per size and route.

Needs scripts/start-sshd.sh (as root: the remote folders belong to its `chainrun` user). Sites:
`here` (this machine) and `a`, `b` (two folders of the chainrun user, each reached over the
OpenSSH transport with its own alias). Routes: push (here -> a), pull (a -> here), driver (a -> b:
pull to a staging folder here, then push), direct (a's login node runs rsync to b with its own
key). Each copy is a fresh checkpoint of random bytes (nothing to delta against), verified and put
in place as in production. copy MB/s: the whole copy (manifest, rsync, verification, rename), what
a move costs (transfer time = size / copy_Bps); rsync MB/s: rsync's legs alone (the network and
ssh). On loopback the numbers are CPU bound (ssh's cipher, sha256 on both ends), not network bound: a ceiling, not a site's figure.

    .venv/bin/python bench/ckpt_copy.py [--sizes 16,64,256] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SSHD = Path(os.environ.get("CHAINRUN_SSH_DIR", "/tmp/chainrun-sshd"))
PORT = 2222
USER = "chainrun"


def host_block(alias: str) -> str:
    return (f"Host {alias}\n  HostName 127.0.0.1\n  Port {PORT}\n  User {USER}\n  IdentityFile {SSHD / 'id_ed25519'}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {SSHD / 'known_hosts'}\n")


def make_checkpoint(ckpt: Path, generation: int, step: int, size: int) -> None:
    """The templates' layout: step-<step>.g<G>/ with a model and an optimizer file, then the marker."""
    folder = ckpt / f"step-{step:09d}.g{generation}"
    folder.mkdir(parents=True)
    sizes = {"model.pt": size * 2 // 3, "optimizer.pt": size - size * 2 // 3}
    for name, n in sizes.items():
        with open(folder / name, "wb") as f:
            for left in range(n, 0, -(1 << 20)):
                f.write(os.urandom(min(left, 1 << 20)))
    (ckpt / f"latest.g{generation}.json").write_text(json.dumps(
        {"generation": generation, "step": step, "folder": folder.name, "files": sizes}))
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(ckpt)], check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,64,256", help="checkpoint sizes in MiB, comma-separated")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/ckpt_copy.py needs root (the remote folders belong to the test sshd's user)")
    if subprocess.run(["bash", str(REPO / "scripts" / "start-sshd.sh"), str(SSHD)], capture_output=True).returncode:
        sys.exit("the test sshd did not start (scripts/start-sshd.sh)")
    tmp = Path(tempfile.mkdtemp(prefix="crbench", dir="/tmp"))
    os.environ["CHAINRUN_SSH_CONTROL_DIR"] = str(tmp / "cm")
    os.environ["CHAINRUN_SSH_CONFIG"] = str(tmp / "ssh_config")
    os.environ["CHAINRUN_HOME"] = str(tmp / "home")
    (tmp / "ssh_config").write_text(host_block("cra") + host_block("crb"))
    base = Path(f"/home/{USER}/cr-bench-{uuid.uuid4().hex[:8]}")
    base.mkdir()
    shutil.copy(SSHD / "id_ed25519", base / "key")
    shutil.copy(SSHD / "known_hosts", base / "known_hosts")
    (base / "key").chmod(0o600)
    subprocess.run(["chown", "-R", f"{USER}:{USER}", str(base)], check=True)

    from chainrun.chain import ckpt_copy
    from chainrun.clusters import Cluster
    from chainrun.runner.local import LocalRunner
    from chainrun.runner.openssh import OpenSSHRunner

    to_b = ckpt_copy.DirectRoute(f"{USER}@127.0.0.1", ("-p", str(PORT), "-i", str(base / "key"), "-o",
                                 "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={base / 'known_hosts'}"))
    rows = []
    try:
        for mib in (int(s) for s in args.sizes.split(",")):
            for route, src_name, dst_name in (("push", "here", "a"), ("pull", "a", "here"), ("driver", "a", "b"),
                                              ("direct", "a", "b")):
                run = base / f"{mib}-{route}"
                dirs = {"here": tmp / f"{mib}-{route}-here", "a": run / "a", "b": run / "b"}
                run.mkdir()
                shutil.chown(run, USER, USER)
                sites = {
                    "here": ckpt_copy.site_for("here", LocalRunner(), str(dirs["here"])),
                    "a": ckpt_copy.site_for("a", OpenSSHRunner(Cluster(name="a", host="cra", transport="openssh")),
                                            str(dirs["a"]), direct={"b": to_b}),
                    "b": ckpt_copy.site_for("b", OpenSSHRunner(Cluster(name="b", host="crb", transport="openssh")),
                                            str(dirs["b"])),
                }
                make_checkpoint(dirs[src_name], 1, 100, mib << 20)
                t0 = time.monotonic()
                r = ckpt_copy.copy_checkpoint(sites[src_name], sites[dst_name], route="direct" if route == "direct"
                                              else "driver", staging_dir=tmp / "staging", poll_s=None)
                total = time.monotonic() - t0
                rsync_s = sum(leg.seconds for leg in r.legs)
                rows.append({"mib": mib, "route": route, "legs": len(r.legs), "copy_s": round(total, 2),
                             "rsync_s": round(rsync_s, 2), "rsync_MBps": round((r.throughput_Bps or 0) / 1e6, 1),
                             "copy_MBps": round((r.copy_Bps or 0) / 1e6, 1)})
                shutil.rmtree(run, ignore_errors=True)
                shutil.rmtree(dirs["here"], ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        for sock in (tmp / "cm").glob("*"):
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'MiB':>5} {'route':<7} {'legs':>4} {'copy s':>7} {'rsync s':>8} {'copy MB/s':>10} {'rsync MB/s':>11}")
    for row in rows:
        print(f"{row['mib']:>5} {row['route']:<7} {row['legs']:>4} {row['copy_s']:>7.2f} {row['rsync_s']:>8.2f} "
              f"{row['copy_MBps']:>10.1f} {row['rsync_MBps']:>11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
