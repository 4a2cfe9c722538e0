#!/usr/bin/env python3
"""What a gated segment costs while it waits for its go-ahead (moving between clusters), on the real test cluster.

Submits one segment of a fresh run folder with CHAINRUN_GATED=1 and no go-ahead ever written, the way the
driver submits the first segment on a site the chain moves to, and lets it wait until its limit's signal.
Then reads its batch step's CPU time from sacct (TotalCPU of <job>.batch: the wrapper and everything it ran,
its start included) against the wall time, and how often it looked (the state file's polls). Needs
scripts/start-cluster.sh; about --minutes.

Run: .venv/bin/python bench/gate_cost.py [--minutes 3] [--poll 10]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chain.test_wrapper_field_slurm import FieldChain, _batch_cpu, _sacct  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=int, default=3, help="the gated segment's time limit")
    ap.add_argument("--poll", type=int, default=10, help="CHAINRUN_GATE_POLL, seconds between looks")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="chainrun-gate-cost-"))
    fc = FieldChain(base, "gatecost", signal_lead=20)
    job = fc.submit(1, minutes=a.minutes, env=f"CHAINRUN_GATED=1,CHAINRUN_GATE_POLL={a.poll}")
    while not fc.ended(job):
        time.sleep(5)
    acct = _sacct(job, "State,ElapsedRaw")
    cpu, wall = _batch_cpu(job), int(acct["ElapsedRaw"])
    looks = fc.file("seg-1.state").get("polls", "?")
    restart = fc.file("seg-1.start").get("restart", "0")
    out = fc.file(f"seg-1.rerun-{restart}") or fc.file("seg-1.outcome")  # a requeued job: its last run's
    if restart != "0":
        print(f"note: Slurm requeued the job ({restart} time(s)); the figures are its last run's")
    print(f"gated segment (job {job}, {a.minutes} min limit, poll {a.poll} s): {acct['State']}, outcome "
          f"{out.get('outcome')} (stopped by {out.get('stopped_by')}); {looks} looks in {wall} s")
    print(f"batch step CPU {cpu:.2f} s = {100 * cpu / max(1, wall):.2f} % of one core; "
          f"{3600 * cpu / max(1, wall):.1f} CPU-s per hour of waiting; run folder {base}")


if __name__ == "__main__":
    main()
