"""Whole-chain replay (and the tuning procedure) on a trace; the result as JSON under docs/results/.

    .venv/bin/python bench/sim_chains.py                                   # default: docs/results/sim-chains-ls6.json
    .venv/bin/python bench/sim_chains.py --tune-score-from 2023-02-01 --out docs/results/sim-tune-ls6.json
    .venv/bin/python bench/sim_render.py                                   # the doc tables from those files

The file holds the commit it ran on (and whether the tree had local changes), the seed, the exact
command and the data `chainrun sim --chains --json` prints under "data". Runs `chainrun sim` in a
subprocess so that what is written is what the CLI prints.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="ls6-a100-dev")
    ap.add_argument("--out", default=None)
    ap.add_argument("--tune-score-from", default=None)
    ap.add_argument("extra", nargs="*", help="more `chainrun sim` options, after --")
    args = ap.parse_args()
    out = Path(args.out or REPO / "docs" / "results" / ("sim-tune-ls6.json" if args.tune_score_from else "sim-chains-ls6.json"))
    cmd = ["chainrun", "sim", "--trace", args.trace, "--chains", "--json", *args.extra]
    if args.tune_score_from:
        cmd += ["--tune-score-from", args.tune_score_from]
    exe = Path(sys.executable).with_name("chainrun")
    t = time.monotonic()
    p = subprocess.run([str(exe), *cmd[1:]], capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        return p.returncode
    env = json.loads(p.stdout)
    doc = {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "chainrun")),
           "seed": 0, "command": " ".join(cmd), "wall_s": round(time.monotonic() - t, 1),
           "chainrun": env["chainrun"], "data": env["data"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} ({doc['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
