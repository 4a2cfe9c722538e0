"""The headline picture: mean completion overhead per policy and load level, from the rolling
evaluation's results file (90 % bootstrap intervals as error bars, n under each group).

    .venv/bin/python bench/sim_rolling_plot.py          # docs/results/sim-rolling-ls6.json -> docs/img/sim-rolling-ls6.png
"""

from __future__ import annotations

import argparse
import json
import sys

from _results import REPO  # bench/ is on sys.path when a bench runs

POLICIES = (("reactive", "reactive", "#b0b0b0"), ("best_fixed", "best fixed lead (rolling)", "#6a9fd0"),
            ("predicted", "predicted (self-tuned, rolling)", "#2a7d2a"), ("oracle", "oracle", "#333333"))
GROUPS = ("low", "medium", "heavy", "all")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default=str(REPO / "docs" / "results" / "sim-rolling-ls6.json"))
    ap.add_argument("--out", default=str(REPO / "docs" / "img" / "sim-rolling-ls6.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(open(args.results).read())
    pols = doc["data"]["chains"]["policies"]
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=120)
    width = 0.8 / len(POLICIES)
    for i, (name, label, color) in enumerate(POLICIES):
        xs, ys, lo, hi = [], [], [], []
        for g, group in enumerate(GROUPS):
            c = pols[name] if group == "all" else pols[name]["by_load"][group]
            if not c["n"] or c["mean_overhead_h"] is None:
                continue
            m = c["mean_overhead_h"]
            a, b = c.get("ci90_h") or (None, None)
            xs.append(g + (i - (len(POLICIES) - 1) / 2) * width)
            ys.append(m)
            lo.append(m - a if a is not None else 0)
            hi.append(b - m if b is not None else 0)
        ax.bar(xs, ys, width, label=label, color=color, yerr=[lo, hi], capsize=2, error_kw={"lw": 0.8})
    n = {g: (pols["reactive"] if g == "all" else pols["reactive"]["by_load"][g])["n"] for g in GROUPS}
    ax.set_xticks(range(len(GROUPS)), [f"{g}\n(n = {n[g]})" for g in GROUPS])
    ax.set_yscale("log")
    ax.set_ylabel("completion overhead, h (log)")
    meta = doc["data"]["meta"]
    argv = doc["command"].split()
    trace = argv[argv.index("--trace") + 1] if "--trace" in argv else "?"
    ax.set_title(f"{meta['injections']} chains of {doc['data']['chains']['work_h']:g} h, scored week by week on their "
                 f"own past ({trace}, commit {doc['commit'][:7]})", fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(axis="y", which="both", lw=0.3, alpha=0.5)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
