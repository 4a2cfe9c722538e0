"""The site margin chosen week by week on its own past: a rolling-origin score (issue #26).

``site_tune.choose_and_score`` chooses the margin once, at the middle of the window, and scores the
newer half. This scores every week of the window out of sample instead, the way the single-cluster
evaluation does (rolling.py, docs/evaluation.md "Rolling-origin evaluation"):

1. **Weeks** of 7 days from the first injection point, until the last point is in one.
2. **Choice** of week W: the points whose every run (every margin and every single-site row, as
   ``choose_and_score``'s ``ended``) ended before W starts. With at least ``site_tune.MIN_CHOICE``
   of them (counted as ``choose_and_score`` counts them: finished ``predicted_multi`` runs at the
   grid's first margin), the margin is ``site_tune.pick`` on their rows, unchanged (grid, budgets,
   tie rule); with fewer, ``site_tune.DEFAULT_MARGIN_S``, and the week's note says so.
3. **Score** W's points (injected in [W.start, W.end)) with W's margin: ``predicted_multi`` (and
   ``predicted_multi_race``) of a chain is its run at the margin in force for its week; the
   single-site rows and the hindsight row are as everywhere. The rows are over every week's chains.

Added after the split's scores had been seen (docs/multi-cluster.md says so): not a new tuning (the
procedure that chooses is ``pick``, as fixed before any score), a score in which every chain's margin
was chosen without it. Cheap by construction: no new replay, only the runs ``run_points`` made,
regrouped.
"""

from __future__ import annotations

from chainrun.sim import site_tune

WEEK_S = 7 * 86400.0


def weeks(pts: list) -> list[tuple[float, float]]:
    """Whole 7-day weeks from the first injection point until the last point is in one."""
    out, a = [], pts[0][0]
    while a <= pts[-1][0]:
        out.append((a, a + WEEK_S))
        a += WEEK_S
    return out


def week_margin(runs: list, loads: dict, cfg, ended: dict, start: float,
                margins: tuple[float, ...]) -> tuple[float, bool, int, int, str]:
    """(margin, chosen, choice points, finished choice chains, note) for a week starting at ``start``:
    ``site_tune.pick`` on the points all of whose runs ended before it, else the default."""
    choice = {k for k, e in ended.items() if e < start}
    past = [r for r in runs if (r.t0, r.nodes) in choice]
    n_choice = len([r for r in past if r.policy == site_tune.multi_name(margins[0]) and r.done])
    if n_choice < site_tune.MIN_CHOICE:
        return (site_tune.DEFAULT_MARGIN_S, False, len(choice), n_choice,
                f"{n_choice} chains ended before the week (fewer than {site_tune.MIN_CHOICE}): the default margin")
    grid = site_tune.policy_rows(past, loads, cfg, [site_tune.multi_name(m) for m in margins])
    return (site_tune.pick({m: grid[site_tune.multi_name(m)] for m in margins}), True, len(choice), n_choice,
            "chosen on the chains ended before the week")


def rolling(runs: list, loads: dict, cfg, names: list[str], pts: list, margins: tuple[float, ...], *,
            race: bool = False) -> dict:
    """``chains.rolling`` of the JSON: the weeks, the rows over every week's chains, their targets."""
    st = site_tune
    rows = [f"reactive:{names[0]}", *(f"predicted:{n}" for n in names), st.MULTI, *([st.RACE] if race else []),
            st.HINDSIGHT]
    ended = site_tune.ended_by_point(runs)
    by_point: dict = {}
    for r in runs:
        by_point.setdefault((r.t0, r.nodes), []).append(r)
    out_weeks, scored = [], []
    for a, b in weeks(pts):
        margin, chosen, n_points, n_choice, note = week_margin(runs, loads, cfg, ended, a, margins)
        here = [k for k in pts if a <= k[0] < b]
        scored += st._with_pick([r for k in here for r in by_point.get(tuple(k), [])], margin, names)
        out_weeks.append({"start": st._iso(a), "end": st._iso(b), "n": len(here), "choice_chains": n_points,
                          "choice_finished": n_choice, "margin_s": margin, "chosen": chosen, "note": note})
    pols = st.policy_rows(scored, loads, cfg, rows)
    return {"weeks": out_weeks, "policies": pols, "targets": st.targets(pols, names),
            "note": "each week's margin chosen with site_tune.pick on the chains whose every run ended before the "
                    f"week (fewer than {st.MIN_CHOICE}: the default {st.DEFAULT_MARGIN_S / 3600:g} h); every chain "
                    "scored with a margin chosen without it; added after the split's scores were seen"}
