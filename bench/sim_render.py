"""Render the doc tables from docs/results/*.json into docs/evaluation.md (between markers).

    .venv/bin/python bench/sim_render.py            # rewrite the marked blocks
    .venv/bin/python bench/sim_render.py --check    # exit 1 if a block is out of date

A block is ``<!-- results:FILE -->`` ... ``<!-- /results:FILE -->`` where FILE is a name in
docs/results/ without .json; what is between the markers is generated: a changed number is a
changed results file. ``results:sim-settings`` is rendered from the code's settings instead (the
replay's defaults, the rolling grid, the shipped priority weights), so the prose can quote them
under the doc test (tests/sim/test_evaluation_docs.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "evaluation.md"


def h(v) -> str:
    if v is None:
        return "-"
    return f"{v * 60:.0f} min" if abs(v) < 1 else f"{v:.2f} h"


def pct(v, d=1) -> str:
    return "-" if v is None else f"{v * 100:.{d}f} %"


def ci(c) -> str:
    if not c or c[0] is None:
        return "-"
    return f"{h(c[0])} .. {h(c[1])}"


def chains_table(block: dict) -> list[str]:
    c, m = block["chains"], block["meta"]
    lines = [f"{m['injections']} chains ({'/'.join(map(str, m['chain_nodes']))} nodes alternating, one every "
             f"{m['chains_every_h']:g} h of trace), {c['work_h']:g} h of work in {c['segment_h']:g} h segments, restart "
             f"{c['restart_cost_min']:g} min, hand-off {c['handoff_min']:g} min, {m['nodes']} nodes; replay "
             f"{m['seconds']:.0f} s.", "",
             "| policy | n | overhead (90 % CI) | from 1st start | queue | restarts | hand-off | segments | "
             "GPU-h twice | low | medium | heavy | stuck |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, p in c["policies"].items():
        bl = p["by_load"]
        lv = [f"{h(bl[k]['mean_overhead_h'])} ({bl[k]['n']})" for k in ("low", "medium", "heavy")]
        lines.append(
            f"| {name} | {p['n']} | {h(p['mean_overhead_h'])} ({ci(p.get('ci90_h'))}) | "
            f"{h(p.get('mean_overhead_from_start_h'))} | {h(p.get('mean_queue_h'))} | {h(p.get('mean_restart_h'))} | "
            f"{h(p.get('mean_handoff_h'))} | {p.get('mean_segments') or 0:.2f} | {pct(p.get('gpu_h_twice_share'), 2)} | "
            f"{' | '.join(lv)} | {p.get('stuck', 0)} |")
    lines += ["", "By load level (reactive's mean gap per boundary for the same injection: <= 2 h, 2-12 h, > 12 h): "
                  "mean completion overhead, 90 % bootstrap interval, n:", "",
              "| policy | low | medium | heavy |", "|---|---:|---:|---:|"]
    for name, p in c["policies"].items():
        cells = []
        for k in ("low", "medium", "heavy"):
            b = p["by_load"][k]
            cells.append("-" if not b["n"] else f"{h(b['mean_overhead_h'])} ({ci(b.get('ci90_h'))}), n = {b['n']}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    lines += ["", "Per transition in the same replay (Mirage's metric, beside the chain's): every boundary of every "
                  "chain; interruption = the successor's start after its predecessor's end at its signal (hand-over point "
                  "and save; 0 if "
                  "before), zero = share of boundaries with at most 60 s, cut = training its early start took "
                  "from the predecessor:", "",
              "| policy | boundaries | interruption | zero interruption | cut |", "|---|---:|---:|---:|---:|"]
    for name, p in c["policies"].items():
        tr = p.get("transitions") or {}
        if tr:
            lines.append(f"| {name} | {tr['n']} | {h(tr['mean_interruption_h'])} | "
                         f"{pct(tr['zero_interruption_share'], 0)} | {h(tr['mean_cut_h'])} |")
    t = c.get("targets") or {}
    lines += ["", "Targets for `predicted` (left share = (predicted - oracle) / (reactive - oracle); closes 90 %: left "
                  "share <= 0.10 where reactive - oracle >= 30 min; the goal, at every level with at least 5 chains: "
                  "closes 90 % or ends within 10 min of the oracle; never > 5 min worse than reactive; GPU-h twice "
                  "<= 1 %):", "",
              "| load | reactive - oracle | left share | closes 90 % | behind oracle | goal met | vs reactive |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for k in ("low", "medium", "heavy"):
        if k in t:
            x = t[k]
            ls = "-" if x["left_share"] is None else f"{x['left_share']:.2f}"
            ok = {True: "yes", False: "**no**", None: "n/a (< 30 min)"}[x["closes_90pct"]]
            met = {True: "yes", False: "**no**", None: "n/a (< 5 chains)"}[x.get("met")]
            behind = "-" if x.get("behind_oracle_min") is None else f"{x['behind_oracle_min']:.0f} min"
            lines.append(f"| {k} | {h(x['reactive_minus_oracle_h'])} | {ls} | {ok} | {behind} | {met} | "
                         f"{x['worse_than_reactive_min']:+.0f} min |")
    if "gpu_h_twice_share_ok" in t:
        lines.append(f"\nGPU-h twice <= 1 %: {'yes' if t['gpu_h_twice_share_ok'] else '**no**'}.")
    pr = c["policies"].get("predicted") or {}
    if pr.get("stuck"):
        lines.append(f"\n**`predicted` got stuck in {pr['stuck']} of {pr['stuck'] + pr['n']} chains** (more than 60 "
                     "segments); they are not in its means, so the shares above flatter it: the target is not met.")
    return lines


LEVELS = ("low", "medium", "heavy")
HEADLINE = ("reactive", "best_fixed", "predicted_shipped", "predicted", "oracle")


def _vals(v: dict) -> str:
    return (f"{v['rule']}, boundary cost {v['transition_cost_s'] / 3600:g} h, guard share {v['lead_share']:g}, "
            f"floor {v['floor_s'] / 3600:g} h")


def rolling_block(c: dict, m: dict) -> list[str]:
    """The rolling-origin evaluation: the numbers in prose, per load level, the goals, the weeks."""
    pols, r = c["policies"], c["rolling"]
    wk = r["weeks"]
    chose = [w for w in wk if w.get("chosen_on_until")]
    changed = sum(1 for a, b in zip(wk, wk[1:]) if a["in_force"] != b["in_force"]) + (wk[0]["in_force"] != r["shipped"])
    p, b, rc, o, sh = (pols[k] for k in ("predicted", "best_fixed", "reactive", "oracle", "predicted_shipped"))
    vs_b = p["mean_overhead_h"] / b["mean_overhead_h"] - 1 if b["mean_overhead_h"] else None
    lines = [f"{m['injections']} chains scored ({'/'.join(map(str, m['chain_nodes']))} nodes alternating, one every "
             f"{m['chains_every_h']:g} h of trace; {c['work_h']:g} h of work in {c['segment_h']:g} h segments, "
             f"{m['nodes']} nodes) in {len(wk)} weeks, {wk[0]['start'][:10]} .. {wk[-1]['end'][:10]}; "
             f"weeks with too little past, which kept the shipped values: {len(wk) - len(chose)}; "
             f"{m['replayed_chains']} chain replays (every candidate once on each of the {r['past_points']} points "
             f"that can be past for a scored week); {m['seconds']:.0f} s.", "",
             f"Overall, `predicted` (self-tuned, rolling) **{h(p['mean_overhead_h'])}** ({ci(p.get('ci90_h'))}), "
             f"`best_fixed` {h(b['mean_overhead_h'])} ({ci(b.get('ci90_h'))}), the shipped values without tuning "
             f"{h(sh['mean_overhead_h'])}, `reactive` {h(rc['mean_overhead_h'])}, the oracle {h(o['mean_overhead_h'])}; "
             f"`predicted` is {pct(abs(vs_b), 0) if vs_b is not None else '-'} "
             f"{'above' if (vs_b or 0) > 0 else 'below'} `best_fixed` (the goal: at most 5 % above), stuck in "
             f"{p['stuck']} chains, GPU-h held twice {pct(p.get('gpu_h_twice_share'), 2)}. Changes of the values in "
             f"force: {changed} in {len(wk)} weeks.", "",
             "Mean completion overhead per load level (90 % bootstrap interval over the scored chains, n):", "",
             "| policy | all | low | medium | heavy | stuck | GPU-h twice |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in [*HEADLINE, *(k for k in pols if k not in HEADLINE)]:
        q = pols[name]
        cells = [f"{h(q['mean_overhead_h'])} ({ci(q.get('ci90_h'))}), n = {q['n']}"]
        for k in LEVELS:
            x = q["by_load"][k]
            cells.append("-" if not x["n"] else f"{h(x['mean_overhead_h'])} ({ci(x.get('ci90_h'))}), n = {x['n']}")
        lines.append(f"| {name} | {' | '.join(cells)} | {q.get('stuck', 0)} | {pct(q.get('gpu_h_twice_share'), 2)} |")
    lines += ["", "Goals for `predicted` per load level (left share = (predicted - oracle) / (reactive - oracle); the "
                  "goal: at most 0.10 wherever a level has >= 5 chains, or within 10 min of the oracle there):", "",
              "| load | n | reactive - oracle | left share | closes >= 90 % | vs best_fixed |", "|---|---:|---:|---:|---|---:|"]
    for k in LEVELS:
        x, rx, ox, bx = p["by_load"][k], rc["by_load"][k], o["by_load"][k], b["by_load"][k]
        if not x["n"]:
            continue
        gap = rx["mean_overhead_h"] - ox["mean_overhead_h"]
        left = (x["mean_overhead_h"] - ox["mean_overhead_h"]) / gap if gap > 0 else None
        near = x["mean_overhead_h"] - ox["mean_overhead_h"] <= 10 / 60
        ok = "n/a (n < 5)" if x["n"] < 5 else ("yes" if (left is not None and left <= 0.10) or near else "**no**")
        rel = f"{(x['mean_overhead_h'] / bx['mean_overhead_h'] - 1) * 100:+.0f} %" if bx["mean_overhead_h"] else "-"
        lines.append(f"| {k} | {x['n']} | {h(gap)} | {'-' if left is None else f'{left:.2f}'} | {ok} | {rel} |")
    lines += ["", "Week by week (chosen on the choice chains, checked on the newest past; in force: what the week's "
                  "chains ran):", "",
              "| week | n | choice / check chains | chosen | adopted (check gain, 90 % interval) | in force | best fixed |",
              "|---|---:|---:|---|---|---|---:|"]
    for w in wk:
        chk = w.get("check") or {}
        gain = "" if not chk.get("n") else f" ({h(chk['mean_gain_h'])}, {ci(chk['ci90_h'])})"
        lines.append(f"| {w['start'][:10]} | {w['n']} | {w.get('choice_chains', 0)} / {w.get('check_chains', 0)} | "
                     f"{_vals(w['chosen']) if w.get('chosen_on_until') else 'too little past'} | "
                     f"{'yes' if w['adopted'] else 'no'}{gain} | {_vals(w['in_force'])} | "
                     f"{w['best_fixed_lead_s'] / 3600:g} h |")
    return lines


def _priority(d: dict) -> str:
    m = (d.get("tune") or {}).get("score", {}).get("meta") or d.get("meta") or {}
    return m.get("priority", "age")


def fidelity_table(name: str, doc: dict) -> str:
    lines = [f"`{doc['command']}` (commit {doc['commit'][:7]}{', local changes' if doc.get('dirty') else ''}, "
             f"{doc['wall_s']:.0f} s; `docs/results/{name}.json`)", "",
             "| nodes | priority | Spearman | without dependency holds | median sim/real | within x2 | jobs |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in doc["data"]["rows"]:
        lines.append(f"| {r['nodes']} | {r['priority']} | {r['spearman']:.2f} | {r['spearman_without_holds']:.2f} "
                     f"({r['jobs_without_holds']}) | {r['median_ratio']:.2f} | {pct(r['within_2x'], 0)} | {r['jobs']} |")
    return "\n".join(lines)


def render(name: str, doc: dict) -> str:
    d = doc["data"]
    if "rows" in d:
        return fidelity_table(name, doc)
    f = d["fidelity"]
    head = [f"`{doc['command']}` (commit {doc['commit'][:7]}{', local changes' if doc.get('dirty') else ''}, seed "
            f"{doc['seed']}, {doc['wall_s']:.0f} s wall on the shared 2-core box; `docs/results/{name}.json`)", "",
            f"Fidelity ({f['nodes']} nodes, priority {_priority(d)}): Spearman {f['spearman']:.2f} over {f['jobs']} jobs, "
            f"{f['spearman_without_holds']:.2f} without the {f['jobs'] - f['jobs_without_holds']} jobs replayed as "
            f"dependency holds; median sim/real wait {f['median_ratio']:.2f}, within x2 {pct(f['within_2x'], 0)}.", ""]
    if "tune" in d:
        t = d["tune"]
        pk = t["choose"]["picked"]
        target = ("none" if pk.get("rule") == "slack" else "shipped") if pk["target"] is None else f"{pk['target']:.4g}"
        cost = f", boundary cost {pk['transition_cost_s'] / 3600:g} h" if pk.get("transition_cost_s") else ""
        objective = t["choose"].get("grid", {}).get("objective", "fewest stuck, then the lowest mean overhead")
        head += [f"Chosen on {t['choose']['injections']} chains that end before the scored window: **{pk['name']}** "
                 f"(rule {pk.get('rule') or 'quantile'}, target {target}{cost}, floor {pk['floor_s'] / 3600:g} h"
                 + (f", guard share {pk['lead_share']:g}" if pk.get("lead_share") is not None else "") + "). "
                 f"Pick: {objective}. Candidates on the choice window (gap left: the largest share of "
                 "reactive - oracle left open over those levels):", "",
                 "| candidate | n | overhead | low | medium | heavy | gap left | GPU-h twice | segments | stuck |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        rows = dict(t["choose"]["candidates"], **t["choose"].get("references", {}))
        for cname, r in rows.items():
            lv = r.get("by_load") or {}
            cells = [f"{h(lv[k]['mean_overhead_h'])} ({lv[k]['n']})" if lv.get(k, {}).get("n") else "-"
                     for k in ("low", "medium", "heavy")]
            left = "-" if r.get("gap_left") is None else f"{r['gap_left']:.2f}"
            head.append(f"| {cname} | {r['n']} | {h(r['mean_overhead_h'])} | {' | '.join(cells)} | {left} | "
                        f"{pct(r.get('gpu_h_twice_share'), 2)} | {(r.get('mean_segments') or 0):.2f} | {r.get('stuck', 0)} |")
        head += ["", "Scored window (chains injected from the split on):", ""]
        return "\n".join(head + chains_table(t["score"]))
    if "rolling" in d["chains"]:
        return "\n".join(head + rolling_block(d["chains"], d["meta"]))
    return "\n".join(head + chains_table(d))


def settings_block() -> str:
    """The settings the prose quotes, read from the code and the shipped priority file."""
    from chainrun.sim import rolling as R, tune
    from chainrun.sim.chains import ChainWork

    w = ChainWork()
    pr = json.loads((REPO / "chainrun" / "data" / "ls6-a100-priority-config.json").read_text())
    hours = lambda v: ", ".join(f"{x / 3600:g}" for x in v) + " h"  # noqa: E731
    unrun = [x for x in tune.SHARES if x not in {s.lead_share for s in R.grid(w.segment_s)}]
    return "\n".join([
        "The code's settings (rendered by `bench/sim_render.py` from `chainrun.sim`, and the shipped priority file):",
        "",
        f"- chain segment: signal lead {w.signal_lead_s:g} s, restart cost {w.restart_s / 60:g} min",
        f"- rolling grid: rules {', '.join(sorted({s.rule for s in R.grid(w.segment_s)}))}; boundary costs "
        f"{hours(tune.COSTS_S)}; shares {', '.join(f'{x:g}' for x in tune.SHARES if x not in unrun)}; floors "
        f"{hours(R.FLOORS_S)}; {len(R.grid(w.segment_s))} candidates; share {', '.join(f'{x:.1f}' for x in unrun)} "
        "(no guard) not run",
        f"- priority (`ls6-a100-priority-config.json`): age {pr['PriorityWeightAge']} over a "
        f"{pr['PriorityMaxAge']}-day PriorityMaxAge, fair share {pr['PriorityWeightFairshare']}, job size "
        f"{pr['PriorityWeightJobSize']}, usage half-life {pr['PriorityDecayHalfLife'].split('-')[0]} days",
    ])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = DOC.read_text()
    new = text
    for m in re.finditer(r"<!-- results:([\w.-]+) -->\n.*?<!-- /results:\1 -->", text, re.S):
        name = m.group(1)
        if name == "sim-settings":
            new = new.replace(m.group(0), f"<!-- results:{name} -->\n{settings_block()}\n<!-- /results:{name} -->")
            continue
        path = REPO / "docs" / "results" / f"{name}.json"
        if not path.exists():
            print(f"no {path.name} yet: block left as it is", file=sys.stderr)
            continue
        doc = json.loads(path.read_text())
        block = f"<!-- results:{name} -->\n{render(name, doc)}\n<!-- /results:{name} -->"
        new = new.replace(m.group(0), block)
    if args.check:
        return 0 if new == text else 1
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
