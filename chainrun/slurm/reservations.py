"""Reservations (``scontrol show reservation -o``) and planning a segment around maintenance.

Slurm will not start a job whose time limit overlaps a MAINT reservation on the nodes it
needs: a 48 h segment submitted the day before a maintenance waits out the whole window.
``fit_before`` shortens the next segment so it ends before the window instead. Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from chainrun.slurm.parsers import expand_hostlist, parse_scontrol_oneliners


@dataclass(frozen=True)
class Reservation:
    name: str
    start: float
    end: float
    nodes: frozenset[str]  # empty with all_nodes
    node_count: int
    flags: frozenset[str]
    partition: str
    all_nodes: bool = False

    @property
    def is_maintenance(self) -> bool:
        return "MAINT" in self.flags


def parse_reservations(text: str) -> list[Reservation]:
    """Records of ``scontrol show reservation -o`` printed with ``SLURM_TIME_FORMAT=%s``."""
    if "No reservations" in text:
        return []
    out = []
    for rec in parse_scontrol_oneliners(text):
        try:
            start, end = float(rec["StartTime"]), float(rec["EndTime"])
        except (KeyError, ValueError):
            continue  # not epoch seconds: unreadable, so not planned around
        nodes_text = rec.get("Nodes", "")
        flags = frozenset(f for f in rec.get("Flags", "").split(",") if f)
        out.append(Reservation(
            name=rec.get("ReservationName", "?"), start=start, end=end, nodes=frozenset(expand_nodes(nodes_text)),
            node_count=_int(rec.get("NodeCnt")), flags=flags,
            partition="" if rec.get("PartitionName") in (None, "(null)") else rec["PartitionName"],
            all_nodes=nodes_text == "ALL" or "ALL_NODES" in flags,
        ))
    return out


def expand_nodes(text: str) -> list[str]:
    """Slurm host lists (``n[1-3,7],gpu01``); ``ALL`` and ``(null)`` name no node here."""
    return [] if text in ("", "(null)", "ALL") else expand_hostlist(text)


@dataclass(frozen=True)
class Fit:
    limit_s: int  # the limit to ask for (unchanged when no maintenance is in the way)
    reservation: Reservation | None  # the window planned around, if any
    shortened: bool


def fit_before(now: float, limit_s: int, shortest_s: int, reservations: list[Reservation], *,
               pinned_nodes: set[str], job_nodes: int, partition: str, partition_nodes: int,
               margin_s: int = 60) -> Fit:
    """The limit that lets a segment submitted now end before the first maintenance window in its way.

    A window is in the way when it starts before the segment would end and the job cannot
    avoid its nodes: the job is pinned to one of them, or too few nodes stay free of it. The
    limit is cut to end ``margin_s`` before the window, in whole minutes (Slurm's unit); if
    that leaves less than ``shortest_s``, the limit is kept and the segment waits the window out.
    """
    for r in sorted(reservations, key=lambda r: r.start):
        if not r.is_maintenance or r.start <= now or r.start >= now + limit_s:
            continue
        if r.partition and partition and r.partition != partition:
            continue
        if pinned_nodes:
            in_way = bool(pinned_nodes & r.nodes) or r.all_nodes
        else:
            in_way = r.all_nodes or partition_nodes - r.node_count < max(1, job_nodes)
        if not in_way:
            continue
        room = int((r.start - now - margin_s) // 60) * 60
        if room >= shortest_s:
            return Fit(room, r, True)
        return Fit(limit_s, r, False)
    return Fit(limit_s, None, False)


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0
