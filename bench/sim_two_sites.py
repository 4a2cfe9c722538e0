"""The multi-cluster replay (issue #26) on two traces; the result as JSON under docs/results/ and a table.

    .venv/bin/python bench/sim_two_sites.py                                 # the shipped trace given twice
    .venv/bin/python bench/sim_two_sites.py --trace A --trace B --name ab    # two clusters' traces
    .venv/bin/python bench/sim_two_sites.py --from-head -- --pace ls6-a100-dev#2=0.6

Writes docs/results/sim-two-sites-<name>.json (default name: ls6x2, the shipped trace twice, its copy
4 weeks later) with the commit, the exact command and the data `chainrun sim --chains --trace A --trace B
--json` prints. The shipped trace is TACC Lonestar6's A100 partition (Mirage, SC'23; CC BY 4.0, see
chainrun/data/README.md). ``--table FILE`` prints the table of a file already written; ``--render``
writes the results blocks of docs/multi-cluster.md from the files (``--check``: the doc test's check).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from _results import REPO, head_state, run_chainrun, sync_doc  # bench/ is on sys.path when a bench runs

LEVELS = ("low", "medium", "heavy")
DOC = REPO / "docs" / "multi-cluster.md"
# docs/multi-cluster.md's results blocks: marker name -> results file
BLOCKS = {"two-sites-ls6x2": "sim-two-sites-ls6x2.json", "two-sites-ls6x2-pace06": "sim-two-sites-ls6x2-pace06.json",
          "two-sites-ls6x2-shift8": "sim-two-sites-ls6x2-shift8.json"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", action="append", default=None, help="a cluster's trace (twice or more)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--table", default=None, help="print the table of this results file and stop")
    ap.add_argument("--render", action="store_true", help="write the results blocks of docs/multi-cluster.md")
    ap.add_argument("--check", action="store_true", help="with --render: exit 1 if the doc is not what it renders to")
    ap.add_argument("--from-head", action="store_true", help="run chainrun from an export of HEAD")
    ap.add_argument("extra", nargs="*", help="more `chainrun sim` options, after --")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())["data"]))
        return 0
    if args.render:
        return sync_doc(DOC, render, args.check)
    traces = args.trace or ["ls6-a100-dev", "ls6-a100-dev"]
    name = args.name or ("ls6x2" if traces == ["ls6-a100-dev", "ls6-a100-dev"] else "custom")
    out = REPO / "docs" / "results" / f"sim-two-sites-{name}.json"
    cmd = ["chainrun", "sim", "--chains", *(x for t in traces for x in ("--trace", t)), "--transfer", "15m",
           "--json", *args.extra]
    p, commit, wall_s = run_chainrun(cmd, args.from_head)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        return p.returncode
    res = json.loads(p.stdout)
    doc = {"commit": commit, "dirty": False if args.from_head else head_state()[1], "from_head": args.from_head,
           "seed": 0, "command": " ".join(cmd), "wall_s": wall_s, "cpus": os.cpu_count(),
           "chainrun": res["chainrun"], "data": res["data"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} ({doc['wall_s']} s)")
    print(table(doc["data"]))
    return 0


def _h(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _rows(pols: dict) -> list[str]:
    lines = [f"  {'policy':<28} {'n':>4} {'all h':>7} " + " ".join(f"{lv + ' h (n)':>14}" for lv in LEVELS)
             + f" {'moves':>6} {'twice':>7} {'stuck':>5}"]
    for name, p in pols.items():
        cells = [f"{_h(p['by_load'][lv]['mean_overhead_h'])} ({p['by_load'][lv]['n']})" for lv in LEVELS]
        twice = p.get("gpu_h_twice_share")
        lines.append(f"  {name:<28} {p['n']:>4} {_h(p['mean_overhead_h']):>7} " + " ".join(f"{c:>14}" for c in cells)
                     + f" {_h(p.get('moves')):>6} {('-' if twice is None else f'{twice * 100:.2f}%'):>7}"
                     f" {p.get('stuck', 0):>5}")
    return lines


def _targets(t: dict) -> list[str]:
    out = []
    for lv in LEVELS:
        r = t.get(lv)
        if not r:
            out.append(f"  {lv}: no chains")
            continue
        red = r["reduction"]
        verdict = r.get("cut_30pct", r.get("within_5pct"))
        goal = ">= 30 % less" if "cut_30pct" in r else ("<= 5 % worse" if "within_5pct" in r else "(< 5 chains)")
        out.append(f"  {lv}: multi {_h(r['multi_h'])} h vs {r['better_single']} {_h(r['better_single_h'])} h: "
                   f"{'-' if red is None else f'{red * 100:+.0f} %'} less; goal {goal}: "
                   f"{'-' if verdict is None else ('met' if verdict else 'missed')}")
    out.append(f"  moves per chain {_h(t.get('moves_per_chain'))} (<= 1: {t.get('moves_ok')}), stuck "
               f"{t.get('stuck')}, GPU-h twice <= 1 %: {t.get('gpu_h_twice_ok')}")
    return out


def _weeks(weeks: list[dict], per_line: int = 6) -> list[str]:
    """The rolling weeks: start, margin in force, chains scored; * marks the default (too little past)."""
    cells = [f"{w['start'][:10]} {w['margin_s'] / 3600:g} h{'' if w['chosen'] else '*'} ({w['n']})" for w in weeks]
    out = ["  weeks (start, margin, chains; * the default margin: too few chains ended before the week):"]
    return out + ["    " + ", ".join(cells[i:i + per_line]) for i in range(0, len(cells), per_line)]


def table(data: dict) -> str:
    c, m = data["chains"], data["meta"]
    sm = c.get("site_margin", {})
    lines = [f"window {m['window']['from'][:10]} .. {m['window']['until'][:10]}, {m['injections']} chains, sites "
             + ", ".join(f"{s['name']} (shift {s['shift_weeks']} w, pace {s['pace']:g})" for s in m["sites"])
             + f"; {m['seconds']:.0f} s"]
    if "choice" in sm:
        lines.append(f"choice: {sm['choice_chains']} chains ended before {sm['split'][:10]}; picked margin "
                     f"{sm['margin_s'] / 3600:g} h ({sm['note']})")
        lines += _rows(sm["choice"])
    lines.append(f"scored: {sm.get('scored_chains', '-')} chains injected from {sm.get('split', '-')[:10]}")
    lines += _rows(c["policies"])
    lines += _targets(c.get("targets", {}))
    if "whole_window" in c:
        lines.append("whole window (choice chains included), picked margin")
        lines += _rows(c["whole_window"]["policies"])
        lines += _targets(c["whole_window"].get("targets", {}))
    if "rolling" in c:
        lines.append("rolling (margin chosen each week on the chains ended before it)")
        lines += _rows(c["rolling"]["policies"])
        lines += _targets(c["rolling"].get("targets", {}))
        lines += _weeks(c["rolling"]["weeks"])
    lines += [f"warning: {w}" for w in m.get("warnings", [])]
    return "\n".join(lines)


def render(text: str) -> str:
    """The doc with every results block rendered from its file (the command, the commit, the table)."""
    for name, file in BLOCKS.items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        if begin not in text:
            continue
        doc = json.loads((REPO / "docs" / "results" / file).read_text())
        block = (f"{begin}\n`{doc['command']}` (commit {doc['commit'][:7]}, {doc['wall_s']:.0f} s wall on "
                 f"{doc.get('cpus', '?')} CPUs shared; docs/results/{file}):\n\n```\n{table(doc['data'])}\n```\n{end}")
        a, b = text.index(begin), text.index(end) + len(end)
        text = text[:a] + block + text[b:]
    return text


if __name__ == "__main__":
    sys.exit(main())
