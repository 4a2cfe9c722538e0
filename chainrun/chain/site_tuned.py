"""The site margin in force for each ordered cluster list (a chain spanning ``a,b`` moves only to gain
more than it): what `chainrun model sites a,b` chose on the past (chainrun/sim/site_selftune.py), else
the shipped one (``site_choice.SHIPPED_MARGIN_S``). `submit --cluster a,b` reads it once and records it
in the chain (``chain.extra["site_margin_s"]``, read by ``site_plan.margin_s`` only).

Stored as JSON in the models folder (``<models>/site_margins.json``; never pickle):

    {"version": 1, "lists": {"a,b": {
        "in_force": {"margin_s", "source": "shipped" | "chosen" | "rollback", "since", "chosen_at", "as_of",
                     "window", "rows"},              # when and on what it was chosen
        "pinned": false,                             # pinned: choices are recorded, change nothing
        "last": {"at", "chosen", "put_in_force", "reason", "summary"},
        "history": [ every choice's outcome ("put_in_force", "previous": the margin in force before),
                     newest last, at most HISTORY_MAX ]}}}

The order is part of the key: ``a,b`` and ``b,a`` prefer different clusters, so their chains differ.
``pin`` and ``rollback`` are `model tune`'s (chain/tuned.py) for a cluster list: `model sites a,b --pin`
keeps the margin in force (a later choice, by hand or by `model refresh`, is recorded and changes
nothing), ``--rollback`` puts the margin in force before the current one back (the shipped one when
there was none) and pins it.

An unreadable file (not JSON, or not this shape) stops nothing: submit takes the shipped margin and
logs it, `model sites --show` names it, and the next `model sites` (or `model sites a,b --rollback`:
the shipped margin, pinned) sets it aside (``site_margins.json.corrupt-<time>``, kept) and starts afresh;
`model refresh` leaves it alone and says so.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from chainrun.state import json_file

log = logging.getLogger(__name__)

VERSION = 1
HISTORY_MAX = 20
RECENT = 5  # the choices `model sites --show` lists (its --json has them all)
FIX = ("the next chainrun model sites CLUSTERS (or model sites CLUSTERS --rollback: the shipped margin, pinned) "
       "sets it aside (kept as site_margins.json.corrupt-<time>)")


def key(names: list[str]) -> str:
    return ",".join(names)


def path() -> Path:
    from chainrun.paths import models_dir

    return models_dir() / "site_margins.json"


def shipped() -> dict:
    from chainrun.chain.site_choice import SHIPPED_MARGIN_S

    return {"margin_s": float(SHIPPED_MARGIN_S), "source": "shipped", "since": None}


def read(p: Path) -> tuple[dict | None, str | None]:
    """``(document, None)`` (an empty one when there is no file), or ``(None, why)``."""
    return json_file.read(p, {"version": VERSION, "lists": {}}, _bad_doc)


def _bad_doc(doc) -> str | None:
    """What makes a parsed document unusable, or None: the checks are what the readers index."""
    if not isinstance(doc, dict) or not isinstance(doc.get("lists"), dict):
        return "not a site margin document"
    if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
        return f"version {doc.get('version')!r} (this chainrun reads {VERSION})"
    for k, e in doc["lists"].items():
        if not isinstance(e, dict) or not isinstance(e.get("in_force"), dict):
            return f"list {k!r} has no margin in force"
        m = e["in_force"].get("margin_s")
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m < 0:
            return f"list {k!r}: margin {m!r}"
        if not isinstance(e.get("history") or [], list) or not all(isinstance(h, dict) for h in e.get("history") or []):
            return f"list {k!r}: history is not a list of objects"
    return None


def set_aside() -> dict | None:
    """An unreadable file renamed to ``site_margins.json.corrupt-<UTC time>`` beside it (one rename:
    atomic, never over another file); what was done, or None when readable or absent."""
    p = path()
    _, why = read(p)
    if why is None:
        return None
    done = json_file.set_aside(p, why)
    log.info("set aside the unreadable site margin file %s (%s) as %s", p, why, done["moved_to"])
    return done


def save(doc: dict) -> Path:
    """Atomically (a submit may read it meanwhile)."""
    return json_file.save(path(), doc)


def in_force(names: list[str]) -> dict:
    """The margin in force for this ordered list (``margin_s``, ``source``, ``since``...): the stored one,
    else the shipped one. Never raises: an unreadable file gives the shipped margin, logged."""
    try:
        p = path()
        doc, why = read(p)
    except Exception as e:  # noqa: BLE001 -- e.g. an unusable CHAINRUN_HOME: a submit is not stopped by it
        doc, why, p = None, f"{type(e).__name__}: {e}", None
    if why is not None:
        log.warning("unreadable site margin file %s: %s; the shipped margin is used (%s)", p, why, FIX)
        return shipped()
    e = doc["lists"].get(key(names))
    return dict(e["in_force"]) if e else shipped()


def _load() -> dict:
    """The stored document (an empty one when there is none); an unreadable file is an error."""
    from chainrun.errors import ModelError

    doc, why = read(path())
    if why is not None:
        raise ModelError(f"unreadable {path()}: {why}", hint=FIX)
    return doc


def _entry(doc: dict, names: list[str]) -> dict:
    return doc["lists"].setdefault(key(names), {"in_force": shipped(), "pinned": False, "history": []})


def is_pinned(names: list[str]) -> bool:
    """Whether this list's margin is pinned (False when unreadable: nothing is pinned in a file no one reads)."""
    doc, why = read(path())
    return why is None and bool((doc["lists"].get(key(names)) or {}).get("pinned"))


def record(names: list[str], outcome: dict) -> dict:
    """Store one choice's outcome (appended to the list's history); a chosen margin goes in force unless
    the list is pinned, a choice that could not be made keeps what is in force. The caller sets an
    unreadable file aside first."""
    with json_file.locked(path()):
        doc = _load()
        e = _entry(doc, names)
        now = time.time()
        put = bool(outcome.get("chosen")) and not e.get("pinned")
        slim = {k: outcome.get(k) for k in ("chosen", "margin_s", "reason", "summary", "as_of", "window", "rows",
                                            "shape", "fidelity", "thinned", "notes", "seconds")}
        prev = {k: e["in_force"].get(k) for k in ("margin_s", "source", "since")}
        h = {**slim, "at": now, "put_in_force": put, "previous": prev}
        e["history"] = ((e.get("history") or []) + [h])[-HISTORY_MAX:]
        if put:
            e["in_force"] = {"margin_s": float(outcome["margin_s"]), "source": "chosen", "since": now,
                             "chosen_at": now, "as_of": outcome.get("as_of"), "window": outcome.get("window"),
                             "rows": outcome.get("rows")}
        e["last"] = {"at": now, "chosen": bool(outcome.get("chosen")), "put_in_force": put,
                     "reason": outcome.get("reason"), "summary": outcome.get("summary")}
        save(doc)
        return e


def pin(names: list[str], on: bool = True) -> dict:
    """Pin the margin in force (a later choice is still recorded, but changes nothing), or unpin. Refused,
    with nothing written, on an unreadable file (``FIX``). The caller checks the names."""
    with json_file.locked(path()):
        doc = _load()
        e = _entry(doc, names)
        e["pinned"] = bool(on)
        save(doc)
        return e


def rollback(names: list[str]) -> dict:
    """Put the margin in force before the current one back in force (the shipped one when there was
    none) and pin it, so the next choice does not put back what was just rolled back. A list with
    nothing stored is refused (nothing to roll back), nothing written. An unreadable file is set aside
    first (its margins are unknown: the shipped one, pinned); the returned entry's ``set_aside`` says so."""
    from chainrun.errors import NotFoundError

    with json_file.locked(path()):
        doc, why = read(path())
        if why is None and key(names) not in doc["lists"]:
            raise NotFoundError(f"no site margin stored for {key(names)}: nothing to roll back; nothing written",
                                hint=f"it runs on the shipped margin; choose one: chainrun model sites {key(names)}")
        aside = set_aside() if why is not None else None
        doc = doc if why is None else {"version": VERSION, "lists": {}}
        e = _entry(doc, names)
        cur = e["in_force"].get("margin_s")
        prev = _previous(e.get("history") or [], cur)
        e["in_force"] = {"margin_s": prev, "source": "rollback", "since": time.time(), "rolled_back_from": cur}
        e["pinned"] = True
        save(doc)
        return {**e, "set_aside": aside}


def _previous(hist: list[dict], cur) -> float:
    """The margin in force before the latest choice that put ``cur`` in force; the shipped one when none
    did. Choices recorded before pins existed (no ``put_in_force``/``previous``) were all put in force:
    their previous margin is the one the choice before them put in force."""
    before, found = float(shipped()["margin_s"]), None
    for h in hist:
        put = h.get("put_in_force", bool(h.get("chosen")))
        p = (h.get("previous") or {}).get("margin_s", before)
        if put and _margin(h.get("margin_s")) and _margin(p):
            if float(h["margin_s"]) == cur:
                found = float(p)
            before = float(h["margin_s"])
    return float(shipped()["margin_s"]) if found is None else found


def _margin(m) -> bool:
    return not isinstance(m, bool) and isinstance(m, (int, float)) and math.isfinite(m) and m >= 0


def status(names: list[str] | None = None) -> dict:
    """What `model sites --show` prints: per list (every list, or ``names``) the margin in force, its
    ``source``, ``pinned``, the last choice and the RECENT latest choices (newest first, each with
    ``put_in_force``). An unreadable file gives ``unreadable``."""
    p = path()
    doc, why = read(p)
    out: dict = {"file": str(p), "lists": {}}
    if why is not None:
        return {**out, "unreadable": {"why": why, "hint": FIX}}
    wanted = [key(names)] if names else sorted(doc["lists"])
    for k in wanted:
        e = doc["lists"].get(k) or {"in_force": shipped(), "history": []}
        hist = e.get("history") or []
        out["lists"][k] = {"in_force": e["in_force"], "pinned": bool(e.get("pinned")),
                           "source": e["in_force"].get("source"), "last": e.get("last"),
                           "recent": [{**{x: h.get(x) for x in ("at", "chosen", "margin_s", "reason", "window")},
                                       "put_in_force": h.get("put_in_force", bool(h.get("chosen")))}
                                      for h in reversed(hist[-RECENT:])]}
    return out
