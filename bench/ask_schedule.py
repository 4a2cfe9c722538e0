"""What the replay's coarser ask schedule costs its verdict: the rolling run with the policy asked
every tick, as the watcher asks it, instead of at half the distance to a decision's due time
(``chainrun.sim.chains._next_ask``, the schedule the shipped replay keeps to save model answers).

    .venv/bin/python bench/ask_schedule.py     # ~14 min on 2 cores; commit first (the JSON says dirty)

Writes docs/results/sim-rolling-ls6-every-tick.json (the commit, the command, the data `chainrun sim
--chains --rolling --json` prints with every ask on the tick grid) and prints `predicted` beside the
committed docs/results/sim-rolling-ls6.json. docs/evaluation.md (Limits) says what it showed. The
trace is TACC Lonestar6's A100 partition (Mirage, SC'23; CC BY 4.0, see chainrun/data/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from _results import REPO, head_state

OUT = REPO / "docs" / "results" / "sim-rolling-ls6-every-tick.json"
BASE = REPO / "docs" / "results" / "sim-rolling-ls6.json"
# run in the child: every non-reactive, non-lead policy asked on the next tick (the watcher's schedule)
PATCH = ("import chainrun.sim.chains as c, chainrun.sim.site_chain as s; o = c._next_ask; "
         "c._next_ask = s._next_ask = lambda t, h, d, p, w, l: o(t, h, d, p, w, l) "
         "if getattr(p, 'name', '') in ('reactive', 'lead') else t + w.tick_s")


def main() -> int:
    import subprocess
    import time

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    cmd = ["chainrun", "sim", "--chains", "--trace", "ls6-a100-dev", "--rolling", "--json"]
    commit, dirty = head_state()
    child = PATCH + "; import sys; from chainrun.cli.main import run; sys.argv[0] = 'chainrun'; sys.exit(run())"
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-c", child, *cmd[1:]], capture_output=True, text=True, cwd=REPO)
    wall_s = round(time.monotonic() - t, 1)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        return p.returncode
    res = json.loads(p.stdout)
    doc = {"commit": commit, "dirty": dirty, "from_head": False, "seed": 0,
           "command": " ".join(cmd) + "  # every ask on the tick grid (bench/ask_schedule.py)",
           "wall_s": wall_s, "cpus": os.cpu_count(), "chainrun": res["chainrun"], "data": res["data"]}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    base = json.loads(BASE.read_text())
    print(f"wrote {OUT} ({wall_s} s)")
    print(f"{'':24} {'all h':>7} {'low h':>7} {'medium h':>9} {'heavy h':>8} {'answers':>9} {'wall s':>7}")
    for name, d in (("shipped schedule", base), ("every tick", doc)):
        v = d["data"]["chains"]["policies"]["predicted"]
        lv = {k: b["mean_overhead_h"] for k, b in v["by_load"].items()}
        cost = d["data"]["meta"]["cost"]["predictions"]
        print(f"{name:24} {v['mean_overhead_h']:7.2f} {lv['low']:7.2f} {lv['medium']:9.2f} {lv['heavy']:8.2f} "
              f"{cost:9d} {d['wall_s']:7.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
