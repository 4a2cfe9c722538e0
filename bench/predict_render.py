"""Render the number blocks of docs/model.md from the code's settings and docs/results/predict_*.json.

    .venv/bin/python bench/predict_render.py            # rewrite the marked blocks
    .venv/bin/python bench/predict_render.py --check    # exit 1 if a block is out of date

A block is ``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->``; what is between the markers is
generated: ``settings`` from the constants in chainrun/predict/, every other NAME from the results
file its bench script wrote (``predict_eval``: bench/predict_eval.py, ...). A changed number is a
changed setting or a changed results file; tests/predict/test_model_docs.py runs ``--check`` and
checks that every number in the prose around the blocks is one a block shows.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
from pathlib import Path
from statistics import NormalDist

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "model.md"
RESULTS = REPO / "docs" / "results"
BLOCK = re.compile(r"(<!-- results:([\w.-]+) -->\n)(.*?)(<!-- /results:\2 -->)", re.S)
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def _load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _printed(fn, *args) -> list[str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn(*args)
    return buf.getvalue().rstrip("\n").split("\n")


def settings() -> list[str]:
    from chainrun.predict import calibration, distribution, evaluate, features, ingest, model, prep, training
    from chainrun.chain import live_score
    from chainrun.predict.doubt import ACTED_LEVEL, Z, read_level, rows_backing

    p = training.PARAMS
    rows = [
        ("learned levels", ", ".join(f"{q:g}" for q in distribution.QUANTILES), "distribution.QUANTILES"),
        ("model kind", f"{training.KIND} (the other: {', '.join(k for k in training.KINDS if k != training.KIND)})",
         "training.KIND"),
        ("boosters", f"{training.ROUNDS} rounds, {p['num_leaves']} leaves, at least {p['min_data_in_leaf']} jobs a "
                     f"leaf, learning rate {p['learning_rate']:g}, {p['num_threads']} thread", "training.PARAMS"),
        ("calibration share", f"most recent {calibration.CAL_FRACTION:.0%} of the training jobs, at least "
                              f"{calibration.MIN_CAL_ROWS}", "calibration.CAL_FRACTION"),
        ("refit on every job after calibrating", "yes" if training.REFIT else "no", "training.REFIT"),
        ("user anchor", "on" if training.ANCHOR else "off", "training.ANCHOR"),
        ("per-user candidates", f"users with at least {training.MIN_USER_ROWS} training jobs, the "
                                f"{training.MAX_USER_MODELS} heaviest", "training.MIN_USER_ROWS"),
        ("training jobs", f"the most recent {training.MAX_TRAIN_ROWS}, at least {training.MIN_ROWS}",
         "training.MAX_TRAIN_ROWS"),
        ("tail slope", f"at least {distribution.TAIL_SLOPE:g} decade per unit of normal score",
         "distribution.TAIL_SLOPE"),
        ("history a prediction reads", f"{model.HISTORY_DAYS:g} days", "model.HISTORY_DAYS"),
        ("short history", f"under {rows_backing()} training jobs (q{ACTED_LEVEL:g}'s one-sided "
                          f"{NormalDist().cdf(Z):.0%} bound, z = {Z:.3f})", "doubt.rows_backing"),
        ("widening, for example", f"q0.98 from 10000 jobs read at {read_level(0.98, 10000):.3f}; q0.9 from 29 jobs "
                                  f"at {read_level(0.9, 29):.2f}", "doubt.read_level"),
        ("recent-wait windows", f"the user's last {features.USER_WINDOW} started jobs, the cluster's last "
                                f"{features.CLUSTER_WINDOW}", "features.USER_WINDOW"),
        ("dependency rule (no Eligible column)", f"started within {prep.DEP_GAP_S:g} s of the same user's previous "
                                                 "end, submitted before it", "prep.DEP_GAP_S"),
        ("warm-up", f"first start + {prep.WARMUP_S / 86400:g} days, when the history spans {4 * prep.WARMUP_S / 86400 / 7:g} weeks or more",
         "prep.WARMUP_S"),
        ("sacct reads", f"{ingest.WINDOW_DAYS:g}-day windows, {ingest.LOOKBACK_DAYS:g} days back the first time, "
                        f"then from the last refresh minus {ingest.OVERLAP_S / 3600:g} h", "ingest.WINDOW_DAYS"),
        ("`model status` resolution", f"{live_score.RESOLUTION_S:g} s (the watcher's tick)", "chain.live_score.RESOLUTION_S"),
        ("`model eval` refits", f"every {evaluate.REFIT_EVERY_S / 3600:g} h by default; deadline horizons "
                                f"{', '.join(evaluate.HORIZONS)}; within 2x: both under {evaluate.SMALL_S:g} s count",
         "evaluate.REFIT_EVERY_S"),
        ("random-forest baseline", ", ".join(f"{k}={v}" for k, v in evaluate.RF_PARAMS.items()) +
         f", on the most recent {evaluate.RF_MAX_ROWS} jobs", "evaluate.RF_PARAMS"),
    ]
    return ["| setting | value | in chainrun/predict/ |", "|---|---|---|"] + \
        [f"| {a} | {b} | `{c}` |" for a, b, c in rows]


def tune() -> list[str]:
    d = _load("predict_tune")
    ch = d["chosen"]
    lines = [f"Validation: {d['n_validation']} jobs from {d['validation_from']} to {d['train_until']}, refits every "
             f"{d['refit_every']}, the trace as known at {d['train_until']}.", "",
             "| model | configuration | mean pinball | cov q50 | cov q90 | cov q98 | width q50-q98 | "
             "deadline acc 1h / 6h |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    # every LightGBM configuration, the chosen random forest (its whole grid is in the JSON), the ablations
    grid = [r for r in d["configs"] if r["model"] == "lightgbm" or
            (r["model"] == "random_forest" and r["config"] == ch["random_forest"])]
    ablations = [dict(d["chosen_without_calibration"], model="lightgbm, calibration off"), d["anchor_ablation"],
                 d["refit_ablation"]]
    for r in grid + ablations:
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        chosen = r["model"] in ch and r["config"] == ch[r["model"]]
        c, a = r["calibration"], r["deadline_acc"]
        lines.append(f"| {r['model']}{' **chosen**' if chosen else ''} | {cfg} | {r['mean_pinball']:.4f} | "
                     f"{c['q50']:.3f} | {c['q90']:.3f} | {c['q98']:.3f} | {r['sharpness_log10_q50_q98']:.2f} | "
                     f"{a['1h']:.3f} / {a['6h']:.3f} |")
    return lines


def evaluation() -> list[str]:
    import predict_eval

    d = _load("predict_eval")
    tr, te = d["train"], d["test"]
    return ([f"Trained from {tr['warmup_until'][:10]} (the warm-up's end), refit every {te['refit_every_h']:g} h "
             f"({te['refits']} refits); test: {te['n']} jobs submitted {te['from'][:10]} .. {te['to'][:10]}, "
             f"{te['excluded_dependency_like']} more left out by the dependency rule, {te['never_started']} never "
             f"started; per-user models at some refit: {len(tr['user_models'])}; fit seconds: "
             + ", ".join(f"{k} {v:g}" for k, v in tr["fit_seconds"].items()) + ".", ""]
            + _printed(predict_eval.main_table, d["models"]) + [""]
            + _printed(predict_eval.deadline_table, d["models"], d["deadline_baselines"]))


# the targets issue 12 set for the model (on held-out data; here the development slice's test month)
COVERAGE_TOLERANCE = {"q50": 0.05, "q90": 0.05, "q98": 0.03}
PINBALL_GAIN = 0.20  # mean and q98 pinball at least this much below the user median's
DEADLINE_ACCURACY = 0.90  # at 1 h and 6 h


def targets() -> list[str]:
    d = _load("predict_eval")
    rows = ["| target (issue 12) | with the dependency rule | without | met |", "|---|---|---|---|"]
    runs = [d, d["without_dependency_rule"]]

    def cov(r):
        return r["models"]["lightgbm"]["calibration"]

    ok = all(abs(cov(r)[q] - float(q[1:]) / 100) <= t for r in runs for q, t in COVERAGE_TOLERANCE.items())
    rows.append("| coverage within " + ", ".join(f"{t:g} of {q}" for q, t in COVERAGE_TOLERANCE.items()) + " | " +
                " | ".join(" / ".join(f"{cov(r)[q]:.3f}" for q in COVERAGE_TOLERANCE) for r in runs) +
                f" | {'yes' if ok else 'no'} |")
    for key, label in (("mean_pinball", "mean pinball"), ("p98", "q98 pinball")):
        def gain(r):
            m, u = r["models"]["lightgbm"], r["models"]["user_median"]
            return (m[key] / u[key] - 1) if key == "mean_pinball" else (m["pinball"][key] / u["pinball"][key] - 1)

        rows.append(f"| {label} at least {PINBALL_GAIN:.0%} below the user median's | " +
                    " | ".join(f"{100 * gain(r):+.1f} %" for r in runs) +
                    f" | {'yes' if all(gain(r) <= -PINBALL_GAIN for r in runs) else 'no'} |")
    acc = [[r["models"]["lightgbm"]["deadline"][h]["accuracy"] for h in ("1h", "6h")] for r in runs]
    rows.append(f"| deadline accuracy at least {DEADLINE_ACCURACY:g} at 1 h and 6 h | " +
                " | ".join(" / ".join(f"{a:.3f}" for a in r) for r in acc) +
                f" | {'yes' if all(a >= DEADLINE_ACCURACY for r in acc for a in r) else 'no'} |")
    return rows


def cadence() -> list[str]:
    """The shipped model across the replays: daily refits, the same without the dependency rule, 6-hourly."""
    rows = ["| lightgbm, test month | cov q50 | cov q90 | cov q98 | mean pinball | deadline acc 1h / 6h | n |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    daily, six = _load("predict_eval"), _load("predict_eval_6h")
    for label, d in ((f"refit every {daily['test']['refit_every_h']:g} h ({daily['test']['refits']} refits)", daily),
                     ("the same, without the dependency rule", daily["without_dependency_rule"]),
                     (f"refit every {six['test']['refit_every_h']:g} h ({six['test']['refits']} refits)", six)):
        m = d["models"]["lightgbm"]
        c = m["calibration"]
        rows.append(f"| {label} | {c['q50']:.3f} | {c['q90']:.3f} | {c['q98']:.3f} | {m['mean_pinball']:.3f} | "
                    f"{m['deadline']['1h']['accuracy']:.3f} / {m['deadline']['6h']['accuracy']:.3f} | "
                    f"{m['n_test'] + m['n_never_started']} |")
    return rows


def deadline() -> list[str]:
    import predict_deadline

    d = _load("predict_deadline")
    out = _printed(predict_deadline.render, d)
    table = out[:out.index("")]  # the main table; the reliability bins stay in the JSON
    return [f"Validation: {d['validation']['n']} jobs ({d['validation']['from'][:7]}); test: {d['test']['n']} jobs "
            f"({d['test']['from'][:7]}).", ""] + table


def recency() -> list[str]:
    d = _load("predict_recency")
    lines = ["| half-life (days) | validation: acc 1h / 6h | mean pinball | coverage in target |",
             "|---|---:|---:|---|"]
    for hl, r in d["validation"].items():
        lines.append(f"| {'none' if hl == 'None' else hl} | {r['deadline']['1h']['accuracy']:.3f} / "
                     f"{r['deadline']['6h']['accuracy']:.3f} | {r['mean_pinball']:.3f} | "
                     f"{'yes' if r['coverage_ok'] else 'no'} |")
    return lines + ["", f"Chosen: {d['chosen_half_life_days'] or 'no weighting'}."]


def queue_future() -> list[str]:
    d = _load("predict_queue_future")
    lw = d["long_waits_test"]
    lines = ["| H | without / with the simulated starts / only them (fit on the training months) | "
             "ceiling without / with |", "|---|---|---|"]
    for h in ("1h", "6h"):
        r = d["horizons"][h]
        lines.append(f"| {h} | {r['existing']['fit_on_train_months']:.3f} / {r['existing+sim']['fit_on_train_months']:.3f}"
                     f" / {r['sim only']['fit_on_train_months']:.3f} | {r['existing']['ceiling_cv_inside_test']:.3f} / "
                     f"{r['existing+sim']['ceiling_cv_inside_test']:.3f} |")
    return lines + ["", f"Of the {lw['jobs_waited_over_6h']} test jobs that waited over 6 h, "
                        f"{lw['share_whose_nodes_were_free_at_eligible']:.0%} became eligible while their nodes were "
                        f"free by the trace's node count."]


def cost() -> list[str]:
    d = _load("predict_cost")
    r, p = d["refresh"], d["prediction"]
    return ["```", f"{'measure':<40}{'value':>10}", f"{'refresh wall time (s)':<40}{r['wall_s']:>10}",
            f"{'  of which sacct parse+cache (s)':<40}{r['seconds']['fetch']:>10}",
            f"{'refresh peak RSS (MiB)':<40}{r['max_rss_mib']:>10}",
            f"{'rows in history / trained on':<30}{r['history_rows']:>10} / {r['train_rows']}",
            f"{'one prediction, median (ms)':<40}{p['median_ms']:>10}",
            f"{'one prediction, max of 50 (ms)':<40}{p['max_ms']:>10}",
            f"(prediction with {p['history_rows']} history rows and {p['snapshot_rows']} queued/running jobs; "
            f"load average {d['load_average'][0]:.1f})", "```"]


def doubt() -> list[str]:
    d = _load("predict_doubt")
    lines = ["| trained on n jobs | short | test jobs | model alone: coverage q50 / q90 / q98 | mean pinball | "
             "widened: coverage q50 / q90 / q98 | mean pinball |", "|---:|---|---:|---|---:|---|---:|"]
    for n, r in d["sizes"].items():
        a, w = r["alone"], r["widened"]
        cov = lambda c: " / ".join(f"{c[k]:.3f}" for k in ("q50", "q90", "q98"))  # noqa: E731
        lines.append(f"| {n} | {'yes' if r['short_history'] else 'no'} | {r['jobs']} | {cov(a['coverage'])} | "
                     f"{a['mean_pinball']:.4f} | {cov(w['coverage'])} | {w['mean_pinball']:.4f} |")
    return lines


BLOCKS = {"settings": settings, "predict_tune": tune, "predict_eval": evaluation, "predict_eval_cadence": cadence,
          "predict_targets": targets,
          "predict_deadline": deadline, "predict_recency": recency, "predict_queue_future": queue_future,
          "predict_cost": cost, "predict_doubt": doubt}


def render(text: str) -> str:
    def one(m: re.Match) -> str:
        if m.group(2) not in BLOCKS:
            raise SystemExit(f"docs/model.md: unknown block {m.group(2)!r}")
        return m.group(1) + "\n".join(BLOCKS[m.group(2)]()) + "\n" + m.group(4)

    return BLOCK.sub(one, text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="exit 1 if a block is out of date")
    a = ap.parse_args()
    text = DOC.read_text()
    new = render(text)
    if a.check:
        sys.exit(0 if new == text else 1)
    DOC.write_text(new)


if __name__ == "__main__":
    main()
