#!/usr/bin/env python3
"""Slurm calls per watcher tick with 1 and 50 chains, on the real local test cluster.

Queries (squeue + sacct) must stay <= 2 per tick whatever the number of chains; sbatch and
scancel are counted apart (they happen only when a segment is submitted or cancelled).
Chains run the toy trainer in 2-minute segments, so segments end and successors are
submitted during the measurement. Needs scripts/start-cluster.sh; takes ~4 minutes.

Run: .venv/bin/python bench/watch_rpcs.py [--sizes 1 50] [--seconds 150] [--interval 5]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run_size(n: int, seconds: float, interval: float) -> dict:
    os.environ["CHAINRUN_HOME"] = tempfile.mkdtemp(prefix=f"bench-rpcs-{n}-")
    work = tempfile.mkdtemp(prefix="bench-work-")
    os.chdir(work)
    from chainrun.chain.create import SubmitRequest, create_chain
    from chainrun.chain.cancel import cancel_chain
    from chainrun.chain.engine import Engine
    from chainrun.context import open_context

    ctx = open_context()
    toy = ROOT / "templates" / "toy_train.sh"
    for i in range(n):
        req = SubmitRequest(script=str(toy), script_text=toy.read_text(), total_s=240, workdir=work, policy="lead",
                            lead_s=30, signal="USR2@30", name=f"bench{i}")
        create_chain(ctx.store, ctx.slurm, ctx.runner, req)
    engine = Engine(ctx.store, ctx.slurm, ctx.runner)
    queries, actions, durations = [], [], []
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        rep = engine.tick()
        durations.append(time.perf_counter() - t0)
        calls = rep.slurm_calls
        queries.append(calls.get("squeue", 0) + calls.get("sacct", 0))
        actions.append(calls.get("sbatch", 0) + calls.get("scancel", 0))
        time.sleep(interval)
    for c in ctx.store.chains(active_only=True):
        cancel_chain(ctx.store, ctx.slurm, c, reason="bench finished")
    ctx.close()
    return {"chains": n, "ticks": len(queries), "q_max": max(queries), "q_mean": statistics.mean(queries),
            "actions": sum(actions), "tick_s": statistics.median(durations)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 50])
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--interval", type=float, default=5)
    a = ap.parse_args()
    rows = [run_size(n, a.seconds, a.interval) for n in a.sizes]
    print(f"{'chains':>6} {'ticks':>5} {'queries/tick max':>17} {'mean':>6} {'sbatch+scancel':>15} {'tick s (median)':>16}")
    for r in rows:
        print(f"{r['chains']:>6} {r['ticks']:>5} {r['q_max']:>17} {r['q_mean']:>6.2f} {r['actions']:>15} {r['tick_s']:>16.3f}")
    print("target: queries/tick max <= 2 (one squeue, at most one sacct), for any number of chains")


if __name__ == "__main__":
    main()
