"""The tuning outcome's words: the values, the one-line outcome of a refresh, the replay's priority
model. Pure functions over the outcome dicts of chainrun/sim/selftune.py, shared by `model refresh`,
`model tune` and `model status` (chainrun/cli/)."""

from __future__ import annotations


def thinned_text(res: dict) -> str:
    """`` (thinned replay: 1/k of the N jobs on M nodes)`` when the replay was thinned, else ''."""
    t = res.get("thinned")
    if not t:
        return ""
    n = t.get("nodes")
    on = "" if n is None else f" on {n} node{'s' if n != 1 else ''}"
    return f" (thinned replay: 1/{t['k']} of the {t['of_jobs']} jobs{on})"


def values_text(v: dict) -> str:
    return (f"rule {v['rule']}, boundary cost {v['transition_cost_s'] / 3600:g} h, guard share {v['lead_share']:g}, "
            f"floor {v['floor_s'] / 3600:g} h")


_PRIORITY_KINDS = {"age": "age-only priority", "multifactor": "multifactor priority (age, job size)",
                   "fairshare": "multifactor priority (age, fair share, job size)"}


def priority_text(facts: dict) -> str:
    """The replay's priority model and what stood in for what Slurm did not tell (``facts.notes``:
    age-only fallback, sprio's weights, partition and QOS weights not replayed), on one short line:
    what `model refresh` and `model status` say of the replay a choice came from."""
    kind = facts.get("priority") or "age"
    notes = [n for n in facts.get("notes") or [] if n]
    return _PRIORITY_KINDS.get(kind, f"{kind} priority") + ("; " + "; ".join(notes) if notes else "")


def summary_line(res: dict, force: dict) -> str:
    """One line: ``adopted: <values> (<reason>)`` or ``kept shipped defaults: <reason>``."""
    if res.get("put_in_force"):
        return f"adopted {values_text(res['chosen'])}: {res['reason']}{thinned_text(res)}"
    kept = "kept shipped defaults" if force.get("source") == "shipped" else \
        f"kept the values in force ({force.get('source')}: {values_text(force)})"
    return f"{kept}: {res['reason']}{thinned_text(res)}"
