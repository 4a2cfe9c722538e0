"""Time one watcher tick on the local cluster vs the same tick over SSH, with 1 and 20 chains.

Needs the real Slurm test cluster and scripts/start-sshd.sh (as root). It submits held
jobs (``--hold``: they never run) as chains in a throw-away chainrun home, times steady
ticks (the connection is opened by the first, untimed tick and then reused, as in a
long-running watcher), and cancels everything afterwards.

    .venv/bin/python bench/ssh_overhead.py [--ticks 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SSHD = Path(os.environ.get("CHAINRUN_SSH_DIR", "/tmp/chainrun-sshd"))
TOY = Path(__file__).resolve().parents[1] / "templates" / "toy_train.sh"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=15)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="chainrun-bench-ssh-"))
    os.environ["CHAINRUN_HOME"] = str(home)
    (home / "known_hosts").write_text((SSHD / "known_hosts").read_text())
    cli = [sys.executable, "-m", "chainrun.cli.main"]
    subprocess.run([*cli, "cluster", "add", "lo", "--host", "127.0.0.1", "--port", "2222", "--user", "chainrun",
                    "--key", str(SSHD / "id_ed25519")], check=True, capture_output=True)

    from chainrun.chain.create import SubmitRequest, create_chain
    from chainrun.chain.cancel import cancel_chain
    from chainrun.chain.multi import MultiEngine
    from chainrun.context import open_context

    ctx = {name: open_context(name) for name in ("local", "lo")}
    text = TOY.read_text()
    made = {"local": 0, "lo": 0}

    def add_chains(name: str, upto: int) -> None:
        c = ctx[name]
        remote = name != "local"
        workdir = c.remote_workdir() if remote else str(home)
        while made[name] < upto:
            req = SubmitRequest(script=str(TOY), script_text=text, total_s=3600, workdir=workdir, signal="USR2@50",
                                name=f"bench-{made[name]}", sbatch_args=["--hold", "--exclude=n1,n2"], cluster=name,
                                upload_script=remote)
            create_chain(c.store, c.slurm, c.runner, req)
            made[name] += 1

    def time_ticks(name: str) -> tuple[float, float, dict]:
        eng = MultiEngine(ctx[name].store, only=name)
        try:
            eng.tick()  # opens the connection; a watcher pays this once
            times, calls = [], {}
            for _ in range(args.ticks):
                t0 = time.perf_counter()
                rep = eng.tick()
                times.append(time.perf_counter() - t0)
                calls = rep.slurm_calls
            return statistics.median(times), min(times), calls
        finally:
            eng.close()

    rows = []
    try:
        for n in (1, 20):
            add_chains("local", n)
            add_chains("lo", n)
            loc, loc_min, loc_calls = time_ticks("local")
            ssh, ssh_min, ssh_calls = time_ticks("lo")
            rows.append((n, loc, ssh, loc_min, ssh_min, loc_calls, ssh_calls))
    finally:
        for name, c in ctx.items():
            for ch in c.store.chains(active_only=True):
                if ch.cluster == name:
                    cancel_chain(c.store, c.slurm, ch)
            c.close()

    print(f"one watcher tick, median (min) of {args.ticks}, Slurm 22.05 test cluster, sshd on 127.0.0.1, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'chains':>6} {'local ms':>13} {'ssh ms':>13} {'ssh/local':>9}  calls per tick (local | ssh)")
    for n, loc, ssh, lmin, smin, lc, sc in rows:
        print(f"{n:>6} {loc * 1000:>6.1f} ({lmin * 1000:>4.1f}) {ssh * 1000:>6.1f} ({smin * 1000:>4.1f}) "
              f"{ssh / loc:>9.2f}  {_calls(lc)} | {_calls(sc)}")


def _calls(calls: dict) -> str:
    return ", ".join(f"{k.split(':')[-1]} {v}" for k, v in sorted(calls.items())) or "none"


if __name__ == "__main__":
    main()
