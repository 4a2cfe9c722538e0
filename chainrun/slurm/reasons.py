"""Why a job is pending, in words, and whether waiting can ever help.

The reason codes are squeue's ``%r`` (e.g. ``Priority``, ``ReqNodeNotAvail, UnavailableNodes:n3``).
A *hopeless* reason means the job can never start as asked: chainrun reports it as an error
with a hint instead of waiting forever. Pure data and one function.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    code: str
    words: str
    hopeless: bool = False
    hint: str = ""


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
    "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions":
        ("the nodes it needs are down, drained or reserved", False, ""),
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
    code = text.split(",", 1)[0].strip()
    if not code or code == "None":
        return Reason(code or "", "")
    words, hopeless, hint = _WORDS.get(code, (text, False, ""))
    detail = text.split(",", 1)[1].strip() if "," in text else ""
    if detail and code == "ReqNodeNotAvail":
        words = f"{words}: {detail}"
    return Reason(code, words, hopeless, hint)
