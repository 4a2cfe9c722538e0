"""The cost of `chainrun model sites a,b`'s choice (chainrun/sim/site_selftune.py) on two histories of
the shipped trace's size: the shipped LS6 trace (TACC Lonestar6 A100, Mirage SC'23, CC BY 4.0, see
chainrun/data/README.md) stands for both clusters' caches, as known at its last submission.

    .venv/bin/python bench/site_margin_cost.py [--workers 1] [--out docs/results/site_margin_cost.json]

Prints a table (wall and CPU seconds, peak RSS, what was chosen on how many chains) and, with --out,
writes it as JSON with the commit. Cron runs the choice single-threaded (--workers 1, the default).
Two identical histories gain nothing from a move, so the choice is the largest margin (ties go to it):
this measures the cost, not a gain.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from _results import head_state  # bench/ is on sys.path when a bench runs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from chainrun.sim import site_selftune
    from chainrun.sim.selftune import chain_shape
    from chainrun.traces import builtin_path, read_trace

    f = read_trace(builtin_path("ls6-a100-dev"))
    as_of = float(f["submit"].max())
    shape = {**chain_shape("none", "", None), "source": "bench: one node, 48 h segments, 168 h of work"}
    t, c = time.monotonic(), time.process_time()
    res = site_selftune.choose([f, f.copy()], ["a", "b"], shape=shape, as_of=as_of, workers=args.workers)
    row = {"wall_s": round(time.monotonic() - t, 1), "cpu_s": round(time.process_time() - c, 1),
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, "workers": args.workers,
           "trace_jobs": len(f), "chosen": res["chosen"], "margin_s": res["margin_s"], "reason": res["reason"],
           "window": res.get("window"), "thinned": res.get("thinned"), "replay_cost": res.get("cost")}
    print(f"{'model sites a,b (choice only)':40s} {row['wall_s']:8.1f} s wall, {row['cpu_s']:.1f} CPU-s, "
          f"{row['peak_rss_mib']} MiB peak, {args.workers} worker(s)")
    print(f"{'history per cluster':40s} {len(f)} jobs, thinned to {(res.get('thinned') or {}).get('a', {}).get('jobs')}")
    print(f"{'chose':40s} {row['margin_s']} s on {(row['window'] or {}).get('finished')} chains: {row['reason']}")
    if args.out:
        commit, dirty = head_state()
        Path(args.out).write_text(json.dumps({"commit": commit, "dirty": dirty, "command":
                                              f"bench/site_margin_cost.py --workers {args.workers}", **row}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
