#!/usr/bin/env python3
"""What a scheduled scrontab tick costs, on the real local test cluster.

Installs `chainrun watch --install-schedule --every 1m --via scrontab` in a fresh home (your scrontab
is saved and put back), lets it tick for --minutes with one chain running, removes it, then reads
sacct for the tick jobs (name cr.tick; -D: a scrontab job runs again under its id): how long each waited (Start - Eligible) and ran, and the CPU
time charged (AllocCPUS x Elapsed). The Slurm calls of one tick are those of `watch --once`: read from
one `watch --once --json` (slurm_calls) in the same home. Needs scripts/start-cluster.sh; ~N+1 minutes.

Run: .venv/bin/python bench/tick_cost.py [--minutes 4]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, home: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "CHAINRUN_HOME": home, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "chainrun.cli.main", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=4.0)
    a = ap.parse_args()
    home, work = tempfile.mkdtemp(prefix="bench-tick-"), tempfile.mkdtemp(prefix="bench-tick-work-")
    saved = subprocess.run(["scrontab", "-l"], capture_output=True, text=True)
    t0 = time.time()
    try:
        p = cli("watch", "--install-schedule", "--every", "1m", "--via", "scrontab", home=home)
        assert p.returncode == 0, p.stderr
        p = cli("submit", str(ROOT / "templates" / "toy_train.sh"), "--total", "4m", "--signal", "USR2@50",
                "--policy", "lead", "--lead", "60s", home=home, cwd=work)
        assert p.returncode == 0, p.stderr
        time.sleep(a.minutes * 60)
        once = json.loads(cli("watch", "--once", "--json", home=home).stdout)["data"]
    finally:
        cli("watch", "--uninstall-schedule", home=home)
        if saved.returncode == 0:
            subprocess.run(["scrontab", "-"], input=saved.stdout, text=True)
        else:
            subprocess.run(["scrontab", "-r"], capture_output=True)
        for ch in json.loads(cli("status", "--json", home=home).stdout or '{"data": []}')["data"]:
            cli("cancel", ch["id"], home=home)
    time.sleep(3)
    out = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "--name", "cr.tick", "-S", f"now-{int(time.time() - t0) + 5}seconds",
                          "-o", "JobID,State,Eligible,Start,End,Elapsed,AllocCPUS,ReqMem"],
                         env={**os.environ, "SLURM_TIME_FORMAT": "%s"}, capture_output=True, text=True, check=True)
    rows = [ln.split("|") for ln in out.stdout.splitlines() if ln.strip()]
    ran = [r for r in rows if r[3].isdigit() and r[4].isdigit()]
    waits = [int(r[3]) - int(r[2]) for r in ran if r[2].isdigit()]
    runs = [int(r[4]) - int(r[3]) for r in ran]
    cpus = [int(r[6] or 0) for r in ran]
    print(f"ticks that ran: {len(ran)} in {a.minutes:g} min (rows: {len(rows)}; states: "
          f"{sorted({r[1] for r in rows})}); ReqMem {ran[0][7] if ran else '-'}")
    if ran:
        print(f"wait (start - eligible) s: median {statistics.median(waits):.0f}, max {max(waits)}")
        print(f"run s: median {statistics.median(runs):.0f}, max {max(runs)}; CPU-s charged per tick: "
              f"median {statistics.median(c * r for c, r in zip(cpus, runs)):.0f}")
    print(f"Slurm calls of one tick (watch --once, 1 chain): {once.get('slurm_calls')}")


if __name__ == "__main__":
    main()
