"""Why a job is pending, in words, and whether waiting can ever help.

The reason codes are squeue's ``%r`` (e.g. ``Priority``, ``ReqNodeNotAvail, UnavailableNodes:n3``).
A *hopeless* reason means the job can never start as asked: chainrun reports it as an error
with a hint instead of waiting forever. Pure data and one function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    code: str
    words: str
    hopeless: bool = False
    hint: str = ""


NODES_UNAVAILABLE = "NodesUnavailable"
_NODES_SENTENCE = "nodes required for job are down"  # "... DOWN, DRAINED or reserved for jobs in higher priority partitions"
_WORDS: dict[str, tuple[str, bool, str]] = {
    "Priority": ("waiting for higher-priority jobs", False, ""),
    "Resources": ("waiting for free nodes (next in line)", False, ""),
    "Dependency": ("waiting for its dependency", False, ""),
    "BeginTime": ("waiting for its start time", False, ""),
    "JobHeldUser": ("held by its user", False, "release it with `scontrol release JOBID`"),
    "JobHeldAdmin": ("held by an administrator", False, "ask your site why"),
    "Reservation": ("waiting for its reservation", False, ""),
    "ReqNodeNotAvail": ("a node it needs is unavailable (down, drained or reserved)", False,
                        "wait, or let it run elsewhere: drop --nodelist or add the node to --exclude"),
    "Licenses": ("waiting for licenses", False, ""),
    "QOSMaxJobsPerUserLimit": ("your QOS allows no more running jobs now", False, ""),
    "QOSMaxGRESPerUser": ("your QOS allows no more GPUs now", False, ""),
    "AssocMaxJobsLimit": ("your account allows no more running jobs now", False, ""),
    "AssocGrpGRES": ("your account's GPU allowance is in use", False, ""),
    "QOSGrpGRES": ("the QOS's GPU allowance is in use", False, ""),
    # Slurm's own sentence (a state description, not a code): too few of the nodes it may use are free of
    # DOWN, DRAIN, reservations and higher-priority partitions' jobs; ``explain_unavailable`` says which
    NODES_UNAVAILABLE: ("the nodes it needs are down, drained or reserved", False, ""),
    "DependencyNeverSatisfied": ("its dependency can never be met", True, "cancel the chain and resubmit"),
    "PartitionTimeLimit": ("its time limit is longer than the partition allows", True,
                           "resubmit with a shorter --segment (see `scontrol show partition`)"),
    "PartitionNodeLimit": ("it asks for more nodes than the partition allows", True, "ask for fewer nodes"),
    "PartitionDown": ("the partition is down", True, "pick another partition or ask your site"),
    "PartitionInactive": ("the partition is inactive", True, "pick another partition"),
    "InvalidAccount": ("its account does not exist or is not yours", True,
                       "set the right --account (per cluster: [sbatch] in config.toml)"),
    "InvalidQOS": ("its QOS does not exist or is not allowed to you", True, "set the right --qos"),
    "BadConstraints": ("no node matches its --constraint", True, "fix the constraint"),
    "QOSMaxWallDurationPerJobLimit": ("its time limit is longer than the QOS allows", True,
                                      "resubmit with a shorter --segment"),
    "AssocMaxWallDurationPerJobLimit": ("its time limit is longer than your account allows", True,
                                        "resubmit with a shorter --segment"),
    "QOSMaxNodePerJobLimit": ("it asks for more nodes than the QOS allows", True, "ask for fewer nodes"),
}


def explain(reason: str) -> Reason:
    """The words for a pending reason (unknown codes are shown as Slurm wrote them)."""
    text = (reason or "").strip()
    if text.replace("_", " ").lower().startswith(_NODES_SENTENCE):
        return Reason(NODES_UNAVAILABLE, _WORDS[NODES_UNAVAILABLE][0])
    code = text.split(",", 1)[0].strip()
    if not code or code == "None":
        return Reason(code or "", "")
    words, hopeless, hint = _WORDS.get(code, (text, False, ""))
    detail = text.split(",", 1)[1].strip() if "," in text else ""
    if detail and code == "ReqNodeNotAvail":
        words = f"{words}: {detail}"
    return Reason(code, words, hopeless, hint)


UNAVAILABLE = ("ReqNodeNotAvail", NODES_UNAVAILABLE)  # explained from the nodes and reservations


# node state flags (scontrol show node: State=IDLE+DRAIN, DOWN*+NOT_RESPONDING, ...) that keep jobs off a node
_UNUSABLE = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN",
             "POWER_DOWN", "POWERING_DOWN", "REBOOT_ISSUED", "REBOOT_REQUESTED", "FUTURE", "UNKNOWN", "INVAL"}


def node_unusable(state: str) -> str:
    """The first flag of a node state that keeps jobs off it (``DOWN``, ``DRAIN``...), or ""."""
    for flag in state.replace("*", "+NOT_RESPONDING").split("+"):
        if flag.upper() in _UNUSABLE:
            return flag.upper()
    return ""


def explain_unavailable(reason: str, *, node_states: dict[str, str], reservations: list, now: float, limit_s: float,
                        pinned: set[str] | frozenset = frozenset(), partition: str = "") -> Reason:
    """Why nodes a pending job needs are "unavailable", from what ``scontrol show node`` and
    ``scontrol show reservation`` say, instead of Slurm's catch-all sentence: which nodes are down
    or drained, which reservation (maintenance or not) its time window runs into, or, with every
    node up and none reserved, that they are kept for jobs of higher priority. ``node_states``:
    node -> state for the nodes of its partition; ``pinned``: its --nodelist, if any. The hint
    suggests --exclude only when some node it may use is left."""
    base = explain(reason)
    scope = set(pinned) or set(node_states)
    if not scope:
        return base
    bad = {n: node_unusable(node_states.get(n, "")) for n in sorted(scope)}
    bad = {n: why for n, why in bad.items() if why}
    if bad:
        some = ", ".join(f"{n} ({why})" for n, why in list(bad.items())[:8]) + (" ..." if len(bad) > 8 else "")
        if len(bad) < len(scope):
            return Reason(base.code, f"node(s) it needs are unavailable: {some}", False,
                          "wait, or let it run elsewhere: " + ("drop --nodelist or " if pinned else "")
                          + "add them to --exclude")
        return Reason(base.code, f"every node it may use is unavailable: {some}", False,
                      "it starts when one comes back; ask your site if they stay down")
    in_way = sorted((r for r in reservations if r.start < now + limit_s and r.end > now
                     and not (r.partition and partition and r.partition != partition)
                     and (r.all_nodes or r.nodes & scope)), key=lambda r: r.start)
    if in_way:
        r = in_way[0]
        whole = r.all_nodes or set(node_states) <= r.nodes  # the whole partition: nowhere else to go
        held = sorted(r.nodes & scope) if not r.all_nodes else sorted(scope)
        what = f"maintenance {r.name}" if r.is_maintenance else f"reservation {r.name}"
        where = "every node it may use" if whole or (not pinned and set(held) >= scope) else ", ".join(held)
        words = (f"{what} holds {where} until {_hm(r.end)}" if r.start <= now else
                 f"its time limit would run into {what} on {where} ({_hm(r.start)}-{_hm(r.end)})")
        if whole:
            return Reason(base.code, words, False, "nothing to change: it starts when the window allows")
        if pinned:
            return Reason(base.code, words, False, "wait, or drop --nodelist so it may run on other nodes")
        return Reason(base.code, words, False, f"wait, or add {', '.join(held)} to --exclude")
    return Reason(base.code, "every node it may use is up and none is reserved: they are kept for jobs of higher "
                             "priority (or of a higher-priority partition)", False, "")


def _hm(epoch: float) -> str:
    return time.strftime("%a %H:%M", time.localtime(epoch))
