"""Replay a trace with every submission policy; print the table, draw docs/img/sim-gaps.png.

    .venv/bin/python bench/sim_replay.py [--trace FILE] [--chains-every 4h] [--out docs/img/sim-gaps.png]

The same numbers as ``chainrun sim --trace FILE``; this adds the picture: the signed gap
(successor start - predecessor end) per policy, one panel per load level.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_TRACE = "ls6-a100-dev"  # built in (chainrun/data), or a file
SHOWN = ("reactive", "fixed_6h_handoff", "avg_handoff", "predicted", "predicted_handoff", "oracle")


def plot(res, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), sharey=True)
    for ax, level in zip(axes, ("low", "medium", "heavy")):
        for name in SHOWN:
            g = np.array([x.gap_s for x in res.gaps.get(name, []) if x.load == level]) / 3600.0
            if len(g) == 0:
                continue
            xs = np.sort(g)
            ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=name)
        n = res.policies["reactive"]["by_load"][level]["transitions"]
        ax.set_title(f"{level} load ({n} transitions)")
        ax.set_xscale("symlog", linthresh=0.1)
        ax.axvline(0, color="k", lw=0.6)
        ax.set_xlabel("successor start - predecessor end (h); < 0 overlap, > 0 interruption")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of transitions (ECDF)")
    axes[0].legend(fontsize=8, loc="upper left")
    m = res.meta
    fig.suptitle(f"chainrun sim: {m['injections']} injected chains, {m['nodes']} nodes, "
                 f"hand-off {m['spec']['handoff_s'] / 60:.0f} min")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=DEFAULT_TRACE)
    ap.add_argument("--chains-every", default="4h")
    ap.add_argument("--nodes", type=int, default=None, help="default: the trace's peak concurrent nodes")
    ap.add_argument("--anonymous-chain", action="store_true",
                    help="the predictor sees no job of the chain's user (not even its running predecessor)")
    ap.add_argument("--out", default=str(REPO / "docs" / "img" / "sim-gaps.png"))
    args = ap.parse_args()

    from chainrun.cli.sim_cmd import render
    from chainrun.durations import parse_duration
    from chainrun.sim import SimConfig, run_sim
    from chainrun.traces import read_trace

    t = time.monotonic()
    cfg = SimConfig(nodes=args.nodes, chains_every_s=float(parse_duration(args.chains_every)),
                    show_predecessor=not args.anonymous_chain)
    res = run_sim(read_trace(args.trace), cfg)
    render(res)
    plot(res, Path(args.out))
    print(f"predictor cost: {res.meta['predictor_cost']}")
    print(f"wrote {args.out}; total {time.monotonic() - t:.0f}s")
    extra = (f" --nodes {args.nodes}" if args.nodes else "") + (" --anonymous-chain" if args.anonymous_chain else "")
    print(f"reproduce: .venv/bin/python bench/sim_replay.py --trace {args.trace} --chains-every {args.chains_every}"
          f"{extra} --out {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
