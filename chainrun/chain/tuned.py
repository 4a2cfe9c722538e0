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
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

VERSION = 1
HISTORY_MAX = 50
KEYS = ("rule", "transition_cost_s", "lead_share", "floor_s")


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
    names the file), never silently the shipped values."""
    from chainrun.errors import ModelError

    p = path(cluster)
    if not p.exists():
        return {"version": VERSION, "partitions": {}}
    try:
        doc = json.loads(p.read_text())
    except ValueError as e:
        raise ModelError(f"unreadable {p}: {e}", hint="fix or remove it; chainrun model refresh writes a new one") \
            from None
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), dict):
        raise ModelError(f"unreadable {p}: not a tuning document", hint="remove it; chainrun model refresh writes "
                                                                         "a new one")
    return doc


def save(cluster: str, doc: dict) -> Path:
    """Atomically (a watcher may read it meanwhile)."""
    p = path(cluster)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(tmp, p)
    return p


def entry(doc: dict, partition: str) -> dict:
    return doc["partitions"].setdefault(partition, {"in_force": {**shipped(), "source": "shipped", "since": None},
                                                    "pinned": False, "history": []})


def in_force(cluster: str, partition: str) -> dict:
    """The four values `predicted` uses for a chain on ``cluster``/``partition``: the stored ones,
    else the shipped ones. Unreadable or missing files give the shipped values (a watcher must not
    stop over them; `model status` names the problem)."""
    try:
        doc = load(cluster)
    except Exception:  # noqa: BLE001 -- the watcher keeps going on the shipped values
        return shipped()
    e = doc["partitions"].get(partition or "")
    if e is None and not partition:  # a chain without a partition: the cluster's default one
        e = doc["partitions"].get(doc.get("default_partition") or "")
    if not e:
        return shipped()
    f = e.get("in_force") or {}
    return {k: f.get(k, v) for k, v in shipped().items()}


def record(cluster: str, partition: str, outcome: dict, *, default_partition: str | None = None) -> dict:
    """Store one refresh's outcome: appended to the history; when adopted and not pinned, its values
    go in force. Returns the partition's entry."""
    doc = load(cluster)
    if default_partition:
        doc["default_partition"] = default_partition
    e = entry(doc, partition)
    now = time.time()
    adopted = bool(outcome.get("adopted")) and not e.get("pinned")
    e["history"] = (e.get("history") or []) + [{**outcome, "at": now, "put_in_force": adopted,
                                                "previous": outcome.get("previous") or {k: (e.get("in_force") or {}).get(k)
                                                                                        for k in KEYS}}]
    e["history"] = e["history"][-HISTORY_MAX:]
    if adopted:
        e["in_force"] = {**{k: outcome["chosen"][k] for k in KEYS}, "source": "chosen", "since": now,
                         "chosen_at": now, "window": outcome.get("window"), "check": outcome.get("check"),
                         "fidelity": outcome.get("fidelity")}
    e["last"] = {"at": now, "adopted": adopted, "reason": outcome.get("reason"), "summary": outcome.get("summary")}
    save(cluster, doc)
    return e


def pin(cluster: str, partition: str, on: bool = True) -> dict:
    """Pin the values in force (a refresh still chooses and records, but changes nothing), or unpin."""
    doc = load(cluster)
    e = entry(doc, partition)
    e["pinned"] = bool(on)
    save(cluster, doc)
    return e


def rollback(cluster: str, partition: str) -> dict:
    """Put the values in force before the current ones back in force (the shipped values when there
    were none) and pin them, so the next refresh does not adopt again what was just rolled back."""
    doc = load(cluster)
    e = entry(doc, partition)
    cur = {k: (e.get("in_force") or {}).get(k) for k in KEYS}
    prev = None
    for h in reversed(e.get("history") or []):
        if h.get("put_in_force") and h.get("previous") and {k: h["chosen"][k] for k in KEYS} == cur:
            prev = h["previous"]
            break
    prev = prev or shipped()
    e["in_force"] = {**{k: prev[k] for k in KEYS}, "source": "rollback", "since": time.time(),
                     "rolled_back_from": cur}
    e["pinned"] = True
    save(cluster, doc)
    return e


def status(cluster: str) -> dict:
    """What `model status` shows per partition: the values in force, where they came from, when and
    on what window they were chosen, the check's scores, pinned or not, the last refresh's outcome
    and the history of choices (newest last)."""
    doc = load(cluster)
    out = {"file": str(path(cluster)), "default_partition": doc.get("default_partition"), "partitions": {}}
    for part, e in sorted(doc["partitions"].items()):
        hist = e.get("history") or []
        out["partitions"][part] = {
            "in_force": e.get("in_force"), "pinned": bool(e.get("pinned")), "last": e.get("last"),
            "history": [{"at": h.get("at"), "chosen": h.get("chosen"), "adopted": h.get("adopted"),
                         "put_in_force": h.get("put_in_force"), "reason": h.get("reason"), "window": h.get("window"),
                         "scores_h": (h.get("check") or {}).get("scores_h")} for h in hist]}
    return out
