#!/usr/bin/env python3
"""The state store on a shared home: writers through two mounts of one export, counted.

One export is mounted twice with sshfs (two clients with caches of their own, like two login
nodes; ``sftp-server`` on a pipe, no sshd needed; as root). Each round, ``--writers`` processes,
alternately through the two mounts, run ``--tx`` read-modify-write transactions on one store
(an increment and a 300-byte event each, so the file grows). The table says per round what was
committed, what the store counted, how many stale views the commit check met and waited out,
how many it refused, and how many updates were lost (committed but not counted).

``--cache kernel`` mounts with ``kernel_cache`` (pages kept across opens: no close-to-open at
all), ``--cache default`` with sshfs's defaults. ``--no-drop`` switches the page drop off
(as where posix_fadvise does nothing) and ``--no-check`` the commit check, to see what each
defence does alone (state/store.py).

Run (as root): .venv/bin/python bench/shared_home.py --cache kernel --no-drop --rounds 6
               .venv/bin/python bench/shared_home.py --cache kernel --no-drop --no-check --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chainrun.state.store import Store  # noqa: E402
from tests.test_store import make_chain  # noqa: E402

SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/lib/sftp-server", "/usr/libexec/openssh/sftp-server")

WRITER = r"""
import logging, os, sys
import chainrun.state.lease as lease
import chainrun.state.store as store
from chainrun.errors import StateError
path, n, drop, check = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
if not drop:
    lease.drop_cached_pages = store.drop_cached_pages = lambda fd: None
    store.read_uncached = lambda fd, size: os.pread(fd, size, 0)
if not check:
    _stale = store.Store._stale
    store.Store._stale = lambda self, db: _stale(self, db) and None  # still reads the commit number
store.STALE_WAIT_S = 5.0
waited = []
logging.basicConfig(level=logging.INFO, handlers=[type("H", (logging.Handler,), {
    "emit": lambda self, r: waited.append(1) if "opening it again" in r.getMessage() else None})()])
st = store.Store(path)
committed = refused = 0
for i in range(n):
    try:
        with st.tx() as db:
            v = db.execute("SELECT credited_s FROM chains").fetchone()[0]
            db.execute("UPDATE chains SET credited_s=?", (v + 1,))
            st._event("train-1a2b", None, "note", "x" * 300)
        committed += 1
    except StateError as e:
        if "older than its last commit" not in str(e):
            raise
        refused += 1
print(committed, refused, len(waited), flush=True)
"""


def mount_twice(root: Path, cache: str) -> list[Path]:
    server = next((p for p in SFTP_SERVERS if Path(p).exists()), None)
    if server is None or not shutil.which("sshfs"):
        sys.exit("needs sshfs and sftp-server (apt-get install sshfs)")
    direct = root / "sftp-direct"
    direct.write_text(f"#!/bin/sh\nexec {server}\n")
    direct.chmod(0o755)
    (root / "export").mkdir()
    opts = ["-o", "kernel_cache"] if cache == "kernel" else []
    mounts = []
    for name in ("a", "b"):
        mnt = root / name
        mnt.mkdir()
        subprocess.run(["sshfs", "-o", f"ssh_command={direct}", *opts, f"localhost:{root / 'export'}", str(mnt)],
                       check=True, timeout=60)
        mounts.append(mnt)
    return mounts


def one_round(mounts: list[Path], r: int, args) -> dict:
    folder = f"round{r}"
    (mounts[0] / folder).mkdir()
    st = Store(mounts[0] / folder / "state.sqlite")
    st.add_chain(make_chain())
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(mounts[i % 2] / folder / "state.sqlite"),
                               str(args.tx), str(int(not args.no_drop)), str(int(not args.no_check))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}) for i in range(args.writers)]
    outs = [p.communicate(timeout=1800) for p in procs]
    crashed = [err.strip().splitlines()[-1] for p, (_, err) in zip(procs, outs) if p.returncode != 0]
    counts = [tuple(map(int, out.split())) for p, (out, _) in zip(procs, outs) if p.returncode == 0]
    committed = sum(c[0] for c in counts)
    credited = int(st.chains()[0].credited_s)
    st.close()
    return {"round": r, "committed": committed, "credited": credited, "lost": committed - credited,
            "stale_waited": sum(c[2] for c in counts), "refused": sum(c[1] for c in counts), "crashed": crashed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", choices=("kernel", "default"), default="kernel")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--tx", type=int, default=15)
    ap.add_argument("--no-drop", action="store_true", help="switch the page drop off")
    ap.add_argument("--no-check", action="store_true", help="switch the commit check off")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("mounting sshfs needs root")
    root = Path(tempfile.mkdtemp(prefix="cr-shared-home-"))
    mounts = []
    try:
        mounts = mount_twice(root, args.cache)
        print(f"sshfs cache={args.cache} page drop={'off' if args.no_drop else 'on'} "
              f"commit check={'off' if args.no_check else 'on'}, {args.writers} writers x {args.tx}, "
              f"load {os.getloadavg()[0]:.1f}\n")
        print("| round | committed | credited | lost | stale views waited out | refused | crashed |")
        print("|---:|---:|---:|---:|---:|---:|---|")
        rows = []
        for r in range(args.rounds):
            row = one_round(mounts, r, args)
            rows.append(row)
            print(f"| {r} | {row['committed']} | {row['credited']} | {row['lost']} | {row['stale_waited']} | "
                  f"{row['refused']} | {'; '.join(row['crashed'])[:80]} |", flush=True)
        if args.json:
            args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))
    finally:
        for mnt in mounts:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
