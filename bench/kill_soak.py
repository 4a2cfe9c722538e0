#!/usr/bin/env python3
"""Kill soak: real chains on the local Slurm while the watcher is SIGKILLed at random moments.

Three chains (dependency, lead and predicted policy, 1-minute segments; the predicted one with
a model trained by `chainrun model refresh` on the cluster's history) run on node n4 of the test
cluster; `chainrun watch` is killed with SIGKILL every 1-10 s (a share of the kills land
right after a successful sbatch, before the job is recorded: the worst moment) and restarted
each time, then a last watcher drives the chains to the end. The audit reads Slurm's
accounting and the toy trainer's step log: every chain completed, one Slurm job per segment
index, no recorded job missing, steps continuous, no two segments training at once, and every
early submission of the predicted chain carried the model's estimate (not the lead fallback).

Needs scripts/start-cluster.sh. Prints one markdown table row per round and a JSON summary.

With ``--fs`` the chains' run folders (control files, checkpoints, the toy's step log) sit on a
loopback network filesystem (bench/netfs.py, as root); the state store stays local. ``nfs``: the
kernel's NFS server and client; where the kernel refuses, the bench says which command refused and
what it said, records that, and stops (exit 0). ``sshfs``: FUSE over SFTP to 127.0.0.1, a network
filesystem with client-side attribute and listing caches. ``auto``: NFS, else sshfs, with NFS's
refusal recorded. The figures go to docs/results/kill-soak-netfs.json and the block between
``<!-- kill-soak-netfs:begin -->`` and ``<!-- kill-soak-netfs:end -->`` of docs/reliability.md.

Run: .venv/bin/python bench/kill_soak.py [--kills 50] [--rounds 1] [--total 6m] [--seed 50]
     .venv/bin/python bench/kill_soak.py --fs auto --kills 30 --total 4m --seed 70
     .venv/bin/python bench/kill_soak.py --check   # exit 1 if the doc's block is not the JSON's rendering
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _results import head_state, sync_doc  # noqa: E402  (bench/ is on sys.path when a bench runs)
from tests.reliability import harness as h  # noqa: E402

OUT = ROOT / "docs" / "results" / "kill-soak-netfs.json"
DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- kill-soak-netfs:begin -->", "<!-- kill-soak-netfs:end -->"
HEAD = ("| round | seed | kills | of which right after sbatch | restarts | adopted | segments | duplicates "
        "| losses | unfinished | training faults | predicted decisions with a model | seconds |")

N4 = ["--", "--exclude=n1,n2,n3"]


def one_round(kills: int, total: str, seed: int, base: Path, runs: Path | None = None) -> dict:
    """``runs``: where the chains are submitted from, so where their run folders are (default: ``base``)."""
    home = base / "home"
    work = runs or base
    shim = base / "shim"
    h.kill_after_sbatch_shim(base / "bin", shim)
    h.train_model(home)
    since = time.time()
    h.submit(home, work / "dep", "soakdep", "--total", total, "--policy", "dependency", *h.SEG, *N4)
    h.submit(home, work / "lead", "soaklead", "--total", total, "--policy", "lead", "--lead", "10s", *h.SEG, *N4)
    pred = h.submit(home, work / "pred", "soakpred", "--total", total, "--policy", "predicted", "--lead", "50s",
                    "--segment", "2m", "--signal", "USR2@20", *N4)
    env = {"PATH": f"{base / 'bin'}:{os.environ['PATH']}"}
    st = h.kill_loop(home, kills=kills, rng=random.Random(seed), log=base / "watch.log", env=env,
                     shim_state=shim, sbatch_share=0.15, min_shim_kills=3, min_s=1, max_s=10, timeout=3600)
    audit = h.audit(home, since)
    segs = sum(c["segments"] for c in audit["chains"].values())
    return {"seed": seed, "kills": st.kills, "kills_after_sbatch": st.shim_kills, "restarts": st.restarts,
            "odd_exits": st.odd_exits, "final_rc": st.final_rc, "seconds": round(st.seconds),
            "adopted": len(h.events(home, "adopted")), "segments": segs,
            "predicted": h.model_decisions(home, pred), **{k: audit[k] for k in
            ("duplicates", "losses", "unfinished", "training_faults")}, "chains": audit["chains"],
            "log": str(base / "watch.log")}


def row(r: int, res: dict) -> str:
    return (f"| {r} | {res['seed']} | {res['kills']} | {res['kills_after_sbatch']} | {res['restarts']} | "
            f"{res['adopted']} | {res['segments']} | {res['duplicates']} | {res['losses']} | {res['unfinished']} | "
            f"{res['training_faults']} | {res['predicted']['with_model']}/{res['predicted']['later_segments']} | "
            f"{res['seconds']} |")


def render(doc: dict) -> str:
    fs = doc["fs"]
    lines = [f"`.venv/bin/python bench/{doc['command']}` (commit {doc['commit'][:7]}"
             f"{', uncommitted changes' if doc['dirty'] else ''}; `docs/results/kill-soak-netfs.json`)."]
    if fs.get("nfs_refused"):
        lines.append(f"Loopback NFS was refused on the machine measured: {fs['nfs_refused']}.")
    if not doc.get("rounds"):
        return "\n".join(lines + ["No round ran."])
    lines += [f"The run folders on `{fs['fstype']}` ({fs['kind']} to 127.0.0.1, mounted `{fs['options']}`); "
              "the state store on the local disk:", "", HEAD, "|---:" * 13 + "|"]
    lines += [row(i + 1, res) for i, res in enumerate(doc["rounds"])]
    return "\n".join(lines)


def rendered_doc(text: str, doc: dict) -> str:
    if BEGIN not in text:
        return text
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{render(doc)}\n{END}{tail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--total", default="6m", help="training per chain (--total counts training time)")
    ap.add_argument("--seed", type=int, default=50)
    ap.add_argument("--json", type=Path, help="also write the summary here")
    ap.add_argument("--fs", choices=("local", "nfs", "sshfs", "auto"), default="local",
                    help="where the run folders are: the local disk, or a loopback network filesystem (root)")
    ap.add_argument("--fs-dir", type=Path, default=Path("/tmp/chainrun-netfs"),
                    help="the network filesystem's folders (export, mount point, sshd)")
    ap.add_argument("--ssh-port", type=int, default=2288, help="the private sshd's port for --fs sshfs")
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/reliability.md's block is out of date")
    ap.add_argument("--render", action="store_true", help="only re-render docs/reliability.md's block")
    a = ap.parse_args()
    if a.check or a.render:
        doc = json.loads(OUT.read_text())
        return sync_doc(DOC, lambda text: rendered_doc(text, doc), check=a.check)
    t0 = time.monotonic()
    mount, fs = None, {"asked": a.fs, "kind": "local"}
    if a.fs != "local":
        import netfs

        if a.fs in ("nfs", "auto"):
            mount, why = netfs.nfs(a.fs_dir / "nfs")
            fs["nfs_refused"] = why or None
            if why:
                print(f"loopback NFS refused: {why}", flush=True)
        if mount is None and a.fs in ("sshfs", "auto"):
            mount, why = netfs.sshfs(a.fs_dir / "sshfs", a.ssh_port)
            if why:
                print(f"sshfs refused: {why}", flush=True)
        if mount is None:
            commit, dirty = head_state()
            OUT.write_text(json.dumps({"commit": commit, "dirty": dirty, "command": "kill_soak.py " +
                                       " ".join(sys.argv[1:]), "fs": fs, "rounds": []}, indent=1) + "\n")
            print("skipped: no network filesystem could be mounted here (see above)")
            return 0
        fs.update(kind=mount.kind, fstype=mount.fstype, options=mount.options, path=str(mount.path))
        print(f"run folders on {mount.path} ({mount.fstype}: {mount.options})", flush=True)
    rows = []
    print(HEAD)
    print("|---:" * 13 + "|")
    try:
        for r in range(a.rounds):
            base = Path(tempfile.mkdtemp(prefix=f"kill-soak-{r}-"))
            runs = Path(tempfile.mkdtemp(prefix=f"kill-soak-{r}-", dir=mount.path)) if mount else None
            res = one_round(a.kills, a.total, a.seed + r, base, runs)
            rows.append(res)
            print(row(r + 1, res), flush=True)
    finally:
        if mount:
            mount.undo()
    summary = {"rounds": rows, "kills": sum(r["kills"] for r in rows),
               "duplicates": sum(r["duplicates"] for r in rows), "losses": sum(r["losses"] for r in rows),
               "unfinished": sum(r["unfinished"] for r in rows),
               "training_faults": sum(r["training_faults"] for r in rows)}
    text = json.dumps(summary, indent=1, default=str)
    if a.json:
        a.json.write_text(text)
    if a.fs != "local":
        commit, dirty = head_state()
        doc = {"commit": commit, "dirty": dirty, "command": "kill_soak.py " + " ".join(sys.argv[1:]), "fs": fs,
               **summary, "wall_s": round(time.monotonic() - t0)}
        OUT.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        sync_doc(DOC, lambda t: rendered_doc(t, doc), check=False)
    print(text if len(text) < 4000 else json.dumps({k: v for k, v in summary.items() if k != "rounds"}))
    bad = summary["duplicates"] + summary["losses"] + summary["unfinished"] + summary["training_faults"]
    return 1 if bad or any(r["odd_exits"] or r["final_rc"] != 0 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
