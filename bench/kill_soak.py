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

Run: .venv/bin/python bench/kill_soak.py [--kills 50] [--rounds 1] [--total 6m] [--seed 50]
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

from tests.reliability import harness as h  # noqa: E402

N4 = ["--", "--exclude=n1,n2,n3"]


def one_round(kills: int, total: str, seed: int, base: Path) -> dict:
    home = base / "home"
    shim = base / "shim"
    h.kill_after_sbatch_shim(base / "bin", shim)
    h.train_model(home)
    since = time.time()
    h.submit(home, base / "dep", "soakdep", "--total", total, "--policy", "dependency", *h.SEG, *N4)
    h.submit(home, base / "lead", "soaklead", "--total", total, "--policy", "lead", "--lead", "10s", *h.SEG, *N4)
    pred = h.submit(home, base / "pred", "soakpred", "--total", total, "--policy", "predicted", "--lead", "50s",
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--total", default="6m", help="training per chain (--total counts training time)")
    ap.add_argument("--seed", type=int, default=50)
    ap.add_argument("--json", type=Path, help="also write the summary here")
    a = ap.parse_args()
    rows = []
    print("| round | seed | kills | of which right after sbatch | restarts | adopted | segments | duplicates "
          "| losses | unfinished | training faults | predicted decisions with a model | seconds |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in range(a.rounds):
        base = Path(tempfile.mkdtemp(prefix=f"kill-soak-{r}-"))
        res = one_round(a.kills, a.total, a.seed + r, base)
        rows.append(res)
        print(f"| {r + 1} | {res['seed']} | {res['kills']} | {res['kills_after_sbatch']} | {res['restarts']} | "
              f"{res['adopted']} | {res['segments']} | {res['duplicates']} | {res['losses']} | {res['unfinished']} | "
              f"{res['training_faults']} | {res['predicted']['with_model']}/{res['predicted']['later_segments']} | "
              f"{res['seconds']} |", flush=True)
    summary = {"rounds": rows, "kills": sum(r["kills"] for r in rows),
               "duplicates": sum(r["duplicates"] for r in rows), "losses": sum(r["losses"] for r in rows),
               "unfinished": sum(r["unfinished"] for r in rows),
               "training_faults": sum(r["training_faults"] for r in rows)}
    text = json.dumps(summary, indent=1, default=str)
    if a.json:
        a.json.write_text(text)
    print(text if len(text) < 4000 else json.dumps({k: v for k, v in summary.items() if k != "rounds"}))
    bad = summary["duplicates"] + summary["losses"] + summary["unfinished"] + summary["training_faults"]
    return 1 if bad or any(r["odd_exits"] or r["final_rc"] != 0 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
