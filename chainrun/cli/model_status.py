"""The rows `chainrun model status` prints (text): the saved model, what its history covers, and
`predicted`'s values in force per partition with their check and recent choices. Pure functions over
the dict ``predict.service.model_status`` returns (its ``--json``); the command renders them."""

from __future__ import annotations


def status_rows(st: dict) -> list[tuple[str, str]]:
    """What `model status` says, one (label, text) a line, for the table and the plain lines alike."""
    import time

    m = st["model"]
    w = m["training_window"] or {}
    rows = [("trained", time.strftime("%Y-%m-%d %H:%M", time.localtime(m["trained_at"])) + f" ({m['fit_seconds']}s)"),
            ("training jobs", f"{w.get('rows')} from {w.get('users')} users, "
             f"{time.strftime('%Y-%m-%d', time.gmtime(w.get('since', 0)))} .. "
             f"{time.strftime('%Y-%m-%d', time.gmtime(w.get('until', 0)))}"),
            ("history", f"{st['history'].get('rows', 0)} jobs, "
             + ("all users" if m["all_users"] else "own jobs only (no queue features)"))]
    src = {"scontrol": "from scontrol show node", "history": "estimated from history: no node list was readable"}
    rows.append(("capacity", f"{m['capacity_nodes']:.0f} nodes "
                             f"({src.get(m.get('capacity_source'), m.get('capacity_source'))})"))
    if m.get("quantiles"):
        cal = m.get("calibration") or {}
        rows.append(("quantiles", ", ".join(f"q{int(round(q * 100))}" for q in m["quantiles"]) +
                     (" (calibrated on the most recent jobs: shifts " +
                      ", ".join(f"{k} {v:+.2f}" for k, v in cal.items()) + " log10 s" +
                      ("; then refit on every job)" if m.get("refit") else ")") if cal else
                      " (not calibrated: too few recent jobs)")))
    rows.append(("per-user models", ", ".join(m["user_models"]) or "none (cluster model for everyone)"))
    rows.append(("answers for you", f"{m['answers_for_you']} ({m['user']})"))
    sup = m.get("support") or {}
    if sup:
        rows.append(("support", _support_text(sup)))
    le = st.get("live_error") or {"n": 0}
    rows.append(("acted on", "no predicted segment has started yet" if not le["n"] else
                 f"{le['verdict']}: {le['n']} segments, {le['acted_quantile_coverage'] * 100:.0f} % waited at most "
                 f"the acted-on quantile (nominal {le['acted_quantile'] * 100:.0f} %; waits compared to the "
                 f"{le['resolution_s']:.0f} s watcher tick)"))
    if le.get("deadline_n"):
        rows.append(("deadline", f"{le['deadline_hit_rate'] * 100:.0f} % of {le['deadline_n']} segments started "
                                 "before their predecessor ended"))
    if le.get("acted_prob_n"):
        rows.append(("acted-on chance", f"{le['acted_prob_n']} segments were submitted at a mean "
                                        f"{le['acted_prob_mean'] * 100:.0f} % chance of starting in time; "
                                        f"{le['acted_prob_hit_rate'] * 100:.0f} % did"))
    if le["n"]:
        rows.append(("live error", f"against the acted-on quantile: MAE {le['mae_log10']:.2f} log10, "
                                   f"{le['within_2x'] * 100:.0f} % within 2x, "
                                   f"{le['waited_longer_than_predicted'] * 100:.0f} % waited longer"))
    rows += _tuning_rows(st.get("tuning") or {})
    rows.append(("versions", ", ".join(f"{k} {v}" for k, v in (m["versions"] or {}).items())))
    rows.append(("files", st["model_dir"]))
    return rows


def _tuning_rows(t: dict) -> list[tuple[str, str]]:
    """`predicted`'s values in force per partition (docs/self-tuning.md), from chain/tuned.py ``status``."""
    from chainrun.sim.tuning_text import priority_text, values_text

    if t.get("unreadable"):  # the rest of the status stands; this says what the watcher does meanwhile
        u = t["unreadable"]
        return [("predicted", f"unreadable tuning file {t['file']}: {u['why']}; the watcher runs `predicted` on "
                              f"the shipped values ({u['hint']})")]
    rows = []
    for part, e in (t.get("partitions") or {}).items():
        f = e["in_force"] or {}
        src = {"shipped": "shipped defaults", "chosen": f"chosen {_day(f.get('chosen_at'))}",
               "rollback": f"rolled back {_day(f.get('since'))}"}.get(f.get("source"), f.get("source"))
        rows.append((f"predicted on {part}", f"{values_text(f)} ({src}{', pinned' if e['pinned'] else ''})"))
        w = f.get("window") or {}
        sc = (f.get("check") or {}).get("scores_h") or {}
        if w:
            rows.append(("  chosen on", f"chains injected {w.get('choice_from')} .. {w.get('choice_until')} "
                                         f"({w.get('choice_chains')}); checked on {w.get('check_from')} .. "
                                         f"{w.get('check_until')} ({w.get('check_chains')})"))
        lc = e.get("last_check") or {}
        if sc and sc != lc.get("scores_h"):  # the choice in force's check, when a later one differs
            rows.append(("  check overhead", _scores_text(sc) + " (when chosen)"))
        if lc:
            earlier = "" if lc.get("of_latest_refresh") else " (an earlier refresh)"
            rows.append(("  last check", f"{_day(lc.get('at'))}{earlier}: {_scores_text(lc['scores_h'])}"))
        if e.get("replay_facts"):
            rows.append(("  latest replay", priority_text(e["replay_facts"])))
        hist = e.get("history") or []
        put = [h for h in hist if h.get("put_in_force")]
        by_tune = sum(1 for h in hist if h.get("by") == "tune")  # `model tune` runs choose too
        runs = f"{len(hist)} runs ({by_tune} by model tune)" if by_tune else f"{len(hist)} refreshes"
        last = f" (last {_day(put[-1].get('at'))})" if put else ""
        rows.append(("  choices", f"{runs}, {len(put)} put in force{last}; pin or roll back: chainrun model tune "
                                   f"--partition {part} --pin | --unpin | --rollback"))
        rows += [(f"  {c.get('by') or 'refresh'} {_day(c.get('at'))}", _choice_text(c)) for c in e.get("recent") or []]
    if not rows:
        rows.append(("predicted", "shipped defaults (not tuned yet: chainrun model refresh chooses them)"))
    return rows


_SCORE_NAMES = {"chosen": "chosen", "in_force": "in force", "reactive": "reactive", "oracle": "oracle",
                "best_fixed": "best fixed lead"}


def _scores_text(sc: dict) -> str:
    order = [*_SCORE_NAMES, *sorted(set(sc) - set(_SCORE_NAMES))]  # the file keeps keys sorted
    return "mean overhead a chain: " + ", ".join(f"{_SCORE_NAMES.get(k, k)} {sc[k]:.2f} h" for k in order
                                                 if isinstance(sc.get(k), (int, float)))


def _choice_text(c: dict) -> str:
    """One refresh on a short line: the window, the values chosen when not put in force (an adopted
    summary names them), and the refresh's outcome line (kept or adopted, and why)."""
    from chainrun.sim.tuning_text import thinned_text, values_text

    w = c.get("window") or {}
    span = f"on {str(w.get('choice_from'))[:10]} .. {str(w.get('check_until'))[:10]}: " if w.get("check_until") else ""
    chose = f"chose {values_text(c['chosen'])}; " if c.get("chosen") and not c.get("put_in_force") else ""
    said = c.get("summary") or (("put in force: " if c.get("put_in_force") else "not put in force: ")
                                + (c.get("reason") or "?") + thinned_text(c))
    return f"{span}{chose}{said}"


def _day(ts) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "?"


def _support_text(sup: dict) -> str:
    """What the model's history covers, and what predict and the watcher do beyond it."""
    seen = sup.get("busiest_queue_seen") or {}
    parts = [f"{seen['q_pending_jobs'][1]:.3g} pending jobs" if "q_pending_jobs" in seen else "",
             f"{seen['q_pending_nodes'][1]:.3g} pending nodes" if "q_pending_nodes" in seen else "",
             f"free-node share down to {seen['q_free_nodes_frac'][0]:.2g}" if "q_free_nodes_frac" in seen else ""]
    busiest = ", ".join(x for x in parts if x)
    head = (f"short history: {sup['training_rows']} jobs, q{sup['acted_level'] * 100:.0f} needs "
            f"{sup['rows_for_full_support']}; predictions are widened, and lean on Slurm's estimate where it is later"
            if sup["short_history"] else
            f"{sup['training_rows']} jobs (q{sup['acted_level'] * 100:.0f} needs {sup['rows_for_full_support']})")
    tail = f"; busiest queue seen: {busiest}; a busier live queue leans on Slurm's estimate where it is later" if busiest else ""
    return head + tail
