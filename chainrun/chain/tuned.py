"""The values `predicted` runs with on each cluster and partition: what `model refresh` chose
(chainrun/sim/selftune.py), pinned or rolled back by hand (`chainrun model tune`), else shipped.

Stored as JSON beside the model's metadata (``<models>/<cluster>/tuning.json``; never pickle):

    {"version": 1, "partitions": {"gpu": {
        "in_force": {"rule", "transition_cost_s", "lead_share", "floor_s",   # the values
                     "source": "shipped" | "chosen" | "rollback" | "pinned", "since": epoch,
                     "chosen_at", "window", "check", ...},                  # when and on what
        "pinned": false,
        "history": [ every refresh's outcome, newest last, at most HISTORY_MAX ]}}}

Light on purpose (json only): the watcher reads it for every `predicted` chain.

An unreadable file (not JSON, or not this shape) stops nothing: the watcher runs on the shipped
values and logs it once, `model status` shows everything else and names the file, and a refresh,
`model tune` or `model tune --rollback` sets it aside (``tuning.json.corrupt-<time>``, kept) and
starts from the shipped values (``set_aside``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from chainrun.state import json_file

log = logging.getLogger(__name__)

VERSION = 1
HISTORY_MAX = 50
RECENT = 5  # the choices `model status` lists as lines (its --json has them all)
KEYS = ("rule", "transition_cost_s", "lead_share", "floor_s")
# how to get past an unreadable file: every route keeps it (renamed), none edits it
FIX = ("it is set aside, kept as tuning.json.corrupt-<time>, by chainrun model tune --partition P --rollback "
       "(shipped values, pinned) or by the next chainrun model refresh")


def shipped() -> dict:
    """The shipped values (chainrun/chain/shipped.py), in the stored shape."""
    from chainrun.chain.shipped import MAX_LEAD_SHARE, PREDICTED_FLOOR_S, PREDICTED_RULE, TRANSITION_COST_S

    return {"rule": PREDICTED_RULE, "transition_cost_s": float(TRANSITION_COST_S), "lead_share": MAX_LEAD_SHARE,
            "floor_s": float(PREDICTED_FLOOR_S)}


def path(cluster: str) -> Path:
    from chainrun.predict.service import model_dir

    return model_dir(cluster) / "tuning.json"


def load(cluster: str) -> dict:
    """The stored document; an empty one when there is none. An unreadable file is an error (it
    names the file and the way past it), never silently the shipped values."""
    from chainrun.errors import ModelError

    doc, why = read(path(cluster))
    if why is not None:
        raise ModelError(f"unreadable {path(cluster)}: {why}", hint=FIX)
    return doc


def read(p: Path) -> tuple[dict | None, str | None]:
    """``(document, None)`` (an empty one when there is no file), or ``(None, why)`` when the file
    cannot be used: not readable, not JSON, or a shape whose values `predicted` could not run with."""
    return json_file.read(p, {"version": VERSION, "partitions": {}}, _bad_doc)


def _bad_doc(doc) -> str | None:
    """What makes a parsed document unusable, or None: the checks are what the readers index."""
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), dict):
        return "not a tuning document"
    if not isinstance(doc.get("default_partition") or "", str):
        return "default_partition is not a name"
    for part, e in doc["partitions"].items():
        if not isinstance(e, dict):
            return f"partition {part!r} is not an object"
        if (bad := bad_values(e.get("in_force"))) is not None:
            return f"partition {part!r}: values in force: {bad}"
        hist = e.get("history") or []
        if not isinstance(hist, list) or not all(isinstance(h, dict) for h in hist):
            return f"partition {part!r}: history is not a list of objects"
        for h in hist:
            if (h.get("chosen") is not None or h.get("put_in_force")) and bad_values(h.get("chosen")) is not None:
                return f"partition {part!r}: a choice in the history: {bad_values(h.get('chosen'))}"
            if not isinstance(h.get("check") or {}, dict):
                return f"partition {part!r}: a check in the history is not an object"
        if not isinstance(e.get("last") or {}, dict):
            return f"partition {part!r}: last is not an object"
    return None


def bad_values(v) -> str | None:
    """Why these are not four values `predicted` can run with, or None."""
    from chainrun.chain.shipped import RULES

    if not isinstance(v, dict):
        return "not an object"
    if v.get("rule") not in RULES:
        return f"rule {v.get('rule')!r} (one of {', '.join(RULES)})"
    for k in KEYS[1:]:
        x = v.get(k)
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            return f"{k} {x!r}"
    return None


def set_aside(cluster: str) -> dict | None:
    """An unreadable tuning file renamed to ``tuning.json.corrupt-<UTC time>`` beside it (one rename
    in the folder: atomic; never over another file, so nothing is lost); what was done, or None when
    the file is readable or absent. The next write starts from the shipped values."""
    p = path(cluster)
    _, why = read(p)
    if why is None:
        return None
    done = json_file.set_aside(p, why)
    log.info("set aside the unreadable tuning file %s (%s) as %s", p, why, done["moved_to"])  # the command says it
    return done


def set_aside_text(aside: dict) -> str:
    """The one line a command prints when it set an unreadable file aside."""
    return (f"set aside the unreadable tuning file {aside['file']} ({aside['why']}) as {aside['moved_to']}; "
            "starting from the shipped values")


def save(cluster: str, doc: dict) -> Path:
    """Atomically (a watcher may read it meanwhile)."""
    return json_file.save(path(cluster), doc)


def entry(doc: dict, partition: str) -> dict:
    return doc["partitions"].setdefault(partition, {"in_force": {**shipped(), "source": "shipped", "since": None},
                                                    "pinned": False, "history": []})


def in_force(cluster: str, partition: str) -> dict:
    """The four values `predicted` uses for a chain on ``cluster``/``partition``: the stored ones,
    else the shipped ones. Unreadable or missing files give the shipped values (a watcher must not
    stop over them: it logs a warning once per state of the file; `model status` names the problem)."""
    try:
        p = path(cluster)
        doc, why = read(p)
    except Exception as e:  # noqa: BLE001 -- e.g. an unusable CHAINRUN_HOME: the watcher keeps going
        doc, why, p = None, f"{type(e).__name__}: {e}", None
    if why is not None:
        _warn_once(p, why)
        return shipped()
    e = doc["partitions"].get(partition or "")
    if e is None and not partition:  # a chain without a partition: the cluster's default one
        e = doc["partitions"].get(doc.get("default_partition") or "")
    if not e:
        return shipped()
    f = e.get("in_force") or {}
    return {k: f.get(k, v) for k, v in shipped().items()}


_warned: set = set()


def _warn_once(p: Path | None, why: str) -> None:
    """One log line per unreadable state of the file (the watcher asks at every decision)."""
    try:
        st = p.stat() if p is not None else None
        key = (str(p), st.st_mtime_ns, st.st_size) if st else (str(p), why)
    except OSError:
        key = (str(p), why)
    if key in _warned:
        return
    _warned.add(key)
    log.warning("unreadable tuning file %s: %s; `predicted` runs on the shipped values (%s)", p, why, FIX)


def record(cluster: str, partition: str, outcome: dict, *, default_partition: str | None = None) -> dict:
    """Store one refresh's outcome: appended to the history; when adopted and not pinned, its values
    go in force. Returns the partition's entry."""
    with json_file.locked(path(cluster)):
        doc = load(cluster)
        if default_partition:
            doc["default_partition"] = default_partition
        e = entry(doc, partition)
        now = time.time()
        adopted = bool(outcome.get("adopted")) and not e.get("pinned")
        was = outcome.get("previous") or {k: (e.get("in_force") or {}).get(k) for k in KEYS}
        e["history"] = (e.get("history") or []) + [{**outcome, "at": now, "put_in_force": adopted, "previous": was}]
        e["history"] = e["history"][-HISTORY_MAX:]
        if adopted:
            e["in_force"] = {**{k: outcome["chosen"][k] for k in KEYS}, "source": "chosen", "since": now,
                             "chosen_at": now, "window": outcome.get("window"), "check": outcome.get("check"),
                             "fidelity": outcome.get("fidelity")}
        e["last"] = {"at": now, "adopted": adopted, "reason": outcome.get("reason"),
                     "summary": outcome.get("summary")}
        save(cluster, doc)
        return e


def pin(cluster: str, partition: str, on: bool = True) -> dict:
    """Pin the values in force (a refresh still chooses and records, but changes nothing), or unpin.
    Refused, with nothing written, on an unreadable file (``FIX``) or a partition this cluster does
    not know (``check_partition``)."""
    with json_file.locked(path(cluster)):
        doc = load(cluster)
        check_partition(cluster, partition, doc)
        e = entry(doc, partition)
        e["pinned"] = bool(on)
        save(cluster, doc)
        return e


def rollback(cluster: str, partition: str) -> dict:
    """Put the values in force before the current ones back in force (the shipped values when there
    were none) and pin them, so the next refresh does not adopt again what was just rolled back.
    An unreadable file is set aside first (its values are unknown: the shipped ones, pinned); the
    returned entry's ``set_aside`` says so. A partition this cluster does not know writes nothing."""
    with json_file.locked(path(cluster)):
        doc, why = read(path(cluster))
        check_partition(cluster, partition, doc or {"partitions": {}})
        aside = set_aside(cluster) if why is not None else None
        doc = doc if why is None else {"version": VERSION, "partitions": {}}
        e = entry(doc, partition)
        cur = {k: (e.get("in_force") or {}).get(k) for k in KEYS}
        prev = None
        for h in reversed(e.get("history") or []):
            if h.get("put_in_force") and bad_values(h.get("previous")) is None and \
                    {k: h["chosen"][k] for k in KEYS} == cur:
                prev = h["previous"]
                break
        prev = prev or shipped()
        e["in_force"] = {**{k: prev[k] for k in KEYS}, "source": "rollback", "since": time.time(),
                         "rolled_back_from": cur}
        e["pinned"] = True
        save(cluster, doc)
        return {**e, "set_aside": aside}


def known_partitions(cluster: str, doc: dict) -> list[str] | None:
    """The partitions `model tune` may pin or roll back on ``cluster``: those of the tuning record
    (``doc``) and those the saved model's history names; None when there is neither a model nor a
    record (nothing was ever learnt of this cluster)."""
    from chainrun.predict.service import model_dir

    parts = set(doc.get("partitions") or {}) | ({doc["default_partition"]} if doc.get("default_partition") else set())
    meta = model_dir(cluster) / "meta.json"
    if meta.exists():
        try:
            parts |= set(((json.loads(meta.read_text()).get("categories") or {}).get("partition") or {}))
        except (OSError, ValueError, AttributeError):  # `model status` names an unreadable model
            pass
    elif not parts:
        return None
    return sorted(p for p in parts if isinstance(p, str) and p)


def check_partition(cluster: str, partition: str, doc: dict) -> None:
    """Raise unless ``partition`` is one :func:`known_partitions` lists (a typo would otherwise be
    stored and reported as pinned while the chains' partition stays as it was)."""
    from chainrun.errors import ModelError, NotFoundError

    parts = known_partitions(cluster, doc)
    if parts is None:
        raise ModelError(f"no queue-delay model for cluster {cluster} yet: no partition to pin or roll back; "
                         "nothing written", hint=f"run: chainrun model refresh --cluster {cluster}")
    if partition not in parts:
        raise NotFoundError(f"no partition {partition!r} on cluster {cluster}: known "
                            f"{', '.join(parts) or 'none (the model history names no partition)'}; nothing written",
                            hint="give one of them with --partition")


def status(cluster: str) -> dict:
    """What `model status` shows per partition: the values in force, where they came from, when and
    on what window they were chosen, the check's scores, pinned or not, the last refresh's outcome,
    the latest refresh's check scores (``last_check``, adopted or not), what its replay read of the
    cluster (``replay_facts``: priority model and notes), the last RECENT choices (``recent``, newest
    first) and the whole history (newest last). An unreadable file gives no
    partitions and ``unreadable`` (why, and the way past it): status still shows the rest."""
    p = path(cluster)
    doc, why = read(p)
    out = {"file": str(p), "default_partition": None, "partitions": {}}
    if why is not None:
        return {**out, "unreadable": {"why": why, "hint": FIX}}
    out["default_partition"] = doc.get("default_partition")
    for part, e in sorted(doc["partitions"].items()):
        hist = e.get("history") or []
        checked = next((h for h in reversed(hist) if (h.get("check") or {}).get("scores_h")), None)
        out["partitions"][part] = {
            "in_force": e.get("in_force"), "pinned": bool(e.get("pinned")), "last": e.get("last"),
            "last_check": None if checked is None else {**_choice(checked), "scores_h": checked["check"]["scores_h"],
                                                        "of_latest_refresh": checked is hist[-1]},
            "recent": [_choice(h) for h in reversed(hist[-RECENT:])],
            # the latest refresh's replay: its priority model and what stood in for what Slurm did not tell
            "replay_facts": (hist[-1].get("facts") if hist and isinstance(hist[-1].get("facts"), dict) else None),
            "history": [{**h, "scores_h": (h.get("check") or {}).get("scores_h")} for h in hist]}
    return out


def _choice(h: dict) -> dict:
    """One refresh's choice as `model status` lists it."""
    w = h.get("window") if isinstance(h.get("window"), dict) else {}
    span = {k: w.get(k) for k in ("choice_from", "choice_until", "check_from", "check_until")} if w else None
    return {"at": h.get("at"), "chosen": h.get("chosen"), "put_in_force": bool(h.get("put_in_force")),
            "adopted": bool(h.get("adopted")), "reason": h.get("reason"), "summary": h.get("summary"),
            "thinned": h.get("thinned"), "by": h.get("by") or "refresh",  # older entries: only refresh chose
            "window": span}
