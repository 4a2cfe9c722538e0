"""``chainrun cluster test --probe``: does a compute node see the folder chain runs would use?

A run folder is written on the submit side (the login node, or this machine) and read by every
segment on whatever compute node Slurm picks. Where the folder is not on a filesystem every node
mounts, a segment finds nothing there (docs/getting-started.md, "Where the run folder lives").
The probe writes a random token into a new folder under ``folder``, submits a one-minute job that
reads it back on a compute node, and reports what that node saw: the token or not, and the mount
type there (``stat -f -c %T``; the mount point, type and source from ``/proc/self/mounts``).

The job answers through its exit code too, because a node that does not see the folder cannot
write its report there: 0 the token matched, 86 the folder is not there (the wrapper's own code for
that, chain/outcomes.py), 87 the token differs (a stale or different copy of the folder).
"""

from __future__ import annotations

import posixpath
import secrets
import shlex
import time
from dataclasses import asdict, dataclass
from typing import Callable

from chainrun.chain.outcomes import NO_RUN_FOLDER_EXIT, is_final
from chainrun.errors import SlurmError
from chainrun.runner.base import Runner
from chainrun.slurm.client import SlurmClient

PROBE_EXIT_DIFFERS = 87
PROBE_JOB_NAME = "cr-probe"  # never a segment's cr.<chain>.<idx>: the watcher leaves it alone
# filesystem types every node of a cluster can mount (stat -f's names and /proc/mounts' names)
NETWORK_FS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb2", "smb", "ceph", "cephfs", "glusterfs",
              "panfs", "wekafs", "afs", "9p", "fuse.")

PROBE_SCRIPT = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --time=1
#SBATCH --output=/dev/null
# chainrun cluster test --probe: read the token written on the submit side, say what this node sees
dir={dir}
node=${{SLURMD_NODENAME:-$(hostname -s)}}
if [ -r "$dir/token" ]; then
  got=$(cat "$dir/token")
else
  got=""
fi
real=$(readlink -f "$dir" 2>/dev/null || echo "$dir")
mnt=$(awk -v p="$real" '($2 == p || index(p, ($2 == "/" ? "/" : $2 "/")) == 1) && length($2) >= n {{ n = length($2); m = $2 " " $3 " " $1 }} END {{ print m }}' /proc/self/mounts 2>/dev/null)
report="node=$node
fstype=$(stat -f -c %T "$dir" 2>/dev/null)
mount=$mnt
seen=$([ -n "$got" ] && echo 1 || echo 0)"
if [ -d "$dir" ] && [ -w "$dir" ]; then printf '%s\\n' "$report" > "$dir/report.tmp" && mv "$dir/report.tmp" "$dir/report"; fi
[ -z "$got" ] && exit {missing}
[ "$got" = {token} ] || exit {differs}
exit 0
"""


@dataclass(frozen=True)
class ProbeResult:
    folder: str  # the folder probed (a new subfolder of it was used and removed)
    job_id: str
    node: str
    state: str  # the job's final Slurm state, or its state when the probe stopped waiting
    sees_token: bool | None  # None: the job did not run (still pending, refused, ...)
    node_fstype: str  # what the compute node says (stat -f -c %T); "" if it could not see the folder
    node_mount: str  # "<mount point> <type> <source>" from the node's /proc/self/mounts
    submit_fstype: str  # what the submit side says about the same folder
    network_fs: bool  # the node's mount type is one every node can share (nfs, lustre, gpfs, ...)
    verdict: str  # what it means, in words
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def probe(runner: Runner, slurm: SlurmClient, folder: str, *, sbatch_args: list[str] | None = None,
          wait_s: float = 600.0, poll_s: float = 3.0, clock: Callable[[], float] = time.time,
          sleep: Callable[[float], None] = time.sleep) -> ProbeResult:
    """Run the probe job on the cluster behind ``runner``; returns what the compute node saw. Waits up to
    ``wait_s`` for the job to start and end (then cancels it). Raises SlurmError when sbatch refuses it."""
    t0 = clock()
    folder = folder.rstrip("/") or "/"
    work = posixpath.join(folder, f"chainrun-probe-{secrets.token_hex(4)}")
    res = runner.run(["mkdir", "-p", "-m", "0700", work], 30)
    if not res.ok:
        raise SlurmError(f"cannot create {work}: {res.first_error_line()}", hint="pick a folder you can write (--folder)")
    token = secrets.token_hex(16)
    try:
        runner.write_file(f"{work}/token", token + "\n", 0o600)
        # output to /dev/null: an output file in a folder the node does not see fails the job before it runs
        script = PROBE_SCRIPT.format(name=PROBE_JOB_NAME, dir=shlex.quote(work),
                                     token=shlex.quote(token), missing=NO_RUN_FOLDER_EXIT, differs=PROBE_EXIT_DIFFERS)
        runner.write_file(f"{work}/probe.sh", script, 0o700)
        # sbatch reads the script here, on the submit side, and hands it to Slurm: nodes need not see it
        job_id, _ = slurm.submit(f"{work}/probe.sh", list(sbatch_args or []))
        row = None
        while clock() - t0 < wait_s:
            rows = slurm.accounting([job_id], since=t0)
            row = next((r for r in rows if r.job_id == job_id), None)
            if row is not None and is_final(row.state):
                break
            sleep(poll_s)
        else:
            slurm.cancel([job_id])
        report = _read_report(runner, f"{work}/report")
        submit_fs = runner.run(["stat", "-f", "-c", "%T", folder], 30)
    finally:
        runner.run(["rm", "-rf", "--", work], 60)  # only the folder this probe made
    return _result(folder, job_id, row, report, submit_fs.stdout.strip() if submit_fs.ok else "", clock() - t0)


def _read_report(runner: Runner, path: str) -> dict[str, str]:
    res = runner.run(["cat", path], 30)
    out = {}
    for line in res.stdout.splitlines() if res.ok else []:
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


def _result(folder: str, job_id: str, row, report: dict[str, str], submit_fs: str, seconds: float) -> ProbeResult:
    from chainrun.chain.outcomes import ran_on

    node = report.get("node") or (ran_on(row) if row is not None else "") or "?"
    state = row.state if row is not None else "UNKNOWN"
    fstype, mount = report.get("fstype", ""), report.get("mount", "")
    mtype = mount.split(" ")[1] if len(mount.split(" ")) > 1 else ""
    network = any(t == n or (n.endswith(".") and t.startswith(n)) for t in (fstype, mtype) if t for n in NETWORK_FS)
    sees: bool | None = None
    if row is not None and is_final(row.state) and row.exit_signal == 0:
        if row.exit_code == 0:
            sees = True
        elif row.exit_code in (NO_RUN_FOLDER_EXIT, PROBE_EXIT_DIFFERS):
            sees = False
    if sees is None:
        verdict = (f"the probe job {job_id} did not run to its end ({state}): nothing is known about what a compute "
                   "node sees; try again when the queue is shorter, or with --partition")
    elif not sees:
        what = "does not see" if row.exit_code == NO_RUN_FOLDER_EXIT else "sees another copy of"
        verdict = (f"compute node {node} {what} {folder} (the token written here was not there): run folders "
                   "under it would end 'no-run-folder'. Put them on a shared filesystem (home, project, scratch)")
    elif network:
        verdict = f"compute node {node} sees {folder} on a shared filesystem ({mtype or fstype}): run folders here work"
    else:
        verdict = (f"compute node {node} sees {folder}, but on a local filesystem type ({mtype or fstype or '?'}): "
                   "fine where every node shares it (a one-host cluster); elsewhere another node may not see it")
    return ProbeResult(folder=folder, job_id=job_id, node=node, state=state, sees_token=sees, node_fstype=fstype,
                       node_mount=mount, submit_fstype=submit_fs, network_fs=network, verdict=verdict,
                       seconds=round(seconds, 1))
